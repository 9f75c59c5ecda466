//! A connect subresource served over a WebSocket, as k8s.io/apiserver's `wsstream`
//! package serves `pods/exec` and `pods/portforward`: the handshake and its subprotocol
//! (a version of kube's channel protocol, `battery_types::channel`), the upgrade, the
//! channel framing of each message, and the task that serves the session once the
//! connection is upgraded.
//!
//! [`accept`] is all a resource calls. Everything that can refuse does so before the
//! `101`, as a `Status`: the handshake here, then whatever the resource's `open` refuses
//! (its options are read before). Only then is the connection upgraded and the
//! [`Session`] run on it; a session that never gets its connection is dropped, which
//! ends whatever it opened.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::response::{IntoResponse, Response};
use battery_api_machinery::status::ApiError;
use battery_types::channel::{self, Encoded, Protocol};
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

/// The largest WebSocket message read from a client: what a session relays onward as one
/// message (the exec agent takes at most 1 MiB, framing included).
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024 - 64;

/// What runs on an upgraded connection: built by the resource before the `101`, run once
/// the client has its WebSocket.
pub trait Session: Send + 'static {
    /// Whether the session streams bulk output (a command's stdout): its connection's TLS
    /// then holds more before it writes ([`BulkOutput`]).
    const BULK_OUTPUT: bool = false;

    /// Serves the client until the session ends; kube's channel framing is [`frame`] and
    /// [`unframe`] with the protocol the session was opened with.
    fn run<S>(self, ws: WebSocketStream<S>) -> impl Future<Output = ()> + Send
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static;
}

/// Answers a WebSocket upgrade with the best of `served` the client offered: `open` is
/// given that protocol and decides, before the `101`, whether the connection may open
/// and with what session; the session is then run on the upgraded connection.
pub async fn accept<S, O, F>(
    mut parts: Parts,
    served: &[Protocol],
    open: O,
) -> Result<Response, ApiError>
where
    S: Session,
    O: FnOnce(Protocol) -> F,
    F: Future<Output = Result<S, ApiError>>,
{
    let handshake = Handshake::of(&parts.headers, served)?;
    let upgrade = take_upgrade(&mut parts)?;
    let bulk = parts.extensions.remove::<BulkOutput>();
    let session = open(handshake.protocol).await?;
    let response = handshake.response()?;
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                if let (true, Some(bulk)) = (S::BULK_OUTPUT, bulk) {
                    bulk.enable();
                }
                session.run(server_websocket(upgraded).await).await;
            }
            // Dropping the session ends what it opened (the command the agent started).
            Err(error) => tracing::debug!(%error, "a WebSocket upgrade did not complete"),
        }
    });
    Ok(response)
}

/// In a request's extensions (`http/serve.rs` puts it there): lets a request that
/// upgrades its connection to bulk output (exec) have the connection's TLS hold more
/// before it writes. Other connections keep rustls's default, so the many that carry
/// small answers (watches above all) hold no more for a slow reader.
#[derive(Debug, Clone, Default)]
pub struct BulkOutput(Arc<AtomicBool>);

impl BulkOutput {
    /// From the connection's next write on.
    pub fn enable(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether a request on the connection enabled it.
    pub fn is_enabled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A message on `channel`: binary, or in the base64 protocol a text frame whose first
/// character is the channel's digit.
pub fn frame(protocol: Protocol, channel: u8, payload: &[u8]) -> Message {
    frame_of_parts(protocol, channel, &[payload])
}

/// [`frame`] of the payload `parts` make one after the other, copied once.
pub fn frame_of_parts<P: AsRef<[u8]>>(protocol: Protocol, channel: u8, parts: &[P]) -> Message {
    match channel::encode_parts(protocol, channel, parts) {
        Encoded::Binary(bytes) => Message::Binary(bytes.into()),
        Encoded::Text(text) => Message::Text(text.into()),
    }
}

/// A client's message as its channel and payload; `None` for what is not a frame of
/// `protocol`.
pub fn unframe(protocol: Protocol, message: Message) -> Option<(u8, Bytes)> {
    match (protocol, message) {
        (Protocol::V4Base64, Message::Text(text)) => {
            channel::decode_text(text.as_str()).map(|(channel, payload)| (channel, payload.into()))
        }
        (Protocol::V5 | Protocol::V4, Message::Binary(data)) => channel::decode_binary(&data)
            .map(|(channel, payload)| (channel, data.slice_ref(payload))),
        _ => None,
    }
}

/// The request's connection, to upgrade once the answer is `101`.
fn take_upgrade(parts: &mut Parts) -> Result<hyper::upgrade::OnUpgrade, ApiError> {
    parts
        .extensions
        .remove::<hyper::upgrade::OnUpgrade>()
        .ok_or_else(|| ApiError::bad_request("this connection cannot be upgraded to a WebSocket"))
}

/// The server's side of an upgraded connection's WebSocket, its messages bounded.
async fn server_websocket(
    upgraded: hyper::upgrade::Upgraded,
) -> WebSocketStream<TokioIo<hyper::upgrade::Upgraded>> {
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_MESSAGE_BYTES));
    WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config)).await
}

