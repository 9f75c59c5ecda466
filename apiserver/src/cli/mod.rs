//! The command line. Every flag can also come from the environment variable named
//! after it (`--data-dir` is `BATTERY_APISERVER_DATA_DIR`). `serve`'s flags become one
//! [`ServeConfig`], checked whole before anything is bound or called.

mod parse;
mod requests;
mod serve_args;
mod serve_config;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use parse::{absolute, certificate_validity, loopback};
pub use requests::RequestArgs;
pub use serve_args::ServeArgs;
pub use serve_config::{ConfigError, ServeConfig};

/// Kubernetes aggregated API server for battery's warm pools of flintlock MicroVMs.
#[derive(Debug, Parser)]
#[command(name = "battery-apiserver", version, about)]
pub struct Cli {
    /// How log lines on stderr are written: `text` for people, `json` (one object a line)
    /// for log collectors.
    #[arg(
        long,
        global = true,
        env = "BATTERY_APISERVER_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    pub log_format: LogFormat,

    #[command(subcommand)]
    pub command: Command,
}

// One log-line shape for every binary; `--log-format` takes its values.
pub use battery_telemetry::LogFormat;

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the API over TLS in front of a battery at --battery-address (production).
    Serve(Box<ServeArgs>),
    /// Run everything on this machine for trying it out: the server on loopback with the
    /// embedded battery and simulated Hosts, a Pool to claim from, self-made certificates,
    /// and a kubeconfig for kubectl.
    Dev(DevArgs),
    /// Serve the embedded battery (a simulation of battery's poolmgrd gRPC API with
    /// simulated flintlock Hosts) on a TCP address, for grpcurl and other clients.
    EmbeddedBattery(EmbeddedBatteryArgs),
    /// Write the certificates of an install without cert-manager: the Secrets deploy/base
    /// mounts (with battery's token and poolmgrd's config.json) and the APIService's
    /// caBundle, as a kustomize component.
    Certs(CertsArgs),
}

/// Options of `certs`.
#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Directory to write the component into (`kustomization.yaml`, `secrets.yaml`,
    /// `battery-secrets.yaml`, `apiservice-ca-bundle.yaml`); made if missing. Only missing
    /// files are written: delete `battery-secrets.yaml` to roll the battery channel.
    #[arg(long, env = "BATTERY_APISERVER_OUT")]
    pub out: PathBuf,

    /// Namespace of the Secrets and of the Service the certificate is for.
    #[arg(
        long,
        env = "BATTERY_APISERVER_NAMESPACE",
        default_value = "battery-system"
    )]
    pub namespace: String,

    /// Name of the Service in front of the server.
    #[arg(
        long,
        env = "BATTERY_APISERVER_SERVICE",
        default_value = "battery-apiserver"
    )]
    pub service: String,

    /// How long the leaf certificates live: serving, relay client, and the battery
    /// channel's two (the CAs, ten years).
    /// Between 1d and 5y.
    #[arg(
        long,
        env = "BATTERY_APISERVER_VALIDITY",
        default_value = "365d",
        value_parser = certificate_validity
    )]
    pub validity: Duration,
}

/// Options of `dev`.
#[derive(Debug, Args)]
pub struct DevArgs {
    /// HTTPS address to serve the API on; loopback only.
    #[arg(long, env = "BATTERY_APISERVER_LISTEN", default_value = "127.0.0.1:8443", value_parser = loopback)]
    pub listen: SocketAddr,

    /// Where the certificates and the kubeconfig are written.
    #[arg(
        long,
        env = "BATTERY_APISERVER_DEV_DIR",
        default_value = ".battery-dev"
    )]
    pub dir: PathBuf,

    /// Keep battery's state, the simulated MicroVMs and the metadata here, so they
    /// survive a restart. Without it everything is in memory.
    #[arg(long, env = "BATTERY_APISERVER_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Number of simulated Hosts.
    #[arg(long, env = "BATTERY_APISERVER_HOSTS", default_value_t = 2)]
    pub hosts: usize,

    /// How often battery's sweeper expires leases.
    #[arg(long, env = "BATTERY_APISERVER_SWEEP_INTERVAL", default_value = "2s", value_parser = humantime::parse_duration)]
    pub sweep_interval: Duration,

    #[command(flatten)]
    pub requests: RequestArgs,

    /// Size of the Pool `default/dev` made at start; 0 makes none.
    #[arg(long, env = "BATTERY_APISERVER_DEV_POOL_SIZE", default_value_t = 3)]
    pub pool_size: i32,

    /// OpenSSH's sshd, which the simulated Hosts run for terminals (`exec -it`, `shell`),
    /// by an absolute path. Without it, the first sshd in PATH, else /usr/sbin/sshd.
    #[arg(long, env = "BATTERY_APISERVER_SSHD", value_parser = absolute)]
    pub sshd: Option<PathBuf>,
}

