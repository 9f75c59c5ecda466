//! Exec agents and their Hosts: an agent may write only its own Host; its readiness
//! report reaches the claims on that Host and battery's placement.

use battery_apiserver::testing as common;
mod dev_process;

use axum::body::Body;
use battery_apiserver::auth::UserInfo;
use battery_types::Host;
use battery_types::agent_identity::{AGENT_GROUP, agent_username};
use battery_types::conditions::{self, HostReadyReason};
use common::{DEADLINE, HOSTS, Harness, eventually};
use dev_process::DevProcess;
use http::{Request, StatusCode, header};
use serde_json::{Value, json};

const MERGE: &str = "application/merge-patch+json";

/// `method` on `uri` as the exec agent of Host `host`, past authentication.
async fn as_agent(
    h: &Harness,
    host: &str,
    method: &str,
    uri: &str,
    content_type: &str,
    body: Value,
) -> (StatusCode, Value) {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body.to_string()))
        .unwrap();
    request.extensions_mut().insert(UserInfo {
        name: agent_username(host),
        groups: vec![AGENT_GROUP.to_owned(), "system:authenticated".to_owned()],
        ..UserInfo::default()
    });
    let (status, _, body) = h.send_as_is(request).await;
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn ready_report(status: &str, reason: &str, message: &str) -> Value {
    json!({"status": {"conditions": [{
        "type": "Ready", "status": status, "reason": reason, "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z"
    }]}})
}

