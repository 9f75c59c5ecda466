//! The SDK against the real `battery-apiserver dev`: claim, renewal, loss, exec, background
//! processes, release and an exhausted Pool.

use std::time::Duration;

use battery_e2e::apiserver::{ApiServer, Route};
use battery_e2e::{eventually, kube_client, kube_event};
use battery_sdk::types::{ClaimPhase, MicroVMClaim, Pool, ProcessPhase};
use battery_sdk::{Client, Error, LostReason};
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

#[path = "../examples/agent.rs"]
#[allow(dead_code)]
mod agent_example;
/// The examples, run as a test runs them; their `main` is the example's entry, not ours.
#[path = "../examples/run.rs"]
#[allow(dead_code)]
mod example;

const HOLDER: &str = "dev";
const WITHIN: Duration = Duration::from_secs(30);

async fn config(server: &ApiServer) -> kube::Config {
    let kubeconfig = kube::config::Kubeconfig::read_from(server.kubeconfig()).unwrap();
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap()
}

/// A dev server, a kube client for it and the SDK's client, which claims as its user.
async fn start() -> (ApiServer, kube::Client, Client) {
    start_on(Route::Direct).await
}

/// As [`start`], by `route`; through a real kube-apiserver with exec agents.
async fn start_on(route: Route) -> (ApiServer, kube::Client, Client) {
    let server = match route {
        Route::Direct => ApiServer::start(route).await,
        Route::Aggregated => ApiServer::aggregated_with_agents().await,
    };
    let kube = kube_client(server.kubeconfig()).await;
    let client = Client::from_config(config(&server).await).unwrap();
    (server, kube, client)
}

/// A Pool of `size` MicroVMs in all (replaced only when deleted), whose leases renew
/// every second and expire after three.
async fn short_lease_pool(kube: &kube::Client, name: &str, size: i32) {
    // The dev Pool's template, with this test's name, size and lease.
    let mut manifest = battery_apiserver::dev::dev_pool(size);
    manifest["metadata"] = json!({"name": name});
    manifest["spec"]["replenishment"] = json!({"type": "ReplaceOnDelete"});
    manifest["spec"]["lease"] = json!({"heartbeatInterval": "1s", "expiryThreshold": "3s"});
    let pool: Pool = serde_json::from_value(manifest).unwrap();
    let pools: Api<Pool> = Api::default_namespaced(kube.clone());
    pools.create(&PostParams::default(), &pool).await.unwrap();
    eventually(WITHIN, "the Pool to have its MicroVMs", async || {
        let available = pools
            .get(name)
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default()
            .available;
        if available >= size {
            Ok(())
        } else {
            Err(format!("{available} available"))
        }
    })
    .await;
}

fn phase(claim: &MicroVMClaim) -> Option<ClaimPhase> {
    claim.status.as_ref().and_then(|s| s.phase.clone())
}

mod a_claim_is_bound_runs_commands_and_is_released {
    #[tokio::test]
    async fn direct() {
        super::a_claim_is_bound_runs_commands_and_is_released(super::Route::Direct).await;
    }

    #[tokio::test]
    async fn aggregated() {
        super::a_claim_is_bound_runs_commands_and_is_released(super::Route::Aggregated).await;
    }
}

