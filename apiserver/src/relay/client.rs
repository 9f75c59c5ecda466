//! The agents' relay client: its TLS, and one HTTP/2 channel per Host's agent, which
//! every session and call to that agent shares. Below the calls (`mod.rs`, `processes`).

use std::time::Duration;

use battery_api_machinery::status::ApiError;
use battery_telemetry::error_chain;
use moka::sync::Cache;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// The relay's TLS material, PEM. `serve` reads it from its `--agent-*` files; `dev` may
/// fill it from what it generates.
#[derive(Clone, Debug)]
pub struct AgentRelayTls {
    /// The CA that signs the agents' serving certificates.
    pub ca_pem: Vec<u8>,
    /// The API server's relay client certificate (chain) and its key.
    pub client_cert_pem: Vec<u8>,
    pub client_key_pem: Vec<u8>,
}

/// stdin messages queued towards the agent: with the agent's own queue and the HTTP/2
/// window, what a WebSocket may send ahead of the command reading it.
pub(super) const STDIN_BUFFER: usize = 4;
/// The largest message decoded from an agent (its own limit on what it sends).
pub(super) const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// How long an agent gets to open a session: above the agent's own 10 s for flintlockd,
/// so its answer, not ours, says what was slow.
pub(super) const OPEN_TIMEOUT: Duration = Duration::from_secs(15);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Output an agent may send ahead of a session's WebSocket taking it, as the agent's own
/// window towards flintlockd: HTTP/2's default (64 KiB) made bulk output wait a round
/// trip per 64 KiB.
const STREAM_WINDOW_BYTES: u32 = 256 * 1024;
/// Output all of one agent's sessions may send ahead: the bound on what slow clients make
/// the API server hold per Host.
const CONNECTION_WINDOW_BYTES: u32 = 4 * 1024 * 1024;
/// The largest HTTP/2 frame an agent may send: a message of output in one frame, not
/// HTTP/2's default 16 KiB pieces, each read and handled apart.
const MAX_FRAME_BYTES: u32 = 1024 * 1024;
/// Channels kept, one per Host and address; a channel reconnects by itself, so a
/// restarted agent is reached again through the same entry.
const CHANNELS: u64 = 1024;
const CHANNEL_IDLE: Duration = Duration::from_secs(600);

/// Opens relay sessions; `None` TLS when `serve` was given no `--agent-*` files.
pub struct AgentRelay {
    tls: Option<(Certificate, Identity)>,
    channels: Cache<(String, String), Channel>,
}

impl AgentRelay {
    pub fn new(tls: Option<&AgentRelayTls>) -> Self {
        Self {
            tls: tls.map(|tls| {
                (
                    Certificate::from_pem(&tls.ca_pem),
                    Identity::from_pem(&tls.client_cert_pem, &tls.client_key_pem),
                )
            }),
            channels: crate::cache::bounded(CHANNEL_IDLE, CHANNELS),
        }
    }

    /// The channel to the agent of `host` at `address`, verified for `host`'s name.
    pub(super) fn channel(&self, host: &str, address: &str) -> Result<Channel, ApiError> {
        let Some((ca, identity)) = &self.tls else {
            return Err(ApiError::service_unavailable(
                "exec is not configured: the API server was started without \
                 --agent-ca-file, --agent-client-cert-file and --agent-client-key-file",
            ));
        };
        let key = (host.to_owned(), address.to_owned());
        if let Some(channel) = self.channels.get(&key) {
            return Ok(channel);
        }
        let tls = ClientTlsConfig::new()
            .ca_certificate(ca.clone())
            .identity(identity.clone())
            .domain_name(host);
        let channel = Endpoint::from_shared(format!("https://{address}"))
            .and_then(|endpoint| endpoint.tls_config(tls))
            .map_err(|err| {
                unavailable(
                    host,
                    address,
                    format_args!("its address cannot be dialled: {}", error_chain(&err)),
                )
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            // Exec carries keystrokes and prompts; Nagle would hold them back.
            .tcp_nodelay(true)
            .initial_stream_window_size(STREAM_WINDOW_BYTES)
            .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
            .max_frame_size(MAX_FRAME_BYTES)
            .connect_lazy();
        self.channels.insert(key, channel.clone());
        Ok(channel)
    }
}

pub(super) fn unavailable(host: &str, address: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::service_unavailable(format!(
        "cannot exec through the exec agent of Host {host} at {address}: {why}"
    ))
}
