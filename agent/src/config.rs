//! The command line, and its validation into a [`Config`] before any port is bound:
//! every file is read and every address parsed here, so a mistake exits at once with
//! the flag to fix instead of on the first exec. Every flag can also come from the
//! environment variable named after it (`--listen` is `BATTERY_AGENT_LISTEN`).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use std::time::Duration;

use battery_types::HostTls;
use clap::Parser;
use thiserror::Error;
use tonic::transport::{Certificate, Identity};

use crate::flintlock::{FlintlockConfig, FlintlockTls};
use crate::readiness::{Check, CheckConfig};
use crate::register::Registration;

/// The Exec Agent on each Host: relays the API server's exec sessions to flintlockd's
/// exec API over mTLS.
#[derive(Debug, Parser)]
#[command(name = "battery-agent", version, about)]
pub struct Cli {
    /// Address to serve the relay on: the Host's internal address.
    #[arg(long, env = "BATTERY_AGENT_LISTEN", default_value = "0.0.0.0:10270")]
    pub listen: SocketAddr,

    /// The relay's serving certificate (PEM), naming the Host; served as it is, never
    /// renewed. The alternative to --serving-certificate-from-api-server.
    #[arg(
        long,
        env = "BATTERY_AGENT_TLS_CERT_FILE",
        requires = "tls_private_key_file"
    )]
    pub tls_cert_file: Option<PathBuf>,

    /// The serving certificate's key (PEM).
    #[arg(
        long,
        env = "BATTERY_AGENT_TLS_PRIVATE_KEY_FILE",
        requires = "tls_cert_file"
    )]
    pub tls_private_key_file: Option<PathBuf>,

    /// Get the relay's serving certificate from the API server
    /// (`hosts/<Host name>/certificate`) with a key made at start, and renew it at 2/3
    /// of its lifetime. Needs the Host's name; the API server is reached as --kubeconfig
    /// or the pod's service account says.
    #[arg(
        long,
        env = "BATTERY_AGENT_SERVING_CERTIFICATE_FROM_API_SERVER",
        conflicts_with_all = ["tls_cert_file", "tls_private_key_file"]
    )]
    pub serving_certificate_from_api_server: bool,

    /// CA bundle (PEM) of the API server's client certificate: a client whose
    /// certificate does not chain to it is refused during the TLS handshake.
    #[arg(long, env = "BATTERY_AGENT_CLIENT_CA_FILE")]
    pub client_ca_file: PathBuf,

    /// flintlockd's gRPC address on this Host, as host:port (e.g. 10.0.0.5:9090).
    #[arg(long, env = "BATTERY_AGENT_FLINTLOCK_ADDRESS")]
    pub flintlock_address: String,

    /// CA bundle (PEM) that signs flintlockd's serving certificate.
    #[arg(long, env = "BATTERY_AGENT_FLINTLOCK_CA_FILE")]
    pub flintlock_ca_file: Option<PathBuf>,

    /// The agent's client certificate (PEM) towards flintlockd.
    #[arg(long, env = "BATTERY_AGENT_FLINTLOCK_CERT_FILE")]
    pub flintlock_cert_file: Option<PathBuf>,

    /// The client certificate's key (PEM).
    #[arg(long, env = "BATTERY_AGENT_FLINTLOCK_KEY_FILE")]
    pub flintlock_key_file: Option<PathBuf>,

    /// Talk to flintlockd in plain gRPC, without TLS: only for the simulated Hosts of
    /// `battery-apiserver dev`, which serve no TLS.
    #[arg(
        long,
        env = "BATTERY_AGENT_FLINTLOCK_INSECURE",
        conflicts_with_all = ["flintlock_ca_file", "flintlock_cert_file", "flintlock_key_file"]
    )]
    pub flintlock_insecure: bool,

    /// How log lines on stderr are written: `text` for people, `json` (one object a
    /// line) for log collectors.
    #[arg(
        long,
        env = "BATTERY_AGENT_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    pub log_format: LogFormat,

    /// The name of this agent's Host, as the Host object is named. Defaults to the
    /// `NODE_NAME` environment variable (a DaemonSet's `spec.nodeName`). Without either,
    /// the agent relays only: it neither registers its Host nor reports readiness.
    #[arg(long, env = "BATTERY_AGENT_HOST_NAME")]
    pub host_name: Option<String>,

    /// The relay's address as the API server dials it (host:port), published as the
    /// Host's `spec.agentAddress`. Required with a Host name.
    #[arg(long, env = "BATTERY_AGENT_ADVERTISE_ADDRESS")]
    pub advertise_address: Option<String>,

    /// The kubeconfig of the agent's identity towards the Kubernetes API; without it,
    /// `KUBECONFIG`, `~/.kube/config` or the in-cluster service account, as kubectl finds
    /// them.
    #[arg(long, env = "BATTERY_AGENT_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// flintlockd's address as battery dials it, written as the Host's `spec.address`
    /// when the agent creates the Host. Defaults to --flintlock-address.
    #[arg(long, env = "BATTERY_AGENT_HOST_FLINTLOCK_ADDRESS")]
    pub host_flintlock_address: Option<String>,

    /// battery reaches flintlockd without TLS (the Host's `spec.tls.insecure`, written
    /// only when the agent creates the Host).
    #[arg(
        long,
        env = "BATTERY_AGENT_HOST_TLS_INSECURE",
        conflicts_with_all = ["host_tls_ca_file", "host_tls_cert_file", "host_tls_key_file"]
    )]
    pub host_tls_insecure: bool,

    /// The Host's `spec.tls.caFile`: a path on battery's machine.
    #[arg(long, env = "BATTERY_AGENT_HOST_TLS_CA_FILE")]
    pub host_tls_ca_file: Option<String>,

    /// The Host's `spec.tls.certFile`: a path on battery's machine.
    #[arg(long, env = "BATTERY_AGENT_HOST_TLS_CERT_FILE")]
    pub host_tls_cert_file: Option<String>,

    /// The Host's `spec.tls.keyFile`: a path on battery's machine.
    #[arg(long, env = "BATTERY_AGENT_HOST_TLS_KEY_FILE")]
    pub host_tls_key_file: Option<String>,

    /// Exec sessions relayed at once; more are refused (RESOURCE_EXHAUSTED, which the
    /// API server answers 429), so a burst cannot exhaust the Host's memory.
    #[arg(long, env = "BATTERY_AGENT_MAX_SESSIONS", default_value = "512")]
    pub max_sessions: std::num::NonZeroUsize,

    /// Where the agent keeps its table of background processes, so a restarted agent
    /// still lists them (one that was running is reported lost). One per Host: two
    /// agents must not share it.
    #[arg(
        long,
        env = "BATTERY_AGENT_STATE_DIR",
        default_value = "/var/lib/battery-agent"
    )]
    pub state_dir: PathBuf,

    /// How often the readiness report is sent when nothing changed: the heartbeat. The
    /// API server takes a Host whose report is older than four intervals as not ready.
    #[arg(
        long,
        env = "BATTERY_AGENT_REPORT_INTERVAL",
        default_value = "10s",
        value_parser = humantime::parse_duration
    )]
    pub report_interval: Duration,

    /// The KVM device: a character device the agent can open read-write.
    #[arg(long, env = "BATTERY_AGENT_KVM_DEVICE", default_value = "/dev/kvm")]
    pub kvm_device: PathBuf,

    /// containerd's devmapper thin pool, as device-mapper names it under /dev/mapper.
    #[arg(
        long,
        env = "BATTERY_AGENT_THIN_POOL_DEVICE",
        default_value = "/dev/mapper/flintlock-thinpool"
    )]
    pub thin_pool_device: PathBuf,

    /// A readiness check not to run (repeatable, or comma-separated); the Ready message
    /// then says it was not checked. Only for Hosts without the thing checked, such as
    /// `battery-apiserver dev`'s simulated Hosts, which have no KVM or thin pool.
    #[arg(
        long,
        env = "BATTERY_AGENT_SKIP_CHECK",
        value_enum,
        value_delimiter = ','
    )]
    pub skip_check: Vec<Check>,
}

