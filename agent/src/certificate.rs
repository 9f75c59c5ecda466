//! The relay's serving certificate from the API server (ADR 0011): a P-256 key made at
//! start and kept in memory, a CSR for the Host's name posted to
//! `hosts/<name>/certificate`, and renewal at 2/3 of the lifetime.
//!
//! The relay is served through [`ServingCertificate`], a rustls certificate resolver
//! whose certificate is swapped on renewal: a new handshake gets the new one, and open
//! connections (and their sessions) keep going on the one they were made with.

use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use battery_types::{Host, HostCertificateRequest, HostCertificateRequestSpec};
use kube::api::{Api, ObjectMeta, PostParams};
use rcgen::{CertificateParams, KeyPair, PKCS_ECDSA_P256_SHA256};
use rustls::crypto::ring::sign::any_supported_type;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use thiserror::Error;

use crate::ssh::SshIdentity;

/// The first retry after a failed renewal; each next one waits twice as long.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between renewal attempts.
const MAX_RETRY: Duration = Duration::from_secs(60);

/// Why a certificate could not be had from the API server or served.
#[derive(Debug, Error)]
pub enum CertificateError {
    #[error("making the serving key")]
    Key(#[source] rcgen::Error),
    #[error("making the SSH key")]
    SshKey(#[source] russh::keys::ssh_key::Error),
    #[error("making the certificate signing request for Host {host:?}")]
    Request {
        host: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("asking the API server to sign the certificate of Host {host:?}")]
    Sign {
        host: String,
        #[source]
        source: kube::Error,
    },
    #[error("the API server's answer carries no certificate")]
    NoCertificate,
    #[error("reading the certificate the API server signed")]
    Parse(#[source] anyhow::Error),
    #[error("loading the serving certificate and key")]
    Tls(#[source] rustls::Error),
}

/// The agent's serving key. It never leaves the process: only its public half goes
/// to the API server, in the CSR.
pub struct AgentKey(KeyPair);

impl fmt::Debug for AgentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AgentKey(..)")
    }
}

impl AgentKey {
    /// A new ECDSA P-256 key.
    pub fn generate() -> Result<Self, CertificateError> {
        KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
            .map(Self)
            .map_err(CertificateError::Key)
    }

    fn certified(
        &self,
        chain: Vec<CertificateDer<'static>>,
    ) -> Result<CertifiedKey, CertificateError> {
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.0.serialize_der()));
        let signing = any_supported_type(&der).map_err(CertificateError::Tls)?;
        Ok(CertifiedKey::new(chain, signing))
    }
}

/// A certificate the API server signed, with the key it was signed for.
pub struct Issued {
    pub certified: Arc<CertifiedKey>,
    pub serial: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl Issued {
    /// When to renew: 2/3 of the way through the lifetime, as kubelet does (roughly).
    pub fn renew_at(&self) -> SystemTime {
        let lifetime = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        self.not_before + lifetime * 2 / 3
    }
}

/// Asks the API server to sign a certificate for the Host `host` with `key`, and to
/// certify `ssh`'s key for logging in to the Host's MicroVMs, which `ssh` then keeps.
pub async fn fetch(
    client: &kube::Client,
    host: &str,
    key: &AgentKey,
    ssh: &SshIdentity,
) -> Result<Issued, CertificateError> {
    // Only the Host's name is asked for; the API server adds the host of its
    // agentAddress itself, so the agent need not know how it is dialled.
    let params = CertificateParams::new(vec![host.to_owned()]).map_err(|source| {
        CertificateError::Request {
            host: host.to_owned(),
            source,
        }
    })?;
    let csr = params
        .serialize_request(&key.0)
        .and_then(|csr| csr.pem())
        .map_err(|source| CertificateError::Request {
            host: host.to_owned(),
            source,
        })?;
    let request = HostCertificateRequest {
        metadata: ObjectMeta {
            name: Some(host.to_owned()),
            ..ObjectMeta::default()
        },
        spec: HostCertificateRequestSpec {
            request: csr,
            ssh_public_key: ssh.public_key(),
        },
        status: None,
    };
    let answer: HostCertificateRequest = Api::<Host>::all(client.clone())
        .create_subresource("certificate", host, &PostParams::default(), &request)
        .await
        .map_err(|source| CertificateError::Sign {
            host: host.to_owned(),
            source,
        })?;
    let status = answer.status.unwrap_or_default();
    if status.certificate.is_empty() {
        return Err(CertificateError::NoCertificate);
    }
    let issued = issued(key, status.certificate.as_bytes())?;
    ssh.set_certificate(&status.ssh_certificate);
    Ok(issued)
}

fn issued(key: &AgentKey, pem: &[u8]) -> Result<Issued, CertificateError> {
    let chain = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CertificateError::Parse(e.into()))?;
    let leaf = chain
        .first()
        .ok_or_else(|| CertificateError::Parse(anyhow::anyhow!("an empty chain")))?;
    let (_, parsed) =
        x509_parser::parse_x509_certificate(leaf).map_err(|e| CertificateError::Parse(e.into()))?;
    let at = |seconds: i64| UNIX_EPOCH + Duration::from_secs(seconds.max(0).unsigned_abs());
    let validity = parsed.validity();
    let not_before = at(validity.not_before.timestamp());
    let not_after = at(validity.not_after.timestamp());
    let serial = parsed.raw_serial_as_string();
    let certified = key.certified(chain)?;
    // A certificate for another key would fail every handshake: refuse it now.
    certified.keys_match().map_err(CertificateError::Tls)?;
    Ok(Issued {
        certified: Arc::new(certified),
        serial,
        not_before,
        not_after,
    })
}

