//! `start`, `ps`, `attach` and `kill` on a fresh `dev` (ADR 44): a background process
//! outlives the plugin that started it, is listed, attached to with its earlier output,
//! and read to its exit code; a killed one records its signal.

use battery_e2e::apiserver::{ApiServer, Route};

use super::common::{hold, kubectl, microvm};

#[tokio::test]
async fn start_ps_attach_and_kill_a_background_process() {
    let server = ApiServer::start(Route::Direct).await;
    let kubectl = kubectl(&server);
    let _held = hold(&kubectl, "c").await;

    // `start` returns at once; the process runs on without it.
    let script = "echo early; sleep 2; echo late; exit 5";
    let started = microvm(
        &kubectl,
        &[
            "start", "c", "--name", "job", "-l", "app=e2e", "--", "sh", "-c", script,
        ],
    )
    .await;
    assert!(started.success, "{started}");
    assert_eq!(started.stdout, "microvmprocess/job\n");

    let ps = microvm(&kubectl, &["ps", "-l", "app=e2e"]).await;
    assert!(ps.success, "{ps}");
    let header = ps.stdout.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("NAME") && header.contains("EXIT CODE"),
        "{ps}"
    );
    assert!(
        ps.stdout.contains("job") && ps.stdout.contains(" c "),
        "{ps}"
    );

    // Its output from its start, then the rest; its exit code is attach's.
    let attached = microvm(&kubectl, &["attach", "microvmprocess/job"]).await;
    assert_eq!(
        (attached.code, attached.stdout.as_str()),
        (Some(5), "early\nlate\n"),
        "{attached}"
    );
    let ps = microvm(&kubectl, &["ps"]).await;
    assert!(
        ps.stdout.contains("Failed") && ps.stdout.contains(" 5 "),
        "{ps}"
    );

    // A kill sends SIGTERM; the process stays listed with the signal that ended it.
    let sleeper = microvm(
        &kubectl,
        &["start", "c", "--name", "nap", "--", "sleep", "600"],
    )
    .await;
    assert!(sleeper.success, "{sleeper}");
    let killed = microvm(&kubectl, &["kill", "nap"]).await;
    assert!(killed.success, "{killed}");
    let ended = microvm(&kubectl, &["attach", "nap"]).await;
    assert_eq!(ended.code, Some(143), "{ended}");
    let ps = microvm(&kubectl, &["ps"]).await;
    assert!(ps.stdout.contains("143 (SIGTERM)"), "{ps}");

    // A name that is not there: one line, naming it.
    let missing = microvm(&kubectl, &["attach", "nothing"]).await;
    assert!(
        !missing.success && missing.stderr.contains("nothing"),
        "{missing}"
    );
}
