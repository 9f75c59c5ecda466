//! Client certificates: verifying a chain against one CA bundle, and the user a
//! certificate names (`CommonNameUserConversion`).

use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, UnixTime, pem::PemObject as _};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use sha2::Digest as _;
use x509_parser::prelude::{FromDer as _, X509Certificate};

use crate::auth::UserInfo;

/// The extra key Kubernetes records a credential's fingerprint under.
const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// Verifies a client certificate chain against one CA bundle: signature, validity
/// period and the client-auth usage.
pub type Verifier = Arc<dyn ClientCertVerifier>;

/// A CA bundle that cannot verify anything.
#[derive(Debug, thiserror::Error)]
pub enum CaBundleError {
    #[error("{what}: not a PEM certificate bundle: {source}")]
    Pem {
        what: String,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{what}: holds no certificate")]
    Empty { what: String },
    #[error("{what}: {source}")]
    Invalid {
        what: String,
        #[source]
        source: rustls::Error,
    },
    #[error("{what}: {source}")]
    Verifier {
        what: String,
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
}

/// A verifier of chains against the PEM bundle `pem`; `what` names the bundle in errors.
pub fn verifier(pem: &[u8], what: &str) -> Result<Verifier, CaBundleError> {
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(pem) {
        let ca = ca.map_err(|source| CaBundleError::Pem {
            what: what.to_owned(),
            source,
        })?;
        roots.add(ca).map_err(|source| CaBundleError::Invalid {
            what: what.to_owned(),
            source,
        })?;
    }
    if roots.is_empty() {
        return Err(CaBundleError::Empty {
            what: what.to_owned(),
        });
    }
    WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|source| CaBundleError::Verifier {
        what: what.to_owned(),
        source,
    })
}

/// Whether `chain` (leaf first) verifies against `verifier` at `now`.
pub fn verify(
    verifier: &Verifier,
    chain: &[CertificateDer<'static>],
    now: UnixTime,
) -> Result<(), String> {
    let (leaf, intermediates) = chain
        .split_first()
        .ok_or_else(|| "no certificate".to_owned())?;
    verifier
        .verify_client_cert(leaf, intermediates, now)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// The first moment a certificate of `chain` is no longer valid; `None` when one cannot
/// be read (or there is none), so nothing is concluded to last.
pub fn expiry(chain: &[CertificateDer<'static>]) -> Option<UnixTime> {
    chain
        .iter()
        .map(|der| {
            let (_, cert) = X509Certificate::from_der(der).ok()?;
            let not_after = u64::try_from(cert.validity().not_after.timestamp()).ok()?;
            // Valid through its notAfter second, as webpki counts it.
            Some(UnixTime::since_unix_epoch(std::time::Duration::from_secs(
                not_after.saturating_add(1),
            )))
        })
        .collect::<Option<Vec<_>>>()?
        .into_iter()
        .min()
}

/// The subject's common name. With several, the last counts, as in Go (`pkix.Name`
/// keeps overwriting `CommonName`), so that this server and kube-apiserver see the same
/// user in the same certificate.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let cn = cert.subject().iter_common_name().last()?.as_str().ok()?;
    Some(cn.to_owned())
}

/// The user a verified client certificate names (CN the user, O the groups, its
/// fingerprint as the credential id), or `None` if it names none.
pub fn user_from_certificate(der: &[u8]) -> Option<UserInfo> {
    let name = common_name(der).filter(|name| !name.is_empty())?;
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let groups = cert
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    let fingerprint: String = sha2::Sha256::digest(der)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    Some(UserInfo {
        name,
        groups,
        extra: [(
            CREDENTIAL_ID.to_owned(),
            vec![format!("X509SHA256={fingerprint}")],
        )]
        .into(),
        ..UserInfo::default()
    })
}