// One log-line shape for every binary; `--log-format` takes its values.
pub use battery_telemetry::LogFormat;

/// A configuration whose files have been read and whose addresses parse.
#[derive(Debug)]
pub struct Config {
    pub listen: SocketAddr,
    /// Where the relay's serving certificate comes from.
    pub serving: Serving,
    /// The CA bundle (PEM) that client certificates must chain to.
    pub client_ca: Vec<u8>,
    pub flintlock: FlintlockConfig,
    /// How the agent registers its Host and reports its readiness; `None` relays only.
    pub registration: Option<Registration>,
    /// Exec sessions relayed at once.
    pub max_sessions: std::num::NonZeroUsize,
    /// Where the process table is kept.
    pub state_dir: PathBuf,
}

/// Where the relay's serving certificate comes from.
pub enum Serving {
    /// PEM files, served as they are.
    Files { cert: Vec<u8>, key: Vec<u8> },
    /// The API server signs it for the agent's Host (ADR 0011), and renews it.
    FromApiServer,
}

impl std::fmt::Debug for Serving {
    // The key is a secret: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Files { .. } => f.write_str("Files"),
            Self::FromApiServer => f.write_str("FromApiServer"),
        }
    }
}

/// A flag whose value cannot be used, named so the message says which to fix.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("reading --{flag} {}", path.display())]
    ReadFile {
        flag: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("--{flag} {}: no PEM block in it; give a PEM file", path.display())]
    NotPem { flag: &'static str, path: PathBuf },
    #[error(
        "--flintlock-address {0:?}: give host:port (e.g. 10.0.0.5:9090), without a scheme or path"
    )]
    FlintlockAddress(String),
    #[error("--advertise-address is required with a Host name (--host-name or NODE_NAME)")]
    AdvertiseAddressMissing,
    #[error("the Host {host:?} this agent would register is invalid: {errors}")]
    HostSpec { host: String, errors: String },
    #[error("--report-interval must be above zero")]
    ReportInterval,
    #[error(
        "flintlockd needs TLS: give --flintlock-ca-file, --flintlock-cert-file and \
         --flintlock-key-file (missing: {missing}), or --flintlock-insecure for a simulated Host"
    )]
    FlintlockTlsMissing { missing: String },
    #[error(
        "the relay needs a serving certificate: give --tls-cert-file and \
         --tls-private-key-file, or --serving-certificate-from-api-server with --host-name"
    )]
    ServingMissing,
}

