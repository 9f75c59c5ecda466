//! A client nobody here wrote: client-go, the Go client that controllers and kubectl are
//! built on. Everything else in this crate talks to battery-apiserver through kube-rs or
//! through clients written here from the same reading of the API conventions, so a
//! misreading shared by the server and those clients would go unnoticed; client-go is
//! Kubernetes' own reading.
//!
//! `client-go-e2e` (`e2e/go/client-go/`, built by `e2e/go/build` with the control plane)
//! uses client-go v0.37.2's dynamic client and its WebSocket exec executor through a real
//! kube-apiserver of the same release to `serve`, with an agent per Host: it lists and
//! watches by `fieldSelector=metadata.name=...` from the list's resourceVersion (as an
//! informer does), creates a MicroVMClaim (Bound in the create response), watches it
//! again from the create's resourceVersion, runs `sh -c 'echo hi; exit 3'` through the
//! claim's `exec` subresource (v5.channel.k8s.io), deletes the claim, and prints what it
//! saw as one JSON line, which this test checks: the output, exit code 3 as client-go
//! decodes it from the Status on the error channel, ADDED through DELETED on the first
//! watch and no ADDED on the second, and no lease left in battery afterwards.

use std::process::Stdio;
use std::time::Duration;

use battery_e2e::apiserver::ApiServer;
use battery_e2e::eventually;
use serde_json::Value;

/// Longer than the program's own bound on all its steps (`--timeout`), so that it fails
/// with its own message first.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// The program's bound on all its steps: a debug build on a loaded 2-core machine.
const STEPS_TIMEOUT: &str = "90s";
/// How long battery may take to release the lease of the deleted claim.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(30);

/// The types of the events of one watch in the program's output.
fn event_types(output: &Value, key: &str) -> Vec<String> {
    output[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} in {output}"))
        .iter()
        .map(|t| t.as_str().expect("event types are strings").to_owned())
        .collect()
}

#[tokio::test]
async fn client_go_claims_watches_execs_and_deletes() {
    let server = ApiServer::aggregated_with_agents().await;
    let program = battery_e2e::control_plane::binaries().join("client-go-e2e");
    let child = tokio::process::Command::new(&program)
        .arg("--kubeconfig")
        .arg(server.kubeconfig())
        .args(["--namespace", "default", "--pool", "dev", "--holder", "dev"])
        .args(["--timeout", STEPS_TIMEOUT])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    let run = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("client-go-e2e ran for more than {RUN_TIMEOUT:?}"))
        .expect("wait for client-go-e2e");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    // What it saw step by step (shown with --nocapture, or when the test fails).
    eprintln!("client-go-e2e said:\n{stderr}{stdout}");
    assert!(
        run.status.success(),
        "client-go-e2e failed ({}):\n{stderr}{stdout}",
        run.status
    );
    let line = stdout.lines().last().unwrap_or_default();
    let output: Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("client-go-e2e's last line is not JSON ({e}): {stdout}"));
    let context = output.to_string();

    assert_eq!(output["created"], "Bound", "{context}");
    assert_eq!(output["stdout"], "hi\n", "{context}");
    assert_eq!(output["stderr"], "", "{context}");
    assert_eq!(output["exitCode"], 3, "{context}");

    // From the list's resourceVersion, before the create: the create, then the delete.
    let events = event_types(&output, "events");
    assert_eq!(
        events.first().map(String::as_str),
        Some("ADDED"),
        "{context}"
    );
    assert_eq!(
        events.last().map(String::as_str),
        Some("DELETED"),
        "{context}"
    );
    // From the create's resourceVersion: only what came after the create.
    let from_create = event_types(&output, "eventsFromCreate");
    assert!(!from_create.iter().any(|t| t == "ADDED"), "{context}");
    assert_eq!(
        from_create.last().map(String::as_str),
        Some("DELETED"),
        "{context}"
    );
    for event in events.iter().chain(&from_create) {
        assert!(
            ["ADDED", "MODIFIED", "DELETED"].contains(&event.as_str()),
            "{context}"
        );
    }

    eventually(RELEASE_TIMEOUT, "battery to hold no lease", async || {
        let leases = server.battery_leases().await;
        if leases.is_empty() {
            Ok(())
        } else {
            Err(format!("{leases:?}"))
        }
    })
    .await;
}
