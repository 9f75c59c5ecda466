//! One exec session on an upgraded connection: kube's channel protocol
//! (`v4.channel.k8s.io`, `v5.channel.k8s.io`) on the WebSocket, relayed to and from the
//! agent's stream.
//!
//! Every message is a binary frame whose first byte is its channel. Backpressure holds
//! because each direction is one loop that reads the next message only once the other
//! side took the last: the WebSocket is read as fast as the relay takes stdin, the
//! relay as fast as the WebSocket is written. The session ends with the first of: the
//! exit status (sent on the error channel as the `Status` kubelet sends), the client
//! going away (the relay stream is dropped, which ends the command), or the claim being
//! released or expiring.

use std::time::Duration;

use bytes::Bytes;
use futures::{FutureExt as _, SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use battery_types::channel::{CLOSE, ERROR, Protocol, RESIZE, Resize, STDERR, STDIN, STDOUT};

use super::sessions::SessionGuard;
use crate::api::connect::websocket::{self, frame, frame_of_parts, unframe};
use crate::relay::{
    ExecInput, ExecInputs, ExecOutput, ExecOutputs, ExecSession, Exit, StreamFailed, TerminalSize,
};

/// The most output one frame carries (the agent's messages are at most 1 MiB too).
const FRAME_OUTPUT_BYTES: usize = 1024 * 1024;
/// How long a client gets to answer our close before the connection is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// Which streams the client attached.
#[derive(Clone, Copy, Debug)]
pub struct Attached {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
}

impl Attached {
    /// Itself, if it attaches anything: a session of no stream is refused, as kubelet
    /// refuses one.
    pub fn required(self) -> Result<Self, battery_api_machinery::status::ApiError> {
        if self.stdin || self.stdout || self.stderr {
            Ok(self)
        } else {
            Err(battery_api_machinery::status::ApiError::bad_request(
                "you must specify at least 1 of stdin, stdout, stderr",
            ))
        }
    }
}

/// What the session is, for the messages it ends with.
pub struct Session {
    pub protocol: Protocol,
    pub attached: Attached,
    /// Whether the command runs on a terminal, whose resizes are relayed.
    pub tty: bool,
    /// `[argv...]`, as kubelet names a command in its messages.
    pub command: String,
    pub relay: ExecSession,
    pub guard: SessionGuard,
}

/// The `Status` kubelet writes on the error channel for an exit code.
pub fn exit_status(command: &str, code: i32) -> Value {
    if code == 0 {
        return json!({"metadata": {}, "status": "Success"});
    }
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!(
            "command terminated with non-zero exit code: command {command} exited with {code}"
        ),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
}

/// An exec that did not end with an exit code.
pub fn failure(message: String) -> Value {
    json!({
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "InternalError",
        "code": 500,
    })
}

impl websocket::Session for Session {
    const BULK_OUTPUT: bool = true;

    async fn run<S>(self, ws: WebSocketStream<S>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Session {
            protocol,
            attached,
            tty,
            command,
            relay,
            guard,
        } = self;
        let ExecSession {
            input: requests,
            output: mut responses,
        } = relay;
        let (mut sink, mut stream) = ws.split();
        // As kubelet does: an empty frame on the lowest channel the client reads tells
        // it the session is established.
        let first = if attached.stdout {
            STDOUT
        } else if attached.stderr {
            STDERR
        } else {
            ERROR
        };
        if sink.send(frame(protocol, first, &[])).await.is_err() {
            return;
        }
        let ending = tokio::select! {
            ending = from_agent(&mut sink, &mut responses, protocol, &command) => ending,
            () = to_agent(&mut stream, &requests, protocol, attached.stdin, tty) => None,
            () = guard.ended().cancelled() => Some(failure(format!(
                "command {command} was ended: its claim was released or has expired"
            ))),
            () = guard.shutting_down().cancelled() => Some(failure(format!(
                "command {command} was ended: the API server is shutting down; run it again"
            ))),
        };
        // Dropping the relay stream resets it, which ends the command if it still runs.
        drop((requests, responses));
        let Some(status) = ending else {
            return;
        };
        let _ = sink
            .send(frame(protocol, ERROR, status.to_string().as_bytes()))
            .await;
        let _ = sink
            .send(Message::Close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            })))
            .await;
        // Let the client answer the close, so it sees a clean end rather than a reset.
        let _ = tokio::time::timeout(CLOSE_GRACE, async {
            while let Some(Ok(_)) = stream.next().await {}
        })
        .await;
    }
}

/// What one message from the agent is to the client.
enum Output {
    /// Output on a channel.
    Chunk(u8, Bytes),
    /// The `Status` the session ends with.
    End(Value),
}