/// The relay's serving certificate, swappable while the server runs.
#[derive(Debug)]
pub struct ServingCertificate {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ServingCertificate {
    pub fn new(certified: Arc<CertifiedKey>) -> Self {
        Self {
            current: RwLock::new(certified),
        }
    }

    /// A certificate and key from PEM, served as they are (`--tls-cert-file`).
    pub fn from_pem(cert: &[u8], key: &[u8]) -> Result<Self, CertificateError> {
        let chain = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CertificateError::Parse(e.into()))?;
        let key =
            PrivateKeyDer::from_pem_slice(key).map_err(|e| CertificateError::Parse(e.into()))?;
        let signing = any_supported_type(&key).map_err(CertificateError::Tls)?;
        let certified = CertifiedKey::new(chain, signing);
        certified.keys_match().map_err(CertificateError::Tls)?;
        Ok(Self::new(Arc::new(certified)))
    }

    /// Serves `certified` from the next handshake on.
    pub fn replace(&self, certified: Arc<CertifiedKey>) {
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = certified;
    }

    /// What the next handshake gets.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl ResolvesServerCert for ServingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Gets the first certificate for the Host `host`: the agent serves nothing before it.
pub async fn first(
    client: &kube::Client,
    host: &str,
    ssh: &SshIdentity,
) -> Result<(AgentKey, Issued, Arc<ServingCertificate>), CertificateError> {
    let key = AgentKey::generate()?;
    let issued = fetch(client, host, &key, ssh).await?;
    tracing::info!(host, serial = %issued.serial, "got the relay's serving certificate");
    let serving = Arc::new(ServingCertificate::new(issued.certified.clone()));
    Ok((key, issued, serving))
}

/// Renews `issued` into `serving` at 2/3 of each lifetime, for as long as it is polled.
/// A failed renewal is retried with backoff from 1s up to a minute; meanwhile the old
/// certificate is served until it expires.
pub async fn keep_renewed(
    client: kube::Client,
    host: String,
    key: AgentKey,
    mut issued: Issued,
    serving: Arc<ServingCertificate>,
    ssh: Arc<SshIdentity>,
) {
    loop {
        let wait = issued
            .renew_at()
            .duration_since(SystemTime::now())
            .unwrap_or_default();
        tokio::time::sleep(wait).await;
        let mut retry = FIRST_RETRY;
        issued = loop {
            match fetch(&client, &host, &key, &ssh).await {
                Ok(renewed) => break renewed,
                Err(error) => {
                    let expired = SystemTime::now() >= issued.not_after;
                    tracing::warn!(
                        error = %anyhow::Error::from(error),
                        host,
                        expired,
                        retry_in = ?retry,
                        "renewing the relay's serving certificate"
                    );
                    tokio::time::sleep(retry).await;
                    retry = (retry * 2).min(MAX_RETRY);
                }
            }
        };
        serving.replace(issued.certified.clone());
        tracing::info!(host, serial = %issued.serial, "renewed the relay's serving certificate");
    }
}
