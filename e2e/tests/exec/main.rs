//! Exec end to end (issue 10): the real binaries, with kube-rs's WebSocket exec client and
//! a second one written from the channel protocol ([`battery_e2e::channel_exec`]).
//!
//! Through a real kube-apiserver, as in a cluster: `serve` with the relay's certificates,
//! the embedded battery in its own process, and one `battery-agent` process per simulated
//! Host, each its Host's identity, getting its serving certificate from the API server.
//! The basic session also runs straight against `battery-apiserver dev`, whose agents run
//! in-process.

use std::time::Duration;

use battery_e2e::apiserver::{ApiServer, Route, front};
use battery_e2e::channel_exec;
use battery_e2e::{eventually, kube_client};
use battery_types::channel::STDIN;
use battery_types::conditions::{HOST_READY, READY};
use battery_types::{Host, MicroVMClaim};
use kube::api::{Api, AttachParams, AttachedProcess, PostParams};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const NAMESPACE: &str = "default";
const HOLDER: &str = "dev";
const WITHIN: Duration = Duration::from_secs(60);
/// What the big transfer sends through `cat`.
const BIG: usize = 100 * 1024 * 1024;
/// How much more memory the API server and the agent may hold at their peak while
/// `BIG` bytes pass through them: a bound per session, far below what holding the
/// transfer would take.
const TRANSFER_MEMORY_BOUND: u64 = 16 * 1024 * 1024;
/// Longer than the transfer takes on a loaded 2-core machine in a debug build, so that a
/// stall fails the test instead of holding the suite.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(300);
/// Well inside the dev Pool's lease.
const RENEW_EVERY: Duration = Duration::from_secs(5);