async fn a_claim_is_bound_runs_commands_and_is_released(route: Route) {
    let (_server, kube, client) = start_on(route).await;
    let claim = client
        .claim("dev")
        .holder(HOLDER)
        .labels([("team", "sdk")])
        .send()
        .await
        .unwrap();
    assert_eq!(phase(claim.object()), Some(ClaimPhase::Bound));
    assert!(claim.name().starts_with("dev-"), "{}", claim.name());
    let labels = claim.object().metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("team").map(String::as_str), Some("sdk"));

    // stdin streamed, then closed: the command sees end of file and exits with its code.
    let mut process = claim
        .exec(["sh", "-c", "cat; echo err >&2; exit 7"])
        .await
        .unwrap();
    let mut stdin = process.stdin().unwrap();
    let (mut stdout, mut stderr) = (process.stdout().unwrap(), process.stderr().unwrap());
    stdin.write_all(b"data").await.unwrap();
    stdin.shutdown().await.unwrap();
    let (mut out, mut err) = (String::new(), String::new());
    stdout.read_to_string(&mut out).await.unwrap();
    stderr.read_to_string(&mut err).await.unwrap();
    assert_eq!((out.as_str(), err.as_str()), ("data", "err\n"));
    assert_eq!(process.wait().await.unwrap(), 7);

    let output = claim.run(["echo", "hi"]).await.unwrap();
    assert_eq!(
        (output.code, output.stdout.as_slice()),
        (0, b"hi\n".as_slice())
    );

    // flintlock's environment and working directory.
    assert_eq!(claim.run(["mkdir", "-p", "work"]).await.unwrap().code, 0);
    let output = claim
        .command(["sh", "-c", "echo $GREETING; basename $PWD"])
        .env("GREETING", "hello")
        .working_dir("/work")
        .output()
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout), "hello\nwork\n");

    let name = claim.name().to_owned();
    claim.release().await.unwrap();
    let claims: Api<MicroVMClaim> = Api::default_namespaced(kube);
    assert!(claims.get_opt(&name).await.unwrap().is_none());
}

#[tokio::test]
async fn a_background_process_is_waited_for_attached_to_stopped_and_deleted() {
    let (_server, _kube, client) = start().await;
    let claim = client.claim("dev").holder(HOLDER).send().await.unwrap();

    // It runs on after its start returns; its end is read, then its output from the
    // start.
    let script = "echo early; sleep 1; echo late; exit 3";
    let mut finished = claim
        .background(["sh", "-c", script])
        .name("finished")
        .start()
        .await
        .unwrap();
    let status = finished.wait().await.unwrap();
    assert_eq!(
        (status.phase, status.exit_code),
        (Some(ProcessPhase::Failed), Some(3))
    );
    let mut attached = finished.attach(false).await.unwrap();
    let mut out = String::new();
    let mut stdout = attached.stdout().unwrap();
    stdout.read_to_string(&mut out).await.unwrap();
    assert_eq!(out, "early\nlate\n");
    assert_eq!(attached.wait().await.unwrap(), 3);

    // Found by name, stopped with its signal recorded, deleted.
    claim
        .background(["sleep", "600"])
        .name("napper")
        .start()
        .await
        .unwrap();
    let mut napper = client.process("napper").await.unwrap();
    napper.kill().await.unwrap();
    let stopped = napper.wait().await.unwrap();
    assert_eq!(
        (stopped.exit_code, stopped.signal.as_deref()),
        (Some(143), Some("SIGTERM"))
    );
    napper.delete().await.unwrap();
    finished.delete().await.unwrap();
    eventually(WITHIN, "both processes to be gone", async || {
        match client.processes(None).await {
            Ok(left) if left.is_empty() => Ok(()),
            other => Err(format!("{:?}", other.map(|l| l.len()))),
        }
    })
    .await;
    claim.release().await.unwrap();
}

/// More stdin than any pipe and window on the way hold, so a writer must wait for the
/// command to read it.
const MORE_THAN_BUFFERED: usize = 64 * 1024 * 1024;

#[tokio::test]
async fn stdin_fails_instead_of_waiting_once_the_command_has_exited() {
    let (_server, _kube, client) = start().await;
    let claim = client.claim("dev").holder(HOLDER).send().await.unwrap();
    // Reads ten bytes of its stdin, then exits without the rest.
    let mut process = claim
        .exec(["sh", "-c", "head -c 10 >/dev/null; exit 3"])
        .await
        .unwrap();
    let mut stdin = process.stdin().unwrap();
    let written = tokio::time::timeout(WITHIN, async {
        let chunk = vec![b'x'; 64 * 1024];
        let mut sent = 0;
        while sent < MORE_THAN_BUFFERED {
            stdin.write_all(&chunk).await?;
            sent += chunk.len();
        }
        Ok::<_, std::io::Error>(sent)
    })
    .await
    .expect("a write into an ended session fails instead of waiting");
    let error = written.expect_err("the command stopped reading long before");
    assert_eq!(error.kind(), std::io::ErrorKind::BrokenPipe, "{error}");
    assert_eq!(process.wait().await.unwrap(), 3);
    claim.release().await.unwrap();
}

