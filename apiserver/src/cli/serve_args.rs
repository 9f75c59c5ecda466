//! `serve`'s flags, as clap reads them; [`super::ServeConfig`] checks them whole.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::parse::{certificate_lifetime, positive_rate};
use super::requests::RequestArgs;
use crate::resources::microvmclaims::GuestApiServer;

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

    /// Where claims' guests reach kube-apiserver, HOST:PORT: a guest with a ServiceAccount
    /// token gets it as KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT, as a Pod does,
    /// so kubectl and client-go in it find the cluster. Without it they get neither: the
    /// reference Host keeps guests off the Service network, where a Pod's address is.
    #[arg(
        long,
        env = "BATTERY_APISERVER_GUEST_API_SERVER",
        value_name = "HOST:PORT"
    )]
    pub guest_api_server: Option<GuestApiServer>,

    #[command(flatten)]
    pub requests: RequestArgs,

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