#[tokio::test]
async fn an_agent_writes_its_own_host_and_is_refused_every_other() {
    let h = Harness::start().await;
    h.eventually(HOSTS, |_, list| {
        list["items"].as_array().is_some_and(|i| i.len() == 2)
    })
    .await;

    // Its own Host: the registration patch and the status report.
    let (status, host) = as_agent(
        &h,
        "host-0",
        "PATCH",
        &format!("{HOSTS}/host-0"),
        MERGE,
        json!({"spec": {"agentAddress": "127.0.0.1:10270"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{host}");
    assert_eq!(host["spec"]["agentAddress"], "127.0.0.1:10270");
    let (status, host) = as_agent(
        &h,
        "host-0",
        "PATCH",
        &format!("{HOSTS}/host-0/status"),
        MERGE,
        ready_report("True", "Ready", "usable"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{host}");

    // Another Host, its spec, its status, its creation and its deletion: 403, naming
    // both Hosts.
    let other = [
        (
            "PATCH",
            format!("{HOSTS}/host-1"),
            MERGE,
            json!({"spec": {"agentAddress": "127.0.0.1:1"}}),
        ),
        (
            "PATCH",
            format!("{HOSTS}/host-1/status"),
            MERGE,
            ready_report("False", "KVMUnavailable", "forged"),
        ),
        (
            "POST",
            HOSTS.to_owned(),
            "application/json",
            json!({"apiVersion": "battery.liquidmetal-x.dev/v1alpha1", "kind": "Host",
                "metadata": {"name": "host-9"},
                "spec": {"address": "127.0.0.1:9", "tls": {"insecure": true}}}),
        ),
        (
            "DELETE",
            format!("{HOSTS}/host-1"),
            "application/json",
            json!({}),
        ),
    ];
    for (method, uri, content_type, body) in other {
        let (status, refusal) = as_agent(&h, "host-0", method, &uri, content_type, body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {uri}: {refusal}");
        assert_eq!(refusal["reason"], "Forbidden");
        let message = refusal["message"].as_str().unwrap();
        assert!(
            message.contains("\"host-0\"") && message.contains("system:battery-agent:host-0"),
            "{message}"
        );
    }
    let (_, host1) = h.get(&format!("{HOSTS}/host-1")).await;
    assert!(host1["spec"].get("agentAddress").is_none(), "{host1}");
    assert!(common::condition(&host1, "Ready").is_none(), "{host1}");
}

#[tokio::test]
async fn in_dev_each_agent_registers_its_host_and_reports_it_ready() {
    let dir = tempfile::tempdir().unwrap();
    let dev = DevProcess::start(
        &dir.path().join("dev"),
        &["--pool-size", "0"],
        &[],
        std::process::Stdio::null(),
    );
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(dev.dir.join("kubeconfig")).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let hosts: kube::Api<Host> = kube::Api::all(kube::Client::try_from(config).unwrap());
    let listed = eventually(
        DEADLINE,
        "the Hosts listed with their agents, Ready",
        || async {
            let list = hosts
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            let ready = list.items.iter().all(|host| {
                host.spec.agent_address.is_some()
                    && host.status.as_ref().is_some_and(|s| {
                        conditions::is_status_condition_true(&s.conditions, conditions::READY)
                    })
            });
            if list.items.len() == 2 && ready {
                Ok(list.items)
            } else {
                Err(format!("{:?}", list.items))
            }
        },
    )
    .await;
    for host in listed {
        let status = host.status.unwrap();
        let ready =
            conditions::find_status_condition(&status.conditions, conditions::READY).unwrap();
        assert_eq!(ready.reason, HostReadyReason::Ready.as_str());
        // The simulated Hosts have neither; the report must not claim them.
        assert!(
            ready
                .message
                .contains("not checked (turned off): KVM, the thin pool"),
            "{}",
            ready.message
        );
        let agent = host.spec.agent_address.unwrap();
        assert!(agent.starts_with("127.0.0.1:"), "{agent}");
    }
    assert!(dev.stop().success());
}

/// The agent of `host` reports `Ready` as `status` with `reason`.
async fn report(h: &Harness, host: &str, status: &str, reason: &str) {
    let (code, body) = as_agent(
        h,
        host,
        "PATCH",
        &format!("{HOSTS}/{host}/status"),
        MERGE,
        ready_report(status, reason, &format!("{host} says {reason}")),
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{body}");
}

async fn hosts_listed(h: &Harness) {
    h.eventually(HOSTS, |_, list| {
        list["items"].as_array().is_some_and(|i| i.len() == 2)
    })
    .await;
}

/// The admin sets `spec.unschedulable` of `host`, retrying the conflicts the follow
/// loop's own writes cause; the patched Host.
async fn admin_cordon(h: &Harness, host: &str, unschedulable: bool) -> Value {
    eventually(DEADLINE, "the Host patched", || async {
        let (status, _, body) = h
            .call(
                "PATCH",
                &format!("{HOSTS}/{host}"),
                MERGE,
                Some(json!({"spec": {"unschedulable": unschedulable}})),
            )
            .await;
        match status {
            StatusCode::OK => Ok(body),
            StatusCode::CONFLICT => Err(body.to_string()),
            other => panic!("{other}: {body}"),
        }
    })
    .await
}

/// Waits until Host `host` is cordoned in battery (or not), as its status shows.
async fn wait_cordoned(h: &Harness, host: &str, why: Option<&str>) -> Value {
    h.eventually(&format!("{HOSTS}/{host}"), |_, object| match why {
        Some(why) => object["status"]["cordonedReason"]
            .as_str()
            .is_some_and(|r| r.contains(why)),
        None => object["status"].get("cordonedReason").is_none(),
    })
    .await
}

#[tokio::test]
async fn a_not_ready_report_reaches_the_bound_claims_on_that_host() {
    let h = Harness::start().await;
    hosts_listed(&h).await;
    report(&h, "host-0", "True", "Ready").await;
    report(&h, "host-1", "True", "Ready").await;
    h.create(common::POOLS, &common::pool("p", 1)).await;
    h.wait_available("p", 1).await;
    let (status, _, claim) = h.claim("c", "p").await;
    assert_eq!(status, StatusCode::CREATED, "{claim}");
    let host = claim["status"]["host"]["nodeName"]
        .as_str()
        .unwrap()
        .to_owned();
    let ready = common::condition(&claim, "HostReady").expect("HostReady at bind");
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("True"), &json!("Ready"))
    );

    report(&h, &host, "False", "KVMUnavailable").await;
    let uri = format!("{}/c", common::CLAIMS);
    let claim = h
        .eventually(&uri, |_, claim| {
            common::condition(claim, "HostReady").is_some_and(|c| c["status"] == "False")
        })
        .await;
    let ready = common::condition(&claim, "HostReady").unwrap();
    assert_eq!(ready["reason"], "KVMUnavailable");
    assert_eq!(ready["message"], format!("{host} says KVMUnavailable"));
    assert_eq!(
        claim["status"]["phase"], "Bound",
        "HostReady changes neither phase nor Bound"
    );

    report(&h, &host, "True", "Ready").await;
    h.eventually(&uri, |_, claim| {
        common::condition(claim, "HostReady").is_some_and(|c| c["status"] == "True")
    })
    .await;
}

#[tokio::test]
async fn new_microvms_skip_a_host_that_is_not_ready() {
    let h = Harness::start().await;
    hosts_listed(&h).await;
    report(&h, "host-0", "False", "ThinPoolMissing").await;
    report(&h, "host-1", "True", "Ready").await;
    let host0 = wait_cordoned(&h, "host-0", Some("not ready: ThinPoolMissing")).await;
    assert_ne!(
        host0["spec"]["unschedulable"], true,
        "the admin did not cordon it"
    );

    h.create(common::POOLS, &common::pool("p", 2)).await;
    h.wait_available("p", 2).await;
    let (_, host0) = h.get(&format!("{HOSTS}/host-0")).await;
    let (_, host1) = h.get(&format!("{HOSTS}/host-1")).await;
    assert_eq!(host0["status"]["vmCount"], 0, "{host0}");
    assert_eq!(host1["status"]["vmCount"], 2, "{host1}");
    let (status, _, claim) = h.claim("c", "p").await;
    assert_eq!(status, StatusCode::CREATED, "{claim}");
    assert_eq!(claim["status"]["host"]["nodeName"], "host-1");

    // Ready again: placed on again.
    report(&h, "host-0", "True", "Ready").await;
    wait_cordoned(&h, "host-0", None).await;
}

#[tokio::test]
async fn the_admins_cordon_survives_readiness_flapping() {
    let h = Harness::start().await;
    hosts_listed(&h).await;
    admin_cordon(&h, "host-1", true).await;
    report(&h, "host-1", "False", "FlintlockdNotReady").await;
    let host = wait_cordoned(&h, "host-1", Some("not ready")).await;
    assert_eq!(host["spec"]["unschedulable"], true);
    report(&h, "host-1", "True", "Ready").await;
    let host = wait_cordoned(&h, "host-1", Some("spec.unschedulable is true")).await;
    assert_eq!(host["spec"]["unschedulable"], true);

    // Uncordoned by the admin while not ready: battery stays cordoned until ready.
    report(&h, "host-1", "False", "FlintlockdNotReady").await;
    wait_cordoned(&h, "host-1", Some("not ready")).await;
    let body = admin_cordon(&h, "host-1", false).await;
    assert_ne!(body["spec"]["unschedulable"], true);
    assert!(
        body["status"]["cordonedReason"]
            .as_str()
            .unwrap()
            .contains("not ready")
    );
    report(&h, "host-1", "True", "Ready").await;
    let host = wait_cordoned(&h, "host-1", None).await;
    assert_ne!(host["spec"]["unschedulable"], true);
}
