//! flintlock's `microvmexec.services.api.v1alpha1.MicroVMExec` service on the
//! simulated Host. Where flintlock's guest agent runs a command inside the MicroVM,
//! this runs it as a **local process of the calling user, with no isolation**, in
//! the MicroVM's directory. The semantics are documented on the parent module.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Component, Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use battery_proto::Bytes;
use battery_proto::microvmexec::services::api::v1alpha1::exec_command_request::Payload as RequestPayload;
use battery_proto::microvmexec::services::api::v1alpha1::exec_command_response::Payload as ResponsePayload;
use battery_proto::microvmexec::services::api::v1alpha1::micro_vm_exec_server::MicroVmExec;
use battery_proto::microvmexec::services::api::v1alpha1::{
    ExecCommandRequest, ExecCommandResponse, ExecStart,
};
use rustix::io::Errno;
use rustix::process::{Pid, Signal, kill_process_group};
use tokio::io::{AsyncRead, AsyncWriteExt as _};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::io::ReaderStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, warn};

use super::error::RequestError;
use super::host::Host;
use super::registry::ExecTarget;

/// Responses queued for a slow client before reading the command's output waits: with
/// `OUTPUT_CHUNK`, at most 1 MiB of output per session.
const OUTPUT_BUFFER: usize = 4;
/// The most output read into one response. tokio's default (4 KiB) made bulk output
/// cost a gRPC message, and downstream a WebSocket frame, per page.
const OUTPUT_CHUNK: usize = 256 * 1024;
/// What the command's stdout and stderr pipes hold (Linux's default is 64 KiB, which
/// would cap each read, and so each response, at that).
const OUTPUT_PIPE_BYTES: usize = 1024 * 1024;
/// What timeout(1) exits with when it had to kill the command.
const TIMED_OUT_EXIT_CODE: i32 = 124;
/// What a shell exits with when the command cannot be executed.
const CANNOT_EXECUTE_EXIT_CODE: i32 = 126;
/// What a shell exits with when the command is not found.
const NOT_FOUND_EXIT_CODE: i32 = 127;
/// A shell reports death by signal n as 128+n.
const SIGNAL_EXIT_BASE: i32 = 128;
/// PATH for commands when the Host itself has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

type Reply = Result<ExecCommandResponse, Status>;

pub(super) struct ExecService {
    host: Arc<Host>,
}

impl ExecService {
    pub(super) fn new(host: Arc<Host>) -> Self {
        Self { host }
    }
}

#[tonic::async_trait]
impl MicroVmExec for ExecService {
    type ExecCommandStream = ReceiverStream<Reply>;

    async fn exec_command(
        &self,
        request: Request<Streaming<ExecCommandRequest>>,
    ) -> Result<Response<Self::ExecCommandStream>, Status> {
        let mut requests = request.into_inner();
        let Some(ExecCommandRequest {
            payload: Some(RequestPayload::Start(start)),
        }) = requests.message().await?
        else {
            return Err(RequestError::StartFirst.into());
        };
        let invocation = Invocation::new(start)?;
        let target = self.host.registry.exec_target(&invocation.uid)?;
        debug!(host = %self.host.name, uid = invocation.uid, "simulated exec");
        let (replies, stream) = mpsc::channel(OUTPUT_BUFFER);
        tokio::spawn(run(invocation, target, requests, replies));
        Ok(Response::new(ReceiverStream::new(stream)))
    }
}

/// A validated `start`.
struct Invocation {
    uid: String,
    cmd: String,
    args: Vec<String>,
    shell: bool,
    cwd: String,
    env: HashMap<String, String>,
    has_stdin: bool,
    timeout: Option<Duration>,
}

impl Invocation {
    fn new(start: ExecStart) -> Result<Self, RequestError> {
        if start.cmd.is_empty() {
            return Err(RequestError::CmdRequired);
        }
        let timeout = match start.timeout_seconds {
            0 => None,
            seconds if seconds > 0 => Some(Duration::from_secs(seconds.unsigned_abs().into())),
            seconds => return Err(RequestError::NegativeTimeout(seconds)),
        };
        Ok(Self {
            uid: start.uid,
            cmd: start.cmd,
            args: start.args,
            shell: start.shell,
            cwd: start.cwd,
            env: start.env,
            has_stdin: start.has_stdin,
            timeout,
        })
    }

