//! A process's follower: reads its exec stream from flintlockd to the end, keeping its
//! output for attaches, and records how it ended. Reading never waits for an attach, so
//! flintlockd's window stays open and the command never stops at a full pipe.

use std::sync::Arc;

use battery_proto::agent::v1alpha1::exit_status::Outcome;
use battery_proto::microvmexec::services::api::v1alpha1::ExecCommandResponse;
use battery_proto::microvmexec::services::api::v1alpha1::exec_command_response::Payload as FlintlockResponse;
use tonic::Streaming;
use tracing::{debug, warn};

use super::live::Live;
use super::output::Stream;
use super::record::{State, now};
use super::table::{Key, Processes};

/// Follows the process `key`, `id`, to its end.
pub async fn follow(
    processes: Processes,
    key: Key,
    id: u64,
    live: Arc<Live>,
    mut from_flintlock: Streaming<ExecCommandResponse>,
) {
    let mut errors: Vec<String> = Vec::new();
    let outcome = loop {
        let message = tokio::select! {
            biased;
            () = live.cut.cancelled() => {
                break Outcome::Error(
                    "it did not end on SIGKILL, so the agent closed its exec stream, which \
                     makes flintlockd end it"
                        .to_owned(),
                );
            }
            message = from_flintlock.message() => message,
        };
        match message {
            Ok(Some(ExecCommandResponse { payload })) => match payload {
                Some(FlintlockResponse::Stdout(bytes)) => live.push(Stream::Stdout, bytes),
                Some(FlintlockResponse::Stderr(bytes)) => live.push(Stream::Stderr, bytes),
                Some(FlintlockResponse::Error(message)) => errors.push(message),
                Some(FlintlockResponse::ExitCode(code)) if errors.is_empty() => {
                    break Outcome::Code(code);
                }
                Some(FlintlockResponse::ExitCode(_)) => break Outcome::Error(errors.join("; ")),
                // A payload this agent does not know, from a newer flintlockd.
                None => {}
            },
            Ok(None) => {
                warn!("flintlockd ended a process's exec stream without an exit code");
                break Outcome::Error(
                    "flintlockd ended the stream without an exit code".to_owned(),
                );
            }
            Err(status) => {
                warn!(%status, "flintlockd's exec stream of a process failed");
                break Outcome::Error(format!("flintlockd: {}", status.message()));
            }
        }
    };
    debug!(?outcome, "process ended");
    drop(from_flintlock);
    live.release().await;
    let sent = live.end(outcome.clone());
    let end_time = now();
    let state = match outcome {
        Outcome::Code(code) => State::Exited {
            code,
            signal: sent
                .filter(|signal| signal.exit_code() == code)
                .map(|signal| signal.name().to_owned()),
            end_time,
        },
        Outcome::Error(message) => State::Failed { message, end_time },
    };
    processes.finish(&key, id, state);
}
