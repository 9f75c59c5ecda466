//! `microvmclaims/<name>/portforward`: TCP connections to ports of the claim's MicroVM, as
//! `pods/portforward` makes them to a Pod's, through the exec agent on its Host and the
//! guest's sshd (ADR 33). Only the Holder may, with RBAC `create` on
//! `microvmclaims/portforward`; kube-apiserver treats the subresource as long-running.
//!
//! kubelet's WebSocket protocol: the query names the ports (`ports=80&ports=443`); the
//! i-th port's data goes on channel `2i` and its errors on `2i+1`, and the first frame on
//! each of them is the port, two bytes little-endian. Each port is one connection to the
//! guest, made once the WebSocket is up; one that cannot be made (nothing listening, no
//! SSH into the guest) is a message on its error channel, and the other ports go on. The
//! session ends when every port's connection has ended, the client goes, or the claim
//! is released or expires.

use std::sync::Arc;

use battery_api_machinery::params::decode_query;
use battery_api_machinery::status::ApiError;
use battery_types::channel::Protocol;
use battery_types::channel::port_forward::{PROTOCOLS, data_channel, error_channel, port_prefix};
use bytes::Bytes;
use futures::{SinkExt as _, StreamExt as _};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

use super::sessions::{ExecSessions, SessionGuard};
use super::target::{ClaimSessions, Target};
use crate::api::connect::websocket::{self, frame, unframe};
use crate::api::{RequestContext, SessionSubresource};
use crate::relay::{AgentRelay, PortConnection, PortOpen};

/// The most ports one session forwards: each is a connection through the agent.
const MAX_PORTS: usize = 32;
/// Frames queued towards the client, from all ports, before their connections wait.
const OUTPUT_FRAMES: usize = 8;
/// Chunks from the client queued towards each port's connection.
const INPUT_CHUNKS: usize = 4;

/// `PodPortForwardOptions`, as the query gives it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PortForwardOptions {
    ports: Vec<u16>,
}

impl PortForwardOptions {
    fn parse(query: &str) -> Result<Self, ApiError> {
        let options: Self = decode_query(query)?;
        if options.ports.is_empty() {
            return Err(ApiError::bad_request(
                "you must specify at least one port to forward (ports=80)",
            ));
        }
        if options.ports.contains(&0) {
            return Err(ApiError::bad_request(
                "port 0 is not a port: give 1 to 65535",
            ));
        }
        if options.ports.len() > MAX_PORTS {
            return Err(ApiError::bad_request(format!(
                "at most {MAX_PORTS} ports at once; open another session for more"
            )));
        }
        Ok(options)
    }
}

/// The `portforward` subresource of claims.
pub struct ClaimPortForward {
    pub claims: Arc<dyn ClaimSessions>,
    /// The live sessions, exec's and port-forward's, bounded together.
    pub sessions: Arc<ExecSessions>,
    pub relay: Arc<AgentRelay>,
}

impl SessionSubresource for ClaimPortForward {
    type Options = PortForwardOptions;
    type Session = Ports;
    const PROTOCOLS: &'static [Protocol] = &PROTOCOLS;

    fn options(query: &str) -> Result<PortForwardOptions, ApiError> {
        PortForwardOptions::parse(query)
    }

    /// The session forwarding `ports` of the claim `name`, if it may open: under the cap,
    /// the user the claim's Holder. Its connections are made once the WebSocket is up.
    async fn open(
        &self,
        ctx: &RequestContext,
        name: &str,
        PortForwardOptions { ports }: PortForwardOptions,
        protocol: Protocol,
    ) -> Result<Ports, ApiError> {
        let permit = self.sessions.admit()?;
        let target = self.claims.target(ctx, name, "forward a port of").await?;
        Ok(Ports {
            protocol,
            ports,
            relay: self.relay.clone(),
            guard: self.sessions.register(&target.claim.uid, permit),
            target,
        })
    }
}

/// One session's ports, and where their connections go.
pub struct Ports {
    protocol: Protocol,
    ports: Vec<u16>,
    relay: Arc<AgentRelay>,
    target: Target,
    guard: SessionGuard,
}

