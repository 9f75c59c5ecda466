//! An attach: the process's retained output from the start, then its output as it comes,
//! and last its exit status, as an `Exec` stream answers; and, when asked, the client's
//! stdin to the process. The client leaving leaves the process running.

use std::sync::Arc;

use battery_proto::agent::v1alpha1::{AttachOpen, ExecRequest, exec_request, exec_response};
use battery_proto::microvmexec::services::api::v1alpha1::exec_command_request::Payload as FlintlockRequest;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::AbortOnDropHandle;
use tonic::{Status, Streaming};
use tracing::{Instrument as _, debug, info_span};

use super::live::Live;
use super::output::Stream;
use super::table::{Processes, not_found};
use crate::exec_reply::{Reply, exit, output};

/// Output messages queued towards the client before an attach waits for it (the
/// process does not wait: its output is retained).
const OUTPUT_BUFFER: usize = 4;

impl Processes {
    /// Attaches to a process; `permit` is the session's slot, held until it ends.
    pub fn attach(
        &self,
        open: AttachOpen,
        inbound: Streaming<ExecRequest>,
        permit: OwnedSemaphorePermit,
    ) -> Result<ReceiverStream<Reply>, Status> {
        let process = open.process.clone().unwrap_or_default();
        let key = (process.namespace, process.name);
        let live = self
            .entries()
            .get(&key)
            .map(|entry| entry.live.clone())
            .ok_or_else(|| not_found(&key))?;
        if open.stdin && !live.stdin {
            return Err(Status::failed_precondition(format!(
                "process {}/{} was started without stdin, so an attach cannot write to it",
                key.0, key.1
            )));
        }
        let span = info_span!("attach", namespace = %key.0, name = %key.1);
        let (replies, stream) = mpsc::channel(OUTPUT_BUFFER);
        tokio::spawn(
            async move {
                relay(live, inbound, &open, replies).await;
                drop(permit);
            }
            .instrument(span),
        );
        Ok(ReceiverStream::new(stream))
    }
}

async fn relay(
    live: Arc<Live>,
    inbound: Streaming<ExecRequest>,
    open: &AttachOpen,
    replies: mpsc::Sender<Reply>,
) {
    let _stdin = AbortOnDropHandle::new(tokio::spawn(
        forward_stdin(live.clone(), inbound, open.stdin).in_current_span(),
    ));
    let mut changes = live.subscribe();
    let mut cursor = 0;
    loop {
        changes.mark_unchanged();
        let (chunks, next, ended) = live.read(cursor);
        for (stream, bytes) in chunks {
            // Output of a stream the client did not attach is not sent.
            let payload = match stream {
                Stream::Stdout if open.stdout => exec_response::Payload::Stdout(bytes),
                Stream::Stderr if open.stderr => exec_response::Payload::Stderr(bytes),
                Stream::Stdout | Stream::Stderr => continue,
            };
            if replies.send(output(payload)).await.is_err() {
                return;
            }
        }
        cursor = next;
        if let Some(outcome) = ended {
            let _ = replies.send(exit(outcome)).await;
            return;
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            () = replies.closed() => {
                debug!("the API server's stream went away; the process runs on");
                return;
            }
        }
    }
}

/// Relays the client's stdin, when it attached stdin; anything else it sends is ignored
/// but read, so its stream's end is seen.
async fn forward_stdin(live: Arc<Live>, mut inbound: Streaming<ExecRequest>, stdin: bool) {
    while let Ok(Some(ExecRequest { payload })) = inbound.message().await {
        match payload {
            Some(exec_request::Payload::Stdin(bytes)) if stdin => {
                let written = live.write(FlintlockRequest::Stdin(bytes)).await;
                if !written {
                    debug!("stdin sent after the process's stdin was closed; dropped");
                }
            }
            Some(exec_request::Payload::StdinEof(_)) if stdin => live.close_stdin().await,
            _ => {}
        }
    }
}