    fn command(&self, root: &Path) -> Command {
        let path = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
        // The command's own PATH, if it sets one, is where its program is looked for.
        let search = self
            .env
            .get("PATH")
            .map_or(path.as_os_str(), |own| own.as_ref());
        let program = if self.shell { "sh" } else { self.cmd.as_str() };
        let mut command = Command::new(on_path(program, search));
        command.arg0(program);
        if self.shell {
            command.arg("-c").arg(&self.cmd).arg("sh");
        }
        command.args(&self.args);
        let stdin = if self.has_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        };
        command
            .current_dir(guest_path(root, &self.cwd))
            .env_clear()
            .env("PATH", path)
            .env("HOME", root)
            .envs(&self.env)
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group, so killing the group reaches everything it started.
            .process_group(0)
            .kill_on_drop(true);
        command
    }
}

/// `program` found on `path` as a shell finds it, or as given when it names a path or is
/// not found (starting it then fails as a shell's would). Resolved here because a command
/// whose PATH is set and whose program is a bare name makes std fork this whole process
/// to search in the child, instead of spawning it (`posix_spawn`): milliseconds a command.
fn on_path(program: &str, path: &std::ffi::OsStr) -> PathBuf {
    if program.contains('/') {
        return PathBuf::from(program);
    }
    std::env::split_paths(path)
        .map(|dir| dir.join(program))
        .find(|candidate| {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::metadata(candidate)
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
        .unwrap_or_else(|| PathBuf::from(program))
}

/// The guest path `cwd` inside `root`, which stands for the guest's `/`: `..`
/// stops at `root` as `/..` stops at `/`.
fn guest_path(root: &Path, cwd: &str) -> PathBuf {
    let mut path = root.to_path_buf();
    let mut depth = 0_usize;
    for component in Path::new(cwd).components() {
        match component {
            Component::Normal(part) => {
                path.push(part);
                depth += 1;
            }
            Component::ParentDir if depth > 0 => {
                path.pop();
                depth -= 1;
            }
            Component::ParentDir
            | Component::CurDir
            | Component::RootDir
            | Component::Prefix(_) => {}
        }
    }
    path
}

/// How a command's run ended.
enum End {
    Exited(i32),
    TimedOut(Duration),
    NotStarted(io::Error),
    /// The stream ends with this error instead of an exit code.
    Failed(RequestError),
    /// Nobody is listening any more.
    ClientGone,
}

async fn run(
    invocation: Invocation,
    target: ExecTarget,
    requests: Streaming<ExecCommandRequest>,
    replies: mpsc::Sender<Reply>,
) {
    let end = execute(&invocation, &target, requests, &replies).await;
    let last = match end {
        End::Exited(code) => vec![exit_reply(code)],
        End::TimedOut(after) => vec![
            error_reply(format!("command timed out after {}s", after.as_secs())),
            exit_reply(TIMED_OUT_EXIT_CODE),
        ],
        End::NotStarted(error) => {
            let code = if error.kind() == io::ErrorKind::NotFound {
                NOT_FOUND_EXIT_CODE
            } else {
                CANNOT_EXECUTE_EXIT_CODE
            };
            vec![
                error_reply(format!("starting {}: {error}", invocation.cmd)),
                exit_reply(code),
            ]
        }
        End::Failed(error) => {
            // Best effort: a client too slow to take it is cut off without it
            // rather than holding up a delete or a shutdown.
            if replies.try_send(Err(error.into())).is_err() {
                debug!(uid = invocation.uid, "exec client gone before the error");
            }
            return;
        }
        End::ClientGone => return,
    };
    for reply in last {
        tokio::select! {
            biased;
            () = target.cancel.cancelled() => {
                let error = interruption(&target, &invocation.uid);
                if replies.try_send(Err(error.into())).is_err() {
                    debug!(uid = invocation.uid, "exec client gone before the error");
                }
                return;
            }
            sent = replies.send(reply) => if sent.is_err() {
                return;
            },
        }
    }
}

/// Runs the command to its end, streaming its output and feeding it stdin. When
/// this returns the command is reaped and its process group has been killed.
async fn execute(
    invocation: &Invocation,
    target: &ExecTarget,
    requests: Streaming<ExecCommandRequest>,
    replies: &mpsc::Sender<Reply>,
) -> End {
    if target.cancel.is_cancelled() {
        return End::Failed(interruption(target, &invocation.uid));
    }
    let mut child = match invocation.command(&target.scratch_dir).spawn() {
        Ok(child) => child,
        Err(error) => return End::NotStarted(error),
    };
    let mut group = ProcessGroup::of(&child);
    let mut stdout = (child.stdout.take()).map(output_stream);
    let mut stderr = (child.stderr.take()).map(output_stream);
    let stdin = pump_stdin(requests, child.stdin.take());
    tokio::pin!(stdin);
    let mut stdin_done = false;
    let deadline = expiry(invocation.timeout);
    tokio::pin!(deadline);
    let mut timed_out = false;
    let mut exit: Option<i32> = None;
    // Output read but not yet taken by the channel. More is read only once it is,
    // so a client that stops reading stops the command at a full pipe.
    let mut pending: Option<ResponsePayload> = None;

    let end = loop {
        if let Some(code) = exit
            && stdout.is_none()
            && stderr.is_none()
            && pending.is_none()
        {
            break match invocation.timeout {
                Some(after) if timed_out => End::TimedOut(after),
                _ => End::Exited(code),
            };
        }
        tokio::select! {
            biased;
            () = target.cancel.cancelled() => break End::Failed(interruption(target, &invocation.uid)),
            () = replies.closed() => break End::ClientGone,
            permit = replies.reserve(), if pending.is_some() => match permit {
                Ok(permit) => {
                    if let Some(payload) = pending.take() {
                        permit.send(Ok(ExecCommandResponse { payload: Some(payload) }));
                    }
                }
                Err(_) => break End::ClientGone,
            },
            ended = &mut stdin, if !stdin_done => {
                stdin_done = true;
                match ended {
                    StdinEnd::HalfClosed => {}
                    StdinEnd::Invalid(error) => break End::Failed(error),
                    StdinEnd::ClientGone => break End::ClientGone,
                }
            }
            () = &mut deadline, if !timed_out && exit.is_none() => {
                timed_out = true;
                group.kill();
            }
            status = child.wait(), if exit.is_none() => match status {
                Ok(status) => {
                    exit = Some(exit_code(status));
                    // Leftovers would hold the pipes open and outlive the command.
                    group.kill_and_forget();
                }
                Err(error) => break End::Failed(RequestError::WaitCommand(error)),
            },
            chunk = next_chunk(&mut stdout), if stdout.is_some() && pending.is_none() => match chunk {
                Some(bytes) => pending = Some(ResponsePayload::Stdout(bytes)),
                None => stdout = None,
            },
            chunk = next_chunk(&mut stderr), if stderr.is_some() && pending.is_none() => match chunk {
                Some(bytes) => pending = Some(ResponsePayload::Stderr(bytes)),
                None => stderr = None,
            },
        }
    };
    if exit.is_none() {
        group.kill_and_forget();
        if let Err(error) = child.wait().await {
            warn!(uid = invocation.uid, %error, "reaping a killed command failed");
        }
    }
    end
}

/// A command's stdout or stderr, read in chunks of up to `OUTPUT_CHUNK`.
fn output_stream<R: AsyncRead + AsFd>(output: R) -> ReaderStream<R> {
    // Best effort: a smaller pipe (beyond the system's limit) only means smaller reads.
    if let Err(error) = rustix::pipe::fcntl_setpipe_size(&output, OUTPUT_PIPE_BYTES) {
        debug!(%error, "enlarging a command's output pipe failed");
    }
    ReaderStream::with_capacity(output, OUTPUT_CHUNK)
}

/// The next chunk of a command's output; `None` once it has ended (or failed, which
/// ends it the same way for the client).
async fn next_chunk<R: AsyncRead + Unpin>(output: &mut Option<ReaderStream<R>>) -> Option<Bytes> {
    let stream = output.as_mut()?;
    match stream.next().await? {
        Ok(bytes) => Some(bytes),
        Err(error) => {
            debug!(%error, "reading a command's output failed");
            None
        }
    }
}

/// Completes when `timeout` has passed; never without one.
async fn expiry(timeout: Option<Duration>) {
    match timeout {
        Some(timeout) => tokio::time::sleep(timeout).await,
        None => std::future::pending().await,
    }
}

/// How the client's side of the stream ended.
enum StdinEnd {
    HalfClosed,
    Invalid(RequestError),
    ClientGone,
}

/// Feeds the client's `stdin` chunks to the command until the client half-closes.
/// Runs beside the output, so a command that does not read its stdin cannot stall
/// its output.
async fn pump_stdin(
    mut requests: Streaming<ExecCommandRequest>,
    mut stdin: Option<ChildStdin>,
) -> StdinEnd {
    loop {
        let request = match requests.message().await {
            Ok(Some(request)) => request,
            Ok(None) => return StdinEnd::HalfClosed,
            Err(status) => {
                debug!(%status, "exec request stream broke");
                return StdinEnd::ClientGone;
            }
        };
        match request.payload {
            Some(RequestPayload::Stdin(data)) => {
                if let Some(pipe) = stdin.as_mut()
                    && pipe.write_all(&data).await.is_err()
                {
                    // The command closed its stdin: later input has no reader, as
                    // with any pipe.
                    stdin = None;
                }
            }
            // Dropping the pipe closes it, so the command reads end of file.
            Some(RequestPayload::StdinEof(true)) => stdin = None,
            Some(RequestPayload::StdinEof(false)) => {}
            Some(RequestPayload::Start(_)) => {
                return StdinEnd::Invalid(RequestError::StartRepeated);
            }
            None => return StdinEnd::Invalid(RequestError::EmptyRequest),
        }
    }
}

fn interruption(target: &ExecTarget, uid: &str) -> RequestError {
    if target.host_shutdown.is_cancelled() {
        RequestError::ShuttingDown
    } else {
        RequestError::DeletedDuringExec(uid.to_owned())
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    // On Unix a reaped process has either an exit code or a terminating signal.
    status
        .code()
        .or_else(|| status.signal().map(|signal| SIGNAL_EXIT_BASE + signal))
        .unwrap_or(SIGNAL_EXIT_BASE)
}

fn exit_reply(code: i32) -> Reply {
    Ok(ExecCommandResponse {
        payload: Some(ResponsePayload::ExitCode(code)),
    })
}

fn error_reply(message: String) -> Reply {
    Ok(ExecCommandResponse {
        payload: Some(ResponsePayload::Error(message)),
    })
}

/// A command's process group, killed whole when dropped, so no path out of
/// [`execute`] (including a dropped task) leaves processes behind.
struct ProcessGroup(Option<Pid>);

impl ProcessGroup {
    /// The command leads its group, so the group's id is its pid.
    fn of(child: &Child) -> Self {
        Self(
            child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .and_then(Pid::from_raw),
        )
    }

    fn kill(&self) {
        let Some(group) = self.0 else {
            return;
        };
        match kill_process_group(group, Signal::KILL) {
            // SRCH: everything in the group is already gone.
            Ok(()) | Err(Errno::SRCH) => {}
            Err(error) => {
                warn!(group = group.as_raw_pid(), %error, "killing a command's process group failed");
            }
        }
    }

    /// Kills the group for the last time. Once its leader is reaped and the group
    /// is empty, its id may be reused, so it must not be signalled again.
    fn kill_and_forget(&mut self) {
        self.kill();
        self.0 = None;
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_paths_stay_inside_the_root() {
        let root = Path::new("/state/microvms/u");
        let cases = [
            ("", "/state/microvms/u"),
            ("/", "/state/microvms/u"),
            ("/srv/app", "/state/microvms/u/srv/app"),
            ("srv/./app", "/state/microvms/u/srv/app"),
            ("/srv/../etc", "/state/microvms/u/etc"),
            ("../../..", "/state/microvms/u"),
            ("/a/../../b", "/state/microvms/u/b"),
        ];
        for (cwd, expected) in cases {
            assert_eq!(guest_path(root, cwd), Path::new(expected), "cwd {cwd:?}");
        }
    }

    #[test]
    fn programs_are_found_on_the_path_as_a_shell_finds_them() {
        use std::os::unix::fs::PermissionsExt as _;
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let write = |dir: &Path, name: &str, mode: u32| {
            let file = dir.join(name);
            std::fs::write(&file, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            file
        };
        // Not executable in the first directory, so the second's is the one.
        write(dirs[0].path(), "tool", 0o644);
        let tool = write(dirs[1].path(), "tool", 0o755);
        std::fs::create_dir(dirs[0].path().join("dir")).unwrap();
        let path = std::env::join_paths(dirs.iter().map(|d| d.path())).unwrap();
        assert_eq!(on_path("tool", &path), tool);
        // A directory is not a program; what is not found, or names a path, is as given.
        assert_eq!(on_path("dir", &path), Path::new("dir"));
        assert_eq!(on_path("missing", &path), Path::new("missing"));
        assert_eq!(on_path("./tool", &path), Path::new("./tool"));
    }

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
        // SIGKILL (9) in the low bits: killed by a signal.
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
    }

    #[test]
    fn start_validation() {
        let start = |cmd: &str, timeout_seconds| ExecStart {
            uid: "u".into(),
            cmd: cmd.into(),
            timeout_seconds,
            ..ExecStart::default()
        };
        assert!(matches!(
            Invocation::new(start("", 0)),
            Err(RequestError::CmdRequired)
        ));
        assert!(matches!(
            Invocation::new(start("true", -1)),
            Err(RequestError::NegativeTimeout(-1))
        ));
        let invocation = Invocation::new(start("true", 2)).expect("valid");
        assert_eq!(invocation.timeout, Some(Duration::from_secs(2)));
        assert_eq!(
            Invocation::new(start("true", 0)).expect("valid").timeout,
            None
        );
    }
}
