//! TLS material read from PEM files: what the serving certificate (`http::serve`) and
//! battery's client (`battery::channel`) load, and reload when the files change.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// How often files are checked for changes.
pub(crate) const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("parsing PEM in {path}")]
    Pem {
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("the key in {key} does not fit the certificate in {cert}")]
    Key {
        cert: PathBuf,
        key: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("setting up TLS")]
    Config(#[source] rustls::Error),
}

/// The files TLS is served from.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub(crate) fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

pub(crate) fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            path: path.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

pub(crate) fn certified_key(files: &TlsFiles) -> Result<CertifiedKey, TlsError> {
    let chain = certificates(&files.cert)?;
    let key_pem = read(&files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|source| TlsError::Pem {
        path: files.key.clone(),
        source,
    })?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|source| TlsError::Key {
        cert: files.cert.clone(),
        key: files.key.clone(),
        source,
    })
}

pub(crate) fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// What was last loaded from some files, loaded again when any of them changes (checked
/// by [`Self::reload_if_changed`], every [`RELOAD_INTERVAL`] by its owner). A changed set
/// that does not load keeps the old value, with a warning, so a half-written rotation
/// never takes the old one away.
pub(crate) struct Reloading<T> {
    /// What it is, for the log: "reloaded {what}".
    what: &'static str,
    files: Vec<PathBuf>,
    load: Box<dyn Fn() -> Result<T, Box<dyn std::error::Error + Send + Sync>> + Send + Sync>,
    current: std::sync::RwLock<(Arc<T>, Vec<Option<SystemTime>>)>,
}

impl<T> std::fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading")
            .field("what", &self.what)
            .field("files", &self.files)
            .finish()
    }
}

impl<T> Reloading<T> {
    /// Loads now with `load`, which reads `files`; its error is the caller's to report.
    pub(crate) fn new<E>(
        what: &'static str,
        files: Vec<PathBuf>,
        load: impl Fn() -> Result<T, E> + Send + Sync + 'static,
    ) -> Result<Self, E>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let stamps = stamps(&files);
        let value = load()?;
        Ok(Self {
            what,
            files,
            load: Box::new(move || load().map_err(Into::into)),
            current: std::sync::RwLock::new((Arc::new(value), stamps)),
        })
    }

    pub(crate) fn current(&self) -> Arc<T> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone()
    }

    pub(crate) fn reload_if_changed(&self) {
        let stamps = stamps(&self.files);
        if self.current.read().unwrap_or_else(|e| e.into_inner()).1 == stamps {
            return;
        }
        match (self.load)() {
            Ok(value) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) =
                    (Arc::new(value), stamps);
                tracing::info!(files = ?self.files, "reloaded {}", self.what);
            }
            Err(err) => tracing::warn!(
                error = %battery_telemetry::error_chain(err.as_ref()),
                "keeping the old {}",
                self.what
            ),
        }
    }
}

fn stamps(files: &[PathBuf]) -> Vec<Option<SystemTime>> {
    files.iter().map(|f| modified(f)).collect()
}