/// Claims a MicroVM of the dev Pool for the kubectl user's ServiceAccount.
async fn claim(claims: &Api<MicroVMClaim>, name: &str) -> MicroVMClaim {
    let claim: MicroVMClaim = serde_json::from_value(json!({
        "apiVersion": battery_types::API_VERSION,
        "kind": "MicroVMClaim",
        "metadata": {"name": name},
        "spec": {"poolRef": {"name": "dev"}, "serviceAccountName": HOLDER},
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap()
}

fn host_of(claim: &MicroVMClaim) -> String {
    claim
        .status
        .as_ref()
        .and_then(|s| s.host.as_ref())
        .map(|h| h.node_name.clone())
        .expect("a Bound claim names its Host")
}

/// Runs `command` with kube-rs and returns its stdout and the Status kube-rs read.
async fn kube_exec(claims: &Api<MicroVMClaim>, claim: &str, command: &[&str]) -> (String, Value) {
    let mut process = claims
        .exec(
            claim,
            command.to_vec(),
            &AttachParams::default().stderr(false),
        )
        .await
        .unwrap();
    let mut stdout = String::new();
    process
        .stdout()
        .unwrap()
        .read_to_string(&mut stdout)
        .await
        .unwrap();
    let status = process.take_status().unwrap().await;
    process.join().await.unwrap();
    (stdout, serde_json::to_value(status).unwrap())
}

async fn basic_session(route: Route) {
    let server = match route {
        Route::Direct => ApiServer::start(route).await,
        Route::Aggregated => ApiServer::aggregated_with_agents().await,
    };
    let claims: Api<MicroVMClaim> =
        Api::namespaced(kube_client(server.kubeconfig()).await, NAMESPACE);
    claim(&claims, "basic").await;

    let (stdout, status) = kube_exec(&claims, "basic", &["echo", "hi"]).await;
    assert_eq!(stdout, "hi\n");
    assert_eq!(status["status"], "Success", "{status}");

    let (_, status) = kube_exec(&claims, "basic", &["sh", "-c", "exit 3"]).await;
    assert_eq!(status["status"], "Failure", "{status}");
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(
        status["details"]["causes"][0]["reason"], "ExitCode",
        "{status}"
    );
    assert_eq!(status["details"]["causes"][0]["message"], "3", "{status}");

    // The second client: stdout and stderr apart, stdin closed with v5's close channel.
    let client = server.exec_client(None);
    let path = channel_exec::exec_path(NAMESPACE, "basic");
    let script = "read line; echo \"out $line\"; echo err >&2; cat >/dev/null; echo done";
    let mut session = client
        .open(
            &format!(
                "{path}?{}",
                channel_exec::query(&["sh", "-c", script], true)
            ),
            "v5.channel.k8s.io, v4.channel.k8s.io",
        )
        .await
        .unwrap();
    assert_eq!(session.protocol, "v5.channel.k8s.io");
    session.send(STDIN, b"in\nmore").await;
    session.close_stdin().await;
    let outcome = session.finish().await;
    assert_eq!(String::from_utf8_lossy(&outcome.stdout), "out in\ndone\n");
    assert_eq!(String::from_utf8_lossy(&outcome.stderr), "err\n");
    assert_eq!(outcome.status["status"], "Success", "{}", outcome.status);

    // With a terminal, the command runs on a PTY (an SSH session into the guest, ADR 33):
    // stdout is a terminal, stderr comes on it, and the exit code ends it as before.
    let mut session = client
        .open(
            &format!(
                "{path}?command=sh&command=-c&command=test%20-t%201%20%26%26%20echo%20on-a-tty%20%3E%262%3B%20exit%205&stdin=true&stdout=true&tty=true"
            ),
            "v5.channel.k8s.io",
        )
        .await
        .unwrap();
    session.close_stdin().await;
    let outcome = session.finish().await;
    assert_eq!(
        String::from_utf8_lossy(&outcome.stdout).trim_end(),
        "on-a-tty",
        "{}",
        outcome.status
    );
    assert_eq!(outcome.stderr, b"", "{}", outcome.status);
    assert_eq!(
        outcome.status["details"]["causes"][0]["message"], "5",
        "{}",
        outcome.status
    );
}

mod basic_session {
    #[tokio::test]
    async fn direct() {
        super::basic_session(battery_e2e::apiserver::Route::Direct).await;
    }

    #[tokio::test]
    async fn aggregated() {
        super::basic_session(battery_e2e::apiserver::Route::Aggregated).await;
    }
}

/// Fills `buffer` with bytes no compressor or cache along the way could shortcut.
fn noise(seed: &mut u64, buffer: &mut [u8]) {
    for byte in buffer {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *byte = *seed as u8;
    }
}

#[tokio::test]
async fn a_hundred_megabytes_round_trip_through_cat_in_bounded_memory() {
    let server = ApiServer::aggregated_with_agents().await;
    let claims: Api<MicroVMClaim> =
        Api::namespaced(kube_client(server.kubeconfig()).await, NAMESPACE);
    let bound = claim(&claims, "big").await;
    let host = host_of(&bound);
    let server_before = server.server_peak_rss_bytes();
    let agent_before = server.agent_peak_rss_bytes(&host).await;

    let mut process: AttachedProcess = claims
        .exec(
            "big",
            ["cat"],
            &AttachParams::default().stdin(true).stderr(false),
        )
        .await
        .unwrap();
    let mut stdin = process.stdin().unwrap();
    let mut stdout = process.stdout().unwrap();
    let writer = async move {
        let (mut seed, mut sent, mut hash) = (0x9e37_79b9_7f4a_7c15_u64, 0, Sha256::new());
        let mut chunk = vec![0; 64 * 1024];
        while sent < BIG {
            noise(&mut seed, &mut chunk);
            hash.update(&chunk);
            stdin.write_all(&chunk).await.unwrap();
            sent += chunk.len();
        }
        stdin.shutdown().await.unwrap();
        hash.finalize()
    };
    let reader = async move {
        let (mut received, mut hash, mut buffer) = (0, Sha256::new(), vec![0; 64 * 1024]);
        loop {
            let read = stdout.read(&mut buffer).await.unwrap();
            if read == 0 {
                return (received, hash.finalize());
            }
            hash.update(&buffer[..read]);
            received += read;
        }
    };
    // A Holder renews while it works: on a loaded machine the transfer outlasts a lease.
    let renewing = async {
        loop {
            tokio::time::sleep(RENEW_EVERY).await;
            let renewal = kube::api::Patch::Merge(json!({}));
            claims
                .patch_subresource("lease", "big", &Default::default(), &renewal)
                .await
                .expect("the Holder renews its lease");
        }
    };
    let (sent, (received, hash)) = tokio::time::timeout(TRANSFER_TIMEOUT, async {
        tokio::select! {
            done = async { tokio::join!(writer, reader) } => done,
            _ = renewing => unreachable!("renewing never ends"),
        }
    })
    .await
    .expect("the transfer finished in time");
    let status = process.take_status().unwrap().await;
    assert_eq!(received, BIG);
    assert_eq!(hash, sent, "what came back is what went in");
    assert_eq!(status.and_then(|s| s.status).as_deref(), Some("Success"));

    let server_growth = server.server_peak_rss_bytes().saturating_sub(server_before);
    let agent_growth = server
        .agent_peak_rss_bytes(&host)
        .await
        .saturating_sub(agent_before);
    eprintln!("peak RSS growth over {BIG} bytes: API server {server_growth}, agent {agent_growth}");
    assert!(
        server_growth < TRANSFER_MEMORY_BOUND,
        "the API server grew by {server_growth} bytes"
    );
    assert!(
        agent_growth < TRANSFER_MEMORY_BOUND,
        "the agent grew by {agent_growth} bytes"
    );
}

/// For exec and for port-forward alike.
#[tokio::test]
async fn only_the_holder_with_rbac_may_exec() {
    let server = ApiServer::aggregated_with_agents().await;
    let claims: Api<MicroVMClaim> =
        Api::namespaced(kube_client(server.kubeconfig()).await, NAMESPACE);
    claim(&claims, "mine").await;
    // Someone allowed to exec into claims and forward their ports, but not this claim's
    // Holder.
    let rules = vec![front::battery_rule(
        &[
            "microvmclaims",
            "microvmclaims/exec",
            "microvmclaims/portforward",
        ],
        &["get", "create"],
    )];
    let account = front::service_account(NAMESPACE, "other");
    let cluster = server.cluster().expect("aggregated");
    cluster.grant("e2e:exec", rules, account).await;
    let exec = format!(
        "{}?{}",
        channel_exec::exec_path(NAMESPACE, "mine"),
        channel_exec::query(&["echo", "hi"], false)
    );
    let portforward = format!(
        "{}?ports=80",
        channel_exec::connect_path(NAMESPACE, "mine", "portforward")
    );
    for (subresource, path, protocol) in [
        ("exec", exec, "v5.channel.k8s.io"),
        ("portforward", portforward, "v4.channel.k8s.io"),
    ] {
        // The Holder rule is ours; without RBAC, kube-apiserver itself refuses the
        // upgrade, a GET, as `get` on the subresource, in its own words.
        let no_rbac = format!("cannot get resource \"microvmclaims/{subresource}\"");
        for (account, why, refusal) in [
            ("other", "not the Holder", "only its Holder"),
            ("nobody", "no RBAC", no_rbac.as_str()),
        ] {
            let user = battery_types::service_account_username(NAMESPACE, account);
            let refused = server
                .exec_client(Some(
                    cluster.service_account_certificate(NAMESPACE, account),
                ))
                .open(&path, protocol)
                .await
                .err()
                .unwrap_or_else(|| panic!("{user} ({why}) may not {subresource}"));
            assert_eq!(refused.0, 403, "{subresource}, {why}: {}", refused.1);
            assert_eq!(refused.1["reason"], "Forbidden", "{why}: {}", refused.1);
            assert!(
                refused.1["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains(refusal),
                "{subresource}, {why}: {}",
                refused.1
            );
        }
    }
}

/// Both kinds of session (a pipe on `MicroVMExec`, a terminal on the SSH proxy) end with a
/// `Status` saying the agent went away, not a dropped connection.
#[tokio::test]
async fn a_killed_agent_ends_pipe_and_terminal_sessions_with_a_clear_error_and_its_successor_serves()
 {
    let server = ApiServer::aggregated_with_agents().await;
    let claims: Api<MicroVMClaim> =
        Api::namespaced(kube_client(server.kubeconfig()).await, NAMESPACE);
    let host = host_of(&claim(&claims, "victim").await);
    let client = server.exec_client(None);
    let path = channel_exec::exec_path(NAMESPACE, "victim");
    let command = channel_exec::query(&["sh", "-c", "echo started; sleep 300"], true);
    let mut sessions = Vec::new();
    for tty in ["false", "true"] {
        let mut session = client
            .open(&format!("{path}?{command}&tty={tty}"), "v5.channel.k8s.io")
            .await
            .unwrap();
        session.read_stdout_until("started").await;
        sessions.push((tty, session));
    }
    let spec = server.kill_agent(&host).await;
    for (tty, session) in sessions {
        let outcome = session.finish().await;
        assert_eq!(
            outcome.status["status"], "Failure",
            "tty={tty}: {}",
            outcome.status
        );
        let message = outcome.status["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("did not finish") && message.contains("exec agent"),
            "tty={tty}: {}",
            outcome.status
        );
    }

    server.start_agent(spec).await;
    let (stdout, status) = eventually(WITHIN, "an exec through the new agent", async || {
        let (stdout, status) = kube_exec(&claims, "victim", &["echo", "back"]).await;
        if status["status"] == "Success" {
            Ok((stdout, status))
        } else {
            Err(status.to_string())
        }
    })
    .await;
    assert_eq!(stdout, "back\n", "{status}");
}

#[tokio::test]
async fn a_host_its_agent_reports_not_ready_shows_on_claims_and_gets_no_new_microvms() {
    let server = ApiServer::aggregated_with_agents().await;
    let client = kube_client(server.kubeconfig()).await;
    let claims: Api<MicroVMClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let hosts: Api<Host> = Api::all(client);
    let first = claim(&claims, "first").await;
    let host = host_of(&first);

    // The same agent, started again on a Host whose KVM device is gone.
    let mut spec = server.kill_agent(&host).await;
    spec.extra = [
        "--kvm-device",
        "/nonexistent/kvm",
        "--skip-check",
        "thin-pool",
    ]
    .map(str::to_owned)
    .to_vec();
    server.start_agent(spec).await;
    let condition =
        |object: Option<&Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>>,
         type_: &str| { object.and_then(|c| c.iter().find(|c| c.type_ == type_).cloned()) };
    let reported = eventually(WITHIN, "the claim to show its Host not ready", async || {
        let object = claims.get("first").await.map_err(|e| e.to_string())?;
        match condition(object.status.as_ref().map(|s| &s.conditions), HOST_READY) {
            Some(c) if c.status == "False" => Ok(c),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(reported.reason, "KVMUnavailable", "{reported:?}");
    let ready = hosts.get(&host).await.unwrap();
    let ready = condition(ready.status.as_ref().map(|s| &s.conditions), READY).unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "KVMUnavailable")
    );
    let refused = server
        .exec_client(None)
        .open(
            &format!(
                "{}?command=true&stdout=true",
                channel_exec::exec_path(NAMESPACE, "first")
            ),
            "v5.channel.k8s.io",
        )
        .await
        .err()
        .expect("no exec on a Host that is not ready");
    assert_eq!(refused.0, 503, "{}", refused.1);

    // Claims keep coming; battery replaces them, never on the Host that is not ready.
    let count = async || {
        hosts
            .get(&host)
            .await
            .unwrap()
            .status
            .unwrap_or_default()
            .vm_count
    };
    let before = count().await;
    for n in 0..4 {
        let name = format!("more-{n}");
        claim(&claims, &name).await;
        claims.delete(&name, &Default::default()).await.unwrap();
    }
    battery_e2e::consistently(
        Duration::from_secs(3),
        "no new MicroVM on the Host",
        async || {
            let now = count().await;
            if now <= before {
                Ok(())
            } else {
                Err(format!("{now} MicroVMs, {before} before"))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn an_agent_cannot_write_another_hosts_status() {
    let server = ApiServer::aggregated_with_agents().await;
    let client = kube_client(server.kubeconfig()).await;
    let names: Vec<String> = Api::<Host>::all(client)
        .list(&Default::default())
        .await
        .unwrap()
        .into_iter()
        .filter_map(|h| h.metadata.name)
        .collect();
    let [mine, theirs, ..] = names.as_slice() else {
        panic!("two Hosts at least: {names:?}");
    };
    let (_, _, kubeconfig) = server.client_certificate(
        &battery_types::agent_identity::agent_username(mine),
        &[battery_types::agent_identity::AGENT_GROUP],
    );
    let hosts: Api<Host> = Api::all(kube_client(&kubeconfig).await);
    let patch = json!({"status": {"conditions": [{
        "type": "Ready", "status": "False", "reason": "KVMUnavailable",
        "message": "forged", "lastTransitionTime": "2026-12-01T00:00:00Z"
    }]}});
    let params = kube::api::PatchParams::default();
    // The binding `deploy/` ships for the agents' group lets the agent through
    // kube-apiserver; our Host rule is what refuses it, naming the exec agent.
    let refused_by_the_host_rule = |error: kube::Error| {
        let kube::Error::Api(status) = error else {
            panic!("{error}")
        };
        assert_eq!(status.code, 403, "{status:?}");
        assert!(status.message.contains("exec agent"), "{status:?}");
    };
    refused_by_the_host_rule(
        hosts
            .patch_status(theirs, &params, &kube::api::Patch::Merge(&patch))
            .await
            .expect_err("another Host's status is not this agent's to write"),
    );
    let certificate = json!({
        "apiVersion": battery_types::API_VERSION, "kind": "HostCertificateRequest",
        "metadata": {}, "spec": {"request": "not even a CSR"}
    });
    let request = http::Request::post(format!(
        "/apis/{}/hosts/{theirs}/certificate",
        battery_types::API_VERSION
    ))
    .header("content-type", "application/json")
    .body(serde_json::to_vec(&certificate).unwrap())
    .unwrap();
    refused_by_the_host_rule(
        kube_client(&kubeconfig)
            .await
            .request::<Value>(request)
            .await
            .expect_err("no certificate for another Host"),
    );
}

#[tokio::test]
async fn stopping_the_server_ends_its_sessions_with_a_status_saying_so() {
    let server = ApiServer::aggregated_with_agents().await;
    let claims: Api<MicroVMClaim> =
        Api::namespaced(kube_client(server.kubeconfig()).await, NAMESPACE);
    claim(&claims, "stopped").await;
    let path = channel_exec::exec_path(NAMESPACE, "stopped");
    let mut session = server
        .exec_client(None)
        .open(
            &format!("{path}?{}", channel_exec::query(&["sleep", "300"], false)),
            "v5.channel.k8s.io",
        )
        .await
        .unwrap();
    session.send(STDIN, b"").await;
    let (_, serve) = server.battery_and_serve_pids();
    let signalled = std::process::Command::new("kill")
        .args(["-TERM", &serve.to_string()])
        .status()
        .unwrap();
    assert!(signalled.success());
    let outcome = session.finish().await;
    assert_eq!(outcome.status["status"], "Failure", "{}", outcome.status);
    let message = outcome.status["message"].as_str().unwrap_or_default();
    assert!(message.contains("shutting down"), "{}", outcome.status);
}
