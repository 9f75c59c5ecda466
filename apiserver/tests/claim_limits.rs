//! Issue 42 item 2: a claim's idle timeout and maximum lifetime, on a real socket with one
//! in-process `battery-agent` per simulated Host (the exec tests' harness), Events
//! recorded by a stand-in for the cluster. A claim left unused for its idle timeout ends,
//! one kept busy by an open exec session or a running background process does not until
//! the session or the process ends; one that reaches its maximum lifetime ends however
//! often it is renewed; each says why in its `Bound` condition, an Event and the lease's
//! `410`. Every wait is an `eventually` with a generous deadline; the waits in the other
//! direction (a busy claim that must not end) are measured from when it became busy, so a
//! slow machine only lengthens them.

use battery_apiserver::testing as common;
// The exec tests' harness, of which these tests use a part.
#[path = "exec/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use battery_apiserver::cluster::Cluster;
use battery_apiserver::dev::pki::DEV_USER;
use common::cluster::fake_kube_apiserver;
use common::{CLAIMS, POOLS, claim, condition, eventually};
use harness::{DEADLINE, Exec, kube_exec};
use http::StatusCode;
use serde_json::{Value, json};
use tokio::time::Instant;

const MERGE_PATCH: &str = "application/merge-patch+json";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

type Events = Arc<Mutex<Vec<Value>>>;

/// The exec harness (Pool `p` of two MicroVMs, an agent per Host), recording Events.
async fn start() -> (Exec, Events) {
    let (client, events) = fake_kube_apiserver().await;
    let exec = Exec::start_with(|settings| {
        settings.cluster = Some(Arc::new(Cluster::new(client)));
    })
    .await;
    (exec, events)
}

/// Claims `name` on Pool `p` with `spec` merged into its spec; the bound claim.
async fn claim_with(exec: &Exec, name: &str, spec: Value) -> Value {
    let mut body = claim(name, "p");
    for (field, value) in spec.as_object().unwrap() {
        body["spec"][field] = value.clone();
    }
    let (status, _, bound) = exec
        .h
        .call("POST", CLAIMS, "application/json", Some(body))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{bound}");
    assert_eq!(bound["status"]["phase"], "Bound", "{bound}");
    bound
}