mod renewal_outlives_the_expiry_and_stops_when_another_client_deletes_the_claim {
    #[tokio::test]
    async fn direct() {
        super::renewal_outlives_the_expiry_and_stops_when_another_client_deletes_the_claim(
            super::Route::Direct,
        )
        .await;
    }

    #[tokio::test]
    async fn aggregated() {
        super::renewal_outlives_the_expiry_and_stops_when_another_client_deletes_the_claim(
            super::Route::Aggregated,
        )
        .await;
    }
}

async fn renewal_outlives_the_expiry_and_stops_when_another_client_deletes_the_claim(route: Route) {
    let (_server, kube, client) = start_on(route).await;
    short_lease_pool(&kube, "short", 2).await;
    let claim = client
        .claim("short")
        .holder(HOLDER)
        .name("kept")
        .send()
        .await
        .unwrap();
    let dropped = client
        .claim("short")
        .holder(HOLDER)
        .name("dropped")
        .send()
        .await
        .unwrap();
    drop(dropped);

    // Three expiry windows.
    tokio::time::sleep(Duration::from_secs(9)).await;
    let claims: Api<MicroVMClaim> = Api::default_namespaced(kube);
    assert_eq!(
        phase(&claims.get("kept").await.unwrap()),
        Some(ClaimPhase::Bound)
    );
    assert_eq!(claim.run(["true"]).await.unwrap().code, 0);
    // A dropped claim renews no more, so battery expired it.
    assert_eq!(
        phase(&claims.get("dropped").await.unwrap()),
        Some(ClaimPhase::Expired)
    );

    claims.delete("kept", &Default::default()).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(5), claim.lost())
        .await
        .expect("lost() resolves within a few renewals");
    assert_eq!(reason, LostReason::Deleted);
    // Already gone: releasing is still fine.
    claim.release().await.unwrap();
}

#[tokio::test]
async fn lost_reports_a_lease_that_battery_ended() {
    use battery_proto::poolmgr::v1alpha1::ReleaseVmRequest;
    use battery_proto::poolmgr::v1alpha1::lease_client::LeaseClient;

    // Through kube-apiserver, with battery in its own process, to reach it behind our back.
    let server = ApiServer::start(Route::Aggregated).await;
    let kube = kube_client(server.kubeconfig()).await;
    let client = Client::from_config(config(&server).await).unwrap();
    short_lease_pool(&kube, "short", 1).await;
    let claim = client.claim("short").holder(HOLDER).send().await.unwrap();
    let vm = claim
        .object()
        .status
        .as_ref()
        .unwrap()
        .micro_vm
        .clone()
        .unwrap()
        .uid;

    let lease = server
        .battery_leases()
        .await
        .into_iter()
        .find(|l| l.vm_uid == vm)
        .expect("battery has the claim's lease");
    let mut leases = LeaseClient::new(server.battery_access().unwrap().channel());
    leases
        .release_vm(ReleaseVmRequest {
            lease_id: lease.lease_id,
        })
        .await
        .unwrap();

    let reason = tokio::time::timeout(Duration::from_secs(5), claim.lost())
        .await
        .expect("lost() resolves at the next renewal");
    assert!(matches!(reason, LostReason::Expired(_)), "{reason:?}");
}

mod limits_say_why_through_lost {
    #[tokio::test]
    async fn direct() {
        super::limits_say_why_through_lost(super::Route::Direct).await;
    }

