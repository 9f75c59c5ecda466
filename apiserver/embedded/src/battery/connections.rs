//! Connections to the registered Hosts' flintlockd, and the in-memory cache of the
//! version each reported (HostStatus.flintlock_version, §4.8).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use battery_proto::poolmgr::v1alpha1::HostTls;
use battery_telemetry::error_chain;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::flintlock::{self, Flintlock, FlintlockError};

/// Bounds each (re)connect, so an unreachable host fails calls instead of hanging them.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a host could not be dialled. AddHost/UpdateHost answer FAILED_PRECONDITION.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialError {
    #[error("invalid address {address:?}: {reason}")]
    Address { address: String, reason: String },
    #[error("reading {path}: {source}", path = .path.display())]
    TlsFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid TLS material: {0}")]
    Tls(String),
}

/// Builds a lazily connecting channel to a flintlockd at `address` (host:port):
/// plaintext when `tls.insecure`, otherwise TLS trusting `ca_file`, presenting
/// `cert_file`/`key_file` when set. The files are read now, on this machine.
pub(crate) fn dial(address: &str, tls: Option<&HostTls>) -> Result<Channel, DialError> {
    let insecure = tls.is_none_or(|tls| tls.insecure);
    let scheme = if insecure { "http" } else { "https" };
    let bad_address = |reason: String| DialError::Address {
        address: address.to_owned(),
        reason,
    };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
        .map_err(|err| bad_address(err.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT)
        // tonic's default today; said here so a change of default cannot bring back
        // delayed-ACK stalls on every MicroVM call.
        .tcp_nodelay(true);
    if let Some(tls) = tls.filter(|tls| !tls.insecure) {
        let ca = read(&tls.ca_file)?;
        if !String::from_utf8_lossy(&ca).contains("-----BEGIN CERTIFICATE-----") {
            return Err(DialError::Tls(format!(
                "{} holds no PEM certificate",
                tls.ca_file
            )));
        }
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        if !tls.cert_file.is_empty() {
            let cert = read(&tls.cert_file)?;
            let key = read(&tls.key_file)?;
            config = config.identity(Identity::from_pem(cert, key));
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|err| DialError::Tls(error_chain(&err)))?;
    }
    Ok(endpoint.connect_lazy())
}

fn read(path: &str) -> Result<Vec<u8>, DialError> {
    std::fs::read(path).map_err(|source| DialError::TlsFile {
        path: PathBuf::from(path),
        source,
    })
}

struct Entry {
    address: String,
    /// None when the stored host could not be dialled at startup (§4.8: skipped with a
    /// warning, still listed, fixable with UpdateHost).
    channel: Option<Channel>,
    /// The version last reported, kept even when too old (HostStatus shows it).
    version: Option<String>,
    /// Whether that version passed: a pass is not asked again, a failure is.
    version_ok: bool,
}

/// The live connection per registered host name.
#[derive(Default)]
pub(crate) struct HostConnections {
    hosts: RwLock<HashMap<String, Entry>>,
}

impl HostConnections {
    /// Installs (or replaces) a host's connection and version cache; a `version` given
    /// here has passed the check.
    pub(crate) fn install(
        &self,
        name: &str,
        address: &str,
        channel: Option<Channel>,
        version: Option<String>,
    ) {
        self.hosts
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                name.to_owned(),
                Entry {
                    address: address.to_owned(),
                    channel,
                    version_ok: version.is_some(),
                    version,
                },
            );
    }

    pub(crate) fn remove(&self, name: &str) {
        self.hosts
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
    }

    /// The registered address (HostInfo.address), if the host is registered.
    pub(crate) fn address(&self, name: &str) -> Option<String> {
        self.hosts
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .map(|entry| entry.address.clone())
    }

    /// The version the host last reported, empty until checked.
    pub(crate) fn version(&self, name: &str) -> String {
        self.hosts
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .and_then(|entry| entry.version.clone())
            .unwrap_or_default()
    }

    /// The host's flintlock client.
    pub(crate) fn client(&self, name: &str) -> Result<Flintlock, FlintlockError> {
        self.hosts
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .and_then(|entry| entry.channel.clone())
            .map(Flintlock::new)
            .ok_or_else(|| FlintlockError::NoConnection(name.to_owned()))
    }

    /// The host's client once its version is known to be >= v0.15.2: checked through
    /// ServerInfo until it passes, then cached (§4.2).
    pub(crate) async fn verified_client(&self, name: &str) -> Result<Flintlock, FlintlockError> {
        let (client, cached) = {
            let hosts = self.hosts.read().unwrap_or_else(PoisonError::into_inner);
            let entry = hosts
                .get(name)
                .ok_or_else(|| FlintlockError::NoConnection(name.to_owned()))?;
            let channel = entry
                .channel
                .clone()
                .ok_or_else(|| FlintlockError::NoConnection(name.to_owned()))?;
            (Flintlock::new(channel), entry.version_ok)
        };
        if !cached {
            let version = client.server_info().await?;
            let checked = flintlock::check_version(&version);
            if let Some(entry) = self
                .hosts
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .get_mut(name)
            {
                entry.version_ok = checked.is_ok();
                entry.version = Some(version);
            }
            checked?;
        }
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls(ca: &str, cert: &str, key: &str) -> HostTls {
        HostTls {
            insecure: false,
            ca_file: ca.to_owned(),
            cert_file: cert.to_owned(),
            key_file: key.to_owned(),
        }
    }

    #[tokio::test]
    async fn dial_reads_and_checks_tls_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("missing.pem");
        let err = dial(
            "127.0.0.1:1",
            Some(&tls(&missing.to_string_lossy(), "", "")),
        )
        .expect_err("missing CA");
        assert!(matches!(err, DialError::TlsFile { .. }), "{err}");

        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").expect("write");
        let err =
            dial("127.0.0.1:1", Some(&tls(&junk.to_string_lossy(), "", ""))).expect_err("junk CA");
        assert!(matches!(err, DialError::Tls(_)), "{err}");

        assert!(dial("127.0.0.1:1", None).is_ok());
        let insecure = HostTls {
            insecure: true,
            ..HostTls::default()
        };
        assert!(dial("127.0.0.1:1", Some(&insecure)).is_ok());
        assert!(matches!(
            dial("not a uri", Some(&insecure)),
            Err(DialError::Address { .. })
        ));
    }

    #[tokio::test]
    async fn unknown_or_undialled_hosts_have_no_client() {
        let hosts = HostConnections::default();
        assert!(matches!(
            hosts.client("h"),
            Err(FlintlockError::NoConnection(_))
        ));
        hosts.install("h", "127.0.0.1:1", None, None);
        assert!(hosts.client("h").is_err());
        assert_eq!(hosts.address("h").as_deref(), Some("127.0.0.1:1"));
        assert_eq!(hosts.version("h"), "");
        hosts.remove("h");
        assert_eq!(hosts.address("h"), None);
    }
}
