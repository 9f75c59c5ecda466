//! Configuration is checked before anything acts (issue 34): `serve` with a value it
//! cannot use exits 64 naming the flag, before it binds its port or calls the cluster or
//! battery; `dev` finds its port taken before it starts battery or makes its Pool.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};

/// Runs `serve` on `listen` with the flags every run needs and then `flags`, with no
/// cluster to find.
fn serve(listen: &str, flags: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_battery-apiserver"))
        .args(["serve", "--listen", listen])
        .args(flags)
        .env_remove("RUST_LOG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap()
}

/// A serving certificate and its key, PEM, as `serve` needs them.
fn serving_files(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cert_file, key_file) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    (cert_file, key_file)
}

#[test]
fn issue_34_serve_exits_64_naming_the_flag_before_it_binds() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = serving_files(dir.path());
    let not_pem = dir.path().join("ca.der");
    std::fs::write(&not_pem, [0x30, 0x82, 0x01]).unwrap();
    let missing = dir.path().join("missing.pem");
    // Held, so a serve that bound before checking would fail on it instead.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let battery = [
        "--battery-address".as_ref(),
        "127.0.0.1:9".as_ref(),
        "--battery-insecure".as_ref(),
    ];
    let empty = dir.path().join("empty-token");
    std::fs::write(&empty, "\n").unwrap();
    let tls = [
        "--tls-cert-file".as_ref(),
        cert.as_os_str(),
        "--tls-private-key-file".as_ref(),
        key.as_os_str(),
    ];
    let cases: Vec<(&str, Vec<&std::ffi::OsStr>)> = vec![
        (
            "--tls-private-key-file",
            [
                &battery[..],
                &[
                    "--tls-cert-file".as_ref(),
                    cert.as_os_str(),
                    "--tls-private-key-file".as_ref(),
                    missing.as_os_str(),
                ],
            ]
            .concat(),
        ),
        (
            "--client-ca-file",
            [
                &battery[..],
                &tls[..],
                &["--client-ca-file".as_ref(), not_pem.as_os_str()],
            ]
            .concat(),
        ),
        (
            "--battery-address",
            [
                &[
                    "--battery-address".as_ref(),
                    "not an address".as_ref(),
                    "--battery-insecure".as_ref(),
                ][..],
                &tls[..],
            ]
            .concat(),
        ),
        // Plaintext only when asked for: an http:// address with a CA is a contradiction.
        (
            "--battery-address",
            [
                &[
                    "--battery-address".as_ref(),
                    "http://127.0.0.1:9".as_ref(),
                    "--battery-ca-file".as_ref(),
                    cert.as_os_str(),
                ][..],
                &tls[..],
            ]
            .concat(),
        ),
        (
            "--battery-ca-file",
            [
                &[
                    "--battery-address".as_ref(),
                    "127.0.0.1:9".as_ref(),
                    "--battery-ca-file".as_ref(),
                    not_pem.as_os_str(),
                ][..],
                &tls[..],
            ]
            .concat(),
        ),
        (
            "--battery-client-cert-file",
            [
                &[
                    "--battery-address".as_ref(),
                    "127.0.0.1:9".as_ref(),
                    "--battery-ca-file".as_ref(),
                    cert.as_os_str(),
                    "--battery-client-cert-file".as_ref(),
                    cert.as_os_str(),
                    "--battery-client-key-file".as_ref(),
                    missing.as_os_str(),
                ][..],
                &tls[..],
            ]
            .concat(),
        ),
        (
            "--battery-token-file",
            [
                &battery[..],
                &tls[..],
                &["--battery-token-file".as_ref(), missing.as_os_str()],
            ]
            .concat(),
        ),
        (
            "--battery-token-file",
            [
                &battery[..],
                &tls[..],
                &["--battery-token-file".as_ref(), empty.as_os_str()],
            ]
            .concat(),
        ),
        (
            "--kubeconfig",
            [
                &battery[..],
                &tls[..],
                &["--kubeconfig".as_ref(), missing.as_os_str()],
            ]
            .concat(),
        ),
        (
            "--agent-client-key-file",
            [
                &battery[..],
                &tls[..],
                &[
                    "--agent-ca-file".as_ref(),
                    cert.as_os_str(),
                    "--agent-client-cert-file".as_ref(),
                    cert.as_os_str(),
                    "--agent-client-key-file".as_ref(),
                    missing.as_os_str(),
                ],
            ]
            .concat(),
        ),
    ];
    for (flag, flags) in cases {
        let output = serve(&listen, &flags);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{flag}: {stderr}");
        assert!(stderr.contains(flag), "the error names {flag}: {stderr}");
        assert!(!stderr.contains("binding"), "{flag}: {stderr}");
    }
}

#[test]
fn issue_34_dev_finds_its_port_taken_before_it_starts_battery() {
    let dir = tempfile::tempdir().unwrap();
    let dev_dir = dir.path().join("dev");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_battery-apiserver"))
        .args(["dev", "--listen", &taken.local_addr().unwrap().to_string()])
        .arg("--dir")
        .arg(&dev_dir)
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("binding"), "{stderr}");
    assert!(!stderr.contains("embedded battery"), "{stderr}");
    // Nothing was made: not even its directory, let alone battery's state or a Pool.
    assert!(!dev_dir.exists(), "dev made {}", dev_dir.display());
}
