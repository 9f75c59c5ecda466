//! A command's session on the terminal: its output streamed to ours, our stdin to it
//! with `-i`, its exit code as ours, and Ctrl-C ending it. With `-it` on a terminal, the
//! command gets a terminal of its own, driven by ours in raw mode.

use std::convert::Infallible;
use std::io::IsTerminal as _;
use std::task::Poll;

use battery_sdk::{Command, Error, OutputStream, Process, Resizer, TerminalSize};
use tokio::io::{AsyncWrite, AsyncWriteExt as _};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::cli::CommandArgs;

/// What kubectl says when `-t` cannot be had, word for word, as scripts may know it.
const NO_TTY: &str = "Unable to use a TTY - input is not a terminal or the right kind of file";

/// The size assumed when the terminal's own cannot be read: a VT100's.
const FALLBACK_SIZE: TerminalSize = TerminalSize::new(80, 24);

/// Whether a session gets a terminal, decided as kubectl decides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tty {
    /// No `-t`, or `-t` without `-i` (which kubectl ignores: no keys to pass on).
    No,
    /// `-it` with stdin not a terminal (a pipe, a file): kubectl warns and runs
    /// without one.
    Unusable,
    /// `-it` on a terminal.
    Yes,
}

impl Tty {
    pub fn of(args: &CommandArgs, stdin_is_terminal: bool) -> Self {
        match (args.tty && args.stdin, stdin_is_terminal) {
            (false, _) => Self::No,
            (true, false) => Self::Unusable,
            (true, true) => Self::Yes,
        }
    }
}

/// `command` as `args` say: its environment, working directory and stdin.
fn prepare(mut command: Command, args: &CommandArgs) -> Command {
    command = command.envs(args.env.iter().cloned()).stdin(args.stdin);
    if let Some(dir) = &args.workdir {
        command = command.working_dir(dir.clone());
    }
    command
}

/// Runs `command` as `args` say, attached to this terminal, until it exits or a signal
/// (SIGINT, SIGTERM, SIGHUP) closes the session; gives its exit code, or a shell's for
/// the signal (130 for Ctrl-C).
pub async fn attach(command: Command, args: &CommandArgs) -> Result<i32, Error> {
    let local = |e| Error::Exec(Box::new(e));
    let mut ended_by_signal = std::pin::pin!(endings().map_err(local)?);
    let mut command = prepare(command, args);
    // SIGWINCH, with a terminal: listened for before the size is read, so that no change
    // between the two is missed.
    let size_changes = match Tty::of(args, std::io::stdin().is_terminal()) {
        Tty::Yes => Some(signal(SignalKind::window_change()).map_err(local)?),
        Tty::Unusable => {
            eprintln!("{NO_TTY}");
            None
        }
        Tty::No => None,
    };
    if size_changes.is_some() {
        command = command.tty(local_size());
    }
    // Ours is still a cooked terminal while this connects, so Ctrl-C can give up on it.
    let process = tokio::select! {
        process = command.spawn() => process?,
        code = &mut ended_by_signal => return Ok(code),
    };
    let _raw = size_changes
        .is_some()
        .then(RawMode::enable)
        .transpose()
        .map_err(local)?;
    let resizing = size_changes.zip(process.resizer());
    let resizing = async move {
        match resizing {
            Some((changes, resizer)) => follow_size(resizer, changes).await,
            None => std::future::pending().await,
        }
    };
    // `_raw` is dropped on the way out of here, whichever way that is (a panic's
    // unwinding too), so the error line, if any, is printed on a restored terminal.
    tokio::select! {
        code = streamed(process) => code,
        code = ended_by_signal => Ok(code),
        never = resizing => match never {},
    }
}

/// A process being opened (an attach to a background process), streamed to this
/// terminal as [`attach`] streams a command, without a terminal of its own: its exit code,
/// or a shell's for the signal that closed the session (which leaves it running).
pub async fn follow(opening: impl Future<Output = Result<Process, Error>>) -> Result<i32, Error> {
    let mut ended_by_signal = std::pin::pin!(endings().map_err(|e| Error::Exec(Box::new(e)))?);
    let process = tokio::select! {
        process = opening => process?,
        code = &mut ended_by_signal => return Ok(code),
    };
    tokio::select! {
        code = streamed(process) => code,
        code = ended_by_signal => Ok(code),
    }
}

