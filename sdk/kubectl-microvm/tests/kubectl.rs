//! The real kubectl runs the plugin against a fresh `battery-apiserver dev` (and exec
//! through a real kube-apiserver too): kubectl finds `kubectl-microvm` on PATH and hands
//! it everything after `microvm`.

mod common;
#[path = "kubectl/port_forward.rs"]
mod port_forward;
#[path = "kubectl/processes.rs"]
mod processes;
#[path = "kubectl/terminal.rs"]
mod terminal;

use battery_e2e::apiserver::{ApiServer, Route, Stream};
use battery_e2e::kube_client;
use common::{kubectl, microvm, one_line, path_with_plugin};
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test]
async fn run_claims_runs_and_releases_on_a_fresh_dev() {
    let server = ApiServer::start(Route::Direct).await;
    let kubectl = kubectl(&server);
    let run = microvm(&kubectl, &["run", "dev", "--", "uname"]).await;
    assert!(run.success, "{run}");
    assert_eq!(run.stdout, "Linux\n", "{run}");
    // Nothing is left behind.
    let claims = kubectl.json(&["get", "microvmclaims", "-o", "json"]).await;
    assert_eq!(claims["items"], json!([]), "{claims}");

    // The command's exit code is run's.
    let failing = microvm(&kubectl, &["run", "dev", "--", "sh", "-c", "exit 4"]).await;
    assert_eq!(failing.code, Some(4), "{failing}");
}

#[tokio::test]
async fn exec_streams_passes_stdin_and_exits_with_the_commands_code() {
    exec_streams_passes_stdin_and_exits(ApiServer::start(Route::Direct).await).await;
}

/// The same through a real kube-apiserver, with an agent per simulated Host: the plugin
/// is one more exec client through the aggregator.
#[tokio::test]
async fn exec_through_kube_apiserver_streams_and_exits_with_the_commands_code() {
    exec_streams_passes_stdin_and_exits(ApiServer::aggregated_with_agents().await).await;
}

async fn exec_streams_passes_stdin_and_exits(server: ApiServer) {
    let kubectl = kubectl(&server);
    let claimed = microvm(&kubectl, &["claim", "dev", "--name", "c", "-o", "name"]).await;
    assert!(claimed.success, "{claimed}");
    assert_eq!(claimed.stdout, "microvmclaim/c\n");
    assert!(
        claimed.stderr.contains("kubectl microvm renew c"),
        "says how to keep it: {claimed}"
    );

    let exec = microvm(
        &kubectl,
        &[
            "exec",
            "microvmclaim/c",
            "--",
            "sh",
            "-c",
            "echo hi; exit 7",
        ],
    )
    .await;
    assert_eq!(
        (exec.code, exec.stdout.as_str()),
        (Some(7), "hi\n"),
        "{exec}"
    );

    let cat = kubectl
        .cmd(&["microvm", "exec", "-i", "c", "--", "cat"])
        .env("PATH", path_with_plugin())
        .stdin("data\n")
        .output()
        .await;
    assert_eq!(
        (cat.code, cat.stdout.as_str()),
        (Some(0), "data\n"),
        "{cat}"
    );

    let env = microvm(
        &kubectl,
        &[
            "exec",
            "c",
            "-e",
            "GREETING=hello",
            "--",
            "sh",
            "-c",
            "echo $GREETING >&2",
        ],
    )
    .await;
    assert_eq!(
        (env.code, env.stderr.as_str()),
        (Some(0), "hello\n"),
        "{env}"
    );

    let listed = microvm(&kubectl, &["ls"]).await;
    let row = listed
        .stdout
        .lines()
        .find(|l| l.starts_with("c "))
        .unwrap_or_else(|| panic!("no row for c: {listed}"));
    assert!(row.contains("Bound") && row.contains(" dev "), "{row}");

    let renewed = microvm(&kubectl, &["renew", "c"]).await;
    assert!(
        renewed.success && renewed.stdout.contains("renewed"),
        "{renewed}"
    );
    let released = microvm(&kubectl, &["release", "c"]).await;
    assert_eq!(released.stdout, "microvmclaim/c released\n", "{released}");

    // Gone: one line naming it, with the way out.
    let gone = microvm(&kubectl, &["exec", "c", "--", "true"]).await;
    assert!(
        one_line(&gone).contains("microvmclaim c does not exist"),
        "{gone}"
    );
    let gone = microvm(&kubectl, &["renew", "c"]).await;
    one_line(&gone);
}

#[tokio::test]
async fn hold_renews_until_ctrl_c_then_releases() {
    let server = ApiServer::start(Route::Direct).await;
    let kubectl = kubectl(&server);
    let mut hold = kubectl
        .cmd(&["microvm", "claim", "dev", "--name", "held", "--hold"])
        .env("PATH", path_with_plugin())
        .spawn();
    hold.line(Stream::Stderr, "the holding line", |l| {
        l.contains("Ctrl-C releases it")
    })
    .await;
    hold.interrupt();
    let ended = hold.finish().await;
    assert!(ended.success, "{ended}");
    assert!(
        ended.stderr.contains("microvmclaim/held released"),
        "{ended}"
    );
    let claims = kubectl.json(&["get", "microvmclaims", "-o", "json"]).await;
    assert_eq!(claims["items"], json!([]), "{claims}");
}

