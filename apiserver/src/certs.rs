//! `battery-apiserver certs`: the certificates of an install without cert-manager
//! (`deploy/README.md`), written as the Secrets `deploy/base` mounts and a kustomize
//! Component that adds them and the APIService's `caBundle` to the base:
//!
//! - a serving CA and the serving certificate for the Service's names, which
//!   kube-apiserver's aggregator verifies against the APIService's `caBundle`;
//! - the agent CA, with which the server signs each agent's relay serving certificate
//!   (`hosts/<name>/certificate`, ADR 0011) and verifies it;
//! - the relay client CA and the server's relay client certificate it signs, the only
//!   client the agents accept (ADR 0013: a CA apart from the agent CA);
//! - in a file of their own, the battery channel as poolmgrd's chart secures it (ADR
//!   0036): a battery gRPC CA, poolmgrd's serving certificate for loopback, the server's
//!   client certificate, which poolmgrd requires, a random basic-auth token, and
//!   poolmgrd's `config.json`, which holds that token inline.
//!
//! The CA keys that sign nothing later (serving, relay client, battery gRPC) are not
//! kept: rotating means running `certs` again. Each file is written only when missing, so
//! deleting the battery channel's file and running `certs` again rolls that channel alone,
//! and an install from before it gains it without new CAs for the agents. The rcgen code
//! is `dev`'s ([`crate::dev::pki`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyUsagePurpose};
use x509_parser::time::ASN1Time;

use crate::cli::CertsArgs;
use crate::dev::pki::{self, PkiError};

/// The APIService `deploy/base` registers.
pub const API_SERVICE: &str = "v1alpha1.battery.liquidmetal-x.dev";
/// The serving certificate and key (`tls.crt`, `tls.key`) and its CA (`ca.crt`).
pub const SERVING_SECRET: &str = "battery-apiserver-serving";
/// The agent CA's certificate and key (`tls.crt`, `tls.key`).
pub const AGENT_CA_SECRET: &str = "battery-agent-ca";
/// The server's relay client certificate and key (`tls.crt`, `tls.key`), and the relay
/// client CA (`ca.crt`).
pub const RELAY_CLIENT_SECRET: &str = "battery-relay-client";
/// The relay client CA's certificate alone (`ca.crt`), for the agents.
pub const RELAY_CLIENT_CA_SECRET: &str = "battery-relay-client-ca";

/// poolmgrd's serving certificate and key (`tls.crt`, `tls.key`), and the battery gRPC CA
/// (`ca.crt`): the CA of the server's client certificate too, so poolmgrd's
/// `client_ca_file`.
pub const BATTERY_SERVING_SECRET: &str = "battery-grpc-serving";
/// The server's client certificate and key towards poolmgrd (`tls.crt`, `tls.key`), and
/// the battery gRPC CA (`ca.crt`), its `--battery-ca-file`.
pub const BATTERY_CLIENT_SECRET: &str = "battery-grpc-client";
/// poolmgrd's basic-auth token, alone (`token`): the server's `--battery-token-file`.
pub const BATTERY_TOKEN_SECRET: &str = "battery-grpc-token";
pub const BATTERY_TOKEN_KEY: &str = "token";
/// poolmgrd's configuration (`config.json`). A Secret, as it holds the token: poolmgrd
/// reads no token file.
pub const BATTERY_CONFIG_SECRET: &str = "battery-config";
pub const BATTERY_CONFIG_KEY: &str = "config.json";

/// Where `deploy/base` runs poolmgrd: its gRPC port, which the server dials, and its
/// metrics, both on the pod's loopback.
pub const BATTERY_ADDRESS: &str = "127.0.0.1:50051";
const BATTERY_METRICS_ADDRESS: &str = "127.0.0.1:9090";
/// Where `deploy/base` mounts [`BATTERY_SERVING_SECRET`] in poolmgrd's container: the
/// paths its configuration names.
pub const BATTERY_TLS_DIR: &str = "/etc/battery/grpc";

