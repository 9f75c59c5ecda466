//! What crosses the relay's edge, in our own types: what a session or a forwarded port is
//! opened with, what goes to the agent and what comes back, the exit status decoded here
//! once. Only this module and its parent know the relay's messages.

use std::collections::HashMap;
use std::fmt;

use battery_proto::agent::v1alpha1::{
    self as pb, ExecRequest, ExecResponse, PortForwardRequest, PortForwardResponse, exec_request,
    exec_response, exit_status, port_forward_request,
};
use bytes::Bytes;
use tokio::sync::mpsc;

use battery_telemetry::error_chain;

/// The claim a session is for: the agent checks it against the MicroVM it runs on.
#[derive(Clone, Debug)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl From<ClaimRef> for pb::ClaimRef {
    fn from(
        ClaimRef {
            namespace,
            name,
            uid,
        }: ClaimRef,
    ) -> Self {
        Self {
            namespace,
            name,
            uid,
        }
    }
}

/// A command to run in a MicroVM, and the streams it is given.
pub struct ExecOpen {
    pub claim: ClaimRef,
    pub microvm_uid: String,
    pub command: Vec<String>,
    pub env: HashMap<String, String>,
    pub working_dir: String,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl From<ExecOpen> for pb::ExecOpen {
    fn from(open: ExecOpen) -> Self {
        Self {
            claim: Some(open.claim.into()),
            microvm_uid: open.microvm_uid,
            command: open.command,
            env: open.env,
            working_dir: open.working_dir,
            stdin: open.stdin,
            stdout: open.stdout,
            stderr: open.stderr,
            tty: open.tty,
        }
    }
}

/// A port of a MicroVM to connect to.
pub struct PortOpen {
    pub claim: ClaimRef,
    pub microvm_uid: String,
    pub port: u16,
}

impl From<PortOpen> for pb::PortForwardOpen {
    fn from(open: PortOpen) -> Self {
        Self {
            claim: Some(open.claim.into()),
            microvm_uid: open.microvm_uid,
            port: open.port.into(),
        }
    }
}

/// A terminal's size in characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TerminalSize {
    pub width: u32,
    pub height: u32,
}

/// What goes to a command.
pub enum ExecInput {
    Stdin(Bytes),
    /// The client will write no more to stdin.
    StdinEof,
    /// The client's terminal changed size.
    Resize(TerminalSize),
}

/// What comes from a command: its output, and last how it ended.
pub enum ExecOutput {
    Stdout(Bytes),
    Stderr(Bytes),
    Exit(Exit),
}

/// How a command ended.
pub enum Exit {
    Code(i32),
    /// The command could not be run, in the agent's words.
    Error(String),
    /// An exit status that says neither (from an agent newer than us).
    Unknown,
}

/// The agent takes no more: the session or the connection is over.
#[derive(Debug)]
pub struct Closed;

/// The relay stream failed; its text is for a person (code, message and causes).
#[derive(Debug)]
pub struct StreamFailed(tonic::Status);

impl StreamFailed {
    /// The agent's own message, without code or causes.
    pub fn message(&self) -> &str {
        self.0.message()
    }
}

impl fmt::Display for StreamFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&describe(&self.0))
    }
}

/// A session the agent accepted.
pub struct ExecSession {
    /// stdin chunks, its end and resizes, in order.
    pub input: ExecInputs,
    /// stdout, stderr and, last, the exit status.
    pub output: ExecOutputs,
}

/// The sending half of a session; sending waits while the agent is behind.
pub struct ExecInputs(pub(super) mpsc::Sender<ExecRequest>);

impl ExecInputs {
    pub async fn send(&self, input: ExecInput) -> Result<(), Closed> {
        let payload = match input {
            ExecInput::Stdin(bytes) => exec_request::Payload::Stdin(bytes),
            ExecInput::StdinEof => exec_request::Payload::StdinEof(pb::StdinEof {}),
            ExecInput::Resize(TerminalSize { width, height }) => {
                exec_request::Payload::Resize(pb::TerminalSize { width, height })
            }
        };
        let request = ExecRequest {
            payload: Some(payload),
        };
        self.0.send(request).await.map_err(|_| Closed)
    }
}

/// The receiving half of a session.
pub struct ExecOutputs(pub(super) tonic::Streaming<ExecResponse>);

impl ExecOutputs {
    /// The next output; `None` when the agent ended the stream. A message this server
    /// does not know is skipped.
    pub async fn next(&mut self) -> Result<Option<ExecOutput>, StreamFailed> {
        loop {
            let Some(response) = self.0.message().await.map_err(StreamFailed)? else {
                return Ok(None);
            };
            let output = match response.payload {
                Some(exec_response::Payload::Stdout(bytes)) => ExecOutput::Stdout(bytes),
                Some(exec_response::Payload::Stderr(bytes)) => ExecOutput::Stderr(bytes),
                Some(exec_response::Payload::Exit(pb::ExitStatus { outcome })) => {
                    ExecOutput::Exit(match outcome {
                        Some(exit_status::Outcome::Code(code)) => Exit::Code(code),
                        Some(exit_status::Outcome::Error(error)) => Exit::Error(error),
                        None => Exit::Unknown,
                    })
                }
                None => continue,
            };
            return Ok(Some(output));
        }
    }
}

/// A forwarded connection the agent made.
pub struct PortConnection {
    /// Bytes for the guest's port; dropping it ends the connection's writing side.
    pub to_guest: PortWriter,
    /// The guest's bytes; the stream ends when the guest closes.
    pub from_guest: PortReader,
}

pub struct PortWriter(pub(super) mpsc::Sender<PortForwardRequest>);

impl PortWriter {
    pub async fn send(&self, data: Bytes) -> Result<(), Closed> {
        let request = PortForwardRequest {
            payload: Some(port_forward_request::Payload::Data(data)),
        };
        self.0.send(request).await.map_err(|_| Closed)
    }
}

pub struct PortReader(pub(super) tonic::Streaming<PortForwardResponse>);

impl PortReader {
    /// The guest's next bytes; `None` when it closed the connection.
    pub async fn next(&mut self) -> Result<Option<Bytes>, StreamFailed> {
        let response = self.0.message().await.map_err(StreamFailed)?;
        Ok(response.map(|response| response.data))
    }
}

/// A relay failure for a person: its code, message and causes (a TLS refusal is only in
/// the causes).
pub(super) fn describe(status: &tonic::Status) -> String {
    let mut text = format!("{:?}: {}", status.code(), status.message());
    if let Some(source) = std::error::Error::source(status) {
        text.push_str(": ");
        text.push_str(&error_chain(source));
    }
    text
}