/// `protocols`' names, for a person.
fn names(protocols: &[Protocol]) -> String {
    let names: Vec<&str> = protocols.iter().map(|p| p.name()).collect();
    names.join(", ")
}

/// A WebSocket handshake we can accept.
struct Handshake {
    accept: String,
    protocol: Protocol,
}

impl Handshake {
    /// The handshake's answer, with the best of `served` the client offered.
    fn of(headers: &HeaderMap, served: &[Protocol]) -> Result<Self, ApiError> {
        let has_token = |name: header::HeaderName, token: &str| {
            headers.get_all(name).iter().any(|value| {
                value
                    .to_str()
                    .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
            })
        };
        let key = headers.get(header::SEC_WEBSOCKET_KEY);
        let (true, Some(key)) = (has_token(header::UPGRADE, "websocket"), key) else {
            return Err(ApiError::bad_request(format!(
                "this needs a WebSocket upgrade ({}); SPDY is not served",
                names(served)
            )));
        };
        if headers.get(header::SEC_WEBSOCKET_VERSION) != Some(&HeaderValue::from_static("13")) {
            return Err(ApiError::bad_request("this needs WebSocket version 13"));
        }
        let offered: Vec<&str> = headers
            .get_all(header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        let protocol = served
            .iter()
            .copied()
            .find(|p| offered.contains(&p.name()))
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "none of the offered WebSocket subprotocols ({}) is served: offer {}",
                    offered.join(", "),
                    names(served)
                ))
            })?;
        Ok(Self {
            accept: derive_accept_key(key.as_bytes()),
            protocol,
        })
    }

    fn response(&self) -> Result<Response, ApiError> {
        let accept = HeaderValue::from_str(&self.accept).map_err(ApiError::internal)?;
        Ok((
            StatusCode::SWITCHING_PROTOCOLS,
            [
                (header::CONNECTION, HeaderValue::from_static("Upgrade")),
                (header::UPGRADE, HeaderValue::from_static("websocket")),
                (header::SEC_WEBSOCKET_ACCEPT, accept),
                (
                    header::SEC_WEBSOCKET_PROTOCOL,
                    HeaderValue::from_static(self.protocol.name()),
                ),
            ],
        )
            .into_response())
    }
}

#[cfg(test)]
mod tests {
    use battery_types::channel::{STDERR, STDIN, STDOUT};

    use super::*;

    fn upgrade(protocols: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        headers.insert(
            header::SEC_WEBSOCKET_KEY,
            HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="),
        );
        headers.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_str(protocols).unwrap(),
        );
        headers
    }

    #[test]
    fn the_handshake_picks_v5_over_v4_and_refuses_others() {
        let both = Handshake::of(
            &upgrade("v4.channel.k8s.io, v5.channel.k8s.io"),
            &Protocol::ALL,
        )
        .unwrap();
        assert_eq!(both.protocol, Protocol::V5);
        // RFC 6455's example key and answer.
        assert_eq!(both.accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        let v4 = Handshake::of(&upgrade("v4.channel.k8s.io"), &Protocol::ALL).unwrap();
        assert_eq!(v4.protocol, Protocol::V4);
        let base64 = Handshake::of(&upgrade("base64.channel.k8s.io"), &Protocol::ALL)
            .err()
            .unwrap();
        assert_eq!(base64.code(), StatusCode::BAD_REQUEST);
        let spdy = Handshake::of(&HeaderMap::new(), &Protocol::ALL)
            .err()
            .unwrap();
        assert!(spdy.message().contains("SPDY"), "{}", spdy.message());
    }

    #[test]
    fn a_frame_is_its_channel_then_its_payload() {
        let binary = frame(Protocol::V4, STDERR, b"x");
        assert_eq!(binary, Message::Binary(vec![2, b'x'].into()));
        assert_eq!(
            unframe(Protocol::V4, binary),
            Some((STDERR, Bytes::from_static(b"x")))
        );
        assert_eq!(
            frame(Protocol::V5, STDOUT, &[]),
            Message::Binary(vec![1].into())
        );
        let text = frame(Protocol::V4Base64, STDOUT, b"hi\n");
        assert_eq!(text, Message::Text("1aGkK".into()));
        assert_eq!(
            unframe(Protocol::V4Base64, Message::Text("0aGkK".into())),
            Some((STDIN, Bytes::from_static(b"hi\n")))
        );
        // A frame of the other kind, or not base64, is not the protocol's.
        assert_eq!(
            unframe(Protocol::V4Base64, Message::Binary(vec![0].into())),
            None
        );
        assert_eq!(
            unframe(Protocol::V4Base64, Message::Text("0!!".into())),
            None
        );
        assert_eq!(unframe(Protocol::V5, Message::Text("0aGkK".into())), None);
    }
}
