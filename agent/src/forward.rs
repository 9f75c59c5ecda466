//! One forwarded connection: the API server's `PortForward` stream to and from a
//! `direct-tcpip` channel to a port on the guest's loopback, over the agent's SSH
//! connection to the guest ([`crate::ssh::Logins`]). Each direction is its own loop, so one that waits (a guest
//! not reading, a client not reading) never stops the other: an echo of more than the
//! windows hold flows both ways at once.

use battery_proto::agent::v1alpha1::{
    PortForwardRequest, PortForwardResponse, port_forward_request,
};
use russh::ChannelMsg;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};
use tracing::debug;

use crate::ssh::Opened;

pub type Reply = Result<PortForwardResponse, Status>;

/// Relays `opened`'s channel until the guest closes it or the API server's stream goes,
/// then closes it.
pub async fn relay(
    opened: Opened,
    mut inbound: Streaming<PortForwardRequest>,
    replies: mpsc::Sender<Reply>,
) {
    let Opened {
        channel,
        connection: _connection,
    } = opened;
    let (mut from_guest, to_guest) = channel.split();
    // Ends only when the client is gone or broke the protocol; the client being done
    // writing leaves the guest's answer to come.
    let upstream = async {
        loop {
            match inbound.message().await {
                Ok(Some(PortForwardRequest {
                    payload: Some(port_forward_request::Payload::Data(data)),
                })) => {
                    if to_guest.data_bytes(data).await.is_err() {
                        break;
                    }
                }
                Ok(Some(PortForwardRequest {
                    payload: Some(port_forward_request::Payload::Open(_)),
                })) => {
                    let _ = replies.try_send(Err(Status::invalid_argument(
                        "only the first message of a port-forward stream may be `open`",
                    )));
                    return;
                }
                // The client is done writing: the guest reads end of file.
                Ok(Some(PortForwardRequest { payload: None }) | None) => {
                    let _ = to_guest.eof().await;
                    break;
                }
                Err(status) => {
                    debug!(%status, "the API server's stream broke; closing the connection");
                    return;
                }
            }
        }
        std::future::pending::<()>().await;
    };
    let downstream = async {
        loop {
            match from_guest.wait().await {
                Some(ChannelMsg::Data { data }) => {
                    if replies
                        .send(Ok(PortForwardResponse { data }))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                // The guest closed: the stream ends, and with it the client's connection.
                Some(ChannelMsg::Eof | ChannelMsg::Close) | None => return,
                Some(_) => {}
            }
        }
    };
    tokio::select! {
        () = replies.closed() => debug!("the API server's stream went away; closing the connection"),
        () = upstream => {}
        () = downstream => {}
    }
    let _ = to_guest.close().await;
}
