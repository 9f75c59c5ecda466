//! Logs as they reach a file or a collector (issue 9 item 6): `battery-apiserver dev
//! 2>log` writes no terminal escape codes, and the JSON format gives one object a line,
//! each with a level and a message, down to the error that ends the process.

mod dev_process;

use std::fs::File;
use std::process::{Command, Stdio};

use battery_apiserver::testing;
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

/// `dev` with every request's trace logged as JSON (a threshold of 0s makes every request
/// slow), and binds waiting `bind_wait` for a MicroVM; its stderr goes to `log`.
fn traced_dev(dir: &std::path::Path, log: &std::path::Path, bind_wait: &str) -> DevProcess {
    DevProcess::start(
        &dir.join("dev"),
        &[
            "--log-format",
            "json",
            "--slow-request-threshold",
            "0s",
            "--bind-wait",
            bind_wait,
        ],
        &[],
        Stdio::from(File::create(log).unwrap()),
    )
}

/// A client of `dev` as its kubeconfig's user, which sends each request once: kube's
/// client would retry a 429, and each try is a request of its own.
async fn dev_client(dev: &DevProcess) -> kube::Client {
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(dev.dir.join("kubeconfig")).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

/// Creates `object` among the default namespace's `resource`.
async fn create(
    client: &kube::Client,
    resource: &str,
    object: &Value,
) -> Result<Value, kube::Error> {
    let path = format!(
        "/apis/{}/namespaces/default/{resource}",
        battery_types::API_VERSION
    );
    let request = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(object).unwrap())
        .unwrap();
    client.request(request).await
}

/// Stops `dev`, then returns the one slow-request line of the create of `name` in its
/// `log`, checked for its method, status and total.
fn traced_create(dev: DevProcess, log: &std::path::Path, name: &str, status: u16) -> Value {
    assert!(dev.stop().success());
    let log = std::fs::read_to_string(log).unwrap();
    let traced: Vec<Value> = json_lines(&log)
        .into_iter()
        .filter(|line| line["message"] == "slow request" && line["name"] == name)
        .collect();
    let [create] = traced.as_slice() else {
        panic!("one slow request named {name}: {log}");
    };
    assert_eq!(create["method"], "POST", "{create}");
    assert_eq!(create["status"], status, "{create}");
    assert!(
        create["total_ms"].as_f64().is_some_and(|ms| ms > 0.0),
        "{create}"
    );
    create.clone()
}

/// Checks that `steps`, all of them, are in `line`'s steps, in that order.
fn assert_steps_in_order(line: &Value, steps: &[&str]) {
    let logged = line["steps"].as_str().expect("steps");
    let mut from = 0;
    for step in steps {
        let step = format!("{step} +");
        let at = logged[from..]
            .find(&step)
            .unwrap_or_else(|| panic!("{step:?} after byte {from} of {logged:?}"));
        from += at + step.len();
    }
}

/// A slow request's trace (issue 41), as kube-apiserver logs one: a claim's create is
/// logged once, named, with its total and its steps in the order they happened, from
/// authentication to the encoded answer.
#[tokio::test]
async fn a_slow_create_is_logged_with_its_steps_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    // However long the Pool's first MicroVMs take to boot on a loaded machine.
    let dev = traced_dev(dir.path(), &log, "60s");
    let claim = testing::claim("traced", battery_apiserver::dev::DEV_POOL);
    let created = create(&dev_client(&dev).await, "microvmclaims", &claim)
        .await
        .unwrap();
    assert_eq!(created["status"]["phase"], "Bound", "{created}");
    assert_steps_in_order(
        &traced_create(dev, &log, "traced", 201),
        &[
            "authenticated",
            "authorized",
            "body read",
            "decoded",
            "validated and admitted",
            "claim's configuration resolved",
            "claim locked",
            "pool's limits and quota checked",
            "ClaimVM sent",
            "pending record handed to the store",
            "ClaimVM answered",
            "pending record durable",
            "claim recorded",
            "stored",
            "encoded",
        ],
    );
}

/// A create answered 429 because its Pool had no MicroVM says so in its trace: battery
/// found none, the bind waited `--bind-wait` for one, and nothing was recorded.
#[tokio::test]
async fn a_create_that_waited_for_a_microvm_says_so_in_its_trace() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let dev = traced_dev(dir.path(), &log, "1s");
    let client = dev_client(&dev).await;
    // A Pool of no MicroVMs: its claims wait, whatever the machine's speed.
    create(&client, "pools", &testing::pool("empty", 0))
        .await
        .unwrap();
    let refused = create(&client, "microvmclaims", &testing::claim("waited", "empty"))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(status) if status.code == 429),
        "{refused}"
    );
    let create = traced_create(dev, &log, "waited", 429);
    assert_steps_in_order(
        &create,
        &[
            "claim locked",
            "ClaimVM sent",
            "ClaimVM found no MicroVM available",
            "waited for an available MicroVM",
            "ClaimVM answered",
        ],
    );
    let steps = create["steps"].as_str().unwrap();
    assert!(!steps.contains("claim recorded"), "{steps}");
}
