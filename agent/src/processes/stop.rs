//! Stopping a process: SIGTERM, then SIGKILL once its grace period passed, each sent by
//! `kill` in the guest (flintlock's exec API has no signals), to the command's process
//! group where it leads one, else to its pid. A process that outlives SIGKILL has its
//! exec stream closed, which makes flintlockd end it. A delete stops it so, and the
//! table forgets it once it ended.

use std::sync::Arc;
use std::time::Duration;

use battery_proto::agent::v1alpha1::{self as pb, StopProcessRequest};
use battery_proto::microvmexec::services::api::v1alpha1::exec_command_request::Payload as FlintlockRequest;
use battery_proto::microvmexec::services::api::v1alpha1::exec_command_response::Payload as FlintlockResponse;
use battery_proto::microvmexec::services::api::v1alpha1::{ExecCommandRequest, ExecStart};
use tokio_util::task::AbortOnDropHandle;
use tonic::Status;
use tracing::{Instrument as _, info, warn};

use super::live::{Live, Signal};
use super::record::now;
use super::table::{Processes, not_found};
use crate::flintlock::Flintlock;

/// How long a process may take to die of SIGKILL before its stream is closed.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// `kill -s SIGNAL` to the group `-PID`, or to `PID` when it leads none.
const KILL: &str = "kill -s \"$1\" -- \"-$2\" 2>/dev/null || kill -s \"$1\" \"$2\"";

impl Processes {
    /// Starts stopping a process (once: a second stop changes nothing) and, for a
    /// delete, marks it to be forgotten at its end, or forgets it now if it ended.
    pub fn stop(&self, request: StopProcessRequest, delete: bool) -> Result<pb::Process, Status> {
        let process = request.process.unwrap_or_default();
        let key = (process.namespace, process.name);
        let grace = Duration::from_secs(request.grace_period_seconds.into());
        let mut entries = self.entries();
        let entry = entries.get_mut(&key).ok_or_else(|| not_found(&key))?;
        if delete && !entry.record.deleting() {
            entry.record.deletion_time = Some(now());
        }
        let answer = entry.record.to_proto();
        if !entry.record.running() {
            if delete {
                entries.remove(&key);
                self.save_or_warn(&entries);
            }
            return Ok(answer);
        }
        if entry.stopper.is_none() {
            info!(namespace = %key.0, name = %key.1, ?grace, "stopping a process");
            let stopping = signal_until_ended(
                self.flintlock().clone(),
                entry.record.microvm_uid.clone(),
                entry.record.pid,
                entry.live.clone(),
                grace,
            );
            entry.stopper = Some(AbortOnDropHandle::new(tokio::spawn(
                stopping.in_current_span(),
            )));
        }
        if delete {
            self.save_or_warn(&entries);
        }
        Ok(answer)
    }
}

/// SIGTERM, SIGKILL once `grace` passed, and the stream closed if even that did not end
/// it.
async fn signal_until_ended(
    flintlock: Flintlock,
    microvm_uid: String,
    pid: u32,
    live: Arc<Live>,
    grace: Duration,
) {
    for (signal, wait) in [(Signal::Term, grace), (Signal::Kill, KILL_WAIT)] {
        live.sent(signal);
        if let Err(error) = send(&flintlock, &microvm_uid, pid, signal).await {
            warn!(%error, signal = signal.name(), "signalling a process failed");
        }
        if tokio::time::timeout(wait, live.wait_ended()).await.is_ok() {
            return;
        }
    }
    live.cut.cancel();
}

/// Runs `kill` in the guest.
async fn send(
    flintlock: &Flintlock,
    microvm_uid: &str,
    pid: u32,
    signal: Signal,
) -> Result<(), String> {
    let start = ExecCommandRequest {
        payload: Some(FlintlockRequest::Start(ExecStart {
            uid: microvm_uid.to_owned(),
            cmd: "sh".to_owned(),
            args: ["-c", KILL, "sh", signal.short(), &pid.to_string()]
                .map(str::to_owned)
                .into(),
            shell: false,
            ..ExecStart::default()
        })),
    };
    let mut responses = flintlock
        .exec(tokio_stream::once(start))
        .await
        .map_err(|status| format!("flintlockd: {}", status.message()))?;
    let mut said = Vec::new();
    loop {
        let Some(response) = responses
            .message()
            .await
            .map_err(|status| format!("flintlockd: {}", status.message()))?
        else {
            return Err("flintlockd ended the stream without an exit code".to_owned());
        };
        match response.payload {
            Some(FlintlockResponse::ExitCode(0)) => return Ok(()),
            Some(FlintlockResponse::ExitCode(code)) => {
                return Err(format!(
                    "kill exited with {code}: {}",
                    String::from_utf8_lossy(&said).trim()
                ));
            }
            Some(FlintlockResponse::Stderr(bytes)) => said.extend_from_slice(&bytes),
            Some(FlintlockResponse::Error(message)) => said.extend_from_slice(message.as_bytes()),
            Some(FlintlockResponse::Stdout(_)) | None => {}
        }
    }
}