/// Our stdin to `process` (when it has one), its output to ours, then its exit code.
async fn streamed(mut process: Process) -> Result<i32, Error> {
    if let Some(mut input) = process.stdin() {
        // Not awaited: reading a terminal blocks until a line (a key, in raw mode) or end
        // of file, which may never come; the process exits without waiting for it. In raw
        // mode, Ctrl-C and Ctrl-D are bytes like any other, for the guest's terminal.
        tokio::spawn(async move {
            if tokio::io::copy(&mut tokio::io::stdin(), &mut input)
                .await
                .is_ok()
            {
                let _ = input.shutdown().await;
            }
        });
    }
    let stdout = pipe(process.stdout(), tokio::io::stdout());
    let stderr = pipe(process.stderr(), tokio::io::stderr());
    let (stdout, stderr) = tokio::join!(stdout, stderr);
    stdout.and(stderr).map_err(Error::Output)?;
    process.wait().await
}

/// The next Ctrl-C, listened for from this call on: `tokio::signal::ctrl_c` listens only
/// once first polled, and a Ctrl-C before that ends the process as by default.
pub fn interrupts() -> std::io::Result<impl Future<Output = ()>> {
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        interrupt.recv().await;
    })
}

/// The first of SIGINT, SIGTERM and SIGHUP from this call on, as the code a shell gives a
/// command they kill: 128 and the signal's number. Caught rather than left to kill the
/// process, so the session closes (ending the command) and a raw terminal is restored.
fn endings() -> std::io::Result<impl Future<Output = i32>> {
    let mut listening = Vec::new();
    for kind in [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
    ] {
        listening.push((signal(kind)?, 128 + kind.as_raw_value()));
    }
    Ok(std::future::poll_fn(move |cx| {
        listening
            .iter_mut()
            .find_map(|(signal, code)| signal.poll_recv(cx).is_ready().then_some(*code))
            .map_or(Poll::Pending, Poll::Ready)
    }))
}

/// This terminal's size, or a VT100's when it cannot be read.
fn local_size() -> TerminalSize {
    crossterm::terminal::size().map_or(FALLBACK_SIZE, |(cols, rows)| TerminalSize::new(cols, rows))
}

/// Gives the command's terminal our size on each SIGWINCH. It never ends by itself: once
/// the session has, there is nothing left to resize, and the session's end ends it.
async fn follow_size(resizer: Resizer, mut changes: Signal) -> Infallible {
    while changes.recv().await.is_some() {
        if resizer.resize(local_size()).is_err() {
            break;
        }
    }
    std::future::pending().await
}

/// This terminal in raw mode while it lives: keys go to the command as typed (not a line
/// at a time), none is echoed here or turned into a signal. Dropping it restores the mode
/// ours had, on every way out of the session: its end, an error, a panic's unwinding.
struct RawMode;

impl RawMode {
    fn enable() -> std::io::Result<Self> {
        crossterm::terminal::enable_raw_mode()?;
        Ok(Self)
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // Nothing to do about a failure on the way out; the process is ending.
        let _ = crossterm::terminal::disable_raw_mode();
    }
}

/// Copies the command's `output` to ours as it comes. Unbuffered for what matters:
/// `tokio::io::copy` flushes whenever the output has nothing more for now, so a prompt
/// without a newline shows at once.
async fn pipe(
    output: Option<OutputStream>,
    mut to: impl AsyncWrite + Unpin,
) -> std::io::Result<()> {
    let Some(mut output) = output else {
        return Ok(());
    };
    tokio::io::copy(&mut output, &mut to).await?;
    to.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(stdin: bool, tty: bool) -> CommandArgs {
        CommandArgs {
            stdin,
            tty,
            env: Vec::new(),
            workdir: None,
            command: vec!["sh".to_owned()],
        }
    }

    #[test]
    fn a_terminal_is_had_as_kubectl_has_one() {
        assert_eq!(Tty::of(&args(true, true), true), Tty::Yes);
        assert_eq!(Tty::of(&args(true, true), false), Tty::Unusable);
        // -t without -i is ignored, terminal or not.
        assert_eq!(Tty::of(&args(false, true), true), Tty::No);
        assert_eq!(Tty::of(&args(true, false), true), Tty::No);
        assert_eq!(Tty::of(&args(false, false), false), Tty::No);
    }
}
