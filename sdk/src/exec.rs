//! Commands in a claim's MicroVM: [`Claim::exec`] and [`Claim::run`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{AttachParams, AttachedProcess};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, SimplexStream, WriteHalf};
use tokio::sync::{oneshot, watch};

use crate::claim::Claim;
use crate::error::Error;

/// A command running in the MicroVM, with its standard streams. Closing (shutting down)
/// stdin lets the command see end of file.
pub struct Process {
    inner: AttachedProcess,
    pool: String,
    /// The session's closing Status, once it has ended.
    status: oneshot::Receiver<Option<Status>>,
    /// Turns true when the session ends, so that stdin stops taking bytes.
    ended: watch::Receiver<bool>,
}

/// The command's stdin. Once the session has ended (the command exited without reading
/// all of it, or the session was cut), writes fail with `BrokenPipe` instead of waiting
/// for ever, as kube-rs's own stdin would.
pub struct Stdin {
    inner: WriteHalf<SimplexStream>,
    ended: watch::Receiver<bool>,
    /// Wakes a write waiting for room when the session ends.
    waiting: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Stdin {
    /// `Ready(BrokenPipe)` once the session has ended; otherwise registers to be woken
    /// when it does.
    fn poll_ended(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if *self.ended.borrow() {
            return Poll::Ready(session_ended());
        }
        let waiting = self.waiting.get_or_insert_with(|| {
            let mut ended = self.ended.clone();
            Box::pin(async move {
                let _ = ended.wait_for(|ended| *ended).await;
            })
        });
        waiting.as_mut().poll(cx).map(|()| session_ended())
    }
}

fn session_ended() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the exec session has ended")
}

impl AsyncWrite for Stdin {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Poll::Ready(result) = Pin::new(&mut self.inner).poll_write(cx, buf) {
            return Poll::Ready(result);
        }
        self.poll_ended(cx).map(Err)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Poll::Ready(result) = Pin::new(&mut self.inner).poll_flush(cx) {
            return Poll::Ready(result);
        }
        self.poll_ended(cx).map(Err)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Poll::Ready(result) = Pin::new(&mut self.inner).poll_shutdown(cx) {
            return Poll::Ready(result);
        }
        self.poll_ended(cx).map(Err)
    }
}

/// What [`Claim::run`] collected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    /// The command's exit code.
    pub code: i32,
    /// All it wrote to stdout.
    pub stdout: Vec<u8>,
    /// All it wrote to stderr.
    pub stderr: Vec<u8>,
}

impl Process {
    /// The command's stdin, once: shut it down to send end of file.
    pub fn stdin(&mut self) -> Option<Stdin> {
        Some(Stdin {
            inner: self.inner.stdin()?,
            ended: self.ended.clone(),
            waiting: None,
        })
    }

    /// The command's stdout, once.
    pub fn stdout(&mut self) -> Option<impl AsyncRead + Unpin + Send + use<>> {
        self.inner.stdout()
    }

    /// The command's stderr, once.
    pub fn stderr(&mut self) -> Option<impl AsyncRead + Unpin + Send + use<>> {
        self.inner.stderr()
    }

    /// Waits for the command to end and gives its exit code. Read stdout and stderr
    /// meanwhile (or not take them): a command whose output nobody reads may stall.
    pub async fn wait(self) -> Result<i32, Error> {
        let status = self.status.await.unwrap_or(None);
        self.inner
            .join()
            .await
            .map_err(|e| Error::Exec(Box::new(e)))?;
        exit_code(status, &self.pool)
    }
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

impl Claim {
    /// Starts `command` (a program and its arguments, no shell) in the MicroVM, with
    /// stdin, stdout and stderr as streams.
    pub async fn exec<I, S>(&self, command: I) -> Result<Process, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.spawn(command, true).await
    }

    /// Runs `command` with no stdin and collects its output and exit code.
    pub async fn run<I, S>(&self, command: I) -> Result<Output, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut process = self.spawn(command, false).await?;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let (out, err) = (process.stdout(), process.stderr());
        let read_out = async {
            match out {
                Some(mut out) => out.read_to_end(&mut stdout).await.map(drop),
                None => Ok(()),
            }
        };
        let read_err = async {
            match err {
                Some(mut err) => err.read_to_end(&mut stderr).await.map(drop),
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

    async fn spawn<I, S>(&self, command: I, stdin: bool) -> Result<Process, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let command: Vec<String> = command.into_iter().map(Into::into).collect();
        let params = AttachParams::default().stdin(stdin).stderr(true);
        let mut inner = self
            .client
            .claims()
            .exec(self.name(), command, &params)
            .await
            .map_err(|e| Error::from_claims(e, &self.pool))?;
        // The Status arrives as the session ends: watched from the start, so that stdin
        // learns of the end even while nobody waits for the exit code.
        let closing = inner.take_status();
        let (status_tx, status) = oneshot::channel();
        let (ended_tx, ended) = watch::channel(false);
        tokio::spawn(async move {
            let status = match closing {
                Some(closing) => closing.await,
                None => None,
            };
            ended_tx.send_replace(true);
            let _ = status_tx.send(status);
        });
        Ok(Process {
            inner,
            pool: self.pool.clone(),
            status,
            ended,
        })
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};

    use super::*;

    fn failure(reason: &str, causes: Vec<StatusCause>) -> Status {
        Status {
            status: Some("Failure".to_owned()),
            code: Some(500),
            reason: Some(reason.to_owned()),
            details: Some(StatusDetails {
                causes: Some(causes),
                ..StatusDetails::default()
            }),
            ..Status::default()
        }
    }

    #[test]
    fn the_exit_code_comes_from_the_status() {
        let success = Status {
            status: Some("Success".to_owned()),
            ..Status::default()
        };
        assert_eq!(exit_code(Some(success), "p").unwrap(), 0);
        let seven = failure(
            "NonZeroExitCode",
            vec![StatusCause {
                reason: Some("ExitCode".to_owned()),
                message: Some("7".to_owned()),
                field: None,
            }],
        );
        assert_eq!(exit_code(Some(seven), "p").unwrap(), 7);
        assert!(matches!(exit_code(None, "p"), Err(Error::ExecIncomplete)));
        assert!(matches!(
            exit_code(Some(failure("InternalError", vec![])), "p"),
            Err(Error::Api(_))
        ));
    }
}
