//! Logs as they reach a file or a collector (issue 9 item 6): `battery-apiserver dev
//! 2>log` writes no terminal escape codes, and the JSON format gives one object a line,
//! each with a level and a message, down to the error that ends the process.

mod dev_process;

use std::fs::File;
use std::process::{Command, Stdio};

use dev_process::DevProcess;
use serde_json::Value;

/// Runs `dev` with stderr to a file until its `next:` line, stops it, and returns the log.
fn dev_log(args: &[&str], env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let stderr = File::create(&log).unwrap();
    let dev = DevProcess::start(&dir.path().join("dev"), args, env, Stdio::from(stderr));
    let status = dev.stop();
    assert!(status.success(), "dev exited with {status}");
    std::fs::read_to_string(&log).unwrap()
}

/// The lines of a JSON log, each parsed, with its level and message checked.
fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line)
                .unwrap_or_else(|err| panic!("not a JSON line ({err}): {line:?}"));
            assert!(value["level"].is_string(), "no level: {line}");
            assert!(value["message"].is_string(), "no message: {line}");
            value
        })
        .collect()
}

#[test]
fn issue_9_dev_writes_no_escape_codes_to_a_log_file() {
    let log = dev_log(&[], &[]);
    assert!(
        log.contains("simulated flintlock host started"),
        "the log holds dev's start: {log}"
    );
    assert!(!log.contains('\x1b'), "escape codes in the log: {log:?}");
}

#[test]
fn issue_9_the_json_format_writes_one_object_a_line() {
    let flag = dev_log(&["--log-format", "json"], &[]);
    let from_env = dev_log(&[], &[("BATTERY_APISERVER_LOG_FORMAT", "json")]);
    for log in [flag, from_env] {
        let lines = json_lines(&log);
        assert!(
            lines
                .iter()
                .any(|line| line["message"] == "simulated flintlock host started"
                    && line["level"] == "INFO"
                    && line["host"].is_string()),
            "the start of a simulated Host, with its fields: {log}"
        );
        assert!(!log.contains('\x1b'), "escape codes in the log: {log:?}");
    }
}

#[test]
fn issue_9_the_error_that_ends_the_process_is_a_json_line_too() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let output = Command::new(env!("CARGO_BIN_EXE_battery-apiserver"))
        .args(["serve", "--log-format", "json", "--listen", "127.0.0.1:0"])
        .args([
            "--battery-address",
            "http://127.0.0.1:9",
            "--battery-insecure",
        ])
        .arg("--tls-cert-file")
        .arg(&missing)
        .arg("--tls-private-key-file")
        .arg(&missing)
        .arg("--client-ca-file")
        .arg(&missing)
        .env_remove("RUST_LOG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64));
    let log = String::from_utf8(output.stderr).unwrap();
    let lines = json_lines(&log);
    let last = lines.last().expect("a log line");
    assert_eq!(last["level"], "ERROR", "{log}");
    assert!(
        last["error"]
            .as_str()
            .is_some_and(|error| error.contains("missing.pem")),
        "the error names the file: {log}"
    );
}

/// A slow request's trace (issue 41), as kube-apiserver logs one: with a threshold of 0s
/// every request is slow, and a claim's create is logged once, named, with its total and
/// its steps in the order they happened, from authentication to the encoded answer.
#[tokio::test]
async fn a_slow_create_is_logged_with_its_steps_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let dev = DevProcess::start(
        &dir.path().join("dev"),
        &[
            "--log-format",
            "json",
            "--slow-request-threshold",
            "0s",
            // However long the Pool's first MicroVMs take to boot on a loaded machine.
            "--bind-wait",
            "60s",
        ],
        &[],
        Stdio::from(File::create(&log).unwrap()),
    );
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(dev.dir.join("kubeconfig")).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let claim = serde_json::json!({
        "apiVersion": battery_types::API_VERSION, "kind": "MicroVMClaim",
        "metadata": {"name": "traced"},
        "spec": {
            "poolRef": {"name": battery_apiserver::dev::DEV_POOL},
            "serviceAccountName": "dev"
        }
    });
    let request = http::Request::post(format!(
        "/apis/{}/namespaces/default/microvmclaims",
        battery_types::API_VERSION
    ))
    .header(http::header::CONTENT_TYPE, "application/json")
    .body(serde_json::to_vec(&claim).unwrap())
    .unwrap();
    let created: Value = client.request(request).await.unwrap();
    assert_eq!(created["status"]["phase"], "Bound", "{created}");
    assert!(dev.stop().success());

    let log = std::fs::read_to_string(&log).unwrap();
    let traced: Vec<Value> = json_lines(&log)
        .into_iter()
        .filter(|line| line["message"] == "slow request" && line["name"] == "traced")
        .collect();
    let [create] = traced.as_slice() else {
        panic!("one slow request named traced: {log}");
    };
    assert_eq!(create["method"], "POST", "{create}");
    assert_eq!(create["status"], 201, "{create}");
    assert!(
        create["total_ms"].as_f64().is_some_and(|ms| ms > 0.0),
        "{create}"
    );
    let steps = create["steps"].as_str().expect("steps");
    let mut from = 0;
    for step in [
        "authenticated +",
        "authorized +",
        "body read +",
        "decoded +",
        "validated and admitted +",
        "claim's configuration resolved +",
        "claim locked +",
        "pool's limits and quota checked +",
        "pool's lease settings read +",
        "ClaimVM sent +",
        "pending record handed to the store +",
        "ClaimVM answered +",
        "pending record durable +",
        "claim recorded +",
        "stored +",
        "encoded +",
    ] {
        let at = steps[from..]
            .find(step)
            .unwrap_or_else(|| panic!("{step:?} after byte {from} of {steps:?}"));
        from += at + step.len();
    }
}
