//! The secured battery channel (issue 39): `serve`'s battery client against an embedded
//! battery that requires what poolmgrd can require of it, TLS, a client certificate and
//! a basic-auth token, and what the client says when one of them is wrong.

use std::path::{Path, PathBuf};
use std::time::Duration;

use battery_apiserver::battery::{BatteryClient, BatteryEndpoint, Security, TlsSettings};
use battery_apiserver::http::serve::TlsFiles;
use battery_embedded::{ApiSecurity, BatteryConfig, EmbeddedBattery, ServerTls};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tokio::net::TcpListener;

/// A CA, battery's serving certificate for 127.0.0.1 signed by it, and a client
/// certificate signed by it, written into a directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: String,
    serving: (String, String),
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).unwrap().pem();
        let issuer = Issuer::new(ca_params, ca_key);
        let sign = |names: Vec<String>| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(names)
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let serving = sign(vec!["127.0.0.1".into()]);
        let client = sign(Vec::new());
        std::fs::write(dir.path().join("ca.crt"), &ca).unwrap();
        std::fs::write(dir.path().join("client.crt"), &client.0).unwrap();
        std::fs::write(dir.path().join("client.key"), &client.1).unwrap();
        std::fs::write(dir.path().join("token"), "the-token\n").unwrap();
        Self { dir, ca, serving }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn security(&self, client_certificates: bool, token: Option<&str>) -> ApiSecurity {
        ApiSecurity {
            tls: Some(ServerTls {
                cert_pem: self.serving.0.clone().into_bytes(),
                key_pem: self.serving.1.clone().into_bytes(),
                client_ca_pem: client_certificates.then(|| self.ca.clone().into_bytes()),
            }),
            basic_auth_token: token.map(str::to_owned),
        }
    }

    fn endpoint(
        &self,
        battery: &EmbeddedBattery,
        client: bool,
        token: Option<&Path>,
    ) -> BatteryEndpoint {
        BatteryEndpoint {
            address: battery.address().to_string(),
            security: Security::Tls(TlsSettings {
                ca_file: self.path("ca.crt"),
                client: client.then(|| TlsFiles {
                    cert: self.path("client.crt"),
                    key: self.path("client.key"),
                }),
                server_name: None,
            }),
            token_file: token.map(Path::to_owned),
        }
    }
}

async fn battery(security: ApiSecurity) -> EmbeddedBattery {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = BatteryConfig {
        api: security,
        ..BatteryConfig::default()
    };
    EmbeddedBattery::start(config, listener).await.unwrap()
}

#[tokio::test]
async fn tls_a_client_certificate_and_the_token_reach_battery() {
    let pki = Pki::new();
    let battery = battery(pki.security(true, Some("the-token"))).await;
    let endpoint = pki.endpoint(&battery, true, Some(&pki.path("token")));
    let (client, _follower) = BatteryClient::connect_secured(&endpoint).unwrap();
    client.readiness().await.unwrap();
    assert!(client.pools(None).await.unwrap().is_empty());
    battery.shutdown().await;
}

#[tokio::test]
async fn a_wrong_or_missing_token_is_said_to_be_refused_and_never_shown() {
    let pki = Pki::new();
    let battery = battery(pki.security(false, Some("the-right-token"))).await;
    for token in [Some(pki.path("token")), None] {
        let endpoint = pki.endpoint(&battery, false, token.as_deref());
        let (client, _follower) = BatteryClient::connect_secured(&endpoint).unwrap();
        let why = client.readiness().await.unwrap_err();
        assert!(
            why.starts_with("battery refused the API server's credentials"),
            "{token:?}: {why}"
        );
        assert!(
            !why.contains("the-token") && !why.contains("the-right-token"),
            "{why}"
        );
        let err = client.pools(None).await.unwrap_err();
        assert_eq!(
            err.failure(),
            battery_apiserver::battery::Failure::Unauthenticated
        );
    }
    battery.shutdown().await;
}

#[tokio::test]
async fn a_rotated_token_file_is_picked_up_without_a_restart() {
    let pki = Pki::new();
    let battery = battery(pki.security(false, Some("the-new-token"))).await;
    let endpoint = pki.endpoint(&battery, false, Some(&pki.path("token")));
    let (client, _follower) = BatteryClient::connect_secured(&endpoint).unwrap();
    assert!(
        client.readiness().await.is_err(),
        "the old token is refused"
    );
    // Through a rename, as a Secret's projected volume swaps its files.
    let staged = pki.path("token.new");
    std::fs::write(&staged, "the-new-token\n").unwrap();
    std::fs::rename(&staged, pki.path("token")).unwrap();
    battery_telemetry::eventually(
        Duration::from_secs(30),
        "the new token to be read and accepted",
        async || client.readiness().await,
    )
    .await;
    battery.shutdown().await;
}

#[tokio::test]
async fn without_a_client_certificate_the_handshake_is_refused() {
    let pki = Pki::new();
    let battery = battery(pki.security(true, None)).await;
    let endpoint = pki.endpoint(&battery, false, None);
    let (client, _follower) = BatteryClient::connect_secured(&endpoint).unwrap();
    let why = client.readiness().await.unwrap_err();
    assert!(why.starts_with("battery is not serving: "), "{why}");
    battery.shutdown().await;
}

#[tokio::test]
async fn a_battery_certificate_from_another_ca_is_refused() {
    let pki = Pki::new();
    let other = Pki::new();
    let battery = battery(other.security(false, None)).await;
    let endpoint = pki.endpoint(&battery, false, None);
    let (client, _follower) = BatteryClient::connect_secured(&endpoint).unwrap();
    let why = client.readiness().await.unwrap_err();
    assert!(
        why.contains("certificate"),
        "says the certificate is why: {why}"
    );
    battery.shutdown().await;
}

#[tokio::test]
async fn plaintext_to_a_tls_battery_fails_clearly() {
    let pki = Pki::new();
    let battery = battery(pki.security(false, None)).await;
    let client = BatteryClient::connect_lazy(&format!("http://{}", battery.address())).unwrap();
    let why = client.readiness().await.unwrap_err();
    assert!(why.starts_with("battery is not serving: "), "{why}");
    battery.shutdown().await;
}
