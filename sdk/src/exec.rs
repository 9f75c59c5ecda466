//! Commands in a claim's MicroVM: [`Command`], [`Claim::exec`] and [`Claim::run`].
//!
//! The session is the WebSocket channel protocol of `pods/exec` (`v5.channel.k8s.io`,
//! else `v4`): one task pumps frames between the socket and the process's pipes, so
//! stdin, stdout and stderr are plain async streams with bounded buffers. With a terminal
//! ([`Command::tty`]), stdout carries the terminal's output and the session also sends
//! its sizes ([`crate::tty`]).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use battery_types::channel::{self, CLOSE, ERROR, STDERR, STDIN, STDOUT};
use futures::{SinkExt as _, StreamExt as _};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, DuplexStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::PollSender;

use crate::claim::Claim;
use crate::client::Client;
use crate::error::{Error, session_ended};
use crate::tty::{Resizer, Sizes, TerminalSize};

/// The most stdin sent in one frame; the server takes up to 1 MiB.
const STDIN_CHUNK: usize = 64 * 1024;
/// Frames of stdin queued before a write waits: with [`STDIN_CHUNK`], 1 MiB.
const STDIN_FRAMES: usize = 16;
/// Bytes of stdout (and of stderr) buffered before the session stops reading.
const OUTPUT_BUFFER: usize = 256 * 1024;

/// A command to run in a claim's MicroVM, built like `std::process::Command`: the
/// program and its arguments (no shell), then its environment and working directory.
#[must_use = "a command runs only by spawn() or output()"]
pub struct Command {
    client: Client,
    claim: String,
    pool: String,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    working_dir: Option<String>,
    stdin: bool,
    tty: Option<TerminalSize>,
}

impl Command {
    pub(crate) fn new(client: Client, claim: String, pool: String, argv: Vec<String>) -> Self {
        Self {
            client,
            claim,
            pool,
            argv,
            env: Vec::new(),
            working_dir: None,
            stdin: true,
            tty: None,
        }
    }

    /// Sets an environment variable for the command, over the guest's own.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Sets several environment variables, as [`Command::env`] does.
    pub fn envs<K: Into<String>, V: Into<String>>(
        mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.env
            .extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// The directory in the guest the command starts in; the guest's default otherwise.
    pub fn working_dir(mut self, dir: impl Into<String>) -> Self {
        self.working_dir = Some(dir.into());
        self
    }

    /// Whether [`Command::spawn`] gives the command a stdin to write (it does unless set
    /// to false); without one, the command reads end of file at once.
    pub fn stdin(mut self, attach: bool) -> Self {
        self.stdin = attach;
        self
    }

    /// Runs the command in a terminal of `size`, as `kubectl exec -t` does: stdout then
    /// carries the terminal's output (stderr merged in, so [`Process::stderr`] is `None`),
    /// stdin goes to the terminal as it is written (so byte 3, Ctrl-C, interrupts the
    /// command, and byte 4, Ctrl-D, is end of file to a shell), and
    /// [`Process::resize`] (or a [`Resizer`]) follows the terminal's changes of size.
    /// Nothing is translated on this side: to pass keys through one at a time, put the
    /// local terminal in raw mode.
    ///
    /// ```no_run
    /// # async fn example(claim: battery_sdk::Claim) -> Result<(), Box<dyn std::error::Error>> {
    /// use battery_sdk::TerminalSize;
    /// use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    ///
    /// let mut shell = claim.command(["/bin/sh"]).tty(TerminalSize::new(80, 24)).spawn().await?;
    /// let (mut stdin, mut stdout) = (shell.stdin().unwrap(), shell.stdout().unwrap());
    /// shell.resize(TerminalSize::new(132, 43))?; // on the local terminal's SIGWINCH
    /// stdin.write_all(b"stty size; exit 3\r").await?; // the Enter key is a carriage return
    /// let mut screen = Vec::new();
    /// stdout.read_to_end(&mut screen).await?; // "43 132", echo and prompts included
    /// assert_eq!(shell.wait().await?, 3);
    /// # Ok(())
    /// # }
    /// ```
    pub fn tty(mut self, size: TerminalSize) -> Self {
        self.tty = Some(size);
        self
    }

    /// Starts the command with stdin (unless [`Command::stdin`] said not), stdout and
    /// stderr (unless it has a terminal, [`Command::tty`]) as streams.
    pub async fn spawn(self) -> Result<Process, Error> {
        let stdin = self.stdin;
        self.start(stdin).await
    }

    /// Runs the command with an empty stdin and collects its output and exit code
    /// (with [`Command::tty`], all of it in [`Output::stdout`]).
    pub async fn output(self) -> Result<Output, Error> {
        let mut process = self.start(false).await?;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let (mut out, mut err) = (process.stdout(), process.stderr());
        let read_out = async {
            match &mut out {
                Some(out) => out.read_to_end(&mut stdout).await.map(drop),
                None => Ok(()),
            }
        };
        let read_err = async {
            match &mut err {
                Some(err) => err.read_to_end(&mut stderr).await.map(drop),
                None => Ok(()),
            }
        };
        let (read_out, read_err) = tokio::join!(read_out, read_err);
        read_out.and(read_err).map_err(Error::Output)?;
        let code = process.wait().await?;
        Ok(Output {
            code,
            stdout,
            stderr,
        })
    }

    /// The exec request's query: `PodExecOptions`, plus flintlock's `env` and
    /// `workingDir`. A terminal merges stderr into stdout, so with one stderr is not
    /// asked for, as kubectl does.
    fn query(&self, stdin: bool) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        for arg in &self.argv {
            query.append_pair("command", arg);
        }
        if stdin {
            query.append_pair("stdin", "true");
        }
        query.append_pair("stdout", "true");
        if self.tty.is_some() {
            query.append_pair("stderr", "false");
            query.append_pair("tty", "true");
        } else {
            query.append_pair("stderr", "true");
        }
        for (name, value) in &self.env {
            query.append_pair("env", &format!("{name}={value}"));
        }
        if let Some(dir) = &self.working_dir {
            query.append_pair("workingDir", dir);
        }
        query.finish()
    }

