//! The agent gets its serving certificate from the real API server's
//! `hosts/<name>/certificate` (in-process, over an embedded battery), serves the relay
//! with it, and renews it under an open session (ADR 0011).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use battery_agent::Cli;
use battery_agent::certificate::{self, ServingCertificate};
use battery_agent::ssh::SshIdentity;
use battery_apiserver::auth::UserInfo;
use battery_apiserver::battery::BatteryClient;
use battery_apiserver::meta_store::MetaStore;
use battery_apiserver::resources::hosts::certificate::AgentSigner;
use battery_apiserver::server::{self, App, Settings};
use battery_embedded::local::{LocalBattery, LocalBatteryConfig};
use battery_embedded::simhost::testing::create_microvm;
use battery_embedded::simhost::{SimulatedHost, SimulatedHostConfig};
use battery_proto::Bytes;
use battery_proto::agent::v1alpha1::relay_client::RelayClient;
use battery_proto::agent::v1alpha1::{
    ClaimRef, ExecOpen, ExecRequest, StdinEof, exec_request, exec_response, exit_status,
};
use battery_telemetry::eventually;
use battery_types::agent_identity::{AGENT_GROUP, agent_username};
use clap::Parser as _;
use http_body_util::BodyExt as _;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tempfile::TempDir;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tower::ServiceExt as _;

const HOST: &str = "host-0";
/// Short, so the test sees a renewal (at 2/3 of it, 2s) and not only the first one.
const LIFETIME: Duration = Duration::from_secs(3);
const DEADLINE: Duration = Duration::from_secs(30);

/// The agent-signing CA, as the API server is given it.
struct SigningCa {
    cert: String,
    key: String,
}

fn signing_ca() -> SigningCa {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "agent signing CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    SigningCa {
        cert: params.self_signed(&key).unwrap().pem(),
        key: key.serialize_pem(),
    }
}

/// The API server over an embedded battery, signing with `ca`.
async fn api_server(ca: &SigningCa) -> (App, LocalBattery) {
    let battery = LocalBattery::start(LocalBatteryConfig {
        hosts: 1,
        ..LocalBatteryConfig::default()
    })
    .await
    .unwrap();
    let client = BatteryClient::connect_lazy(&format!("http://{}", battery.address())).unwrap();
    let signer = AgentSigner::from_pem(&ca.cert, &ca.key, LIFETIME).unwrap();
    let settings = Settings {
        agent_signer: Some(Arc::new(signer)),
        ..Settings::default()
    };
    let app = server::build(client, Arc::new(MetaStore::in_memory().unwrap()), &settings).unwrap();
    (app, battery)
}

/// A kube client whose requests reach `app` as `user` would, past authentication.
fn kube_client(app: &App, user: UserInfo) -> kube::Client {
    flaky_kube_client(app, user, Arc::default()).0
}

/// As [`kube_client`], but while `failing` is set every request is answered 503; the
/// counter counts those requests.
fn flaky_kube_client(
    app: &App,
    user: UserInfo,
    failing: Arc<AtomicBool>,
) -> (kube::Client, Arc<AtomicUsize>) {
    let router = app.router.clone();
    let refused = Arc::new(AtomicUsize::new(0));
    let counter = refused.clone();
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let router = router.clone();
        let user = user.clone();
        let failing = failing.clone();
        let counter = counter.clone();
        async move {
            if failing.load(Ordering::SeqCst) {
                counter.fetch_add(1, Ordering::SeqCst);
                let status = serde_json::json!({
                    "apiVersion": "v1", "kind": "Status", "status": "Failure",
                    "reason": "ServiceUnavailable", "code": 503, "message": "down for the test"
                });
                return Ok(http::Response::builder()
                    .status(503)
                    .header("content-type", "application/json")
                    .body(Body::from(status.to_string()))
                    .unwrap());
            }
            let (parts, body) = request.into_parts();
            let body = body.collect().await?.to_bytes();
            let mut request = http::Request::from_parts(parts, Body::from(body));
            request.extensions_mut().insert(user);
            router.oneshot(request).await.map_err(tower::BoxError::from)
        }
    });
    (kube::Client::new(service, "default"), refused)
}

fn agent_user() -> UserInfo {
    UserInfo {
        name: agent_username(HOST),
        groups: vec![AGENT_GROUP.into()],
        ..UserInfo::default()
    }
}