/// Renews the claims' leases every half second until dropped: renewal is not activity,
/// so it must not keep an idle claim alive; it keeps the lease from being why one ends.
fn keep_renewing(exec: &Exec, names: &[&str]) -> tokio::task::JoinHandle<()> {
    let router = exec.h.router();
    let uris: Vec<String> = names
        .iter()
        .map(|name| format!("{CLAIMS}/{name}/lease"))
        .collect();
    tokio::spawn(async move {
        use tower::ServiceExt as _;
        loop {
            for uri in &uris {
                let request = http::Request::patch(uri.as_str())
                    .header(http::header::CONTENT_TYPE, MERGE_PATCH)
                    .body(axum::body::Body::from("{}"))
                    .unwrap();
                // A claim that ended answers 410: nothing to renew any more.
                let _ = router.clone().oneshot(common::as_dev(request)).await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

/// Waits for the claim `name` to be Expired and returns it.
async fn ended(exec: &Exec, name: &str) -> Value {
    exec.h
        .eventually(&format!("{CLAIMS}/{name}"), |_, claim| {
            claim["status"]["phase"] == "Expired"
        })
        .await
}

/// The `Bound` condition's status and reason.
fn bound_reason(claim: &Value) -> (String, String) {
    let bound = condition(claim, "Bound").expect("a Bound condition");
    (
        bound["status"].as_str().unwrap().to_owned(),
        bound["reason"].as_str().unwrap().to_owned(),
    )
}

/// Waits for an Event of `reason` on the claim `claim` and returns it.
async fn event_on(events: &Events, claim: &Value, reason: &str) -> Value {
    let uid = claim["metadata"]["uid"].clone();
    eventually(DEADLINE, "the claim's Event", || async {
        let recorded = events.lock().unwrap().clone();
        recorded
            .into_iter()
            .find(|e| e["involvedObject"]["uid"] == uid && e["reason"] == reason)
            .ok_or_else(|| format!("no {reason} Event on the claim yet"))
    })
    .await
}

/// Renews the claim `name` once: its status and body.
async fn renew(exec: &Exec, name: &str) -> (StatusCode, Value) {
    let uri = format!("{CLAIMS}/{name}/lease");
    let (status, _, body) = exec
        .h
        .call("PATCH", &uri, MERGE_PATCH, Some(json!({})))
        .await;
    (status, body)
}

/// Whether battery still has the MicroVM `vm` on some Host.
fn battery_has(exec: &Exec, vm: &str) -> bool {
    exec.h
        .battery()
        .hosts()
        .iter()
        .any(|host| host.microvm_uids().iter().any(|uid| uid == vm))
}

/// The claim `name`'s row in a Table of claims, by column name.
async fn table_row(exec: &Exec, name: &str) -> Vec<(String, Value)> {
    let request = http::Request::get(CLAIMS)
        .header(http::header::ACCEPT, TABLE)
        .body(axum::body::Body::empty())
        .unwrap();
    let (status, table) = exec.h.json(request).await;
    assert_eq!(status, StatusCode::OK, "{table}");
    let columns: Vec<String> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect();
    let row = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["cells"][0] == name)
        .unwrap_or_else(|| panic!("no row of {name}: {table}"));
    columns
        .into_iter()
        .zip(row["cells"].as_array().unwrap().iter().cloned())
        .collect()
}

fn cell<'a>(row: &'a [(String, Value)], column: &str) -> &'a Value {
    &row.iter().find(|(c, _)| c == column).unwrap().1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_claim_ends_at_its_idle_timeout_and_one_in_use_does_not() {
    let (exec, events) = start().await;
    let idle = claim_with(&exec, "idle", json!({"idleTimeout": "5s"})).await;
    let busy = claim_with(&exec, "busy", json!({"idleTimeout": "5s"})).await;
    assert_eq!(idle["spec"]["idleTimeout"], "5s");
    assert_eq!(idle["status"]["idleTimeout"], "5s", "{idle}");
    let renewing = keep_renewing(&exec, &["idle", "busy"]);

    // `busy` runs a long command: its session keeps the claim in use while it is open.
    let mut session = exec
        .raw(
            DEV_USER,
            "busy",
            "command=sleep&command=600&stdout=true",
            "v5.channel.k8s.io",
        )
        .await
        .expect("the busy claim's session opens");
    let opened = Instant::now();
    // `idle` is used once, then left alone.
    let api = exec.claims(DEV_USER);
    let (printed, status) = kube_exec(&api, "idle", &["echo", "used"]).await;
    assert_eq!(
        (printed.as_str(), &status["status"]),
        ("used\n", &json!("Success"))
    );

    let ended_idle = ended(&exec, "idle").await;
    assert_eq!(
        bound_reason(&ended_idle),
        ("False".to_owned(), "IdleTimeout".to_owned()),
        "{ended_idle}"
    );
    let message = condition(&ended_idle, "Bound").unwrap()["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("idle timeout (5s)"), "{message}");
    let vm = idle["status"]["microVM"]["uid"].as_str().unwrap();
    eventually(
        DEADLINE,
        "battery to take the idle claim's MicroVM back",
        || async {
            if battery_has(&exec, vm) {
                Err("battery still has it")
            } else {
                Ok(())
            }
        },
    )
    .await;
    let event = event_on(&events, &ended_idle, "IdleTimeout").await;
    assert_eq!(event["involvedObject"]["kind"], "MicroVMClaim");
    assert_eq!(event["involvedObject"]["name"], "idle");
    assert_eq!(event["type"], "Normal");
    assert_eq!(event["message"], message.as_str());
    let (status, gone) = renew(&exec, "idle").await;
    assert_eq!(status, StatusCode::GONE, "{gone}");
    assert!(
        gone["message"].as_str().unwrap().contains("(IdleTimeout)"),
        "the renewal says why: {gone}"
    );

    // Well past its idle timeout since its session opened, the busy claim is still
    // Bound: the session is activity for as long as it is open.
    tokio::time::sleep_until(opened + Duration::from_secs(8)).await;
    let (_, still) = exec.h.get(&format!("{CLAIMS}/busy")).await;
    assert_eq!(still["status"]["phase"], "Bound", "{still}");
    let row = table_row(&exec, "busy").await;
    assert_eq!(
        cell(&row, "TTL"),
        "<none>",
        "in use, no idle time runs: {row:?}"
    );

    // Its session ends: from then on it is idle, and it ends too.
    session.ws.close(None).await.unwrap();
    drop(session);
    let ended_busy = ended(&exec, "busy").await;
    assert_eq!(
        bound_reason(&ended_busy),
        ("False".to_owned(), "IdleTimeout".to_owned()),
        "{ended_busy}"
    );
    event_on(&events, &ended_busy, "IdleTimeout").await;
    renewing.abort();
    drop(busy);
}

/// The claims' background processes (ADR 44), beside [`CLAIMS`].
const PROCESSES: &str =
    "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/microvmprocesses";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_background_process_keeps_its_claim_in_use_until_it_ends() {
    let (exec, events) = start().await;
    claim_with(&exec, "worker", json!({"idleTimeout": "5s"})).await;
    let renewing = keep_renewing(&exec, &["worker"]);

    // A dev server, say: started by a request that is over at once, running on.
    let process = json!({
        "apiVersion": battery_types::API_VERSION,
        "kind": "MicroVMProcess",
        "metadata": {"name": "server"},
        "spec": {"claimName": "worker", "command": ["sleep", "600"]},
    });
    let (status, _, started) = exec
        .h
        .call("POST", PROCESSES, "application/json", Some(process))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{started}");
    assert_eq!(started["status"]["phase"], "Running", "{started}");
    let running_since = Instant::now();

    // Well past its idle timeout with no session open, the claim is still Bound: the
    // running process is activity.
    tokio::time::sleep_until(running_since + Duration::from_secs(8)).await;
    let (_, still) = exec.h.get(&format!("{CLAIMS}/worker")).await;
    assert_eq!(still["status"]["phase"], "Bound", "{still}");
    let row = table_row(&exec, "worker").await;
    assert_eq!(
        cell(&row, "TTL"),
        "<none>",
        "in use, no idle time runs: {row:?}"
    );

    // Stopped, it no longer runs: from then on the claim is idle, and it ends.
    let (status, _, stopping) = exec
        .h
        .call(
            "DELETE",
            &format!("{PROCESSES}/server"),
            "application/json",
            None,
        )
        .await;
    assert!(status.is_success(), "{status}: {stopping}");
    let ended_worker = ended(&exec, "worker").await;
    assert_eq!(
        bound_reason(&ended_worker),
        ("False".to_owned(), "IdleTimeout".to_owned()),
        "{ended_worker}"
    );
    event_on(&events, &ended_worker, "IdleTimeout").await;
    renewing.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_ends_at_its_maximum_lifetime_however_often_it_is_renewed() {
    let (exec, events) = start().await;
    // The Pool's defaults apply to a claim that sets none.
    let limits = json!({"spec": {"claimLimits": {
        "idleTimeout": {"default": "1h"},
        "maxLifetime": {"default": "6s", "max": "1h"},
    }}});
    let (status, _, pool) = exec
        .h
        .call("PATCH", &format!("{POOLS}/p"), MERGE_PATCH, Some(limits))
        .await;
    assert_eq!(status, StatusCode::OK, "{pool}");
    assert_eq!(pool["spec"]["claimLimits"]["maxLifetime"]["default"], "6s");
    let (_, read) = exec.h.get(&format!("{POOLS}/p")).await;
    assert_eq!(read["spec"]["claimLimits"], pool["spec"]["claimLimits"]);

    let bound = claim_with(&exec, "short", json!({})).await;
    assert_eq!(bound["status"]["maxLifetime"], "6s", "{bound}");
    assert_eq!(bound["status"]["idleTimeout"], "1h0m0s", "{bound}");
    let row = table_row(&exec, "short").await;
    let left = cell(&row, "TTL").as_str().unwrap().to_owned();
    assert!(
        left.ends_with('s') && left != "<none>",
        "the time left to its lifetime's end: {row:?}"
    );
    // In use and renewed all along: neither keeps it past its lifetime.
    let renewing = keep_renewing(&exec, &["short"]);
    let session = exec
        .raw(
            DEV_USER,
            "short",
            "command=sleep&command=600&stdout=true",
            "v5.channel.k8s.io",
        )
        .await
        .expect("a session opens");

    let ended = ended(&exec, "short").await;
    assert_eq!(
        bound_reason(&ended),
        ("False".to_owned(), "MaxLifetimeReached".to_owned()),
        "{ended}"
    );
    let event = event_on(&events, &ended, "MaxLifetimeReached").await;
    assert!(
        event["message"]
            .as_str()
            .unwrap()
            .contains("maximum lifetime (6s)"),
        "{event}"
    );
    let vm = bound["status"]["microVM"]["uid"].as_str().unwrap();
    eventually(DEADLINE, "battery to take the MicroVM back", || async {
        if battery_has(&exec, vm) {
            Err("battery still has it")
        } else {
            Ok(())
        }
    })
    .await;
    let (status, gone) = renew(&exec, "short").await;
    assert_eq!(status, StatusCode::GONE, "{gone}");
    assert!(
        gone["message"]
            .as_str()
            .unwrap()
            .contains("(MaxLifetimeReached)"),
        "{gone}"
    );
    let row = table_row(&exec, "short").await;
    assert_eq!(
        cell(&row, "TTL"),
        "<none>",
        "an ended claim has none: {row:?}"
    );
    renewing.abort();
    drop(session);
}

#[tokio::test]
async fn a_claim_asking_for_more_than_its_pool_allows_is_refused_naming_the_field() {
    let (exec, _) = start().await;
    let limits = json!({"spec": {"claimLimits": {"maxLifetime": {"max": "1m"}}}});
    let (status, _, pool) = exec
        .h
        .call("PATCH", &format!("{POOLS}/p"), MERGE_PATCH, Some(limits))
        .await;
    assert_eq!(status, StatusCode::OK, "{pool}");

    let mut greedy = claim("greedy", "p");
    greedy["spec"]["maxLifetime"] = json!("2m");
    let (status, _, refused) = exec
        .h
        .call("POST", CLAIMS, "application/json", Some(greedy))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(refused["reason"], "Invalid");
    assert_eq!(
        refused["details"]["causes"][0]["field"], "spec.maxLifetime",
        "{refused}"
    );
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("must be no more than 1m0s, the maximum its Pool sets"),
        "{refused}"
    );
    let (status, _) = exec.h.get(&format!("{CLAIMS}/greedy")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing is left behind");

    // A Pool's maximum with no default is every claim's default.
    let bound = claim_with(&exec, "capped", json!({})).await;
    assert_eq!(bound["status"]["maxLifetime"], "1m0s", "{bound}");

    // Nonsense limits are refused where they are written.
    let mut zero = claim("zero", "p");
    zero["spec"]["idleTimeout"] = json!("0s");
    let (status, _, refused) = exec
        .h
        .call("POST", CLAIMS, "application/json", Some(zero))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(refused["details"]["causes"][0]["field"], "spec.idleTimeout");
    let upside_down =
        json!({"spec": {"claimLimits": {"idleTimeout": {"default": "2h", "max": "1h"}}}});
    let (status, _, refused) = exec
        .h
        .call(
            "PATCH",
            &format!("{POOLS}/p"),
            MERGE_PATCH,
            Some(upside_down),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(
        refused["details"]["causes"][0]["field"],
        "spec.claimLimits.idleTimeout.default"
    );
    // A claim's limits are fixed once it is bound.
    let (status, _, refused) = exec
        .h
        .call(
            "PATCH",
            &format!("{CLAIMS}/capped"),
            MERGE_PATCH,
            Some(json!({"spec": {"maxLifetime": "30s"}})),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(refused["details"]["causes"][0]["field"], "spec.maxLifetime");
}