    async fn start(self, stdin: bool) -> Result<Process, Error> {
        let connection = self
            .client
            .connect(&self.claim, "exec", &self.query(stdin), &self.pool)
            .await?;
        Ok(Process::pumped(connection, stdin, self.tty, self.pool))
    }
}

impl Process {
    /// The process a session on `connection` serves: a task pumps its frames to and
    /// from the pipes; `stdin` when the session has it, `tty` when it runs on one.
    pub(crate) fn pumped(
        connection: kube::client::Connection,
        stdin: bool,
        tty: Option<TerminalSize>,
        pool: String,
    ) -> Self {
        let can_close = connection.supports_stream_close();
        let (stdin_tx, stdin_rx) = mpsc::channel(STDIN_FRAMES);
        let (stdout, stdout_pipe) = tokio::io::duplex(OUTPUT_BUFFER);
        // A terminal's stderr is its stdout: no pipe of its own.
        let (stderr, stderr_pipe) = tty
            .is_none()
            .then(|| tokio::io::duplex(OUTPUT_BUFFER))
            .unzip();
        let (resizer, sizes) = tty.map(Resizer::new).unzip();
        let (finished, status) = oneshot::channel();
        let pump = Pump {
            ws: connection.into_stream(),
            can_close,
            stdin: stdin.then_some(stdin_rx),
            sizes,
            stdout: Some(stdout_pipe),
            stderr: stderr_pipe,
        };
        let task = tokio::spawn(async move {
            // Nobody waits only when the Process and its streams are all gone.
            let _ = finished.send(pump.run().await);
        });
        let session = Arc::new(Session(task.abort_handle()));
        Process {
            stdin: stdin.then(|| Stdin {
                frames: PollSender::new(stdin_tx),
                _session: session.clone(),
            }),
            stdout: Some(OutputStream {
                pipe: stdout,
                _session: session.clone(),
            }),
            stderr: stderr.map(|pipe| OutputStream {
                pipe,
                _session: session.clone(),
            }),
            resizer,
            status,
            pool,
            can_close,
            _session: session,
        }
    }
}

/// Ends the session (and so the command) once the [`Process`] and every stream taken
/// from it are dropped: nobody is left to read it.
struct Session(AbortHandle);

