//! `battery-apiserver certs`: the certificates of an install without cert-manager
//! (`deploy/README.md`), written as the Secrets `deploy/base` mounts and a kustomize
//! Component that adds them and the APIService's `caBundle` to the base:
//!
//! - a serving CA and the serving certificate for the Service's names, which
//!   kube-apiserver's aggregator verifies against the APIService's `caBundle`;
//! - the agent CA, with which the server signs each agent's relay serving certificate
//!   (`hosts/<name>/certificate`, ADR 0011) and verifies it;
//! - the relay client CA and the server's relay client certificate it signs, the only
//!   client the agents accept (ADR 0013: a CA apart from the agent CA).
//!
//! The CA keys that sign nothing later (serving, relay client) are not kept: rotating
//! means running `certs` again. The rcgen code is `dev`'s ([`crate::dev::pki`]).

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

/// The files `certs` writes in `--out`.
pub const SECRETS_FILE: &str = "secrets.yaml";
pub const CA_BUNDLE_PATCH_FILE: &str = "apiservice-ca-bundle.yaml";
pub const KUSTOMIZATION_FILE: &str = "kustomization.yaml";

/// How long the CAs live; the leaves live `--validity`. Long, as a CA rotation means
/// re-issuing everything it signed (battery-operator's CAs live as long).
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Runs `certs`.
pub fn run(args: &CertsArgs) -> anyhow::Result<()> {
    let written = write(args)?;
    crate::logging::announce(&[format!(
        "battery-apiserver certs: wrote {}, a kustomize component with the Secrets and the APIService's caBundle (deploy/README.md)",
        written.display()
    )]);
    Ok(())
}

/// Makes the CAs and certificates and writes the component into `args.out`; refuses to
/// replace an earlier run's, whose CAs the installed agents trust.
pub fn write(args: &CertsArgs) -> anyhow::Result<PathBuf> {
    let secrets_path = args.out.join(SECRETS_FILE);
    if secrets_path.exists() {
        anyhow::bail!(
            "{} exists: new CAs would lock out the installed agents; delete it to rotate every certificate",
            secrets_path.display()
        );
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let made = Certificates::make(&args.namespace, &args.service, args.validity)?;
    let secrets = made
        .secrets(&args.namespace)
        .iter()
        .map(serde_norway::to_string)
        .collect::<Result<Vec<_>, _>>()
        .context("writing the Secrets as YAML")?
        .join("---\n");
    pki::write_file(&secrets_path, &secrets, true)?;
    pki::write_file(
        &args.out.join(CA_BUNDLE_PATCH_FILE),
        &ca_bundle_patch(&made.serving_ca)?,
        false,
    )?;
    pki::write_file(&args.out.join(KUSTOMIZATION_FILE), &kustomization()?, false)?;
    Ok(args.out.clone())
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
        let now = ASN1Time::now().to_datetime();
        let ca = |cn: &str| {
            let mut params = pki::ca_params(cn);
            params.not_before = now;
            params.not_after = now + CA_VALIDITY;
            pki::self_signed_ca(params)
        };
        let leaf = |mut params: CertificateParams| {
            params.not_before = now;
            params.not_after = now + validity;
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            params.use_authority_key_identifier_extension = true;
            params
        };

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

/// The kustomize Component: the Secrets, and the caBundle patch on the base's APIService.
fn kustomization() -> anyhow::Result<String> {
    let component = serde_json::json!({
        "apiVersion": "kustomize.config.k8s.io/v1alpha1",
        "kind": "Component",
        "resources": [SECRETS_FILE],
        "patches": [{
            "path": CA_BUNDLE_PATCH_FILE,
            "target": { "kind": "APIService", "name": API_SERVICE },
        }],
    });
    let yaml = serde_norway::to_string(&component).context("writing the kustomization")?;
    Ok(format!(
        "# Written by `battery-apiserver certs`: the Secrets deploy/base mounts and the\n# APIService's caBundle. Holds private keys: keep it out of version control.\n{yaml}"
    ))
}

#[cfg(test)]
mod tests;