impl websocket::Session for Ports {
    async fn run<S>(self, ws: WebSocketStream<S>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Ports {
            protocol,
            ports,
            relay,
            target,
            guard,
        } = self;
        let (mut sink, mut stream) = ws.split();
        // As kubelet does: each channel opens with its port.
        for (i, port) in ports.iter().enumerate() {
            for channel in [data_channel(i), error_channel(i)] {
                if sink
                    .feed(frame(protocol, channel, &port_prefix(*port)))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
        if sink.flush().await.is_err() {
            return;
        }
        let (to_client, mut outgoing) = mpsc::channel(OUTPUT_FRAMES);
        let mut inputs = Vec::with_capacity(ports.len());
        for (i, port) in ports.iter().enumerate() {
            let (input, chunks) = mpsc::channel(INPUT_CHUNKS);
            inputs.push(Some(input));
            let connection = Connection {
                index: i,
                port: *port,
                protocol,
                to_client: to_client.clone(),
            };
            let (relay, target) = (relay.clone(), open_for(&target, *port));
            tokio::spawn(connection.run(relay, target, chunks));
        }
        // Once every connection has ended, `outgoing` ends.
        drop(to_client);
        // The client's bytes and the guest's each move on their own, so a client that
        // is slow to read never stops what it writes, nor the other way round.
        let to_client = async {
            while let Some(frame) = outgoing.recv().await {
                if sink.send(frame).await.is_err() {
                    return;
                }
            }
        };
        let from_client = async {
            while let Some(Ok(message)) = stream.next().await {
                if let Message::Close(_) = message {
                    return;
                }
                let Some((channel, payload)) = unframe(protocol, message) else {
                    continue;
                };
                // Only data channels carry the client's bytes; an empty frame is none.
                let index = usize::from(channel / 2);
                if channel % 2 != 0 || payload.is_empty() {
                    continue;
                }
                let Some(Some(input)) = inputs.get(index) else {
                    continue;
                };
                // A connection that ended takes no more; its error is already sent.
                if input.send(payload).await.is_err() {
                    inputs[index] = None;
                }
            }
        };
        tokio::select! {
            () = to_client => {}
            () = from_client => {}
            () = guard.ended().cancelled() => {}
            () = guard.shutting_down().cancelled() => {}
        }
        // Dropping the inputs and `outgoing` ends every connection still open.
        let _ = sink.close().await;
    }
}

fn open_for(target: &Target, port: u16) -> (String, String, PortOpen) {
    (
        target.host.clone(),
        target.agent_address.clone(),
        PortOpen {
            claim: target.claim.clone(),
            microvm_uid: target.microvm_uid.clone(),
            port,
        },
    )
}

/// One port's connection through the agent.
struct Connection {
    index: usize,
    port: u16,
    protocol: Protocol,
    to_client: mpsc::Sender<Message>,
}

impl Connection {
    async fn run(
        self,
        relay: Arc<AgentRelay>,
        (host, address, open): (String, String, PortOpen),
        mut chunks: mpsc::Receiver<Bytes>,
    ) {
        let PortConnection {
            to_guest,
            mut from_guest,
        } = match relay.open_port(&host, &address, open).await {
            Ok(port) => port,
            Err(message) => return self.fail(&message).await,
        };
        // Each direction on its own, as the session's: the client's bytes go on while the
        // guest's wait for the client, and the other way round.
        let upstream = async {
            while let Some(data) = chunks.recv().await {
                if to_guest.send(data).await.is_err() {
                    // The agent takes no more: its answer, or why, still comes.
                    std::future::pending::<()>().await;
                }
            }
            // The session is over: the connection goes with it.
        };
        let downstream = async {
            loop {
                match from_guest.next().await {
                    Ok(Some(bytes)) => {
                        let data = frame(self.protocol, data_channel(self.index), &bytes);
                        if self.to_client.send(data).await.is_err() {
                            return None;
                        }
                    }
                    // The guest closed the connection.
                    Ok(None) => return None,
                    Err(failed) => {
                        return Some(format!(
                            "the connection to port {} in the MicroVM failed: {}",
                            self.port,
                            failed.message()
                        ));
                    }
                }
            }
        };
        let failed = tokio::select! {
            () = upstream => None,
            failed = downstream => failed,
        };
        if let Some(message) = failed {
            self.fail(&message).await;
        }
    }

    /// Says on the port's error channel why its connection failed or could not be made.
    async fn fail(self, message: &str) {
        tracing::debug!(port = self.port, message, "a forwarded connection failed");
        let error = frame(self.protocol, error_channel(self.index), message.as_bytes());
        let _ = self.to_client.send(error).await;
    }
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;

    #[test]
    fn ports_are_required_and_bounded() {
        let options = PortForwardOptions::parse("ports=80&ports=443").unwrap();
        assert_eq!(options.ports, [80, 443]);
        for (query, says) in [
            ("", "at least one port"),
            ("ports=0", "port 0"),
            ("ports=65536", ""),
            ("ports=http", ""),
        ] {
            let error = PortForwardOptions::parse(query).unwrap_err();
            assert_eq!(error.code(), StatusCode::BAD_REQUEST, "{query}");
            assert!(
                error.message().contains(says),
                "{query}: {}",
                error.message()
            );
        }
        let many = vec!["ports=1"; MAX_PORTS + 1].join("&");
        assert!(PortForwardOptions::parse(&many).is_err());
    }

    #[test]
    fn each_port_has_a_data_and_an_error_channel() {
        assert_eq!((data_channel(0), error_channel(0)), (0, 1));
        assert_eq!((data_channel(3), error_channel(3)), (6, 7));
    }
}