    #[tokio::test]
    async fn aggregated() {
        super::limits_say_why_through_lost(super::Route::Aggregated).await;
    }
}

/// Issue 42: a claim's idle timeout and maximum lifetime end it though the SDK renews it
/// all along (renewing is not use), and `lost()` says which; a claim kept busy by a
/// running command is not idle.
async fn limits_say_why_through_lost(route: Route) {
    let (_server, kube, client) = start_on(route).await;
    short_lease_pool(&kube, "limited", 3).await;
    let idle = client
        .claim("limited")
        .holder(HOLDER)
        .name("idle")
        .idle_timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    let busy = client
        .claim("limited")
        .holder(HOLDER)
        .name("busy")
        .idle_timeout(Duration::from_secs(5))
        .send()
        .await
        .unwrap();
    let short = client
        .claim("limited")
        .holder(HOLDER)
        .name("short")
        .max_lifetime(Duration::from_secs(6))
        .send()
        .await
        .unwrap();
    let spec = &idle.object().spec;
    assert_eq!(
        spec.idle_timeout.map(|d| d.to_string()).as_deref(),
        Some("5s")
    );
    // `kubectl get` shows the time left where a limit applies, as it shows an age.
    let table = claims_table(&kube).await;
    let left = ttl_of(&table, "short");
    assert!(left.ends_with('s') && left != "<none>", "{table}");

    // Open for as long as the test holds it: the busy claim is in use meanwhile.
    let running = busy.exec(["sleep", "600"]).await.unwrap();
    let opened = tokio::time::Instant::now();
    assert_eq!(idle.run(["true"]).await.unwrap().code, 0);

    let reason = tokio::time::timeout(Duration::from_secs(60), idle.lost())
        .await
        .expect("the idle claim ends");
    let LostReason::IdleTimeout(message) = &reason else {
        panic!("lost() says the idle timeout ended it: {reason:?}");
    };
    assert!(message.contains("idle timeout (5s)"), "{message}");
    let reason = tokio::time::timeout(Duration::from_secs(60), short.lost())
        .await
        .expect("the short-lived claim ends");
    assert!(
        matches!(&reason, LostReason::MaxLifetimeReached(m) if m.contains("maximum lifetime (6s)")),
        "{reason:?}"
    );

    // Past its idle timeout since the command started, the busy claim holds on.
    tokio::time::sleep_until(opened + Duration::from_secs(8)).await;
    let claims: Api<MicroVMClaim> = Api::default_namespaced(kube.clone());
    assert_eq!(
        phase(&claims.get("busy").await.unwrap()),
        Some(ClaimPhase::Bound)
    );
    // Once the command's session ends, it is idle, and ends too.
    drop(running);
    let reason = tokio::time::timeout(Duration::from_secs(60), busy.lost())
        .await
        .expect("the claim ends once its command's session has");
    assert!(matches!(reason, LostReason::IdleTimeout(_)), "{reason:?}");
    let ended = claims.get("idle").await.unwrap();
    let bound = ended
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Bound")
        .unwrap();
    assert_eq!(
        (bound.status.as_str(), bound.reason.as_str()),
        ("False", "IdleTimeout")
    );
    assert_eq!(ttl_of(&claims_table(&kube).await, "idle"), "<none>");
    if route == Route::Aggregated {
        // `serve` records why on the claim, in the cluster, for `kubectl describe`.
        let uid = ended.metadata.uid.as_deref();
        kube_event(&kube, "default", uid, "IdleTimeout", WITHIN).await;
    }
}

/// The claims of the namespace as the server's Table, as kubectl asks for it.
async fn claims_table(kube: &kube::Client) -> serde_json::Value {
    let request = http::Request::get(
        "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/microvmclaims",
    )
    .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    .body(Vec::new())
    .unwrap();
    kube.request::<serde_json::Value>(request).await.unwrap()
}

