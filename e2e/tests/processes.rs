//! Background processes (issue 42 item 1; ADR 44) through a real kube-apiserver, as in a
//! cluster (`serve`, one `battery-agent` per simulated Host, RBAC as `deploy/` ships
//! it): a process outlives the request that started it, is listed (Table, label
//! selector) and watched, attached to with the output it wrote before, read to its exit
//! code, stopped
//! with its signal recorded; a viewer lists but neither starts nor attaches; and an agent
//! that restarts reports what it was running as lost.

use std::time::Duration;

use battery_e2e::apiserver::{ApiServer, Stream, front};
use battery_e2e::channel_exec;
use battery_e2e::control_plane::Options;
use battery_e2e::https::Identity;
use battery_e2e::{dev_claim, eventually, kube_client};
use battery_types::{MicroVMClaim, MicroVMProcess, ProcessPhase};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

const NAMESPACE: &str = "default";
/// Generous, for a debug build on a loaded 2-core machine.
const DEADLINE: Duration = Duration::from_secs(90);

fn process(name: &str, claim: &str, command: &[&str]) -> MicroVMProcess {
    serde_json::from_value(json!({
        "apiVersion": battery_types::API_VERSION,
        "kind": "MicroVMProcess",
        "metadata": {"name": name, "labels": {"app": "e2e"}},
        "spec": {"claimName": claim, "command": command, "terminationGracePeriodSeconds": 20},
    }))
    .expect("a MicroVMProcess")
}

/// The path of the process `name`'s attach, with stdout and stderr.
fn attach_path(name: &str) -> String {
    format!(
        "/apis/{}/namespaces/{NAMESPACE}/microvmprocesses/{name}/attach?stdout=true&stderr=true",
        battery_types::API_VERSION
    )
}

/// Waits until the process `name` no longer runs; its last state.
async fn ended(processes: &Api<MicroVMProcess>, name: &str) -> MicroVMProcess {
    eventually(DEADLINE, &format!("process {name} to end"), async || {
        let process = processes.get(name).await.map_err(|e| e.to_string())?;
        let phase = process.status.as_ref().and_then(|s| s.phase.clone());
        match phase {
            Some(ProcessPhase::Running) | None => Err(format!("{phase:?}")),
            Some(_) => Ok(process),
        }
    })
    .await
}