#[tokio::test]
async fn a_bind_shows_its_wait_and_fails_in_one_line_at_the_deadline() {
    let server = ApiServer::start(Route::Direct).await;
    let kubectl = kubectl(&server);
    // A Pool of one MicroVM, not replaced while claimed, held by a first claim.
    let mut manifest = battery_apiserver::dev::dev_pool(1);
    manifest["metadata"] = json!({"name": "one"});
    manifest["spec"]["replenishment"] = json!({"type": "ReplaceOnDelete"});
    let pools: Api<battery_sdk::types::Pool> =
        Api::default_namespaced(kube_client(server.kubeconfig()).await);
    pools
        .create(
            &PostParams::default(),
            &serde_json::from_value(manifest).unwrap(),
        )
        .await
        .unwrap();
    let mut first = kubectl
        .cmd(&["microvm", "claim", "one", "--deadline", "30s", "--hold"])
        .env("PATH", path_with_plugin())
        .spawn();
    first
        .line(Stream::Stderr, "the first claim holding", |l| {
            l.contains("Ctrl-C")
        })
        .await;

    // The server waits 5s for a MicroVM before its 429 (Retry-After 1s): 8s sees a retry.
    let refused = microvm(&kubectl, &["claim", "one", "--deadline", "8s"]).await;
    assert!(
        refused.stderr.contains("pool one has no free MicroVM yet"),
        "shows the wait: {refused}"
    );
    let last = refused.stderr.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: pool one has no free MicroVM before the deadline")
            && last.contains("--deadline"),
        "{refused}"
    );
    first.interrupt();
    assert!(first.finish().await.success);
}

#[tokio::test]
async fn bad_input_gets_one_line_with_the_fix() {
    let server = ApiServer::start(Route::Direct).await;
    let kubectl = kubectl(&server);
    let no_pool = microvm(&kubectl, &["claim", "nonexistent"]).await;
    assert!(
        one_line(&no_pool).contains("pool nonexistent does not exist"),
        "{no_pool}"
    );
    let no_config = microvm(&kubectl, &["ls", "--kubeconfig", "/nonexistent"]).await;
    assert!(
        one_line(&no_config).contains("check --kubeconfig"),
        "{no_config}"
    );
    let elsewhere = microvm(&kubectl, &["run", "dev", "-n", "other", "--", "true"]).await;
    assert!(one_line(&elsewhere).contains("--holder"), "{elsewhere}");
    // The token flags reach the claim's spec, which dev, having no cluster, refuses.
    let token = [
        "claim",
        "dev",
        "--token-audience",
        "vault",
        "--token-expiration",
        "1h",
    ];
    let no_cluster = microvm(&kubectl, &token).await;
    assert!(
        one_line(&no_cluster).contains(
            "spec.serviceAccountToken: Forbidden: this API server has no cluster to request \
             ServiceAccount tokens from"
        ) && no_cluster
            .stderr
            .contains("needs battery-apiserver serve in a cluster"),
        "{no_cluster}"
    );
    // A usage error is clap's, with its exit code 2.
    let usage = microvm(&kubectl, &["exec", "c"]).await;
    assert_eq!(usage.code, Some(2), "{usage}");
}

#[tokio::test]
async fn every_command_has_help_and_completions_cover_them() {
    let server = ApiServer::start(Route::Direct).await;
    let kubectl = kubectl(&server);
    for command in [
        "claim",
        "exec",
        "run",
        "renew",
        "release",
        "ls",
        "completion",
    ] {
        let help = microvm(&kubectl, &[command, "--help"]).await;
        assert!(help.success && help.stdout.contains("Usage:"), "{help}");
    }
    let completion = microvm(&kubectl, &["completion", "bash"]).await;
    assert!(completion.success, "{completion}");
    for command in ["claim", "exec", "run", "renew", "release", "ls"] {
        assert!(
            completion.stdout.contains(command),
            "{command}: {completion}"
        );
    }
}

#[tokio::test]
async fn ctrl_c_ends_the_command_of_an_exec() {
    let server = ApiServer::start(Route::Direct).await;
    let kubectl = kubectl(&server);
    let claimed = microvm(&kubectl, &["claim", "dev", "--name", "c"]).await;
    assert!(claimed.success, "{claimed}");
    // A sleep no other test runs, to find it among the simulated MicroVMs' processes.
    let marker = "4711";
    let mut exec = kubectl
        .cmd(&[
            "microvm",
            "exec",
            "c",
            "--",
            "sh",
            "-c",
            &format!("echo started; exec sleep {marker}"),
        ])
        .env("PATH", path_with_plugin())
        .spawn();
    exec.line(Stream::Stdout, "the command's first line", |l| {
        l == "started"
    })
    .await;
    exec.interrupt();
    let ended = exec.finish().await;
    assert_eq!(ended.code, Some(130), "{ended}");
    battery_e2e::eventually(
        std::time::Duration::from_secs(10),
        "the command to be ended",
        async || {
            let found = std::process::Command::new("pgrep")
                .args(["-f", &format!("^sleep {marker}$")])
                .output()
                .map_err(|e| e.to_string())?;
            if found.status.success() {
                Err(format!(
                    "still running: {}",
                    String::from_utf8_lossy(&found.stdout)
                ))
            } else {
                Ok(())
            }
        },
    )
    .await;
}
