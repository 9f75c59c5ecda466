use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use clap::Parser;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier as _;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use serde::Deserialize as _;

use super::*;
use crate::cli::{Cli, Command};

fn args(out: &Path, extra: &[&str]) -> CertsArgs {
    let mut argv = vec![
        "battery-apiserver".to_owned(),
        "certs".to_owned(),
        "--out".to_owned(),
        out.display().to_string(),
    ];
    argv.extend(extra.iter().map(|arg| (*arg).to_owned()));
    match Cli::try_parse_from(argv).expect("parses").command {
        Command::Certs(args) => args,
        other => panic!("parsed {other:?}"),
    }
}

/// Deserializes `yaml` as a `T`, failing on any field `T` does not have.
fn strict<T: serde::de::DeserializeOwned>(yaml: &str) -> T {
    let mut unknown = Vec::new();
    let value = serde_ignored::deserialize(serde_norway::Deserializer::from_str(yaml), |path| {
        unknown.push(path.to_string())
    })
    .unwrap_or_else(|e| panic!("{e}:\n{yaml}"));
    assert!(unknown.is_empty(), "unknown fields {unknown:?} in\n{yaml}");
    value
}

/// The Secrets in `dir`, by name, each parsed strictly as a k8s-openapi Secret.
fn secrets(dir: &Path) -> BTreeMap<String, Secret> {
    let yaml = std::fs::read_to_string(dir.join(SECRETS_FILE)).unwrap();
    serde_norway::Deserializer::from_str(&yaml)
        .map(|document| {
            let value = serde_norway::Value::deserialize(document).unwrap();
            let secret: Secret = strict(&serde_norway::to_string(&value).unwrap());
            (secret.metadata.name.clone().unwrap(), secret)
        })
        .collect()
}

fn data<'a>(secret: &'a Secret, key: &str) -> &'a [u8] {
    &secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .unwrap_or_else(|| panic!("{:?} has no {key}", secret.metadata.name))
        .0
}

fn roots(pem: &[u8]) -> Arc<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        roots.add(cert.unwrap()).unwrap();
    }
    Arc::new(roots)
}

fn leaf(pem: &[u8]) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem).unwrap()
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Whether `client` (PEM) is a client certificate that chains to `ca` (PEM).
fn client_chains_to(client: &[u8], ca: &[u8]) -> bool {
    WebPkiClientVerifier::builder_with_provider(roots(ca), provider())
        .build()
        .unwrap()
        .verify_client_cert(&leaf(client), &[], UnixTime::now())
        .is_ok()
}

