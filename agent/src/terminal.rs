//! Relays one session with a terminal: the API server's stream to and from an SSH
//! channel on a PTY in the guest ([`crate::ssh`]). stdin, resizes and stdin's end go to
//! the channel; the terminal's output and the command's exit status come back.
//!
//! The command starts once the client's first size comes (the API server sends each
//! resize the client's terminal makes, the first at once), or after [`FIRST_SIZE_WAIT`]
//! at 80x24, so a program that reads its size at start sees the client's. Backpressure
//! holds as on the exec path: the client's stream is read only once the channel took the
//! last message, and the channel only once the client took the last output.

use std::time::Duration;

use battery_proto::agent::v1alpha1::{
    ExecRequest, TerminalSize, exec_request, exec_response, exit_status,
};
use russh::{ChannelMsg, Sig};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};
use tracing::debug;

use crate::exec_reply::{Reply, exit, output};
use crate::ssh::{self, DEFAULT_SIZE, Opened};

/// How long the command waits for the client's terminal size before it starts at
/// [`DEFAULT_SIZE`]: clients that send none (a program, not a person) then lose only this.
const FIRST_SIZE_WAIT: Duration = Duration::from_secs(1);
/// A shell reports death by signal n as 128+n.
const SIGNAL_EXIT_BASE: i32 = 128;

/// Runs `command` on a PTY on `opened`, a session channel, and relays it until it ends;
/// then closes the channel, which hangs up the terminal if the command still runs.
pub async fn relay(
    opened: Opened,
    command: String,
    mut inbound: Streaming<ExecRequest>,
    replies: mpsc::Sender<Reply>,
) {
    let Opened {
        channel,
        connection: _connection,
    } = opened;
    let (size, early) = first_size(&mut inbound).await;
    if let Err(error) = ssh::run_on_terminal(&channel, &command, size).await {
        let _ = replies
            .send(exit(exit_status::Outcome::Error(format!(
                "starting the command on a terminal in the MicroVM: {error}"
            ))))
            .await;
        let _ = channel.close().await;
        return;
    }
    let (mut from_guest, to_guest) = channel.split();
    for request in early {
        if apply(&to_guest, request).await.is_err() {
            break;
        }
    }
    // Each direction is its own loop, so a paste the guest is slow to read never stops
    // its output, nor the other way round. The client being done writing leaves the
    // output and the exit status to come.
    let upstream = async {
        loop {
            match inbound.message().await {
                Ok(Some(ExecRequest {
                    payload: Some(payload),
                })) => {
                    if let Err(status) = check(&payload) {
                        let _ = replies.try_send(Err(status));
                        return;
                    }
                    if apply(&to_guest, payload).await.is_err() {
                        break;
                    }
                }
                Ok(Some(ExecRequest { payload: None }) | None) => break,
                Err(status) => {
                    debug!(%status, "the API server's stream broke; ending the terminal session");
                    return;
                }
            }
        }
        std::future::pending::<()>().await;
    };
    let downstream = async {
        let mut code = None;
        loop {
            match from_guest.wait().await {
                // With a PTY, stderr is the terminal too; a server may still send some
                // apart (sshd's own messages).
                Some(ChannelMsg::Data { data } | ChannelMsg::ExtendedData { data, .. }) => {
                    let reply = output(exec_response::Payload::Stdout(data));
                    if replies.send(reply).await.is_err() {
                        return;
                    }
                }
                Some(ChannelMsg::ExitStatus { exit_status }) => {
                    code = Some(i32::try_from(exit_status).unwrap_or(i32::MAX));
                }
                Some(ChannelMsg::ExitSignal { signal_name, .. }) => {
                    code = Some(SIGNAL_EXIT_BASE + signal_number(&signal_name));
                }
                Some(ChannelMsg::Failure) => {
                    let _ = replies
                        .send(exit(exit_status::Outcome::Error(
                            "the MicroVM's sshd refused to run the command on a terminal"
                                .to_owned(),
                        )))
                        .await;
                    return;
                }
                // The status comes before the channel closes; a close ends the session.
                Some(ChannelMsg::Close) | None => {
                    let outcome = code.map_or_else(
                        || {
                            exit_status::Outcome::Error(
                                "the terminal session ended without an exit status".to_owned(),
                            )
                        },
                        exit_status::Outcome::Code,
                    );
                    debug!(?outcome, "terminal session ended");
                    let _ = replies.send(exit(outcome)).await;
                    return;
                }
                Some(_) => {}
            }
        }
    };
    tokio::select! {
        () = replies.closed() => debug!("the API server's stream went away; ending the terminal session"),
        () = upstream => {}
        () = downstream => {}
    }
    let _ = to_guest.close().await;
}

/// Waits (up to [`FIRST_SIZE_WAIT`]) for the client's first size; what came before it
/// (stdin the client typed ahead) is returned to be applied once the command runs.
async fn first_size(
    inbound: &mut Streaming<ExecRequest>,
) -> (TerminalSize, Vec<exec_request::Payload>) {
    let mut early = Vec::new();
    let waited = tokio::time::timeout(FIRST_SIZE_WAIT, async {
        while let Ok(Some(ExecRequest {
            payload: Some(payload),
        })) = inbound.message().await
        {
            match payload {
                exec_request::Payload::Resize(size) => return Some(size),
                other => early.push(other),
            }
        }
        None
    })
    .await;
    (waited.ok().flatten().unwrap_or(DEFAULT_SIZE), early)
}

/// Refuses what a session may not send after `open`.
fn check(payload: &exec_request::Payload) -> Result<(), Status> {
    match payload {
        exec_request::Payload::Open(_) | exec_request::Payload::Attach(_) => Err(
            Status::invalid_argument("only the first message of an exec session may be `open`"),
        ),
        _ => Ok(()),
    }
}

/// Hands one of the client's messages to the channel; an error means the channel is gone.
async fn apply(
    to_guest: &russh::ChannelWriteHalf<russh::client::Msg>,
    payload: exec_request::Payload,
) -> Result<(), russh::Error> {
    match payload {
        exec_request::Payload::Stdin(bytes) => to_guest.data_bytes(bytes).await,
        exec_request::Payload::StdinEof(_) => to_guest.eof().await,
        exec_request::Payload::Resize(TerminalSize { width, height }) => {
            to_guest.window_change(width, height, 0, 0).await
        }
        exec_request::Payload::Open(_) | exec_request::Payload::Attach(_) => Ok(()),
    }
}

/// Linux's number of a signal SSH names.
fn signal_number(signal: &Sig) -> i32 {
    match signal {
        Sig::HUP => 1,
        Sig::INT => 2,
        Sig::QUIT => 3,
        Sig::ILL => 4,
        Sig::ABRT => 6,
        Sig::FPE => 8,
        Sig::KILL => 9,
        Sig::USR1 => 10,
        Sig::SEGV => 11,
        Sig::PIPE => 13,
        Sig::ALRM => 14,
        Sig::TERM => 15,
        Sig::Custom(_) => 0,
    }
}