impl Output {
    fn of(next: Result<Option<ExecOutput>, StreamFailed>, command: &str) -> Self {
        let message = match next {
            Ok(Some(output)) => output,
            Ok(None) => {
                return Self::End(failure(format!(
                    "command {command} did not finish: the exec agent ended the session \
                     without an exit status"
                )));
            }
            Err(failed) => {
                return Self::End(failure(format!(
                    "command {command} did not finish: the exec agent's stream failed: {failed}"
                )));
            }
        };
        match message {
            ExecOutput::Stdout(bytes) => Self::Chunk(STDOUT, bytes),
            ExecOutput::Stderr(bytes) => Self::Chunk(STDERR, bytes),
            ExecOutput::Exit(exit) => Self::End(match exit {
                Exit::Code(code) => exit_status(command, code),
                Exit::Error(error) => {
                    failure(format!("error executing command {command}: {error}"))
                }
                Exit::Unknown => failure(format!(
                    "command {command} did not finish: the exec agent sent an empty exit status"
                )),
            }),
        }
    }
}

/// Relays the agent's output to the client; the `Status` to end with, or `None` when
/// the client went away.
async fn from_agent<W>(
    sink: &mut W,
    responses: &mut ExecOutputs,
    protocol: Protocol,
    command: &str,
) -> Option<Value>
where
    W: futures::Sink<Message> + Unpin,
{
    // A message read while filling a frame that could not join it.
    let mut read_ahead = None;
    loop {
        // Output already in is queued behind what is being written; the WebSocket is
        // flushed only before waiting for more, so bulk output leaves in large writes.
        let output = match read_ahead.take() {
            Some(output) => output,
            None => {
                let next = match responses.next().now_or_never() {
                    Some(next) => next,
                    None => {
                        if sink.flush().await.is_err() {
                            return None;
                        }
                        responses.next().await
                    }
                };
                Output::of(next, command)
            }
        };
        let (channel, first) = match output {
            Output::Chunk(channel, bytes) => (channel, bytes),
            Output::End(status) => return Some(status),
        };
        // Output of the same channel already in joins this frame: bulk output then costs
        // a frame per batch, not per agent message, at both ends.
        let mut size = first.len();
        let mut parts = vec![first];
        while let Some(next) = responses.next().now_or_never() {
            match Output::of(next, command) {
                Output::Chunk(next_channel, bytes)
                    if next_channel == channel && size + bytes.len() <= FRAME_OUTPUT_BYTES =>
                {
                    size += bytes.len();
                    parts.push(bytes);
                }
                other => {
                    read_ahead = Some(other);
                    break;
                }
            }
        }
        // Waits while the client is slow: the agent, then the command, wait with it.
        if sink
            .feed(frame_of_parts(protocol, channel, &parts))
            .await
            .is_err()
        {
            return None;
        }
    }
}

/// Relays the client's stdin (and, in v5, its end) and, on a terminal, its resizes to
/// the agent; returns when the client closes or goes away.
async fn to_agent<R>(
    stream: &mut R,
    requests: &ExecInputs,
    protocol: Protocol,
    stdin: bool,
    tty: bool,
) where
    R: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    // Once the agent takes no more (the command exited), the client's messages are read
    // and dropped until the exit status ends the session.
    let mut open = true;
    while let Some(Ok(message)) = stream.next().await {
        if let Message::Close(_) = message {
            return;
        }
        // Pings are answered by the WebSocket itself.
        let Some((channel, payload)) = unframe(protocol, message) else {
            continue;
        };
        let request = match channel {
            // Clients may open with an empty frame per channel.
            STDIN if payload.is_empty() || !stdin => continue,
            STDIN => ExecInput::Stdin(payload),
            CLOSE if protocol == Protocol::V5 && payload.first() == Some(&STDIN) && stdin => {
                ExecInput::StdinEof
            }
            // A size that does not read is dropped, as kubelet drops it.
            RESIZE if tty => match terminal_size(&payload) {
                Some(size) => ExecInput::Resize(size),
                None => continue,
            },
            // Without a terminal there is nothing to resize. Anything else is not ours.
            _ => continue,
        };
        if open {
            open = requests.send(request).await.is_ok();
        }
    }
}

/// A resize message's size: kubectl's `{"Width": 80, "Height": 24}`.
fn terminal_size(payload: &[u8]) -> Option<TerminalSize> {
    let Resize { width, height } = Resize::parse(payload)?;
    Some(TerminalSize {
        width: width.into(),
        height: height.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resize_reads_as_kubectl_writes_it() {
        assert_eq!(
            terminal_size(br#"{"Width":120,"Height":40}"#),
            Some(TerminalSize {
                width: 120,
                height: 40
            })
        );
        assert_eq!(terminal_size(b"120x40"), None);
        assert_eq!(terminal_size(br#"{"Width":-1,"Height":40}"#), None);
    }

    #[test]
    fn exit_statuses_are_kubelets() {
        assert_eq!(
            exit_status("[true]", 0).to_string(),
            r#"{"metadata":{},"status":"Success"}"#
        );
        let failed = exit_status("[sh -c exit 3]", 3);
        assert_eq!(failed["status"], "Failure");
        assert_eq!(failed["reason"], "NonZeroExitCode");
        assert_eq!(
            failed["details"]["causes"],
            json!([{"reason": "ExitCode", "message": "3"}])
        );
        assert_eq!(
            failed["message"],
            "command terminated with non-zero exit code: command [sh -c exit 3] exited with 3"
        );
    }
}
