//! The `battery-agent` binary refuses a bad configuration before it binds its port,
//! with one line naming the flag and the usage exit status.

use std::net::TcpListener;
use std::process::Command;

#[test]
fn a_missing_certificate_exits_64_naming_the_flag_before_binding() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Held, so a bind by the agent would fail with another message.
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let missing = dir.path().join("absent.crt");
    let output = Command::new(env!("CARGO_BIN_EXE_battery-agent"))
        .arg("--listen")
        .arg(taken.local_addr().expect("address").to_string())
        .arg("--tls-cert-file")
        .arg(&missing)
        .arg("--tls-private-key-file")
        .arg(&missing)
        .arg("--client-ca-file")
        .arg(&missing)
        .args(["--flintlock-address", "127.0.0.1:9", "--flintlock-insecure"])
        .env_remove("RUST_LOG")
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(64), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("battery-agent: reading --tls-cert-file"),
        "{stderr}"
    );
    assert!(!stderr.contains("binding"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}
