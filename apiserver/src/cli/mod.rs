//! The command line. Every flag can also come from the environment variable named
//! after it (`--data-dir` is `BATTERY_APISERVER_DATA_DIR`). `serve`'s flags become one
//! [`ServeConfig`], checked whole before anything is bound or called.

mod serve_config;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

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

/// A leaf's validity: at least a day, so an install does not expire while it is set up;
/// at most five years, well inside the CAs' ten.
fn certificate_validity(value: &str) -> Result<Duration, String> {
    const DAY: u64 = 24 * 3600;
    duration_within(value, DAY, 5 * 365 * DAY, "1d..5y (try 365d)")
}

/// `value` as a duration of `min..=max` seconds; otherwise why, with `range` to try.
fn duration_within(value: &str, min: u64, max: u64, range: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(value).map_err(|e| e.to_string())?;
    if (Duration::from_secs(min)..=Duration::from_secs(max)).contains(&duration) {
        Ok(duration)
    } else {
        Err(format!("{value} is outside {range}"))
    }
}

/// Options of `serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// HTTPS address to serve the API on.
    #[arg(long, env = "BATTERY_APISERVER_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,

    /// battery's gRPC address, host:port (e.g. 127.0.0.1:50051, the poolmgrd sidecar):
    /// over TLS, or in plaintext with --battery-insecure.
    #[arg(long, env = "BATTERY_APISERVER_BATTERY_ADDRESS")]
    pub battery_address: String,

    /// CA bundle (PEM) battery's serving certificate must chain to (poolmgrd's
    /// api_server.tls.cert_file). Required unless --battery-insecure; reloaded when it
    /// changes.
    #[arg(
        long,
        env = "BATTERY_APISERVER_BATTERY_CA_FILE",
        required_unless_present = "battery_insecure"
    )]
    pub battery_ca_file: Option<PathBuf>,

    /// Client certificate (PEM) for a poolmgrd that validates clients
    /// (api_server.tls.validate_client); reloaded when it changes.
    #[arg(
        long,
        env = "BATTERY_APISERVER_BATTERY_CLIENT_CERT_FILE",
        requires_all = ["battery_client_key_file", "battery_ca_file"]
    )]
    pub battery_client_cert_file: Option<PathBuf>,

    /// The key (PEM) of --battery-client-cert-file.
    #[arg(
        long,
        env = "BATTERY_APISERVER_BATTERY_CLIENT_KEY_FILE",
        requires = "battery_client_cert_file"
    )]
    pub battery_client_key_file: Option<PathBuf>,

    /// The name battery's certificate must carry, when not the host of
    /// --battery-address.
    #[arg(
        long,
        env = "BATTERY_APISERVER_BATTERY_TLS_SERVER_NAME",
        requires = "battery_ca_file"
    )]
    pub battery_tls_server_name: Option<String>,

    /// File holding poolmgrd's basic-auth token (api_server.basic_auth_token), sent on
    /// every call; read again when it changes. A trailing newline is ignored.
    #[arg(long, env = "BATTERY_APISERVER_BATTERY_TOKEN_FILE")]
    pub battery_token_file: Option<PathBuf>,

    /// Reach battery in plaintext (poolmgrd's api_server.tls.insecure): anyone who can
    /// reach its port can then read and spoof the channel.
    #[arg(
        long,
        env = "BATTERY_APISERVER_BATTERY_INSECURE",
        conflicts_with_all = ["battery_ca_file", "battery_client_cert_file", "battery_tls_server_name"]
    )]
    pub battery_insecure: bool,

    /// The serving certificate (PEM); reloaded when the file changes.
    #[arg(long, env = "BATTERY_APISERVER_TLS_CERT_FILE")]
    pub tls_cert_file: PathBuf,

    /// The serving certificate's key (PEM); reloaded with it.
    #[arg(long, env = "BATTERY_APISERVER_TLS_PRIVATE_KEY_FILE")]
    pub tls_private_key_file: PathBuf,

    /// CA bundle that signs client certificates; their CN is the user, their
    /// organizations the groups. Without it, the cluster's ConfigMap
    /// kube-system/extension-apiserver-authentication (`client-ca-file`) is read and watched.
    #[arg(long, env = "BATTERY_APISERVER_CLIENT_CA_FILE")]
    pub client_ca_file: Option<PathBuf>,

    /// CA bundle of the front proxy (kube-apiserver's aggregator): a client certificate it
    /// signs may say who the request is from in the identity headers. Without it, this
    /// and the other --requestheader-* settings come from the cluster's ConfigMap
    /// kube-system/extension-apiserver-authentication, read and watched.
    #[arg(long, env = "BATTERY_APISERVER_REQUESTHEADER_CLIENT_CA_FILE")]
    pub requestheader_client_ca_file: Option<PathBuf>,

    /// CNs the front proxy's certificate may have (comma-separated); empty allows any
    /// certificate the requestheader CA signed.
    #[arg(
        long,
        env = "BATTERY_APISERVER_REQUESTHEADER_ALLOWED_NAMES",
        value_delimiter = ',',
        default_value = "front-proxy-client"
    )]
    pub requestheader_allowed_names: Vec<String>,

    /// Headers naming the user (the first with a value wins).
    #[arg(
        long,
        env = "BATTERY_APISERVER_REQUESTHEADER_USERNAME_HEADERS",
        value_delimiter = ',',
        default_value = "X-Remote-User"
    )]
    pub requestheader_username_headers: Vec<String>,

    /// Headers naming the user's uid; off unless given, as in Kubernetes.
    #[arg(
        long,
        env = "BATTERY_APISERVER_REQUESTHEADER_UID_HEADERS",
        value_delimiter = ','
    )]
    pub requestheader_uid_headers: Vec<String>,

    /// Headers naming the user's groups, one per line.
    #[arg(
        long,
        env = "BATTERY_APISERVER_REQUESTHEADER_GROUP_HEADERS",
        value_delimiter = ',',
        default_value = "X-Remote-Group"
    )]
    pub requestheader_group_headers: Vec<String>,

    /// Prefixes of the headers carrying the user's extra attributes.
    #[arg(
        long,
        env = "BATTERY_APISERVER_REQUESTHEADER_EXTRA_HEADERS_PREFIX",
        value_delimiter = ',',
        default_value = "X-Remote-Extra-"
    )]
    pub requestheader_extra_headers_prefix: Vec<String>,

    /// Start even when the ConfigMap kube-system/extension-apiserver-authentication cannot
    /// be read; then only the CAs given as flags are trusted.
    #[arg(long, env = "BATTERY_APISERVER_AUTHENTICATION_TOLERATE_LOOKUP_FAILURE")]
    pub authentication_tolerate_lookup_failure: bool,

    /// Directory of the metadata store, on battery's volume. Without it the metadata is
    /// kept in memory and lost on restart.
    #[arg(long, env = "BATTERY_APISERVER_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Watches open at once, across all users; more are refused with 429.
    #[arg(long, env = "BATTERY_APISERVER_MAX_WATCHES", default_value_t = 1000)]
    pub max_watches: usize,

    /// Creates per second each user may sustain; faster ones are refused with 429. Off
    /// by default: behind kube-apiserver, its API Priority and Fairness queues and sheds
    /// each user's requests to us, as it does for built-in resources (ADR 32). Set it
    /// when clients reach this server without kube-apiserver in front.
    #[arg(
        long,
        env = "BATTERY_APISERVER_CREATES_PER_SECOND",
        value_parser = positive_rate
    )]
    pub creates_per_second: Option<f64>,

    /// Creates a user may make at once before --creates-per-second applies.
    #[arg(
        long,
        env = "BATTERY_APISERVER_CREATE_BURST",
        default_value_t = 200,
        requires = "creates_per_second"
    )]
    pub create_burst: u32,

    /// Deadline of every request but a watch; keep it under kube-apiserver's 60 s.
    #[arg(long, env = "BATTERY_APISERVER_REQUEST_TIMEOUT", default_value = "55s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,

    /// kubeconfig of the cluster served (namespace lifecycle, Events); inside a pod the
    /// in-cluster config is used when this is not given.
    #[arg(long, env = "BATTERY_APISERVER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// How long creating a claim waits for a MicroVM when the pool has none available,
    /// before answering 429.
    #[arg(long, env = "BATTERY_APISERVER_BIND_WAIT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub bind_wait: Duration,

    /// PEM CA that signs the exec agents' serving certificates; each agent's must name
    /// its Host. Without the three `--agent-*` files, exec answers 503.
    #[arg(long, env = "BATTERY_APISERVER_AGENT_CA_FILE", requires_all = ["agent_client_cert_file", "agent_client_key_file"])]
    pub agent_ca_file: Option<PathBuf>,

    /// PEM client certificate the API server presents to exec agents.
    #[arg(long, env = "BATTERY_APISERVER_AGENT_CLIENT_CERT_FILE", requires_all = ["agent_ca_file", "agent_client_key_file"])]
    pub agent_client_cert_file: Option<PathBuf>,

    /// PEM private key of `--agent-client-cert-file`.
    #[arg(long, env = "BATTERY_APISERVER_AGENT_CLIENT_KEY_FILE", requires_all = ["agent_ca_file", "agent_client_cert_file"])]
    pub agent_client_key_file: Option<PathBuf>,

    /// Exec sessions open at once; more are answered 429.
    #[arg(long, env = "BATTERY_APISERVER_MAX_EXEC_SESSIONS", default_value_t = crate::resources::microvmclaims::DEFAULT_MAX_SESSIONS)]
    pub max_exec_sessions: usize,

    /// CA certificate (PEM) that signs exec agents' serving certificates at
    /// hosts/<name>/certificate. Without it that subresource answers 503.
    #[arg(
        long,
        env = "BATTERY_APISERVER_AGENT_SIGNING_CERT_FILE",
        requires = "agent_signing_key_file"
    )]
    pub agent_signing_cert_file: Option<PathBuf>,

    /// The key (PEM) of --agent-signing-cert-file.
    #[arg(
        long,
        env = "BATTERY_APISERVER_AGENT_SIGNING_KEY_FILE",
        requires = "agent_signing_cert_file"
    )]
    pub agent_signing_key_file: Option<PathBuf>,

    /// An SSH CA's private key (OpenSSH's format, as ssh-keygen writes it). With it,
    /// hosts/<name>/certificate also certifies each agent's SSH key, which exec with a
    /// terminal (tty) logs in to guests with; guests' sshd must trust its public key
    /// (docs/exec.md). Without it, exec with a terminal is refused.
    #[arg(
        long,
        env = "BATTERY_APISERVER_AGENT_SSH_CA_KEY_FILE",
        requires = "agent_signing_cert_file"
    )]
    pub agent_ssh_ca_key_file: Option<PathBuf>,

    /// How long an exec agent's serving certificate lives; agents renew at 2/3 of it.
    /// Short lifetimes stand in for revocation. Between 1m and 30d.
    #[arg(
        long,
        env = "BATTERY_APISERVER_AGENT_CERTIFICATE_LIFETIME",
        default_value = "24h",
        value_parser = certificate_lifetime
    )]
    pub agent_certificate_lifetime: Duration,
}