/// The TTL cell of the claim `name`'s row.
fn ttl_of(table: &serde_json::Value, name: &str) -> String {
    let columns = table["columnDefinitions"].as_array().unwrap();
    let at = columns.iter().position(|c| c["name"] == "TTL").unwrap();
    let row = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["cells"][0] == name)
        .unwrap_or_else(|| panic!("no row of {name}: {table}"));
    row["cells"][at].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn host_ready_follows_the_hosts_reports() {
    use futures::StreamExt as _;
    use kube::api::{Patch, PatchParams};

    // No agents: the Hosts report nothing until this test reports for them.
    let server = ApiServer::start(Route::Aggregated).await;
    let kube = kube_client(server.kubeconfig()).await;
    let client = Client::from_config(config(&server).await).unwrap();
    let claim = client.claim("dev").holder(HOLDER).send().await.unwrap();
    let host = claim
        .object()
        .status
        .as_ref()
        .unwrap()
        .host
        .clone()
        .unwrap()
        .node_name;
    let mut readiness = Box::pin(claim.host_ready());
    let mut next = async || {
        tokio::time::timeout(WITHIN, readiness.next())
            .await
            .expect("a change within the deadline")
            .expect("the claim is there")
            .unwrap()
    };
    let first = next().await;
    assert_eq!(
        (first.ready, first.reason.as_str()),
        (false, "NoHostReport")
    );

    let hosts: Api<battery_sdk::types::Host> = Api::all(kube.clone());
    let report = |status: &str, reason: &str| {
        json!({"status": {"conditions": [{
            "type": "Ready", "status": status, "reason": reason, "message": "from the test",
            "lastTransitionTime": "2026-01-01T00:00:00Z"
        }]}})
    };
    let patch = async |status, reason| {
        hosts
            .patch_status(
                &host,
                &PatchParams::default(),
                &Patch::Merge(report(status, reason)),
            )
            .await
            .unwrap();
    };
    patch("True", "Ready").await;
    let ready = next().await;
    assert_eq!((ready.ready, ready.reason.as_str()), (true, "Ready"));
    patch("False", "KVMUnavailable").await;
    let down = next().await;
    assert_eq!(
        (down.ready, down.reason.as_str(), down.message.as_str()),
        (false, "KVMUnavailable", "from the test")
    );
    let name = claim.name().to_owned();
    claim.release().await.unwrap();
    let end = tokio::time::timeout(WITHIN, readiness.next())
        .await
        .unwrap();
    assert!(
        end.is_none(),
        "the stream ends with the claim {name}: {end:?}"
    );
}

mod an_exhausted_pool_fails_at_the_deadline_and_a_freed_microvm_is_claimed {
    #[tokio::test]
    async fn direct() {
        super::an_exhausted_pool_fails_at_the_deadline_and_a_freed_microvm_is_claimed(
            super::Route::Direct,
        )
        .await;
    }

    #[tokio::test]
    async fn aggregated() {
        super::an_exhausted_pool_fails_at_the_deadline_and_a_freed_microvm_is_claimed(
            super::Route::Aggregated,
        )
        .await;
    }
}

