//! The `battery.agent.v1alpha1.Relay` service: each `Exec` stream from the API server
//! becomes one `ExecCommand` stream to flintlockd, relayed in both directions; one with a
//! terminal becomes an SSH session over flintlockd's SSH proxy instead ([`crate::terminal`]).
//!
//! Backpressure holds end to end because every hop is bounded: stdin moves through a
//! channel of [`STDIN_BUFFER`] messages and output through one of [`OUTPUT_BUFFER`], and
//! the agent reads the next message from one side only once the other side has taken the
//! last. A client that stops reading stops the agent reading flintlockd, whose window
//! fills, which stops the command at a full pipe. Nothing is dropped or reordered: each
//! direction is one task reading and writing in order.
//!
//! The session ends with the first of: flintlockd's exit code, flintlockd's stream
//! failing (reported as an exit error, never as success), or the API server's stream
//! going away, which drops the flintlockd stream; flintlockd then ends the command.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use battery_proto::agent::v1alpha1::relay_server::Relay;
use battery_proto::agent::v1alpha1::{
    self as pb, ClaimRef, ExecOpen, ExecRequest, ListProcessesRequest, PortForwardRequest,
    StartProcessRequest, StopProcessRequest, exec_request, exec_response, exit_status,
    port_forward_request,
};
use battery_proto::microvmexec::services::api::v1alpha1::exec_command_request::Payload as FlintlockRequest;
use battery_proto::microvmexec::services::api::v1alpha1::exec_command_response::Payload as FlintlockResponse;
use battery_proto::microvmexec::services::api::v1alpha1::{
    ExecCommandRequest, ExecCommandResponse, ExecStart,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::AbortOnDropHandle;
use tonic::{Request, Response, Status, Streaming};
use tracing::{Instrument as _, debug, info, info_span, warn};

use crate::exec_reply::{Reply, exit, output};
use crate::flintlock::Flintlock;
use crate::forward;
use crate::processes::Processes;
use crate::ssh::{self, Logins, OpenError, Opened, SshIdentity};

/// stdin messages queued towards flintlockd before the agent stops reading the client.
pub const STDIN_BUFFER: usize = 4;
/// Output messages queued towards the client before the agent stops reading flintlockd.
pub const OUTPUT_BUFFER: usize = 4;
/// How long the client may take to send `open`, and flintlockd to accept the session
/// (EA-021's exec-open-timeout).
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// The relay, one per agent.
#[derive(Clone, Debug)]
pub struct RelayService {
    flintlock: Flintlock,
    /// One permit per session relayed, held until it ends.
    sessions: Arc<Semaphore>,
    /// The SSH connections to guests that terminals and forwarded ports are channels on.
    logins: Logins,
    /// The Host's background processes.
    processes: Processes,
}

impl RelayService {
    pub fn new(
        flintlock: Flintlock,
        max_sessions: NonZeroUsize,
        ssh: Arc<SshIdentity>,
        processes: Processes,
    ) -> Self {
        Self {
            logins: Logins::new(flintlock.clone(), ssh),
            flintlock,
            sessions: Arc::new(Semaphore::new(max_sessions.get())),
            processes,
        }
    }
}

#[tonic::async_trait]
impl Relay for RelayService {
    type ExecStream = ReceiverStream<Reply>;

    async fn exec(
        &self,
        request: Request<Streaming<ExecRequest>>,
    ) -> Result<Response<Self::ExecStream>, Status> {
        let permit = self.admit()?;
        let mut inbound = request.into_inner();
        let first = first_message(&mut inbound).await?;
        let Some(ExecRequest {
            payload: Some(exec_request::Payload::Open(open)),
        }) = first
        else {
            return Err(Status::invalid_argument(
                "the first message of an exec session must be `open`",
            ));
        };
        let session = Session::new(open)?;
        let span = info_span!(
            "exec",
            claim = %session.claim,
            microvm = %session.microvm_uid,
        );
        if session.tty {
            // Opened before answering, so a guest that refuses is refused here, before
            // the API server upgrades its client's connection.
            let opened = self
                .open(self.logins.open_session(&session.microvm_uid), &span)
                .await
                .map_err(|error| match error {
                    OpenError::Login(status) => status,
                    OpenError::Channel(error) => {
                        Status::unavailable(format!("a session in the MicroVM's sshd: {error}"))
                    }
                })?;
            debug!(parent: &span, "terminal session opened");
            let command = ssh::command_line(&session.command, &session.env, &session.working_dir);
            let (replies, stream) = mpsc::channel(OUTPUT_BUFFER);
            tokio::spawn(
                async move {
                    crate::terminal::relay(opened, command, inbound, replies).await;
                    drop(permit);
                }
                .instrument(span),
            );
            return Ok(Response::new(ReceiverStream::new(stream)));
        }
        let (to_flintlock, requests) = mpsc::channel(STDIN_BUFFER);
        // Room for one is guaranteed: the channel is new.
        if to_flintlock.try_send(session.start()).is_err() {
            return Err(Status::internal("queueing the exec start failed"));
        }
        let opened = tokio::time::timeout(
            OPEN_TIMEOUT,
            self.flintlock.exec(ReceiverStream::new(requests)),
        )
        .instrument(span.clone())
        .await;
        let from_flintlock = match opened {
            Ok(Ok(responses)) => responses,
            Ok(Err(status)) => {
                info!(parent: &span, %status, "flintlockd refused the exec");
                return Err(Status::new(
                    status.code(),
                    format!("flintlockd: {}", status.message()),
                ));
            }
            Err(_) => {
                info!(parent: &span, "flintlockd did not accept the exec in time");
                return Err(Status::deadline_exceeded(format!(
                    "flintlockd did not accept the exec within {}s",
                    OPEN_TIMEOUT.as_secs()
                )));
            }
        };
        debug!(parent: &span, "exec opened");
        let (replies, stream) = mpsc::channel(OUTPUT_BUFFER);
        let relayed = relay(
            session.attached,
            inbound,
            to_flintlock,
            from_flintlock,
            replies,
        );
        tokio::spawn(
            async move {
                relayed.await;
                drop(permit);
            }
            .instrument(span),
        );
        Ok(Response::new(ReceiverStream::new(stream)))
    }

    type PortForwardStream = ReceiverStream<forward::Reply>;

    async fn port_forward(
        &self,
        request: Request<Streaming<PortForwardRequest>>,
    ) -> Result<Response<Self::PortForwardStream>, Status> {
        let permit = self.admit()?;
        let mut inbound = request.into_inner();
        let Some(PortForwardRequest {
            payload: Some(port_forward_request::Payload::Open(open)),
        }) = first_message(&mut inbound).await?
        else {
            return Err(Status::invalid_argument(
                "the first message of a port-forward stream must be `open`",
            ));
        };
        let port = u16::try_from(open.port)
            .ok()
            .filter(|port| *port != 0)
            .ok_or_else(|| {
                Status::invalid_argument(format!("open.port {} is not 1 to 65535", open.port))
            })?;
        if open.microvm_uid.is_empty() {
            return Err(Status::invalid_argument("open.microvm_uid is required"));
        }
        let span = info_span!(
            "port_forward",
            claim = %claim_name(open.claim.as_ref()),
            microvm = %open.microvm_uid,
            port,
        );
        let opened = self
            .open(self.logins.open_port(&open.microvm_uid, port), &span)
            .await
            .map_err(|error| match error {
                OpenError::Login(status) => status,
                OpenError::Channel(error) => {
                    info!(parent: &span, %error, "the guest refused the connection");
                    Status::failed_precondition(format!(
                        "connecting to port {port} in the MicroVM: {error} (is anything \
                         listening on 127.0.0.1:{port} there?)"
                    ))
                }
            })?;
        debug!(parent: &span, "connection opened");
        let (replies, stream) = mpsc::channel(OUTPUT_BUFFER);
        tokio::spawn(
            async move {
                forward::relay(opened, inbound, replies).await;
                drop(permit);
            }
            .instrument(span),
        );
        Ok(Response::new(ReceiverStream::new(stream)))
    }

    async fn start_process(
        &self,
        request: Request<StartProcessRequest>,
    ) -> Result<Response<pb::Process>, Status> {
        self.processes
            .start(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_processes(
        &self,
        request: Request<ListProcessesRequest>,
    ) -> Result<Response<pb::ProcessList>, Status> {
        let items = self.processes.list(&request.into_inner().namespace);
        Ok(Response::new(pb::ProcessList { items }))
    }

    type AttachProcessStream = ReceiverStream<Reply>;

    async fn attach_process(
        &self,
        request: Request<Streaming<ExecRequest>>,
    ) -> Result<Response<Self::AttachProcessStream>, Status> {
        let permit = self.admit()?;
        let mut inbound = request.into_inner();
        let Some(ExecRequest {
            payload: Some(exec_request::Payload::Attach(open)),
        }) = first_message(&mut inbound).await?
        else {
            return Err(Status::invalid_argument(
                "the first message of an attach must be `attach`",
            ));
        };
        let stream = self.processes.attach(open, inbound, permit)?;
        Ok(Response::new(stream))
    }

    async fn stop_process(
        &self,
        request: Request<StopProcessRequest>,
    ) -> Result<Response<pb::Process>, Status> {
        self.processes
            .stop(request.into_inner(), false)
            .map(Response::new)
    }

    async fn delete_process(
        &self,
        request: Request<StopProcessRequest>,
    ) -> Result<Response<pb::Process>, Status> {
        self.processes
            .stop(request.into_inner(), true)
            .map(Response::new)
    }

    async fn replace_process_object(
        &self,
        request: Request<pb::ReplaceProcessObjectRequest>,
    ) -> Result<Response<pb::Process>, Status> {
        let request = request.into_inner();
        let process = request.process.unwrap_or_default();
        let key = (process.namespace, process.name);
        let replaced = self.processes.replace_object(&key, request.object)?;
        Ok(Response::new(replaced))
    }

    async fn forget_claim_processes(
        &self,
        request: Request<ClaimRef>,
    ) -> Result<Response<pb::ForgetClaimProcessesResponse>, Status> {
        self.processes.forget_claim(&request.into_inner().uid);
        Ok(Response::new(pb::ForgetClaimProcessesResponse {}))
    }
}

impl RelayService {
    /// A slot under `--max-sessions`, held until the session ends.
    fn admit(&self) -> Result<OwnedSemaphorePermit, Status> {
        self.sessions.clone().try_acquire_owned().map_err(|_| {
            Status::resource_exhausted(
                "the agent relays as many sessions as --max-sessions allows; retry later",
            )
        })
    }

    /// A channel into the MicroVM, logged in first when needed, within [`OPEN_TIMEOUT`].
    async fn open(
        &self,
        opening: impl Future<Output = Result<Opened, OpenError>>,
        span: &tracing::Span,
    ) -> Result<Opened, OpenError> {
        tokio::time::timeout(OPEN_TIMEOUT, opening)
            .instrument(span.clone())
            .await
            .map_err(|_| {
                OpenError::Login(Status::deadline_exceeded(format!(
                    "the MicroVM's sshd did not accept the agent within {}s",
                    OPEN_TIMEOUT.as_secs()
                )))
            })?
            .inspect_err(|error| {
                if let OpenError::Login(status) = error {
                    info!(parent: span, %status, "no SSH login to the guest");
                }
            })
    }
}

/// A stream's first message: a client that never says what it wants must not hold a
/// handler forever.
async fn first_message<T: prost::Message + Default>(
    inbound: &mut Streaming<T>,
) -> Result<Option<T>, Status> {
    tokio::time::timeout(OPEN_TIMEOUT, inbound.message())
        .await
        .map_err(|_| {
            Status::deadline_exceeded(format!(
                "no `open` within {}s of the stream starting",
                OPEN_TIMEOUT.as_secs()
            ))
        })?
}

/// A claim as the logs name it.
fn claim_name(claim: Option<&ClaimRef>) -> String {
    claim.map_or_else(
        || "<none>".to_owned(),
        |ClaimRef {
             namespace,
             name,
             uid,
         }| format!("{namespace}/{name} ({uid})"),
    )
}

/// Which streams the client attached.
#[derive(Clone, Copy, Debug)]
struct Attached {
    stdin: bool,
    stdout: bool,
    stderr: bool,
}

/// A validated `open`.
struct Session {
    claim: String,
    microvm_uid: String,
    command: Vec<String>,
    env: std::collections::HashMap<String, String>,
    working_dir: String,
    attached: Attached,
    tty: bool,
}

impl Session {
    fn new(open: ExecOpen) -> Result<Self, Status> {
        if open.microvm_uid.is_empty() {
            return Err(Status::invalid_argument("open.microvm_uid is required"));
        }
        if open.command.first().is_none_or(String::is_empty) {
            return Err(Status::invalid_argument(
                "open.command needs at least the program to run",
            ));
        }
        let claim = claim_name(open.claim.as_ref());
        Ok(Self {
            claim,
            microvm_uid: open.microvm_uid,
            command: open.command,
            env: open.env,
            working_dir: open.working_dir,
            attached: Attached {
                stdin: open.stdin,
                stdout: open.stdout,
                stderr: open.stderr,
            },
            tty: open.tty,
        })
    }

    /// flintlock's `start`: argv as is, never through a shell, as `pods/exec` runs it.
    fn start(&self) -> ExecCommandRequest {
        let mut argv = self.command.iter().cloned();
        ExecCommandRequest {
            payload: Some(FlintlockRequest::Start(ExecStart {
                uid: self.microvm_uid.clone(),
                cmd: argv.next().unwrap_or_default(),
                args: argv.collect(),
                cwd: self.working_dir.clone(),
                env: self.env.clone(),
                shell: false,
                has_stdin: self.attached.stdin,
                ..ExecStart::default()
            })),
        }
    }
}

/// Runs one opened session to its end. Returning drops the flintlockd stream and the
/// stdin task, which resets the stream, so every way out ends the command.
async fn relay(
    attached: Attached,
    inbound: Streaming<ExecRequest>,
    to_flintlock: mpsc::Sender<ExecCommandRequest>,
    mut from_flintlock: Streaming<ExecCommandResponse>,
    replies: mpsc::Sender<Reply>,
) {
    // Its own task, so stdin keeps moving while output waits for the client, as a pipe
    // would: a command may read all its input before it writes.
    let mut stdin = AbortOnDropHandle::new(tokio::spawn(
        forward_stdin(inbound, to_flintlock, attached.stdin).in_current_span(),
    ));
    let mut stdin_done = false;
    // flintlockd's `error` messages, which come before the exit code when the command
    // could not run.
    let mut errors: Vec<String> = Vec::new();
    loop {
        tokio::select! {
            biased;
            () = replies.closed() => {
                debug!("the API server's stream went away; ending the command");
                return;
            }
            ended = &mut stdin, if !stdin_done => {
                stdin_done = true;
                match ended {
                    Ok(StdinEnd::Done) => {}
                    Ok(StdinEnd::Invalid(status)) => {
                        info!(%status, "invalid exec request; ending the command");
                        // Best effort: the client broke the protocol and may not read.
                        let _ = replies.try_send(Err(status));
                        return;
                    }
                    Ok(StdinEnd::ClientGone) => {
                        debug!("the API server's stream broke; ending the command");
                        return;
                    }
                    Err(error) => {
                        warn!(%error, "the stdin task failed; ending the command");
                        return;
                    }
                }
            }
            message = from_flintlock.message() => {
                let reply = match message {
                    Ok(Some(ExecCommandResponse { payload })) => match payload {
                        Some(FlintlockResponse::Stdout(bytes)) if attached.stdout => {
                            output(exec_response::Payload::Stdout(bytes))
                        }
                        Some(FlintlockResponse::Stderr(bytes)) if attached.stderr => {
                            output(exec_response::Payload::Stderr(bytes))
                        }
                        // The client did not attach this stream.
                        Some(FlintlockResponse::Stdout(_) | FlintlockResponse::Stderr(_)) => continue,
                        Some(FlintlockResponse::Error(message)) => {
                            errors.push(message);
                            continue;
                        }
                        Some(FlintlockResponse::ExitCode(code)) => {
                            let outcome = if errors.is_empty() {
                                exit_status::Outcome::Code(code)
                            } else {
                                exit_status::Outcome::Error(errors.join("; "))
                            };
                            debug!(?outcome, "command ended");
                            let _ = replies.send(exit(outcome)).await;
                            return;
                        }
                        // A payload this agent does not know, from a newer flintlockd.
                        None => continue,
                    },
                    Ok(None) => {
                        warn!("flintlockd ended the exec stream without an exit code");
                        let _ = replies
                            .send(exit(exit_status::Outcome::Error(
                                "flintlockd ended the stream without an exit code".to_owned(),
                            )))
                            .await;
                        return;
                    }
                    Err(status) => {
                        warn!(%status, "flintlockd's exec stream failed");
                        let _ = replies
                            .send(exit(exit_status::Outcome::Error(format!(
                                "flintlockd: {}",
                                status.message()
                            ))))
                            .await;
                        return;
                    }
                };
                if replies.send(reply).await.is_err() {
                    debug!("the API server's stream went away; ending the command");
                    return;
                }
            }
        }
    }
}

/// How the client's side of a session ended.
enum StdinEnd {
    /// It half-closed, or flintlockd stopped taking stdin: the response side decides.
    Done,
    Invalid(Status),
    ClientGone,
}

/// Relays the client's stdin and its EOF to flintlockd, one message at a time: the next
/// is read from the client only once flintlockd's queue has room for it. Dropping
/// `to_flintlock` on return half-closes flintlockd's side, which closes stdin too.
async fn forward_stdin(
    mut inbound: Streaming<ExecRequest>,
    to_flintlock: mpsc::Sender<ExecCommandRequest>,
    stdin_attached: bool,
) -> StdinEnd {
    loop {
        let payload = match inbound.message().await {
            Ok(Some(ExecRequest { payload })) => payload,
            Ok(None) => return StdinEnd::Done,
            Err(status) => {
                debug!(%status, "the API server's exec stream broke");
                return StdinEnd::ClientGone;
            }
        };
        let forwarded = match payload {
            Some(exec_request::Payload::Stdin(bytes)) if stdin_attached => {
                FlintlockRequest::Stdin(bytes)
            }
            Some(exec_request::Payload::Stdin(_)) => {
                return StdinEnd::Invalid(Status::invalid_argument(
                    "stdin sent, but `open` did not attach stdin",
                ));
            }
            Some(exec_request::Payload::StdinEof(_)) => FlintlockRequest::StdinEof(true),
            Some(exec_request::Payload::Resize(_)) => {
                return StdinEnd::Invalid(Status::invalid_argument(
                    "a resize sent, but `open` asked for no terminal",
                ));
            }
            Some(exec_request::Payload::Open(_) | exec_request::Payload::Attach(_)) => {
                return StdinEnd::Invalid(Status::invalid_argument(
                    "only the first message of an exec session may be `open`",
                ));
            }
            None => {
                return StdinEnd::Invalid(Status::invalid_argument(
                    "an exec request carries no payload",
                ));
            }
        };
        let request = ExecCommandRequest {
            payload: Some(forwarded),
        };
        if to_flintlock.send(request).await.is_err() {
            return StdinEnd::Done;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(command: &[&str]) -> ExecOpen {
        ExecOpen {
            microvm_uid: "u".into(),
            command: command.iter().map(|arg| (*arg).to_owned()).collect(),
            stdin: true,
            ..ExecOpen::default()
        }
    }

    #[test]
    fn argv_becomes_cmd_and_args_without_a_shell() {
        let session = Session::new(ExecOpen {
            working_dir: "/srv".into(),
            ..open(&["sh", "-c", "exit 3"])
        })
        .expect("valid");
        let Some(FlintlockRequest::Start(start)) = session.start().payload else {
            panic!("not a start");
        };
        assert_eq!(start.uid, "u");
        assert_eq!(start.cmd, "sh");
        assert_eq!(start.args, ["-c", "exit 3"]);
        assert_eq!(start.cwd, "/srv");
        assert!(!start.shell);
        assert!(start.has_stdin);
    }

    #[test]
    fn open_needs_a_program_and_a_microvm() {
        for bad in [
            open(&[]),
            open(&[""]),
            ExecOpen {
                microvm_uid: String::new(),
                ..open(&["true"])
            },
        ] {
            let status = Session::new(bad).err().expect("invalid");
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
        }
    }
}
