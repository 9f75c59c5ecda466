//! What an `Exec` stream answers the API server with, for both paths that serve one: the
//! relay to flintlockd's exec API ([`crate::relay`]) and a terminal's SSH session
//! ([`crate::terminal`]).

use battery_proto::agent::v1alpha1::{ExecResponse, ExitStatus, exec_response, exit_status};
use tonic::Status;

/// One message of an `Exec` stream's answer.
pub(crate) type Reply = Result<ExecResponse, Status>;

/// Output (or any payload) as a message of the answer.
pub(crate) fn output(payload: exec_response::Payload) -> Reply {
    Ok(ExecResponse {
        payload: Some(payload),
    })
}

/// The session's end as a message of the answer.
pub(crate) fn exit(outcome: exit_status::Outcome) -> Reply {
    output(exec_response::Payload::Exit(ExitStatus {
        outcome: Some(outcome),
    }))
}