async fn an_exhausted_pool_fails_at_the_deadline_and_a_freed_microvm_is_claimed(route: Route) {
    let (_server, kube, client) = start_on(route).await;
    short_lease_pool(&kube, "one", 1).await;
    let first = client.claim("one").holder(HOLDER).send().await.unwrap();

    let started = tokio::time::Instant::now();
    let refused = client
        .claim("one")
        .holder(HOLDER)
        .deadline(Duration::from_secs(2))
        .send()
        .await
        .err()
        .expect("no MicroVM is free");
    assert!(
        matches!(&refused, Error::PoolExhausted { pool, retry_after } if pool == "one" && !retry_after.is_zero()),
        "{refused:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    let waiting = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .claim("one")
                .holder(HOLDER)
                .deadline(WITHIN)
                .send()
                .await
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    first.release().await.unwrap();
    let second = waiting
        .await
        .unwrap()
        .expect("the freed MicroVM is claimed");
    assert_eq!(phase(second.object()), Some(ClaimPhase::Bound));
}

#[tokio::test]
async fn errors_name_the_missing_pool() {
    let (_server, _, client) = start().await;
    let refused = client
        .claim("nonexistent")
        .holder(HOLDER)
        .send()
        .await
        .err()
        .expect("no such Pool");
    assert!(
        matches!(&refused, Error::PoolNotFound { pool } if pool == "nonexistent"),
        "{refused:?}"
    );
}

/// The examples, as the SDK's page and the agent platforms page show them: each exits
/// with its command's code and leaves no claim behind (the agent's claim binds under the
/// limits it asks for).
#[tokio::test]
async fn the_examples_run_a_command() {
    let (server, kube, _) = start().await;
    let kubeconfig = server.kubeconfig().display().to_string();
    let args = |code: i32| {
        let exit = format!("exit {code}");
        ["--kubeconfig", &kubeconfig, "dev", "sh", "-c", &exit]
            .map(str::to_owned)
            .to_vec()
    };
    assert_eq!(example::run(args(3)).await.unwrap(), 3);
    assert_eq!(agent_example::run(args(5)).await.unwrap(), 5);
    assert_no_claims(&kube).await;
}

/// The namespace has no claim: nothing was left behind.
async fn assert_no_claims(kube: &kube::Client) {
    let claims: Api<MicroVMClaim> = Api::default_namespaced(kube.clone());
    let left = claims.list(&Default::default()).await.unwrap().items;
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn the_holder_defaults_to_the_clients_own_service_account() {
    let server = ApiServer::start(Route::Direct).await;
    let config = config(&server).await;
    let kube = kube::Client::try_from(config.clone()).unwrap();
    let refused = Client::new(kube).claim("dev").send().await.err();
    assert!(
        matches!(refused, Some(Error::HolderUnknown)),
        "a client that does not know its user needs a Holder: {refused:?}"
    );
    let client = Client::from_config(config).unwrap();
    let claim = client.claim("dev").send().await.unwrap();
    assert_eq!(claim.object().spec.service_account_name, HOLDER);
    let elsewhere = client.namespace("other").claim("dev").send().await.err();
    assert!(
        matches!(elsewhere, Some(Error::HolderUnknown)),
        "not a ServiceAccount of that namespace: {elsewhere:?}"
    );
}

/// Issue 42: the builder asks for the claim's ServiceAccount token with the audience and
/// lifetime given (rounded up to whole seconds), which `dev`, having no cluster, refuses
/// saying so; a lifetime under the API's 10 minutes is refused naming the field.
#[tokio::test]
async fn the_builder_asks_for_a_service_account_token() {
    let (_server, kube, client) = start().await;
    let refusal = async |builder: battery_sdk::ClaimBuilder| match builder
        .holder(HOLDER)
        .send()
        .await
        .err()
    {
        Some(Error::Api(kube::Error::Api(status))) => status,
        other => panic!("dev has no cluster to request tokens from: {other:?}"),
    };
    let status = refusal(
        client
            .claim("dev")
            .token_audience("vault")
            .token_expiration(Duration::from_millis(599_500)),
    )
    .await;
    assert_eq!(status.code, 422, "{status:?}");
    assert!(
        status.message.contains(
            "spec.serviceAccountToken: Forbidden: this API server has no cluster to request \
             ServiceAccount tokens from"
        ) && !status.message.contains("expirationSeconds"),
        "{status:?}"
    );
    let short = client.claim("dev").service_account_token();
    let status = refusal(short.token_expiration(Duration::from_secs(599))).await;
    assert!(
        status.message.contains(
            "spec.serviceAccountToken.expirationSeconds: Invalid value: 599: may not specify \
             a duration less than 10 minutes"
        ),
        "{status:?}"
    );
    assert_no_claims(&kube).await;
}
