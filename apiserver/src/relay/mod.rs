//! The client of the exec agents' relay (`battery.agent.v1alpha1.Relay`): one `Exec`
//! stream per exec session, and one `PortForward` stream per forwarded connection, to
//! the agent on the claim's Host ([`client`] holds the channel to each), and the agents'
//! process tables ([`processes`]). The one place that knows the relay's gRPC, as
//! `battery/` is for battery's.
//!
//! mTLS both ways: the agent's serving certificate must chain to the agent CA *and*
//! name the Host the session is for (`domain_name`), whatever address the Host's
//! `agentAddress` gives, so an agent of another Host, or anyone on that address,
//! receives nothing. The API server presents its relay client certificate.
//!
//! It hands out our own types ([`stream`]): no `tonic` or relay message leaves it.

use battery_api_machinery::status::ApiError;
use battery_proto::agent::v1alpha1::relay_client::RelayClient;
use battery_proto::agent::v1alpha1::{
    ExecRequest, PortForwardRequest, exec_request, port_forward_request,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

mod client;
mod processes;
mod stream;

use client::{MAX_MESSAGE_BYTES, OPEN_TIMEOUT, STDIN_BUFFER, unavailable};

use stream::describe;

pub use client::{AgentRelay, AgentRelayTls};
pub use processes::{AgentProcess, ProcessRun, ProcessStart};

pub use stream::{
    ClaimRef, Closed, ExecInput, ExecInputs, ExecOpen, ExecOutput, ExecOutputs, ExecSession, Exit,
    PortConnection, PortOpen, PortReader, PortWriter, StreamFailed, TerminalSize,
};

impl AgentRelay {
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
