//! A second exec client, independent of kube-rs: the WebSocket channel protocol
//! (`v5.channel.k8s.io`, `v4.channel.k8s.io`) spoken by hand over tokio-tungstenite, on a
//! TLS connection of [`crate::https`] as its identity (a client certificate or a bearer
//! token).

use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

/// The channels of the protocol.
pub const STDIN: u8 = 0;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;
pub const ERROR: u8 = 3;
/// v5: a frame here closes the channel its payload names.
pub const CLOSE: u8 = 255;

/// How long a session may take to say anything.
const QUIET_LIMIT: Duration = Duration::from_secs(60);

/// Who connects, and to where: an [`https::Client`](crate::https::Client) whose
/// connections the WebSocket runs on.
pub struct Client {
    pub https: crate::https::Client,
}

/// What a session printed, and its closing Status.
#[derive(Debug, Default)]
pub struct Outcome {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub status: Value,
}

/// An open exec session.
pub struct Session {
    ws: WebSocketStream<TlsStream<TcpStream>>,
    /// The subprotocol the server chose.
    pub protocol: String,
}

impl Client {
    /// Opens `path_and_query` offering `protocols`; a refusal is its HTTP status and the
    /// `Status` body.
    pub async fn open(
        &self,
        path_and_query: &str,
        protocols: &str,
    ) -> Result<Session, (u16, Value)> {
        let authority = self.https.authority();
        let tls = self.https.connect(b"http/1.1").await;
        let mut request = format!("wss://{authority}{path_and_query}")
            .into_client_request()
            .expect("a WebSocket request");
        request.headers_mut().insert(
            "sec-websocket-protocol",
            protocols.parse().expect("a header value"),
        );
        if let Some(authorization) = self.https.authorization() {
            request.headers_mut().insert(
                http::header::AUTHORIZATION,
                authorization.parse().expect("a header value"),
            );
        }
        match tokio_tungstenite::client_async(request, tls).await {
            Ok((ws, response)) => Ok(Session {
                protocol: response
                    .headers()
                    .get("sec-websocket-protocol")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned(),
                ws,
            }),
            Err(WsError::Http(response)) => {
                let status = response.status().as_u16();
                let body = response.into_body().unwrap_or_default();
                Err((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
            }
            Err(other) => panic!("the WebSocket handshake failed: {other}"),
        }
    }
}

impl Session {
    /// Sends `payload` on `channel`.
    pub async fn send(&mut self, channel: u8, payload: &[u8]) {
        let mut frame = Vec::with_capacity(payload.len() + 1);
        frame.push(channel);
        frame.extend_from_slice(payload);
        self.ws
            .send(Message::Binary(frame.into()))
            .await
            .expect("send a frame");
    }

    /// v5: the command reads end of file on stdin.
    pub async fn close_stdin(&mut self) {
        self.send(CLOSE, &[STDIN]).await;
    }

    /// Reads until the server closes the connection.
    pub async fn finish(mut self) -> Outcome {
        let mut outcome = Outcome::default();
        while let Some(message) = tokio::time::timeout(QUIET_LIMIT, self.ws.next())
            .await
            .expect("the session said nothing for a minute")
        {
            let Ok(Message::Binary(data)) = message else {
                continue;
            };
            let Some((&channel, payload)) = data.split_first() else {
                continue;
            };
            match channel {
                STDOUT => outcome.stdout.extend_from_slice(payload),
                STDERR => outcome.stderr.extend_from_slice(payload),
                ERROR => {
                    outcome.status =
                        serde_json::from_slice(payload).expect("a Status on channel 3");
                }
                other => panic!("a frame on channel {other}"),
            }
        }
        outcome
    }
}

/// The query of an exec of `command`, as kubectl writes it.
pub fn query(command: &[&str], stdin: bool) -> String {
    let mut query: Vec<String> = command
        .iter()
        .map(|arg| format!("command={}", percent_encode(arg)))
        .collect();
    query.extend(["stdout=true".to_owned(), "stderr=true".to_owned()]);
    if stdin {
        query.push("stdin=true".to_owned());
    }
    query.join("&")
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The path of a claim's exec subresource.
pub fn exec_path(namespace: &str, claim: &str) -> String {
    format!(
        "/apis/{}/namespaces/{namespace}/microvmclaims/{claim}/exec",
        battery_types::API_VERSION
    )
}