#[test]
fn the_secrets_parse_and_are_the_ones_the_base_mounts() {
    let dir = tempfile::tempdir().unwrap();
    write(&args(dir.path(), &[])).unwrap();
    let secrets = secrets(dir.path());
    assert_eq!(
        secrets.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            AGENT_CA_SECRET,
            SERVING_SECRET,
            RELAY_CLIENT_SECRET,
            RELAY_CLIENT_CA_SECRET
        ]
    );
    for (name, secret) in &secrets {
        assert_eq!(
            secret.metadata.namespace.as_deref(),
            Some("battery-system"),
            "{name}"
        );
    }
    // The relay client CA's Secret is what every agent mounts: its certificate only.
    let ca_only = &secrets[RELAY_CLIENT_CA_SECRET];
    assert_eq!(
        ca_only.data.as_ref().unwrap().keys().collect::<Vec<_>>(),
        ["ca.crt"]
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join(SECRETS_FILE))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn the_serving_certificate_is_for_the_service_and_chains_to_the_ca_bundle() {
    let dir = tempfile::tempdir().unwrap();
    write(&args(dir.path(), &["--namespace", "infra"])).unwrap();
    let serving = &secrets(dir.path())[SERVING_SECRET];
    let component: serde_json::Value = serde_norway::from_str(
        &std::fs::read_to_string(dir.path().join(KUSTOMIZATION_FILE)).unwrap(),
    )
    .unwrap();
    assert_eq!(component["kind"], "Component");
    assert_eq!(component["resources"], serde_json::json!([SECRETS_FILE]));
    assert_eq!(component["patches"][0]["path"], CA_BUNDLE_PATCH_FILE);
    assert_eq!(component["patches"][0]["target"]["name"], API_SERVICE);

    let patch: k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService =
        strict(&std::fs::read_to_string(dir.path().join(CA_BUNDLE_PATCH_FILE)).unwrap());
    assert_eq!(patch.metadata.name.as_deref(), Some(API_SERVICE));
    let ca_bundle = patch.spec.unwrap().ca_bundle.unwrap().0;
    assert_eq!(ca_bundle, data(serving, "ca.crt"));

    let verifier = WebPkiServerVerifier::builder_with_provider(roots(&ca_bundle), provider())
        .build()
        .unwrap();
    let verify = |name: &str| {
        verifier.verify_server_cert(
            &leaf(data(serving, "tls.crt")),
            &[],
            &ServerName::try_from(name.to_owned()).unwrap(),
            &[],
            UnixTime::now(),
        )
    };
    for name in [
        "battery-apiserver.infra.svc",
        "battery-apiserver.infra.svc.cluster.local",
    ] {
        verify(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    assert!(verify("battery-apiserver.battery-system.svc").is_err());
    // The key is the certificate's.
    let key =
        rcgen::KeyPair::from_pem(std::str::from_utf8(data(serving, "tls.key")).unwrap()).unwrap();
    let (_, cert) = x509_parser::pem::parse_x509_pem(data(serving, "tls.crt")).unwrap();
    assert_eq!(
        cert.parse_x509()
            .unwrap()
            .public_key()
            .subject_public_key
            .data,
        key.public_key_raw()
    );
}

#[test]
fn the_agent_ca_and_the_relay_client_ca_are_distinct() {
    let dir = tempfile::tempdir().unwrap();
    write(&args(dir.path(), &[])).unwrap();
    let secrets = secrets(dir.path());
    let agent_ca = data(&secrets[AGENT_CA_SECRET], "tls.crt");
    let relay = &secrets[RELAY_CLIENT_SECRET];
    let relay_ca = data(relay, "ca.crt");
    assert_ne!(agent_ca, relay_ca);
    assert_eq!(relay_ca, data(&secrets[RELAY_CLIENT_CA_SECRET], "ca.crt"));
    assert!(client_chains_to(data(relay, "tls.crt"), relay_ca));
    // ADR 0013: nothing the agent CA signs is the server's relay client, and the
    // other way round.
    assert!(!client_chains_to(data(relay, "tls.crt"), agent_ca));
    // The server signs agents' certificates with the agent CA (ADR 0011).
    crate::resources::hosts::certificate::AgentSigner::from_pem(
        std::str::from_utf8(agent_ca).unwrap(),
        std::str::from_utf8(data(&secrets[AGENT_CA_SECRET], "tls.key")).unwrap(),
        Duration::from_secs(3600),
    )
    .unwrap();
}

#[test]
fn a_second_run_does_not_replace_the_first_ones_cas() {
    let dir = tempfile::tempdir().unwrap();
    write(&args(dir.path(), &[])).unwrap();
    let first = std::fs::read(dir.path().join(SECRETS_FILE)).unwrap();
    let err = write(&args(dir.path(), &[])).unwrap_err();
    assert!(
        err.to_string().contains("lock out the installed agents"),
        "{err}"
    );
    assert_eq!(std::fs::read(dir.path().join(SECRETS_FILE)).unwrap(), first);
}

#[test]
fn the_validity_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        args(dir.path(), &[]).validity,
        Duration::from_secs(365 * 24 * 3600)
    );
    for validity in ["1h", "6y", "never"] {
        let err = Cli::try_parse_from([
            "battery-apiserver",
            "certs",
            "--out",
            "x",
            "--validity",
            validity,
        ])
        .unwrap_err();
        assert!(err.to_string().contains("--validity"), "{validity}: {err}");
    }
}
