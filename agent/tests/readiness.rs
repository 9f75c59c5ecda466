//! The readiness checks that call flintlockd, against a simulated Host, a gRPC server
//! without the exec API, and a port where nothing listens.

use battery_agent::flintlock::{Flintlock, FlintlockConfig, FlintlockTls};
use battery_agent::readiness::{CheckConfig, check};
use battery_embedded::simhost::{SimulatedHost, SimulatedHostConfig};
use battery_types::conditions::HostReadyReason;
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

fn flintlock(address: std::net::SocketAddr) -> Flintlock {
    let config = FlintlockConfig::new(&address.to_string(), FlintlockTls::Insecure).unwrap();
    Flintlock::new(config).unwrap()
}

/// Every check that needs no device.
fn flintlockd_checks() -> CheckConfig {
    CheckConfig {
        kvm_device: None,
        thin_pool_device: None,
        flintlockd: true,
        exec_api: true,
    }
}

#[tokio::test]
async fn a_simulated_host_is_ready_and_the_message_names_what_was_not_checked() {
    let dir = tempfile::tempdir().unwrap();
    let host = SimulatedHost::start(SimulatedHostConfig {
        state_dir: dir.path().join("host"),
        ..SimulatedHostConfig::default()
    })
    .await
    .unwrap();
    let report = check(&flintlockd_checks(), &flintlock(host.address())).await;
    assert!(report.ready, "{report:?}");
    assert_eq!(report.reason, HostReadyReason::Ready);
    assert_eq!(
        report.message,
        "usable: flintlockd, the exec API; not checked (turned off): KVM, the thin pool"
    );
}

#[tokio::test]
async fn a_device_check_that_fails_comes_first_and_names_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let kvm = dir.path().join("kvm");
    std::fs::write(&kvm, b"").unwrap();
    let config = CheckConfig {
        kvm_device: Some(kvm.clone()),
        ..flintlockd_checks()
    };
    // Nothing listens there, yet the KVM failure is what is reported.
    let report = check(&config, &flintlock(unused_address().await)).await;
    assert!(!report.ready);
    assert_eq!(report.reason, HostReadyReason::KvmUnavailable);
    assert!(
        report.message.contains(&kvm.display().to_string()),
        "{report:?}"
    );
}

#[tokio::test]
async fn flintlockd_not_answering_is_flintlockd_not_ready() {
    let report = check(&flintlockd_checks(), &flintlock(unused_address().await)).await;
    assert!(!report.ready);
    assert_eq!(report.reason, HostReadyReason::FlintlockdNotReady);
    assert!(
        report.message.starts_with("flintlockd ServerInfo failed"),
        "{report:?}"
    );
}

#[tokio::test]
async fn a_server_without_microvmexec_is_exec_disabled() {
    // gRPC health only: MicroVMExec answers UNIMPLEMENTED, as flintlockd without
    // --enable-exec-api does.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(
        Server::builder()
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    let config = CheckConfig {
        flintlockd: false,
        ..flintlockd_checks()
    };
    let report = check(&config, &flintlock(address)).await;
    assert!(!report.ready);
    assert_eq!(report.reason, HostReadyReason::ExecDisabled);
    assert!(report.message.contains("--enable-exec-api"), "{report:?}");
}

/// A loopback port nothing listens on.
async fn unused_address() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}