/// Sets the Host's agent address, once the API server has adopted the Host.
async fn register(client: &kube::Client, agent: SocketAddr) {
    let hosts: kube::Api<battery_types::Host> = kube::Api::all(client.clone());
    let patch = serde_json::json!({ "spec": { "agentAddress": agent.to_string() } });
    eventually(DEADLINE, "the Host takes its agent address", async || {
        hosts
            .patch(
                HOST,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .is_ok()
    })
    .await;
}

/// The relay's client side: trusts the signing CA, presents a client certificate.
struct RelayPeer {
    agent: SocketAddr,
    signing_ca: String,
    client_cert: String,
    client_key: String,
}

impl RelayPeer {
    /// A fresh handshake verifying the agent for the Host's name: the serial it served,
    /// and the ALPN it chose.
    async fn handshake(&self) -> (String, Option<Vec<u8>>) {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(self.signing_ca.as_bytes()).unwrap())
            .unwrap();
        let chain = CertificateDer::pem_slice_iter(self.client_cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(self.client_key.as_bytes()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let tcp = TcpStream::connect(self.agent).await.unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from(HOST).unwrap(), tcp)
            .await
            .expect("the agent's certificate verifies for the Host's name");
        let (_, session) = tls.get_ref();
        let leaf = &session.peer_certificates().unwrap()[0];
        let (_, parsed) = x509_parser::parse_x509_certificate(leaf).unwrap();
        (
            parsed.raw_serial_as_string(),
            session.alpn_protocol().map(<[u8]>::to_vec),
        )
    }

    async fn relay(&self) -> RelayClient<Channel> {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.signing_ca))
            .identity(Identity::from_pem(&self.client_cert, &self.client_key))
            .domain_name(HOST);
        let channel = Channel::from_shared(format!("https://{}", self.agent))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .unwrap();
        RelayClient::new(channel)
    }
}

fn send(payload: exec_request::Payload) -> ExecRequest {
    ExecRequest {
        payload: Some(payload),
    }
}

#[tokio::test]
async fn the_agent_serves_a_fetched_certificate_and_renews_it_under_an_open_session() {
    let dir = TempDir::new().unwrap();
    let ca = signing_ca();
    let (app, _battery) = api_server(&ca).await;
    let client = kube_client(&app, agent_user());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let agent = listener.local_addr().unwrap();
    register(&client, agent).await;

    let ssh = Arc::new(SshIdentity::generate().unwrap());
    let (key, issued, serving) = certificate::first(&client, HOST, &ssh).await.unwrap();
    assert_eq!(
        issued.not_after.duration_since(issued.not_before).unwrap(),
        LIFETIME
    );
    let first_serial = issued.serial.clone();

    let flintlock = SimulatedHost::start(SimulatedHostConfig {
        state_dir: dir.path().join("host"),
        ..SimulatedHostConfig::default()
    })
    .await
    .unwrap();
    let microvm_uid = create_microvm(&flintlock, "vm").await;
    let client_ca = battery_agent::testing::Ca::new("API server client CA");
    let client_ca_file = dir.path().join("client-ca.crt");
    std::fs::write(&client_ca_file, &client_ca.pem).unwrap();
    let args = [
        "battery-agent".to_owned(),
        "--serving-certificate-from-api-server".to_owned(),
        "--host-name".to_owned(),
        HOST.to_owned(),
        "--client-ca-file".to_owned(),
        client_ca_file.display().to_string(),
        "--flintlock-address".to_owned(),
        flintlock.address().to_string(),
        "--flintlock-insecure".to_owned(),
        "--advertise-address".to_owned(),
        agent.to_string(),
        "--host-tls-insecure".to_owned(),
    ];
    // The test drives the certificate itself; registration and reports are another
    // test's (they need a kubeconfig this one does not write).
    let config = || {
        let mut config = Cli::try_parse_from(args.clone())
            .unwrap()
            .into_config()
            .unwrap();
        config.registration = None;
        config
    };
    assert!(
        matches!(
            battery_agent::build(config()),
            Err(battery_agent::AgentError::NoServingCertificate)
        ),
        "without a fetched certificate there is nothing to serve"
    );
    let server = battery_agent::build_with(config(), serving.clone(), ssh.clone()).unwrap();
    tokio::spawn(server.serve(listener, std::future::pending()));
    tokio::spawn(certificate::keep_renewed(
        client.clone(),
        HOST.to_owned(),
        key,
        issued,
        serving.clone(),
        ssh.clone(),
    ));

    let client_cert = client_ca.client("battery-apiserver");
    let peer = RelayPeer {
        agent,
        signing_ca: ca.cert.clone(),
        client_cert: client_cert.cert,
        client_key: client_cert.key,
    };
    let (serial, alpn) = peer.handshake().await;
    assert_eq!(serial, first_serial);
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));

    // A session opened on the first certificate, kept open across the renewal.
    let mut relay = peer.relay().await;
    let (requests, rx) = mpsc::channel(4);
    requests
        .send(send(exec_request::Payload::Open(ExecOpen {
            claim: Some(ClaimRef {
                namespace: "team-a".into(),
                name: "claim-1".into(),
                uid: "c-1".into(),
            }),
            microvm_uid,
            command: vec!["cat".into()],
            stdin: true,
            stdout: true,
            stderr: true,
            ..ExecOpen::default()
        })))
        .await
        .unwrap();
    let mut responses = relay
        .exec(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    requests
        .send(send(exec_request::Payload::Stdin(Bytes::from_static(
            b"before ",
        ))))
        .await
        .unwrap();
    let mut stdout = Vec::new();
    while stdout != b"before " {
        match responses.message().await.unwrap().unwrap().payload.unwrap() {
            exec_response::Payload::Stdout(bytes) => stdout.extend(bytes),
            other => panic!("{other:?} before the echo"),
        }
    }

    let mut renewed = String::new();
    eventually(
        DEADLINE,
        "a new handshake sees a renewed certificate",
        async || {
            renewed = peer.handshake().await.0;
            renewed != first_serial
        },
    )
    .await;

    requests
        .send(send(exec_request::Payload::Stdin(Bytes::from_static(
            b"after",
        ))))
        .await
        .unwrap();
    requests
        .send(send(exec_request::Payload::StdinEof(StdinEof {})))
        .await
        .unwrap();
    let mut exit = None;
    while let Some(response) = responses.message().await.expect("the session survived") {
        match response.payload.unwrap() {
            exec_response::Payload::Stdout(bytes) => stdout.extend(bytes),
            exec_response::Payload::Stderr(bytes) => panic!("stderr: {bytes:?}"),
            exec_response::Payload::Exit(status) => exit = status.outcome,
        }
    }
    assert_eq!(stdout, b"before after");
    assert_eq!(exit, Some(exit_status::Outcome::Code(0)));

    // The certificate keeps being renewed, each with a new serial.
    eventually(DEADLINE, "a second renewal", async || {
        let serial = peer.handshake().await.0;
        serial != renewed && serial != first_serial
    })
    .await;
}