/// The files `certs` writes in `--out`.
pub const SECRETS_FILE: &str = "secrets.yaml";
pub const BATTERY_SECRETS_FILE: &str = "battery-secrets.yaml";
pub const CA_BUNDLE_PATCH_FILE: &str = "apiservice-ca-bundle.yaml";
pub const KUSTOMIZATION_FILE: &str = "kustomization.yaml";

/// How long the CAs live; the leaves live `--validity`. Long, as a CA rotation means
/// re-issuing everything it signed (battery-operator's CAs live as long).
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Runs `certs`.
pub fn run(args: &CertsArgs) -> anyhow::Result<()> {
    let written = write(args)?;
    crate::logging::announce(&[format!(
        "battery-apiserver certs: wrote {} into {}, a kustomize component with the Secrets and the APIService's caBundle (deploy/README.md)",
        written.files.join(", "),
        written.dir.display()
    )]);
    Ok(())
}

/// What one run wrote.
#[derive(Debug)]
pub struct Written {
    pub dir: PathBuf,
    /// The files' names, in `dir`.
    pub files: Vec<&'static str>,
}

/// Makes what `args.out` is missing and writes the component there. An earlier run's
/// Secrets are kept: new CAs in [`SECRETS_FILE`] would lock out the installed agents, and
/// [`BATTERY_SECRETS_FILE`] is rolled by deleting it first. With both there, it refuses.
pub fn write(args: &CertsArgs) -> anyhow::Result<Written> {
    let secrets_path = args.out.join(SECRETS_FILE);
    let battery_path = args.out.join(BATTERY_SECRETS_FILE);
    let (cluster, battery) = (!secrets_path.exists(), !battery_path.exists());
    if !cluster && !battery {
        anyhow::bail!(
            "{} exists: new CAs would lock out the installed agents; delete it to rotate every certificate, or delete {} alone to roll the battery channel's CA, certificates and token",
            secrets_path.display(),
            battery_path.display()
        );
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let mut files = Vec::new();
    if cluster {
        let made = Certificates::make(&args.namespace, &args.service, args.validity)?;
        pki::write_file(
            &secrets_path,
            &yaml_stream(&made.secrets(&args.namespace))?,
            true,
        )?;
        pki::write_file(
            &args.out.join(CA_BUNDLE_PATCH_FILE),
            &ca_bundle_patch(&made.serving_ca)?,
            false,
        )?;
        files.extend([SECRETS_FILE, CA_BUNDLE_PATCH_FILE]);
    }
    if battery {
        let channel = BatteryChannel::make(&args.service, args.validity)?;
        pki::write_file(
            &battery_path,
            &yaml_stream(&channel.secrets(&args.namespace)?)?,
            true,
        )?;
        files.push(BATTERY_SECRETS_FILE);
    }
    // Written every time: a component from before the battery channel lists one file.
    pki::write_file(&args.out.join(KUSTOMIZATION_FILE), &kustomization()?, false)?;
    files.push(KUSTOMIZATION_FILE);
    Ok(Written {
        dir: args.out.clone(),
        files,
    })
}

/// `secrets` as one YAML stream.
fn yaml_stream(secrets: &[Secret]) -> anyhow::Result<String> {
    Ok(secrets
        .iter()
        .map(serde_norway::to_string)
        .collect::<Result<Vec<_>, _>>()
        .context("writing the Secrets as YAML")?
        .join("---\n"))
}

/// When one run's certificates are valid: from now, CAs for [`CA_VALIDITY`], leaves for
/// the validity asked for.
struct Validity {
    now: ASN1Time,
    leaf: Duration,
}

impl Validity {
    fn from_now(leaf: Duration) -> Self {
        Self {
            now: ASN1Time::now(),
            leaf,
        }
    }

    fn ca(&self, cn: &str) -> CertificateParams {
        let mut params = pki::ca_params(cn);
        params.not_before = self.now.to_datetime();
        params.not_after = self.now.to_datetime() + CA_VALIDITY;
        params
    }

    /// A leaf signed by one of the run's CAs, for signatures only.
    fn leaf(&self, mut params: CertificateParams) -> CertificateParams {
        params.not_before = self.now.to_datetime();
        params.not_after = self.now.to_datetime() + self.leaf;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        params
    }
}

/// One run's PEMs.
struct Certificates {
    serving_ca: String,
    serving: (String, String),
    agent_ca: (String, String),
    relay_client_ca: String,
    relay_client: (String, String),
}

impl Certificates {
    fn make(namespace: &str, service: &str, validity: Duration) -> Result<Self, PkiError> {
        let validity = Validity::from_now(validity);
        let ca = |cn: &str| pki::self_signed_ca(validity.ca(cn));
        let leaf = |params| validity.leaf(params);

        let (serving_ca, _, serving_issuer) = ca("battery-apiserver serving CA")?;
        let serving = pki::sign(
            "serving certificate",
            leaf(serving_params(namespace, service)?),
            &serving_issuer,
        )?;
        let (agent_ca_cert, agent_ca_key, _) = ca("battery-apiserver agent CA")?;
        let (relay_client_ca, _, relay_issuer) = ca("battery-apiserver relay client CA")?;
        let relay_client = pki::sign(
            "relay client certificate",
            leaf(pki::client_params(service, &[])?),
            &relay_issuer,
        )?;
        Ok(Self {
            serving_ca,
            serving,
            agent_ca: (agent_ca_cert, agent_ca_key),
            relay_client_ca,
            relay_client,
        })
    }

    fn secrets(&self, namespace: &str) -> [Secret; 4] {
        let (serving_cert, serving_key) = &self.serving;
        let (agent_ca_cert, agent_ca_key) = &self.agent_ca;
        let (relay_cert, relay_key) = &self.relay_client;
        [
            secret(
                namespace,
                SERVING_SECRET,
                TLS,
                &[
                    ("tls.crt", serving_cert),
                    ("tls.key", serving_key),
                    ("ca.crt", &self.serving_ca),
                ],
            ),
            secret(
                namespace,
                AGENT_CA_SECRET,
                TLS,
                &[("tls.crt", agent_ca_cert), ("tls.key", agent_ca_key)],
            ),
            secret(
                namespace,
                RELAY_CLIENT_SECRET,
                TLS,
                &[
                    ("tls.crt", relay_cert),
                    ("tls.key", relay_key),
                    ("ca.crt", &self.relay_client_ca),
                ],
            ),
            secret(
                namespace,
                RELAY_CLIENT_CA_SECRET,
                "Opaque",
                &[("ca.crt", &self.relay_client_ca)],
            ),
        ]
    }
}

/// The battery channel's PEMs and token.
struct BatteryChannel {
    ca: String,
    serving: (String, String),
    client: (String, String),
    token: String,
}

impl BatteryChannel {
    fn make(service: &str, validity: Duration) -> anyhow::Result<Self> {
        let validity = Validity::from_now(validity);
        let leaf = |params| validity.leaf(params);
        // One CA for both ends: both are in the one pod, and each leaf is good for its
        // own side only (serverAuth, clientAuth).
        let (ca, _, issuer) =
            pki::self_signed_ca(validity.ca("battery-apiserver battery gRPC CA"))?;
        // serve dials 127.0.0.1; localhost and ::1 for anyone who dials those instead.
        let serving = pki::sign(
            "battery's serving certificate",
            leaf(
                pki::loopback_serving_params("poolmgrd")
                    .map_err(pki::generate("battery's serving certificate"))?,
            ),
            &issuer,
        )?;
        let client = pki::sign(
            "battery client certificate",
            leaf(pki::client_params(service, &[])?),
            &issuer,
        )?;
        Ok(Self {
            ca,
            serving,
            client,
            token: token()?,
        })
    }

    fn secrets(&self, namespace: &str) -> anyhow::Result<[Secret; 4]> {
        let (serving_cert, serving_key) = &self.serving;
        let (client_cert, client_key) = &self.client;
        let config = serde_json::to_string_pretty(&poolmgrd_config(&self.token))
            .context("writing poolmgrd's config")?
            + "\n";
        Ok([
            secret(
                namespace,
                BATTERY_SERVING_SECRET,
                TLS,
                &[
                    ("tls.crt", serving_cert),
                    ("tls.key", serving_key),
                    ("ca.crt", &self.ca),
                ],
            ),
            secret(
                namespace,
                BATTERY_CLIENT_SECRET,
                TLS,
                &[
                    ("tls.crt", client_cert),
                    ("tls.key", client_key),
                    ("ca.crt", &self.ca),
                ],
            ),
            secret(
                namespace,
                BATTERY_TOKEN_SECRET,
                "Opaque",
                &[(BATTERY_TOKEN_KEY, &self.token)],
            ),
            secret(
                namespace,
                BATTERY_CONFIG_SECRET,
                "Opaque",
                &[(BATTERY_CONFIG_KEY, &config)],
            ),
        ])
    }
}

/// poolmgrd's `config.json` as `deploy/base` runs it, requiring `token`: TLS with the
/// serving certificate of [`BATTERY_SERVING_SECRET`], client certificates of its CA, and
/// the token, on loopback. The cert-manager overlay's `battery-token` script writes the
/// same (a test compares them).
pub fn poolmgrd_config(token: &str) -> serde_json::Value {
    serde_json::json!({
        "api_server": {
            "addr": BATTERY_ADDRESS,
            "tls": {
                "cert_file": format!("{BATTERY_TLS_DIR}/tls.crt"),
                "key_file": format!("{BATTERY_TLS_DIR}/tls.key"),
                "validate_client": true,
                "client_ca_file": format!("{BATTERY_TLS_DIR}/ca.crt"),
            },
            "basic_auth_token": token,
        },
        "metrics_addr": BATTERY_METRICS_ADDRESS,
    })
}

/// 32 random bytes as hex: printable ASCII, so neither the JSON nor the header escapes it.
fn token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 32];
    crate::tls_files::provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| anyhow::anyhow!("no randomness for battery's token"))?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