#[tokio::test]
async fn a_background_process_outlives_its_client_is_listed_attached_to_and_stopped() {
    let server = ApiServer::aggregated_with_agents().await;
    let client = kube_client(server.kubeconfig()).await;
    let claims: Api<MicroVMClaim> = Api::namespaced(client.clone(), NAMESPACE);
    claims
        .create(&PostParams::default(), &dev_claim("work", "dev"))
        .await
        .expect("the kubectl user claims for itself");
    let processes: Api<MicroVMProcess> = Api::namespaced(client.clone(), NAMESPACE);
    // A watch from before the start sees it start and end.
    let kubectl = server.kubectls().next().expect("a kubectl");
    let mut watch = kubectl
        .cmd(&["get", "microvmprocesses", "-w", "-n", NAMESPACE])
        .spawn();

    // Started by one request, which is over before the process writes its last line.
    let script = "echo early; sleep 2; echo late; exit 3";
    let created = processes
        .create(
            &PostParams::default(),
            &process("sleeper", "work", &["sh", "-c", script]),
        )
        .await
        .expect("the Holder starts a process");
    let status = created.status.expect("a status");
    assert_eq!(status.phase, Some(ProcessPhase::Running));
    assert!(status.node_name.is_some());

    // Listed, with the columns kubectl users expect, and by label.
    let table = kubectl
        .ok(&["get", "microvmprocesses", "-l", "app=e2e", "-n", NAMESPACE])
        .await;
    let header = table.lines().next().unwrap_or_default();
    for column in ["NAME", "CLAIM", "COMMAND", "STATE", "EXIT CODE", "AGE"] {
        assert!(header.contains(column), "{column} in {table}");
    }
    assert!(
        table.contains("sleeper") && table.contains("work"),
        "{table}"
    );
    assert!(
        kubectl
            .ok(&[
                "get",
                "microvmprocesses",
                "-l",
                "app=other",
                "-n",
                NAMESPACE
            ])
            .await
            .trim()
            .is_empty()
    );

    // Its labels change as any object's do; its spec does not.
    kubectl
        .ok(&[
            "label",
            "microvmprocess",
            "sleeper",
            "tier=build",
            "-n",
            NAMESPACE,
        ])
        .await;
    let relabeled = kubectl
        .ok(&[
            "get",
            "mvp",
            "-l",
            "tier=build",
            "-o",
            "name",
            "-n",
            NAMESPACE,
        ])
        .await;
    assert_eq!(
        relabeled.trim(),
        "microvmprocess.battery.liquidmetal-x.dev/sleeper"
    );
    let refused = kubectl
        .fails(&[
            "patch",
            "mvp",
            "sleeper",
            "--type=merge",
            "-p",
            r#"{"spec":{"command":["true"]}}"#,
            "-n",
            NAMESPACE,
        ])
        .await;
    assert!(refused.contains("field is immutable"), "{refused}");

    // An attach gets what the process wrote before it, then the rest, then its exit code.
    let exec = server.exec_client(None);
    let mut attached = exec
        .open(&attach_path("sleeper"), "v5.channel.k8s.io")
        .await
        .expect("the Holder attaches");
    attached.read_stdout_until("early\n").await;
    let outcome = attached.finish().await;
    assert!(String::from_utf8_lossy(&outcome.stdout).contains("late\n"));
    assert_eq!(
        outcome.status["reason"], "NonZeroExitCode",
        "{}",
        outcome.status
    );
    let done = ended(&processes, "sleeper").await.status.expect("a status");
    assert_eq!(
        (done.phase, done.exit_code),
        (Some(ProcessPhase::Failed), Some(3))
    );
    assert!(done.finish_time.is_some());
    watch
        .line(Stream::Stdout, "the watch to show it Failed", |line| {
            line.starts_with("sleeper") && line.contains("Failed")
        })
        .await;
    watch.interrupt();
    // Read again after its end: its output from the start.
    let again = exec
        .open(&attach_path("sleeper"), "v5.channel.k8s.io")
        .await
        .expect("attaches to an ended process")
        .finish()
        .await;
    assert_eq!(String::from_utf8_lossy(&again.stdout), "early\nlate\n");

    // A stop records the signal that ended it, and the process stays to be read.
    processes
        .create(
            &PostParams::default(),
            &process("napper", "work", &["sleep", "600"]),
        )
        .await
        .expect("started");
    let stop = kube::core::Request::new(processes.resource_url())
        .create_subresource("stop", "napper", &PostParams::default(), b"{}".to_vec())
        .expect("a request");
    let stopping: MicroVMProcess = client.request(stop).await.expect("the Holder stops it");
    assert_eq!(stopping.metadata.name.as_deref(), Some("napper"));
    let stopped = ended(&processes, "napper").await.status.expect("a status");
    assert_eq!(
        (stopped.exit_code, stopped.signal.as_deref()),
        (Some(143), Some("SIGTERM"))
    );
    // A delete removes it.
    processes
        .delete("napper", &DeleteParams::default())
        .await
        .expect("deleted");
    eventually(DEADLINE, "napper to be gone", async || {
        match processes.get("napper").await {
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn a_viewer_lists_processes_but_neither_starts_nor_attaches() {
    // The ClusterRole aggregation controller puts `battery-view` into `view`.
    let server = ApiServer::aggregated_with_agents_and(Options {
        controllers: true,
        ..Options::default()
    })
    .await;
    let admin = kube_client(server.kubeconfig()).await;
    // Held by the viewer, so only RBAC stands in its way.
    Api::<MicroVMClaim>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &dev_claim("watched", "viewer"))
        .await
        .expect("a claim held by the viewer");
    let cluster = server.cluster().expect("a real control plane");
    let kubeconfig = cluster
        .plane
        .service_account_kubeconfig(NAMESPACE, "viewer")
        .await;
    let expected = front::battery_rule(&["microvmprocesses"], &["list"]);
    cluster
        .bind_in(
            NAMESPACE,
            "view",
            front::service_account(NAMESPACE, "viewer"),
            &expected,
        )
        .await;
    let viewer: Api<MicroVMProcess> = Api::namespaced(kube_client(&kubeconfig).await, NAMESPACE);

    let listed = viewer
        .list(&ListParams::default())
        .await
        .expect("view lists");
    assert!(listed.items.is_empty());
    match viewer
        .create(&PostParams::default(), &process("p", "watched", &["true"]))
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("view started a process: {other:?}"),
    }
    let token = cluster
        .plane
        .service_account_token(NAMESPACE, "viewer")
        .await;
    let client = channel_exec::Client {
        https: battery_e2e::https::Client::new(
            cluster.url(),
            &cluster.ca(),
            Identity::Token(token),
        ),
    };
    let refused = client
        .open(&attach_path("p"), "v5.channel.k8s.io")
        .await
        .err()
        .expect("view may not attach");
    assert_eq!(refused.0, 403, "{}", refused.1);
}

#[tokio::test]
async fn a_restarted_agent_reports_the_process_it_ran_as_lost() {
    let server = ApiServer::aggregated_with_agents().await;
    let client = kube_client(server.kubeconfig()).await;
    let claims: Api<MicroVMClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let bound = claims
        .create(&PostParams::default(), &dev_claim("work", "dev"))
        .await
        .expect("claimed");
    let host = bound.status.and_then(|s| s.host).expect("a Host").node_name;
    let processes: Api<MicroVMProcess> = Api::namespaced(client, NAMESPACE);
    processes
        .create(
            &PostParams::default(),
            &process("long", "work", &["sleep", "600"]),
        )
        .await
        .expect("started");

    // As a crash: SIGKILL, then the same agent again, on the same state directory.
    let spec = server.kill_agent(&host).await;
    server.start_agent(spec).await;
    let lost: Value = eventually(DEADLINE, "the process to be reported lost", async || {
        let process = processes.get("long").await.map_err(|e| e.to_string())?;
        let status = process.status.unwrap_or_default();
        match status.phase {
            Some(ProcessPhase::Lost) => Ok(json!(status.message)),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        lost.as_str()
            .unwrap_or_default()
            .contains("the exec agent restarted"),
        "{lost}"
    );
}