/// An agent certificate's lifetime: long enough to be renewed calmly, short enough that
/// an agent whose identity was withdrawn is locked out soon (ADR 0011).
fn certificate_lifetime(value: &str) -> Result<Duration, String> {
    duration_within(
        value,
        60,
        30 * 24 * 3600,
        "1m..30d; agents renew at 2/3 of the lifetime (try 24h)",
    )
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

    /// How long creating a claim waits for a MicroVM when the pool has none available.
    #[arg(long, env = "BATTERY_APISERVER_BIND_WAIT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub bind_wait: Duration,

    /// Size of the Pool `default/dev` made at start; 0 makes none.
    #[arg(long, env = "BATTERY_APISERVER_DEV_POOL_SIZE", default_value_t = 3)]
    pub pool_size: i32,
}

/// A rate must be a positive number: 0 would refuse every create after the burst.
fn positive_rate(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err(format!(
            "{value} is not a positive number of creates per second (try 50)"
        )),
    }
}

/// `dev` has no authorization beyond its own certificate: refuse to serve it on a
/// network.
fn loopback(value: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = value.parse().map_err(|e| format!("{e}"))?;
    if addr.ip().is_loopback() {
        Ok(addr)
    } else {
        Err(format!(
            "{addr} is not a loopback address; dev serves on loopback only (try 127.0.0.1:8443)"
        ))
    }
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