const TLS: &str = "kubernetes.io/tls";

/// The names kube-apiserver's aggregator dials the Service by: it verifies the serving
/// certificate for `<service>.<namespace>.svc`; the shorter and longer forms serve
/// in-cluster clients.
fn serving_params(namespace: &str, service: &str) -> Result<CertificateParams, PkiError> {
    let names = vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ];
    let mut params = CertificateParams::new(names).map_err(pki::generate("serving certificate"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{service}.{namespace}.svc"));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    Ok(params)
}

fn secret(namespace: &str, name: &str, type_: &str, data: &[(&str, &String)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/part-of".to_owned(),
                "battery-apiserver".to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some(type_.to_owned()),
        data: Some(
            data.iter()
                .map(|(key, pem)| ((*key).to_owned(), ByteString(pem.as_bytes().to_vec())))
                .collect(),
        ),
        ..Secret::default()
    }
}

/// A patch of the APIService that sets its `caBundle` to the serving CA; also usable
/// as `kubectl patch apiservice --type merge --patch-file`.
fn ca_bundle_patch(serving_ca: &str) -> anyhow::Result<String> {
    let patch = serde_json::json!({
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": { "name": API_SERVICE },
        "spec": { "caBundle": ByteString(serving_ca.as_bytes().to_vec()) },
    });
    serde_norway::to_string(&patch).context("writing the caBundle patch as YAML")
}

/// The kustomize Component: both files of Secrets, and the caBundle patch on the base's
/// APIService.
fn kustomization() -> anyhow::Result<String> {
    let component = serde_json::json!({
        "apiVersion": "kustomize.config.k8s.io/v1alpha1",
        "kind": "Component",
        "resources": [SECRETS_FILE, BATTERY_SECRETS_FILE],
        "patches": [{
            "path": CA_BUNDLE_PATCH_FILE,
            "target": { "kind": "APIService", "name": API_SERVICE },
        }],
    });
    let yaml = serde_norway::to_string(&component).context("writing the kustomization")?;
    Ok(format!(
        "# Written by `battery-apiserver certs`: the Secrets deploy/base mounts and the\n# APIService's caBundle. Holds private keys and battery's token: keep it out of version\n# control.\n{yaml}"
    ))
}

#[cfg(test)]
mod tests;