impl Cli {
    /// Reads every file and checks every value, before anything is bound or dialled.
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let serving = match (&self.tls_cert_file, &self.tls_private_key_file) {
            (Some(cert), Some(key)) => Serving::Files {
                cert: read_pem("tls-cert-file", cert)?,
                key: read_pem("tls-private-key-file", key)?,
            },
            _ if self.serving_certificate_from_api_server => Serving::FromApiServer,
            _ => return Err(ConfigError::ServingMissing),
        };
        let client_ca = read_pem("client-ca-file", &self.client_ca_file)?;
        let tls = if self.flintlock_insecure {
            FlintlockTls::Insecure
        } else {
            match (
                &self.flintlock_ca_file,
                &self.flintlock_cert_file,
                &self.flintlock_key_file,
            ) {
                (Some(ca), Some(cert), Some(key)) => FlintlockTls::Mutual {
                    ca: Certificate::from_pem(read_pem("flintlock-ca-file", ca)?),
                    identity: Identity::from_pem(
                        read_pem("flintlock-cert-file", cert)?,
                        read_pem("flintlock-key-file", key)?,
                    ),
                },
                (ca, cert, key) => {
                    let missing: Vec<&str> = [
                        (ca.is_none(), "--flintlock-ca-file"),
                        (cert.is_none(), "--flintlock-cert-file"),
                        (key.is_none(), "--flintlock-key-file"),
                    ]
                    .into_iter()
                    .filter_map(|(absent, flag)| absent.then_some(flag))
                    .collect();
                    return Err(ConfigError::FlintlockTlsMissing {
                        missing: missing.join(", "),
                    });
                }
            }
        };
        let flintlock = FlintlockConfig::new(&self.flintlock_address, tls)
            .ok_or_else(|| ConfigError::FlintlockAddress(self.flintlock_address.clone()))?;
        let registration = self.registration()?;
        if matches!(serving, Serving::FromApiServer) && registration.is_none() {
            return Err(ConfigError::ServingMissing);
        }
        Ok(Config {
            listen: self.listen,
            serving,
            client_ca,
            flintlock,
            registration,
            max_sessions: self.max_sessions,
            state_dir: self.state_dir,
        })
    }

    /// The registration and readiness settings, when the agent knows its Host's name.
    fn registration(&self) -> Result<Option<Registration>, ConfigError> {
        let Some(host) = self
            .host_name
            .clone()
            .or_else(|| std::env::var("NODE_NAME").ok())
            .filter(|name| !name.is_empty())
        else {
            return Ok(None);
        };
        let advertise_address = self
            .advertise_address
            .clone()
            .ok_or(ConfigError::AdvertiseAddressMissing)?;
        if self.report_interval.is_zero() {
            return Err(ConfigError::ReportInterval);
        }
        let spec = battery_types::HostSpec {
            address: self
                .host_flintlock_address
                .clone()
                .unwrap_or_else(|| self.flintlock_address.clone()),
            unschedulable: false,
            tls: HostTls {
                insecure: self.host_tls_insecure,
                ca_file: self.host_tls_ca_file.clone(),
                cert_file: self.host_tls_cert_file.clone(),
                key_file: self.host_tls_key_file.clone(),
            },
            agent_address: Some(advertise_address),
        };
        // Checked here, so a Host the API server would refuse stops the agent at start.
        let errors = spec.validate();
        if !errors.is_empty() {
            let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
            return Err(ConfigError::HostSpec {
                host,
                errors: errors.join("; "),
            });
        }
        Ok(Some(Registration {
            host,
            spec,
            kubeconfig: self.kubeconfig.clone(),
            report_interval: self.report_interval,
            checks: CheckConfig {
                kvm_device: (!self.skip_check.contains(&Check::Kvm))
                    .then(|| self.kvm_device.clone()),
                thin_pool_device: (!self.skip_check.contains(&Check::ThinPool))
                    .then(|| self.thin_pool_device.clone()),
                flintlockd: !self.skip_check.contains(&Check::Flintlockd),
                exec_api: !self.skip_check.contains(&Check::ExecApi),
            },
        }))
    }
}

/// The file's bytes, if it holds at least one PEM block. rustls parses them only when
/// the server or channel is built; this catches a wrong file (a DER, a path mix-up)
/// with the flag's name.
fn read_pem(flag: &'static str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    let bytes = std::fs::read(path).map_err(|source| ConfigError::ReadFile {
        flag,
        path: path.to_owned(),
        source,
    })?;
    if !bytes.windows(11).any(|window| window == b"-----BEGIN ") {
        return Err(ConfigError::NotPem {
            flag,
            path: path.to_owned(),
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests;