#[tokio::test]
async fn a_static_certificate_must_match_its_key() {
    let ca = battery_agent::testing::Ca::new("serving CA");
    let serving = ca.loopback_server();
    ServingCertificate::from_pem(serving.cert.as_bytes(), serving.key.as_bytes())
        .expect("a matching certificate and key load");
    let other = ca.loopback_server();
    let error = ServingCertificate::from_pem(serving.cert.as_bytes(), other.key.as_bytes())
        .expect_err("another certificate's key");
    assert!(
        error
            .to_string()
            .contains("loading the serving certificate"),
        "{error}"
    );
}

#[tokio::test]
async fn a_failed_renewal_is_retried_and_the_old_certificate_served_meanwhile() {
    let ca = signing_ca();
    let (app, _battery) = api_server(&ca).await;
    let failing = Arc::new(AtomicBool::new(false));
    let (client, refused) = flaky_kube_client(&app, agent_user(), failing.clone());
    register(&client, SocketAddr::from(([127, 0, 0, 1], 10270))).await;
    let ssh = Arc::new(SshIdentity::generate().unwrap());
    let (key, issued, serving) = certificate::first(&client, HOST, &ssh).await.unwrap();
    let first = issued.certified.cert[0].clone();
    let renew_at = issued.renew_at();

    failing.store(true, Ordering::SeqCst);
    tokio::spawn(certificate::keep_renewed(
        client,
        HOST.to_owned(),
        key,
        issued,
        serving.clone(),
        ssh.clone(),
    ));
    // Past the renewal time, two attempts were refused (the second after a backoff),
    // and the first certificate is still the one served.
    eventually(DEADLINE, "two renewals were refused", async || {
        refused.load(Ordering::SeqCst) >= 2
    })
    .await;
    assert!(std::time::SystemTime::now() >= renew_at);
    assert_eq!(serving.current().cert[0], first);

    failing.store(false, Ordering::SeqCst);
    eventually(DEADLINE, "a retry succeeds", async || {
        serving.current().cert[0] != first
    })
    .await;
}
