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

/// The Secrets in both files in `dir`, by name.
fn secrets(dir: &Path) -> BTreeMap<String, Secret> {
    let mut all = secrets_in(dir, SECRETS_FILE);
    all.extend(secrets_in(dir, BATTERY_SECRETS_FILE));
    all
}

/// The Secrets in `dir`'s `file`, by name, each parsed strictly as a k8s-openapi Secret.
fn secrets_in(dir: &Path, file: &str) -> BTreeMap<String, Secret> {
    let yaml = std::fs::read_to_string(dir.join(file)).unwrap();
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

/// Whether `server` (PEM) is a serving certificate for `name` that chains to `ca` (PEM).
fn serves_for(server: &[u8], name: &str, ca: &[u8]) -> bool {
    WebPkiServerVerifier::builder_with_provider(roots(ca), provider())
        .build()
        .unwrap()
        .verify_server_cert(
            &leaf(server),
            &[],
            &ServerName::try_from(name.to_owned()).unwrap(),
            &[],
            UnixTime::now(),
        )
        .is_ok()
}

/// Whether the key (PEM) is the certificate's (PEM).
fn key_fits(cert: &[u8], key: &[u8]) -> bool {
    let key = rcgen::KeyPair::from_pem(std::str::from_utf8(key).unwrap()).unwrap();
    let (_, cert) = x509_parser::pem::parse_x509_pem(cert).unwrap();
    cert.parse_x509()
        .unwrap()
        .public_key()
        .subject_public_key
        .data
        == key.public_key_raw()
}

#[test]
fn the_secrets_parse_and_are_the_ones_the_base_mounts() {
    let dir = tempfile::tempdir().unwrap();
    let written = write(&args(dir.path(), &[])).unwrap();
    assert_eq!(
        written.files,
        [
            SECRETS_FILE,
            CA_BUNDLE_PATCH_FILE,
            BATTERY_SECRETS_FILE,
            KUSTOMIZATION_FILE
        ]
    );
    let names = |file| secrets_in(dir.path(), file).into_keys().collect::<Vec<_>>();
    assert_eq!(
        names(SECRETS_FILE),
        [
            AGENT_CA_SECRET,
            SERVING_SECRET,
            RELAY_CLIENT_SECRET,
            RELAY_CLIENT_CA_SECRET
        ]
    );
    assert_eq!(
        names(BATTERY_SECRETS_FILE),
        [
            BATTERY_CONFIG_SECRET,
            BATTERY_CLIENT_SECRET,
            BATTERY_SERVING_SECRET,
            BATTERY_TOKEN_SECRET
        ]
    );
    let secrets = secrets(dir.path());
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
    for file in [SECRETS_FILE, BATTERY_SECRETS_FILE] {
        let mode = std::fs::metadata(dir.path().join(file))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{file}");
    }
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
    assert_eq!(
        component["resources"],
        serde_json::json!([SECRETS_FILE, BATTERY_SECRETS_FILE])
    );
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
    let read = |file| std::fs::read(dir.path().join(file)).unwrap();
    let (first, first_battery) = (read(SECRETS_FILE), read(BATTERY_SECRETS_FILE));
    let err = write(&args(dir.path(), &[])).unwrap_err();
    assert!(
        err.to_string().contains("lock out the installed agents"),
        "{err}"
    );
    assert_eq!(read(SECRETS_FILE), first);
    assert_eq!(read(BATTERY_SECRETS_FILE), first_battery);
}

#[test]
fn the_battery_channel_is_rolled_alone_and_added_to_an_earlier_install() {
    let dir = tempfile::tempdir().unwrap();
    write(&args(dir.path(), &[])).unwrap();
    let read = |file| std::fs::read(dir.path().join(file)).unwrap();
    let (cluster, patch) = (read(SECRETS_FILE), read(CA_BUNDLE_PATCH_FILE));
    let token = |dir: &Path| data(&secrets(dir)[BATTERY_TOKEN_SECRET], BATTERY_TOKEN_KEY).to_vec();
    let first_token = token(dir.path());

    // Rolled: a new CA, certificates and token; the agents' CAs kept.
    std::fs::remove_file(dir.path().join(BATTERY_SECRETS_FILE)).unwrap();
    let written = write(&args(dir.path(), &[])).unwrap();
    assert_eq!(written.files, [BATTERY_SECRETS_FILE, KUSTOMIZATION_FILE]);
    assert_eq!(read(SECRETS_FILE), cluster);
    assert_eq!(read(CA_BUNDLE_PATCH_FILE), patch);
    assert_ne!(token(dir.path()), first_token);

    // A component written before the battery channel: its kustomization names one file.
    std::fs::remove_file(dir.path().join(BATTERY_SECRETS_FILE)).unwrap();
    std::fs::write(
        dir.path().join(KUSTOMIZATION_FILE),
        "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\nresources: [secrets.yaml]\n",
    )
    .unwrap();
    write(&args(dir.path(), &[])).unwrap();
    let component: serde_json::Value = serde_norway::from_slice(&read(KUSTOMIZATION_FILE)).unwrap();
    assert_eq!(
        component["resources"],
        serde_json::json!([SECRETS_FILE, BATTERY_SECRETS_FILE])
    );
    assert_eq!(read(SECRETS_FILE), cluster);
}

#[test]
fn poolmgrd_serves_loopback_and_requires_the_servers_client_certificate_and_token() {
    let dir = tempfile::tempdir().unwrap();
    write(&args(dir.path(), &[])).unwrap();
    let secrets = secrets(dir.path());
    let serving = &secrets[BATTERY_SERVING_SECRET];
    let client = &secrets[BATTERY_CLIENT_SECRET];
    let ca = data(serving, "ca.crt");
    // One CA: serve verifies poolmgrd with it, poolmgrd the server's client certificate.
    assert_eq!(data(client, "ca.crt"), ca);
    let host = BATTERY_ADDRESS.rsplit_once(':').unwrap().0;
    for name in [host, "localhost", "::1"] {
        assert!(serves_for(data(serving, "tls.crt"), name, ca), "{name}");
    }
    assert!(!serves_for(
        data(serving, "tls.crt"),
        "battery-apiserver",
        ca
    ));
    assert!(client_chains_to(data(client, "tls.crt"), ca));
    // Each leaf is good for its own end only.
    assert!(!client_chains_to(data(serving, "tls.crt"), ca));
    assert!(!serves_for(data(client, "tls.crt"), host, ca));
    assert!(key_fits(data(serving, "tls.crt"), data(serving, "tls.key")));
    assert!(key_fits(data(client, "tls.crt"), data(client, "tls.key")));
    // Apart from the cluster-facing CAs.
    for other in [
        data(&secrets[SERVING_SECRET], "ca.crt"),
        data(&secrets[RELAY_CLIENT_SECRET], "ca.crt"),
        data(&secrets[AGENT_CA_SECRET], "tls.crt"),
    ] {
        assert_ne!(other, ca);
    }

    // The token serve sends is the one poolmgrd's config requires.
    let token = std::str::from_utf8(data(&secrets[BATTERY_TOKEN_SECRET], BATTERY_TOKEN_KEY))
        .unwrap()
        .to_owned();
    assert_eq!(token.len(), 64, "{token}");
    assert!(token.chars().all(|c| c.is_ascii_hexdigit()), "{token}");
    let config: serde_json::Value =
        serde_json::from_slice(data(&secrets[BATTERY_CONFIG_SECRET], BATTERY_CONFIG_KEY)).unwrap();
    assert_eq!(config, poolmgrd_config(&token));
    assert_eq!(config["api_server"]["basic_auth_token"], token.as_str());
    assert_eq!(config["api_server"]["tls"]["validate_client"], true);
    assert_eq!(config["api_server"]["tls"].get("insecure"), None);

    let again = tempfile::tempdir().unwrap();
    write(&args(again.path(), &[])).unwrap();
    assert_ne!(
        data(
            &secrets_in(again.path(), BATTERY_SECRETS_FILE)[BATTERY_TOKEN_SECRET],
            BATTERY_TOKEN_KEY
        ),
        token.as_bytes()
    );
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