impl Drop for Session {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the stdin half of the session carries.
enum StdinFrame {
    Data(Vec<u8>),
    /// End of file: v5's close of channel 0.
    Close,
}

/// The task between the WebSocket and the process's pipes.
struct Pump<W> {
    ws: W,
    can_close: bool,
    stdin: Option<mpsc::Receiver<StdinFrame>>,
    /// The terminal's sizes to send; `None` without a terminal, or once no [`Resizer`]
    /// is left.
    sizes: Option<Sizes>,
    /// `None` once its reader is gone: the rest of that output is dropped.
    stdout: Option<DuplexStream>,
    stderr: Option<DuplexStream>,
}

impl<W> Pump<W>
where
    W: futures::Stream<Item = Result<Message, WsError>>
        + futures::Sink<Message, Error = WsError>
        + Unpin,
{
    /// Relays until the server ends the session, and gives its closing Status.
    async fn run(mut self) -> Result<Option<Status>, Error> {
        // A terminal's size comes before anything is typed into it.
        if let Some(frame) = self.sizes.as_mut().map(Sizes::current_frame) {
            self.send(frame).await?;
        }
        let mut status = None;
        loop {
            tokio::select! {
                size = or_never(self.sizes.as_mut().map(Sizes::next_frame)) => match size {
                    Some(frame) => self.send(frame).await?,
                    None => self.sizes = None,
                },
                frame = or_never(self.stdin.as_mut().map(mpsc::Receiver::recv)) => {
                    self.send_stdin(frame).await?;
                }
                message = self.ws.next() => match message {
                    // The server closes after the Status; a cut without one is the
                    // caller's `ExecIncomplete`.
                    None | Some(Ok(Message::Close(_))) => return Ok(status),
                    Some(Err(error)) if status.is_none() => {
                        return Err(Error::Exec(Box::new(error)));
                    }
                    Some(Err(_)) => return Ok(status),
                    Some(Ok(Message::Binary(data))) => {
                        let Some((channel, payload)) = channel::decode_binary(&data) else { continue };
                        match channel {
                            STDOUT => write_or_drop(&mut self.stdout, payload).await,
                            STDERR => write_or_drop(&mut self.stderr, payload).await,
                            ERROR => status = serde_json::from_slice(payload).ok(),
                            _ => {}
                        }
                    }
                    Some(Ok(_)) => {}
                },
            }
        }
    }

    async fn send_stdin(&mut self, frame: Option<StdinFrame>) -> Result<(), Error> {
        let message = match frame {
            Some(StdinFrame::Data(data)) => Some(channel::frame(STDIN, &data)),
            // Shut down, or dropped: end of file either way, as for a local pipe.
            Some(StdinFrame::Close) | None => {
                self.stdin = None;
                self.can_close.then(|| channel::frame(CLOSE, &[STDIN]))
            }
        };
        match message {
            Some(message) => self.send(message).await,
            None => Ok(()),
        }
    }

    async fn send(&mut self, frame: Vec<u8>) -> Result<(), Error> {
        self.ws
            .send(Message::Binary(frame.into()))
            .await
            .map_err(|e| Error::Exec(Box::new(e)))
    }
}

/// What `next` gives, or never without it: a half of the session that has ended (or
/// was never there) is left out of the pump's `select!`.
async fn or_never<F: Future>(next: Option<F>) -> F::Output {
    match next {
        Some(next) => next.await,
        None => std::future::pending().await,
    }
}

async fn write_or_drop(pipe: &mut Option<DuplexStream>, payload: &[u8]) {
    if let Some(writer) = pipe
        && writer.write_all(payload).await.is_err()
    {
        *pipe = None;
    }
}

/// A command running in the MicroVM, with its standard streams.
pub struct Process {
    stdin: Option<Stdin>,
    stdout: Option<OutputStream>,
    stderr: Option<OutputStream>,
    resizer: Option<Resizer>,
    status: oneshot::Receiver<Result<Option<Status>, Error>>,
    pool: String,
    /// Whether the protocol can end stdin (v5); v4 cannot, so a command reading to end
    /// of file would never see it.
    can_close: bool,
    _session: Arc<Session>,
}

impl Process {
    /// The command's stdin, once; `None` for [`Command::output`]. Shut it down (or drop
    /// it) to send end of file.
    pub fn stdin(&mut self) -> Option<Stdin> {
        self.stdin.take()
    }

    /// Whether shutting stdin down reaches the command as end of file: the server speaks
    /// `v5.channel.k8s.io`.
    pub(crate) fn stdin_can_end(&self) -> bool {
        self.can_close
    }

    /// The command's stdout, once.
    pub fn stdout(&mut self) -> Option<OutputStream> {
        self.stdout.take()
    }

    /// The command's stderr, once; `None` with a terminal, whose output is all stdout.
    pub fn stderr(&mut self) -> Option<OutputStream> {
        self.stderr.take()
    }

