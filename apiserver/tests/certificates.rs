//! `hosts/<name>/certificate`: the exec agent of a Host, and only it, gets a serving
//! certificate signed for that Host's names (ADR 0011).

use battery_apiserver::testing as common;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use base64::Engine;
use battery_api_machinery::request_info::RequestInfo;
use battery_apiserver::auth::{Authorizer, Decision, UserInfo};
use battery_apiserver::battery::BatteryClient;
use battery_apiserver::meta_store::MetaStore;
use battery_apiserver::resources::hosts::certificate::AgentSigner;
use battery_apiserver::server::{self, App, Settings};
use battery_embedded::local::LocalBattery;
use battery_types::agent_identity::{AGENT_GROUP, agent_username};
use common::{HOSTS, as_dev, eventually, fast_battery, settings};
use futures::future::BoxFuture;
use http::{Request, StatusCode, header};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, PublicKeyData,
    SanType,
};
use serde_json::{Value, json};
use tower::ServiceExt;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

const LIFETIME: Duration = Duration::from_secs(3600);
const AGENT_ADDRESS: &str = "127.0.0.1:10270";

struct Ca {
    cert_pem: String,
    key_pem: String,
}

fn ca() -> Ca {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "battery agent CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let cert = params.self_signed(&key).unwrap();
    Ca {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

struct Server {
    app: App,
    _battery: LocalBattery,
}

impl Server {
    /// The server over an embedded battery, signing with `ca` (or not at all), once its
    /// Hosts are adopted and `host-0` has the agent address [`AGENT_ADDRESS`].
    async fn start(ca: Option<&Ca>) -> Self {
        Self::with_settings(ca, settings()).await
    }

    async fn with_settings(ca: Option<&Ca>, settings: Settings) -> Self {
        let battery = fast_battery().await;
        let client = BatteryClient::connect_lazy(&format!("http://{}", battery.address())).unwrap();
        let signer = ca.map(|ca| {
            Arc::new(AgentSigner::from_pem(&ca.cert_pem, &ca.key_pem, LIFETIME).unwrap())
        });
        let settings = Settings {
            agent_signer: signer,
            ..settings
        };
        let app =
            server::build(client, Arc::new(MetaStore::in_memory().unwrap()), &settings).unwrap();
        let server = Self {
            app,
            _battery: battery,
        };
        let patch = json!({ "spec": { "agentAddress": AGENT_ADDRESS } });
        eventually(
            common::DEADLINE,
            "the agent address patched onto host-0",
            || async {
                let request = Request::patch(format!("{HOSTS}/host-0"))
                    .header(header::CONTENT_TYPE, "application/merge-patch+json")
                    .body(Body::from(patch.to_string()))
                    .unwrap();
                let (status, body) = send(server.router(), as_dev(request)).await;
                if status == StatusCode::OK {
                    Ok(())
                } else {
                    Err(format!("{status} {body}"))
                }
            },
        )
        .await;
        server
    }

    fn router(&self) -> Router {
        self.app.router.clone()
    }

    /// POSTs a HostCertificateRequest for `csr` to `hosts/<host>/certificate` as `user`.
    async fn request(&self, user: UserInfo, host: &str, csr: &str) -> (StatusCode, Value) {
        self.request_query(user, host, csr, "").await
    }

    /// As [`Server::request`], with `query` after the path.
    async fn request_query(
        &self,
        user: UserInfo,
        host: &str,
        csr: &str,
        query: &str,
    ) -> (StatusCode, Value) {
        let body = json!({
            "apiVersion": "battery.liquidmetal-x.dev/v1alpha1",
            "kind": "HostCertificateRequest",
            "metadata": {},
            "spec": { "request": csr }
        });
        let mut request = Request::post(format!("{HOSTS}/{host}/certificate{query}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        request.extensions_mut().insert(user);
        send(self.router(), request).await
    }
}

async fn send(router: Router, request: Request<Body>) -> (StatusCode, Value) {
    let response = router.oneshot(request).await.unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn agent(host: &str) -> UserInfo {
    UserInfo {
        name: agent_username(host),
        groups: vec![AGENT_GROUP.into(), "system:authenticated".into()],
        ..UserInfo::default()
    }
}

/// A CSR for `names` (DNS, or IP when they parse as one), and its key.
fn csr(names: &[&str]) -> (String, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.subject_alt_names = names
        .iter()
        .map(|name| match name.parse() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName((*name).try_into().unwrap()),
        })
        .collect();
    params
        .distinguished_name
        .push(DnType::CommonName, "whatever the agent says");
    let request = params.serialize_request(&key).unwrap();
    (request.pem().unwrap(), key)
}

fn pem_blocks(chain: &str) -> Vec<Vec<u8>> {
    x509_parser::pem::Pem::iter_from_buffer(chain.as_bytes())
        .map(|pem| pem.unwrap().contents)
        .collect()
}

#[tokio::test]
async fn the_hosts_agent_gets_a_certificate_for_the_hosts_names_only() {
    let ca = ca();
    let server = Server::start(Some(&ca)).await;
    let (request, key) = csr(&["host-0", "127.0.0.1"]);
    let (status, body) = server.request(agent("host-0"), "host-0", &request).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["kind"], "HostCertificateRequest");

    let chain = pem_blocks(body["status"]["certificate"].as_str().unwrap());
    assert_eq!(chain.len(), 2, "the certificate, then its CA");
    let (_, leaf) = X509Certificate::from_der(&chain[0]).unwrap();
    let ca_der = pem_blocks(&ca.cert_pem).remove(0);
    assert_eq!(chain[1], ca_der);
    let (_, ca_cert) = X509Certificate::from_der(&ca_der).unwrap();
    leaf.verify_signature(Some(ca_cert.public_key()))
        .expect("signed by the agent CA");

    // The requested subject is ignored; the names are the Host's.
    let cn: Vec<&str> = leaf
        .subject()
        .iter_common_name()
        .map(|cn| cn.as_str().unwrap())
        .collect();
    assert_eq!(cn, ["host-0"]);
    let sans = leaf.subject_alternative_name().unwrap().unwrap();
    let names: Vec<String> = sans
        .value
        .general_names
        .iter()
        .map(|name| match name {
            GeneralName::DNSName(dns) => format!("DNS:{dns}"),
            GeneralName::IPAddress(ip) => format!("IP:{ip:?}"),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(names, ["DNS:host-0", "IP:[127, 0, 0, 1]"]);

    let eku = leaf.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth);
    assert!(!eku.client_auth && !eku.any && eku.other.is_empty());
    assert!(!leaf.is_ca());
    let validity = leaf.validity();
    assert_eq!(
        validity.not_after.timestamp() - validity.not_before.timestamp(),
        LIFETIME.as_secs() as i64
    );
    assert_eq!(
        body["status"]["expirationTime"],
        k8s_openapi::jiff::Timestamp::from_second(validity.not_after.timestamp())
            .unwrap()
            .to_string()
    );
    // The key is the agent's: the server saw only its public half.
    assert_eq!(leaf.public_key().raw, key.subject_public_key_info());

    // Asking for fewer names still gets all of them; serials differ.
    let (request, _) = csr(&[]);
    let (status, again) = server.request(agent("host-0"), "host-0", &request).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    let second = pem_blocks(again["status"]["certificate"].as_str().unwrap());
    let (_, second) = X509Certificate::from_der(&second[0]).unwrap();
    assert_eq!(
        second
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .len(),
        2
    );
    assert_ne!(second.raw_serial(), leaf.raw_serial());
}

#[tokio::test]
async fn only_the_hosts_own_agent_may_ask() {
    let ca = ca();
    let server = Server::start(Some(&ca)).await;
    let (request, _) = csr(&["host-0"]);
    let not_in_group = UserInfo {
        name: agent_username("host-0"),
        groups: vec!["system:authenticated".into()],
        ..UserInfo::default()
    };
    let dev = UserInfo {
        name: battery_apiserver::dev::pki::DEV_USER.into(),
        groups: vec!["system:authenticated".into()],
        ..UserInfo::default()
    };
    for user in [agent("host-1"), not_in_group, dev] {
        let (status, body) = server.request(user.clone(), "host-0", &request).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{}: {body}", user.name);
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("User {:?}", user.name))
                && message.contains("system:battery-agent:host-0")
                && message.contains(AGENT_GROUP),
            "{message}"
        );
    }
}

#[tokio::test]
async fn extra_names_a_bad_request_and_a_missing_host_are_refused() {
    let ca = ca();
    let server = Server::start(Some(&ca)).await;
    let (request, _) = csr(&["host-0", "evil.example"]);
    let (status, body) = server.request(agent("host-0"), "host-0", &request).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("\"evil.example\"") && message.contains("may name only host-0, 127.0.0.1"),
        "{message}"
    );
    assert_eq!(body["details"]["kind"], "HostCertificateRequest");

    let (request, _) = csr(&["10.9.9.9"]);
    let (status, body) = server.request(agent("host-0"), "host-0", &request).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("\"10.9.9.9\""),
        "{body}"
    );

    // A request whose signature does not verify: its last byte flipped.
    let (good, _) = csr(&["host-0"]);
    let mut der = pem_blocks(&good).remove(0);
    let last = der.len() - 1;
    der[last] ^= 0x01;
    let tampered = format!(
        "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
        base64::engine::general_purpose::STANDARD.encode(&der)
    );
    for bad in [tampered.as_str(), "not a CSR", ""] {
        let (status, body) = server.request(agent("host-0"), "host-0", bad).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad:?}: {body}");
        assert!(
            body["message"].as_str().unwrap().contains("spec.request"),
            "{body}"
        );
    }

    let (status, body) = server.request(agent("host-9"), "host-9", &request).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    // A dry run checks the request and signs nothing.
    let (good, _) = csr(&["host-0"]);
    let (status, body) = server
        .request_query(agent("host-0"), "host-0", &good, "?dryRun=All")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["status"].is_null(), "{body}");
    let (request, _) = csr(&["evil.example"]);
    let (status, body) = server
        .request_query(agent("host-0"), "host-0", &request, "?dryRun=All")
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

