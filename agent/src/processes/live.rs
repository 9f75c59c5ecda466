//! A process as the agent follows it while it lives: its retained output, how it ended,
//! the signal a stop last sent, and the stream its stdin goes through. Attaches read it;
//! its follower and a stop write it.

use std::sync::{Mutex, MutexGuard, PoisonError};

use battery_proto::Bytes;
use battery_proto::agent::v1alpha1::exit_status::Outcome;
use battery_proto::microvmexec::services::api::v1alpha1::ExecCommandRequest;
use battery_proto::microvmexec::services::api::v1alpha1::exec_command_request::Payload as FlintlockRequest;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::output::{Output, Stream};

/// A signal a stop sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Term,
    Kill,
}

impl Signal {
    /// As `kill -s` takes it.
    pub fn short(self) -> &'static str {
        match self {
            Self::Term => "TERM",
            Self::Kill => "KILL",
        }
    }

    /// As the API shows it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Term => "SIGTERM",
            Self::Kill => "SIGKILL",
        }
    }

    /// What a shell (and flintlockd) reports a death by this signal as: 128+n.
    pub fn exit_code(self) -> i32 {
        match self {
            Self::Term => 128 + 15,
            Self::Kill => 128 + 9,
        }
    }
}

struct Shared {
    output: Output,
    ended: Option<Outcome>,
    sent: Option<Signal>,
}

/// One process, shared by its follower, its stop and its attaches.
pub struct Live {
    shared: Mutex<Shared>,
    /// Told of every change: output, and the end.
    changed: watch::Sender<()>,
    /// The stream of requests to flintlockd, kept open while the process runs (closing
    /// it closes the command's stdin); taken at stdin's end.
    requests: tokio::sync::Mutex<Option<mpsc::Sender<ExecCommandRequest>>>,
    /// Whether it was started with stdin open for attaches.
    pub stdin: bool,
    /// Cancelled when a stop gives up on signals: the follower then closes the exec
    /// stream, which makes flintlockd end the command.
    pub cut: CancellationToken,
}

impl Live {
    pub fn new(requests: mpsc::Sender<ExecCommandRequest>, stdin: bool) -> Self {
        Self::with(Some(requests), stdin, None)
    }

    /// A process that ended before this agent started: nothing of it is live.
    pub fn ended(outcome: Outcome) -> Self {
        Self::with(None, false, Some(outcome))
    }

    fn with(
        requests: Option<mpsc::Sender<ExecCommandRequest>>,
        stdin: bool,
        ended: Option<Outcome>,
    ) -> Self {
        Self {
            shared: Mutex::new(Shared {
                output: Output::default(),
                ended,
                sent: None,
            }),
            changed: watch::Sender::new(()),
            requests: tokio::sync::Mutex::new(requests),
            stdin,
            cut: CancellationToken::new(),
        }
    }

    fn shared(&self) -> MutexGuard<'_, Shared> {
        // Each change leaves it consistent, so a panic elsewhere harms nothing.
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn push(&self, stream: Stream, bytes: Bytes) {
        self.shared().output.push(stream, bytes);
        self.changed.send_replace(());
    }

    /// Records its end; returns the signal a stop last sent.
    pub fn end(&self, outcome: Outcome) -> Option<Signal> {
        let sent = {
            let mut shared = self.shared();
            shared.ended = Some(outcome);
            shared.sent
        };
        self.changed.send_replace(());
        sent
    }

    pub fn sent(&self, signal: Signal) {
        self.shared().sent = Some(signal);
    }

    /// Output after `cursor`, the cursor to read from next, and the end once all output
    /// before it has been read: both under one lock, so no output is read after the end.
    pub fn read(&self, cursor: u64) -> (Vec<(Stream, Bytes)>, u64, Option<Outcome>) {
        let shared = self.shared();
        let (chunks, next) = shared.output.after(cursor);
        (chunks, next, shared.ended.clone())
    }

    pub fn has_ended(&self) -> bool {
        self.shared().ended.is_some()
    }

    /// Waits for a change after the last one `changes` saw.
    pub fn subscribe(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// Completes once it ended.
    pub async fn wait_ended(&self) {
        let mut changes = self.subscribe();
        while !self.has_ended() {
            if changes.changed().await.is_err() {
                return;
            }
        }
    }

    /// Writes to its stdin, in order; false once stdin is closed.
    pub async fn write(&self, payload: FlintlockRequest) -> bool {
        let requests = self.requests.lock().await;
        match requests.as_ref() {
            Some(requests) => requests
                .send(ExecCommandRequest {
                    payload: Some(payload),
                })
                .await
                .is_ok(),
            None => false,
        }
    }

    /// Closes its stdin: end of file, then the request stream's end.
    pub async fn close_stdin(&self) {
        self.write(FlintlockRequest::StdinEof(true)).await;
        self.requests.lock().await.take();
    }

    /// Lets go of the request stream once it ended.
    pub async fn release(&self) {
        self.requests.lock().await.take();
    }
}
