//! The client of the exec agents' relay (`battery.agent.v1alpha1.Relay`): one `Exec`
//! stream per exec session, and one `PortForward` stream per forwarded connection, to
//! the agent on the claim's Host. The one place that knows
//! the relay's gRPC, as `battery/` is for battery's.
//!
//! mTLS both ways: the agent's serving certificate must chain to the agent CA *and*
//! name the Host the session is for (`domain_name`), whatever address the Host's
//! `agentAddress` gives, so an agent of another Host, or anyone on that address,
//! receives nothing. The API server presents its relay client certificate.
//!
//! It hands out our own types ([`stream`]): no `tonic` or relay message leaves it.

use std::time::Duration;

use battery_api_machinery::status::ApiError;
use battery_proto::agent::v1alpha1::relay_client::RelayClient;
use battery_proto::agent::v1alpha1::{
    ExecRequest, PortForwardRequest, exec_request, port_forward_request,
};
use battery_telemetry::error_chain;
use moka::sync::Cache;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

mod stream;

use stream::describe;

pub use stream::{
    ClaimRef, Closed, ExecInput, ExecInputs, ExecOpen, ExecOutput, ExecOutputs, ExecSession, Exit,
    PortConnection, PortOpen, PortReader, PortWriter, StreamFailed, TerminalSize,
};

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
const STDIN_BUFFER: usize = 4;
/// The largest message decoded from an agent (its own limit on what it sends).
const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// How long an agent gets to open a session: above the agent's own 10 s for flintlockd,
/// so its answer, not ours, says what was slow.
const OPEN_TIMEOUT: Duration = Duration::from_secs(15);
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
    fn channel(&self, host: &str, address: &str) -> Result<Channel, ApiError> {
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

    /// Opens a session and waits for the agent to accept it (it has opened flintlockd's
    /// exec), so that a refusal is a Status before the client's connection is upgraded.
    pub async fn open(
        &self,
        host: &str,
        address: &str,
        open: ExecOpen,
    ) -> Result<ExecSession, ApiError> {
        let channel = self.channel(host, address)?;
        let (requests, queue) = mpsc::channel(STDIN_BUFFER);
        // The queue is new, so there is room for the first message.
        requests
            .try_send(ExecRequest {
                payload: Some(exec_request::Payload::Open(open.into())),
            })
            .map_err(|_| ApiError::internal(std::io::Error::other("queueing the exec open")))?;
        let mut client = RelayClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
        let opened = tokio::time::timeout(OPEN_TIMEOUT, client.exec(ReceiverStream::new(queue)))
            .await
            .map_err(|_| {
                unavailable(
                    host,
                    address,
                    format_args!(
                        "it did not accept the session within {}s",
                        OPEN_TIMEOUT.as_secs()
                    ),
                )
            })?
            .map_err(|status| {
                let why = format!("it refused the session: {}", describe(&status));
                if status.code() == tonic::Code::ResourceExhausted {
                    // Full, not broken: come back as for our own session cap.
                    ApiError::too_many_requests(
                        format!("the exec agent of Host {host} at {address} is busy: {why}"),
                        1,
                    )
                } else {
                    unavailable(host, address, why)
                }
            })?;
        Ok(ExecSession {
            input: ExecInputs(requests),
            output: ExecOutputs(opened.into_inner()),
        })
    }
}

impl AgentRelay {
    /// Opens a connection to a port of a MicroVM through its Host's agent. The error is
    /// for a person, to go on the port's error channel: the client's WebSocket is
    /// already upgraded, and other ports of it go on.
    pub async fn open_port(
        &self,
        host: &str,
        address: &str,
        open: PortOpen,
    ) -> Result<PortConnection, String> {
        let port = open.port;
        let channel = self
            .channel(host, address)
            .map_err(|error| error.message().to_owned())?;
        let (requests, queue) = mpsc::channel(STDIN_BUFFER);
        // The queue is new, so there is room for the first message.
        requests
            .try_send(PortForwardRequest {
                payload: Some(port_forward_request::Payload::Open(open.into())),
            })
            .map_err(|_| "queueing the port-forward open failed".to_owned())?;
        let mut client = RelayClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
        let opened = tokio::time::timeout(
            OPEN_TIMEOUT,
            client.port_forward(ReceiverStream::new(queue)),
        )
        .await
        .map_err(|_| {
            format!(
                "the exec agent of Host {host} did not connect to port {port} within {}s",
                OPEN_TIMEOUT.as_secs()
            )
        })?
        .map_err(|status| match status.code() {
            // The agent's own words: what the guest said about the port.
            tonic::Code::FailedPrecondition => status.message().to_owned(),
            _ => format!(
                "the exec agent of Host {host} at {address} could not connect to port {port}: {}",
                describe(&status)
            ),
        })?;
        Ok(PortConnection {
            to_guest: PortWriter(requests),
            from_guest: PortReader(opened.into_inner()),
        })
    }
}

fn unavailable(host: &str, address: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::service_unavailable(format!(
        "cannot exec through the exec agent of Host {host} at {address}: {why}"
    ))
}
