//! A second exec client, independent of kube-rs: the WebSocket channel protocol
//! (`v5.channel.k8s.io`, `v4.channel.k8s.io`) spoken by hand over tokio-tungstenite, on a
//! connection of [`crate::https`] upgraded as its identity (a client certificate or a
//! bearer token). The framing is `battery_types::channel`'s, which the server speaks too;
//! what is written by hand is the client: the handshake and the session.

use std::time::Duration;

use battery_types::channel::{self, CLOSE, ERROR, STDERR, STDIN, STDOUT};
use futures::{SinkExt as _, StreamExt as _};
use http_body_util::BodyExt as _;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::{Message, handshake};

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
    ws: WebSocketStream<TokioIo<Upgraded>>,
    /// The subprotocol the server chose.
    pub protocol: String,
}

impl Client {
    /// Opens `path_and_query` offering `protocols`; a refusal is its HTTP status and the
    /// `Status` body.
    ///
    /// The handshake is hyper's, not tungstenite's: tungstenite keeps of a refusal only
    /// the body bytes that came with its headers, and kube-apiserver's proxy writes a
    /// refusal's headers and body apart.
    pub async fn open(
        &self,
        path_and_query: &str,
        protocols: &str,
    ) -> Result<Session, (u16, Value)> {
        let key = handshake::client::generate_key();
        let headers = [
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", key.as_str()),
            ("sec-websocket-protocol", protocols),
        ];
        let response = self.https.open("GET", path_and_query, &headers, None).await;
        let status = response.status();
        if status != http::StatusCode::SWITCHING_PROTOCOLS {
            let body = response
                .into_body()
                .collect()
                .await
                .map(|body| body.to_bytes())
                .unwrap_or_default();
            return Err((
                status.as_u16(),
                serde_json::from_slice(&body).unwrap_or(Value::Null),
            ));
        }
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        assert_eq!(
            header("sec-websocket-accept"),
            handshake::derive_accept_key(key.as_bytes()),
            "the server accepted another handshake"
        );
        let protocol = header("sec-websocket-protocol");
        let upgraded = hyper::upgrade::on(response)
            .await
            .expect("the connection upgrades");
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await;
        Ok(Session { ws, protocol })
    }
}

impl Session {
    /// Sends `payload` on `channel`.
    pub async fn send(&mut self, channel: u8, payload: &[u8]) {
        self.ws
            .send(Message::Binary(channel::frame(channel, payload).into()))
            .await
            .expect("send a frame");
    }

    /// v5: the command reads end of file on stdin.
    pub async fn close_stdin(&mut self) {
        self.send(CLOSE, &[STDIN]).await;
    }

    /// Reads stdout until it has shown `text`; returns what it read. Other channels'
    /// frames are dropped: this is for waiting until a command is under way.
    pub async fn read_stdout_until(&mut self, text: &str) -> String {
        let mut stdout = Vec::new();
        while !String::from_utf8_lossy(&stdout).contains(text) {
            let message = tokio::time::timeout(QUIET_LIMIT, self.ws.next())
                .await
                .expect("the session said nothing for a minute")
                .unwrap_or_else(|| {
                    panic!(
                        "the session ended before {text:?}: {}",
                        String::from_utf8_lossy(&stdout)
                    )
                });
            if let Ok(Message::Binary(data)) = message
                && let Some((&STDOUT, payload)) = data.split_first()
            {
                stdout.extend_from_slice(payload);
            }
        }
        String::from_utf8_lossy(&stdout).into_owned()
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
            let Some((channel, payload)) = channel::decode_binary(&data) else {
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
    connect_path(namespace, claim, "exec")
}

/// The path of the claim's WebSocket subresource `subresource` (`exec`, `portforward`).
pub fn connect_path(namespace: &str, claim: &str, subresource: &str) -> String {
    format!(
        "/apis/{}/namespaces/{namespace}/microvmclaims/{claim}/{subresource}",
        battery_types::API_VERSION
    )
}