/// Options of `embedded-battery`.
#[derive(Debug, Args)]
pub struct EmbeddedBatteryArgs {
    /// gRPC address to serve battery's API on.
    #[arg(
        long,
        env = "BATTERY_APISERVER_LISTEN",
        default_value = "127.0.0.1:9090"
    )]
    pub listen: SocketAddr,

    /// Keep battery's state and the simulated Hosts' MicroVMs here, so they survive a
    /// restart. Without it everything is in memory.
    #[arg(long, env = "BATTERY_APISERVER_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Number of simulated Hosts (host-0, host-1, ...).
    #[arg(long, env = "BATTERY_APISERVER_HOSTS", default_value_t = 2)]
    pub hosts: usize,

    /// How long a simulated MicroVM takes to boot.
    #[arg(long, env = "BATTERY_APISERVER_PROVISIONING_DELAY", default_value = "200ms", value_parser = humantime::parse_duration)]
    pub provisioning_delay: Duration,

    /// How often battery's sweeper expires leases and retries deletions.
    #[arg(long, env = "BATTERY_APISERVER_SWEEP_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub sweep_interval: Duration,

    /// How long before expiry battery emits VM_EXPIRING_SOON.
    #[arg(long, env = "BATTERY_APISERVER_WARNING_WINDOW", default_value = "30s", value_parser = humantime::parse_duration)]
    pub warning_window: Duration,

    /// How often a Subscribe stream looks for new events after a read that was not a full
    /// batch of 100: poolmgrd's 1 s, which is how late an event may reach a subscriber.
    #[arg(long, env = "BATTERY_APISERVER_EVENT_POLL_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub event_poll_interval: Duration,

    /// Not poolmgrd's: wake Subscribe streams on each commit instead of polling, so an
    /// event reaches subscribers at once. For tests and benchmarks of our own speed; the
    /// default polls as poolmgrd does.
    #[arg(long, env = "BATTERY_APISERVER_EXTENSION_EVENTS_ON_COMMIT")]
    pub extension_events_on_commit: bool,

    /// Serving certificate (PEM) of the gRPC port, as poolmgrd's api_server.tls.cert_file:
    /// battery serves TLS unless --insecure.
    #[arg(
        long,
        env = "BATTERY_APISERVER_TLS_CERT_FILE",
        requires = "tls_private_key_file",
        required_unless_present = "insecure"
    )]
    pub tls_cert_file: Option<PathBuf>,

    /// The key (PEM) of --tls-cert-file.
    #[arg(
        long,
        env = "BATTERY_APISERVER_TLS_PRIVATE_KEY_FILE",
        requires = "tls_cert_file"
    )]
    pub tls_private_key_file: Option<PathBuf>,

    /// CA bundle (PEM) client certificates must chain to; with it, a client without one
    /// is refused (poolmgrd's validate_client with client_ca_file).
    #[arg(
        long,
        env = "BATTERY_APISERVER_CLIENT_CA_FILE",
        requires = "tls_cert_file"
    )]
    pub client_ca_file: Option<PathBuf>,

    /// File holding a basic-auth token every call must carry, health included
    /// (poolmgrd's api_server.basic_auth_token). A trailing newline is ignored.
    #[arg(long, env = "BATTERY_APISERVER_BASIC_AUTH_TOKEN_FILE")]
    pub basic_auth_token_file: Option<PathBuf>,

    /// Serve plaintext gRPC (poolmgrd's api_server.tls.insecure).
    #[arg(
        long,
        env = "BATTERY_APISERVER_INSECURE",
        conflicts_with_all = ["tls_cert_file", "client_ca_file"]
    )]
    pub insecure: bool,

    /// The public key (one line) of the SSH user CA the simulated Hosts' guests trust:
    /// with it, they serve flintlock's SSH proxy with the Host's own sshd (Debian's
    /// openssh-server, run as root), for exec with a terminal. Give the same CA's private
    /// key to serve's --agent-ssh-ca-key-file.
    #[arg(long, env = "BATTERY_APISERVER_SSH_USER_CA_PUBLIC_KEY_FILE")]
    pub ssh_user_ca_public_key_file: Option<PathBuf>,
}

#[cfg(test)]
mod tests;