#[tokio::test]
async fn without_a_signing_ca_the_subresource_is_unavailable() {
    let server = Server::start(None).await;
    let (request, _) = csr(&["host-0"]);
    let (status, body) = server.request(agent("host-0"), "host-0", &request).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.starts_with("agent certificate signing is not configured: ")
            && message.contains("--agent-signing-cert-file"),
        "{message}"
    );
}

#[tokio::test]
async fn discovery_and_openapi_show_the_subresource() {
    let server = Server::start(None).await;
    let (status, list) = send(
        server.router(),
        as_dev(
            Request::get("/apis/battery.liquidmetal-x.dev/v1alpha1")
                .body(Body::empty())
                .unwrap(),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let entry = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "hosts/certificate")
        .unwrap_or_else(|| panic!("no hosts/certificate in {list}"));
    assert_eq!(entry["kind"], "HostCertificateRequest");
    assert_eq!(entry["verbs"], json!(["create"]));

    let (status, document) = send(
        server.router(),
        as_dev(
            Request::get("/openapi/v3/apis/battery.liquidmetal-x.dev/v1alpha1")
                .body(Body::empty())
                .unwrap(),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let path =
        &document["paths"]["/apis/battery.liquidmetal-x.dev/v1alpha1/hosts/{name}/certificate"];
    assert!(path["post"].is_object(), "{path}");
    assert!(path.get("get").is_none(), "{path}");
    let schema = &document["components"]["schemas"]["dev.liquidmetal-x.battery.v1alpha1.HostCertificateRequest"];
    assert!(
        schema["properties"]["spec"]["properties"]["request"].is_object(),
        "{schema}"
    );
}

/// RBAC as a cluster would hold it for this test: the dev user may do anything (it
/// registers the Host), and `agents` may only create `hosts/certificate`.
struct Rbac {
    agents: Vec<String>,
}

impl Authorizer for Rbac {
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        request: &'a RequestInfo,
    ) -> BoxFuture<'a, Result<Decision, battery_api_machinery::status::ApiError>> {
        let certificate = request.verb == "create"
            && request.resource == "hosts"
            && request.subresource == "certificate";
        let allowed = user.name == battery_apiserver::dev::pki::DEV_USER
            || (certificate && self.agents.contains(&user.name));
        let decision = if allowed {
            Decision::Allow
        } else {
            Decision::Deny("no RBAC rule allows it".to_owned())
        };
        Box::pin(async move { Ok(decision) })
    }
}

#[tokio::test]
async fn rbac_create_on_hosts_certificate_is_checked_first() {
    let ca = ca();
    let server = Server::with_settings(
        Some(&ca),
        Settings {
            authorizer: Some(Arc::new(Rbac {
                agents: vec![agent_username("host-0")],
            })),
            ..settings()
        },
    )
    .await;
    let (request, _) = csr(&["host-0"]);
    let (status, body) = server.request(agent("host-0"), "host-0", &request).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // The agent of host-1 without the RBAC rule is refused by the authorizer, before the
    // subresource's own rule is asked.
    let (status, body) = server.request(agent("host-1"), "host-1", &request).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("cannot create resource \"hosts/certificate\"")
            && message.contains("no RBAC rule allows it"),
        "{message}"
    );
}