    /// Gives the command's terminal ([`Command::tty`]) a new size, as
    /// [`Resizer::resize`]. Fails with `Unsupported` for a command without a terminal, and
    /// `BrokenPipe` once the session has ended.
    pub fn resize(&self, size: TerminalSize) -> io::Result<()> {
        self.resizer
            .as_ref()
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::Unsupported, "the command has no terminal")
            })?
            .resize(size)
    }

    /// A handle that resizes the command's terminal, to keep after [`Process::wait`];
    /// `None` without a terminal.
    pub fn resizer(&self) -> Option<Resizer> {
        self.resizer.clone()
    }

    /// Waits for the command to end and gives its exit code. Stdin not taken is closed
    /// first and output not taken is dropped; output taken must be read, or the command stalls once its buffer
    /// (256 KiB) is full.
    pub async fn wait(mut self) -> Result<i32, Error> {
        // As `std::process::Child::wait`: stdin not taken is closed first.
        drop((self.stdin.take(), self.stdout.take(), self.stderr.take()));
        let status = (&mut self.status)
            .await
            .unwrap_or(Err(Error::ExecIncomplete))?;
        exit_code(status, &self.pool)
    }
}

/// The command's stdin. Once the session has ended (the command exited without reading
/// all of it, or the session was cut), writes fail with `BrokenPipe`.
pub struct Stdin {
    frames: PollSender<StdinFrame>,
    _session: Arc<Session>,
}

impl AsyncWrite for Stdin {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        ready!(self.frames.poll_reserve(cx)).map_err(|_| session_ended())?;
        let len = buf.len().min(STDIN_CHUNK);
        self.frames
            .send_item(StdinFrame::Data(buf[..len].to_vec()))
            .map_err(|_| session_ended())?;
        Poll::Ready(Ok(len))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Every write is already queued for the session.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.frames.is_closed() {
            return Poll::Ready(Ok(()));
        }
        ready!(self.frames.poll_reserve(cx)).map_err(|_| session_ended())?;
        self.frames
            .send_item(StdinFrame::Close)
            .map_err(|_| session_ended())?;
        self.frames.close();
        Poll::Ready(Ok(()))
    }
}

/// The command's stdout or stderr; end of file once the command has ended.
pub struct OutputStream {
    pipe: DuplexStream,
    _session: Arc<Session>,
}

impl AsyncRead for OutputStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.pipe).poll_read(cx, buf)
    }
}

/// What [`Command::output`] and [`Claim::run`] collected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    /// The command's exit code.
    pub code: i32,
    /// All it wrote to stdout.
    pub stdout: Vec<u8>,
    /// All it wrote to stderr; empty with a terminal, whose output is all stdout.
    pub stderr: Vec<u8>,
}

/// The exit code the session's closing Status gives: `Success` is 0, `NonZeroExitCode`
/// carries it in its `ExitCode` cause.
fn exit_code(status: Option<Status>, pool: &str) -> Result<i32, Error> {
    let status = status.ok_or(Error::ExecIncomplete)?;
    if status.status.as_deref() == Some("Success") {
        return Ok(0);
    }
    if status.reason.as_deref() == Some("NonZeroExitCode")
        && let Some(code) = status
            .details
            .iter()
            .flat_map(|d| d.causes.iter().flatten())
            .find(|c| c.reason.as_deref() == Some("ExitCode"))
            .and_then(|c| c.message.as_deref()?.parse().ok())
    {
        return Ok(code);
    }
    // The same Status kube-rs's calls carry, so the same mapping applies.
    let status = serde_json::to_value(status)
        .and_then(serde_json::from_value)
        .map_err(|e| Error::Api(kube::Error::SerdeError(e)))?;
    Err(Error::from_claims(kube::Error::Api(Box::new(status)), pool))
}

impl Client {
    /// `command` (a program and its arguments) for the claim `claim` of this client's
    /// namespace, which this client's user holds. Unlike [`Claim::command`], nothing
    /// renews that claim's lease meanwhile.
    pub fn command<I, S>(&self, claim: impl Into<String>, command: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let argv = command.into_iter().map(Into::into).collect();
        Command::new(self.clone(), claim.into(), String::new(), argv)
    }
}

impl Claim {
    /// `command` (a program and its arguments, no shell) in the claim's MicroVM, to set
    /// its environment and working directory before it runs.
    pub fn command<I, S>(&self, command: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let argv = command.into_iter().map(Into::into).collect();
        Command::new(
            self.client.clone(),
            self.name().to_owned(),
            self.pool.clone(),
            argv,
        )
    }

    /// Starts `command` (a program and its arguments, no shell) in the MicroVM, with
    /// stdin, stdout and stderr as streams: `self.command(command).spawn()`.
    pub async fn exec<I, S>(&self, command: I) -> Result<Process, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.command(command).spawn().await
    }

    /// Runs `command` with no stdin and collects its output and exit code:
    /// `self.command(command).output()`.
    pub async fn run<I, S>(&self, command: I) -> Result<Output, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.command(command).output().await
    }
}

#[cfg(test)]
mod tests;
