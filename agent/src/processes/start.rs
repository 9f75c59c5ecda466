//! Starting a background process: argv through `sh`, which writes its pid (what a stop
//! signals) as the first line of stdout and then `exec`s the command as given, so the
//! pid is the command's own; then the follower takes over.

use std::sync::Arc;
use std::time::Duration;

use battery_proto::Bytes;
use battery_proto::agent::v1alpha1::{self as pb, StartProcessRequest};
use battery_proto::microvmexec::services::api::v1alpha1::exec_command_request::Payload as FlintlockRequest;
use battery_proto::microvmexec::services::api::v1alpha1::exec_command_response::Payload as FlintlockResponse;
use battery_proto::microvmexec::services::api::v1alpha1::{
    ExecCommandRequest, ExecCommandResponse, ExecStart,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::AbortOnDropHandle;
use tonic::{Status, Streaming};
use tracing::{Instrument as _, info_span};

use super::follow::follow;
use super::live::Live;
use super::output::Stream;
use super::record::{Claim, Record, State, now};
use super::table::{Key, Processes};

/// How long flintlockd may take to accept the command and the guest's `sh` to write
/// its pid.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// stdin messages queued towards flintlockd before an attach waits.
const STDIN_BUFFER: usize = 4;
/// The wrapper: `$$` is `sh`'s pid, which `exec` hands to the command.
const WRAPPER: &str = "echo $$; exec \"$@\"";
/// The most the pid line may take.
const PID_LINE_BYTES: usize = 32;

/// What was asked, checked.
struct Start {
    key: Key,
    claim: Claim,
    microvm_uid: String,
    object: String,
    start: ExecStart,
    stdin: bool,
}

fn checked(request: StartProcessRequest) -> Result<Start, Status> {
    let process = request.process.unwrap_or_default();
    let claim = request.claim.unwrap_or_default();
    if process.namespace.is_empty() || process.name.is_empty() {
        return Err(Status::invalid_argument(
            "process.namespace and process.name are required",
        ));
    }
    if request.microvm_uid.is_empty() || claim.uid.is_empty() {
        return Err(Status::invalid_argument(
            "microvm_uid and claim.uid are required",
        ));
    }
    if request.command.first().is_none_or(String::is_empty) {
        return Err(Status::invalid_argument("command needs a program"));
    }
    let args = ["-c", WRAPPER, "sh"]
        .into_iter()
        .map(str::to_owned)
        .chain(request.command)
        .collect();
    Ok(Start {
        key: (process.namespace, process.name),
        claim: Claim {
            namespace: claim.namespace,
            name: claim.name,
            uid: claim.uid,
        },
        start: ExecStart {
            uid: request.microvm_uid.clone(),
            cmd: "sh".to_owned(),
            args,
            cwd: request.working_dir,
            env: request.env,
            shell: false,
            has_stdin: request.stdin,
            ..ExecStart::default()
        },
        microvm_uid: request.microvm_uid,
        object: request.object,
        stdin: request.stdin,
    })
}

impl Processes {
    /// Starts a process and answers once its pid is known.
    pub async fn start(&self, request: StartProcessRequest) -> Result<pb::Process, Status> {
        let start = checked(request)?;
        self.check_room(&start.key)?;
        let span = info_span!("process", namespace = %start.key.0, name = %start.key.1);
        let (requests, queue) = mpsc::channel(STDIN_BUFFER);
        // The queue is new, so there is room for the start.
        requests
            .try_send(ExecCommandRequest {
                payload: Some(FlintlockRequest::Start(start.start)),
            })
            .map_err(|_| Status::internal("queueing the exec start failed"))?;
        let started = tokio::time::timeout(START_TIMEOUT, async {
            let mut responses = self
                .flintlock()
                .exec(ReceiverStream::new(queue))
                .await
                .map_err(|status| {
                    Status::new(status.code(), format!("flintlockd: {}", status.message()))
                })?;
            let (pid, early) = pid(&mut responses).await?;
            Ok::<_, Status>((responses, pid, early))
        })
        .instrument(span.clone())
        .await
        .map_err(|_| {
            Status::deadline_exceeded(format!(
                "the process did not start within {}s",
                START_TIMEOUT.as_secs()
            ))
        })??;
        let (responses, pid, early) = started;
        let live = Arc::new(Live::new(requests, start.stdin));
        for (stream, bytes) in early {
            live.push(stream, bytes);
        }
        let record = Record {
            namespace: start.key.0.clone(),
            name: start.key.1.clone(),
            claim: start.claim,
            microvm_uid: start.microvm_uid,
            object: start.object,
            pid,
            start_time: now(),
            state: State::Running,
            deletion_time: None,
        };
        let processes = self.clone();
        let followed = live.clone();
        self.insert(record, live, move |id| {
            AbortOnDropHandle::new(tokio::spawn(
                follow(processes, start.key, id, followed, responses).instrument(span),
            ))
        })
    }
}

/// Reads the pid line, keeping output that came with or before it; a command that
/// ends first could not be started, and says why.
async fn pid(
    responses: &mut Streaming<ExecCommandResponse>,
) -> Result<(u32, Vec<(Stream, Bytes)>), Status> {
    let mut line = Vec::new();
    let mut early = Vec::new();
    let mut errors = Vec::new();
    loop {
        let Some(response) = responses
            .message()
            .await
            .map_err(|status| Status::unavailable(format!("flintlockd: {}", status.message())))?
        else {
            return Err(Status::unavailable(format!(
                "flintlockd ended the stream before the process started: {}",
                errors.join("; ")
            )));
        };
        match response.payload {
            Some(FlintlockResponse::Stdout(mut bytes)) => {
                let Some(newline) = bytes.iter().position(|b| *b == b'\n') else {
                    line.extend_from_slice(&bytes);
                    if line.len() > PID_LINE_BYTES {
                        return Err(Status::failed_precondition(
                            "the guest's sh wrote no pid: is /bin/sh a POSIX shell?",
                        ));
                    }
                    continue;
                };
                line.extend_from_slice(&bytes.split_to(newline + 1)[..newline]);
                let pid = std::str::from_utf8(&line)
                    .ok()
                    .and_then(|line| line.trim().parse().ok())
                    .ok_or_else(|| {
                        Status::failed_precondition(
                            "the guest's sh wrote no pid: is /bin/sh a POSIX shell?",
                        )
                    })?;
                early.push((Stream::Stdout, bytes));
                return Ok((pid, early));
            }
            Some(FlintlockResponse::Stderr(bytes)) => {
                errors.push(String::from_utf8_lossy(&bytes).trim().to_owned());
                early.push((Stream::Stderr, bytes));
            }
            Some(FlintlockResponse::Error(message)) => errors.push(message),
            Some(FlintlockResponse::ExitCode(code)) => {
                return Err(Status::failed_precondition(format!(
                    "the process could not start (exit code {code}): {}",
                    errors.join("; ")
                )));
            }
            // A payload this agent does not know, from a newer flintlockd.
            None => {}
        }
    }
}
