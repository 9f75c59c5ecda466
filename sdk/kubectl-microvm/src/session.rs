//! A command's session on the terminal: its output streamed to ours, our stdin to it
//! with `-i`, its exit code as ours, and Ctrl-C ending it.

use battery_sdk::{Command, Error, OutputStream};
use tokio::io::{AsyncWrite, AsyncWriteExt as _};

use crate::cli::CommandArgs;

/// How a session ended.
pub enum Ended {
    /// The command exited with this code.
    Exited(i32),
    /// Ctrl-C: the session was closed, which ends the command.
    Interrupted,
}

/// The exit code of a shell for a command killed by SIGINT.
pub const INTERRUPTED: i32 = 130;

/// `command` as `args` say, its environment and working directory set.
pub fn prepare(mut command: Command, args: &CommandArgs) -> Command {
    command = command.envs(args.env.iter().cloned()).stdin(args.stdin);
    if let Some(dir) = &args.workdir {
        command = command.working_dir(dir.clone());
    }
    command
}

/// Runs `command` attached to this terminal until it exits or Ctrl-C.
pub async fn attach(command: Command) -> Result<Ended, Error> {
    let interrupted = interrupts().map_err(|e| Error::Exec(Box::new(e)))?;
    let mut process = command.spawn().await?;
    if let Some(mut input) = process.stdin() {
        // Not awaited: reading a terminal blocks until a line or end of file, which
        // may never come; the process exits without waiting for it.
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
    let session = async {
        let (stdout, stderr) = tokio::join!(stdout, stderr);
        stdout.and(stderr).map_err(Error::Output)?;
        process.wait().await
    };
    tokio::select! {
        code = session => code.map(Ended::Exited),
        () = interrupted => Ok(Ended::Interrupted),
    }
}

/// The next Ctrl-C, listened for from this call on: `tokio::signal::ctrl_c` listens only
/// once first polled, and a Ctrl-C before that ends the process as by default.
pub fn interrupts() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        interrupt.recv().await;
    })
}

/// Copies the command's `output` to ours as it comes.
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
