//! An HTTPS client for tests that must choose exactly what a request carries: which
//! client certificate (or none, or a bearer token), which headers, HTTP/1.1 or HTTP/2.
//! kubectl cannot forge an `X-Remote-User` header or present an expired certificate;
//! the attack table needs both.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::StatusCode;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use serde_json::Value;

use crate::pki;

/// How long any single step may take.
pub const STEP: Duration = Duration::from_secs(20);

/// Who a request comes from.
#[derive(Clone, Debug)]
pub enum Identity {
    Anonymous,
    Cert(PathBuf, PathBuf),
    Token(String),
}

/// An HTTPS client of one server, trusting `ca`, speaking as `identity`.
pub struct Client {
    url: String,
    ca: PathBuf,
    identity: Identity,
    /// The name the server's certificate must hold.
    server_name: String,
}

impl Client {
    /// A client of a server whose certificate holds 127.0.0.1.
    pub fn new(url: &str, ca: &Path, identity: Identity) -> Self {
        Self {
            url: url.to_owned(),
            ca: ca.to_owned(),
            identity,
            server_name: "127.0.0.1".to_owned(),
        }
    }

    /// The same client, verifying that the server's certificate holds `name` instead: for
    /// a server dialed by address whose certificate names its Service, as a client on the
    /// pod network reaches battery-apiserver.
    pub fn with_server_name(mut self, name: &str) -> Self {
        name.clone_into(&mut self.server_name);
        self
    }

    /// A TLS connection to the server offering `alpn`, as this client's identity.
    pub async fn connect(
        &self,
        alpn: &[u8],
    ) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        let identity = match &self.identity {
            Identity::Cert(cert, key) => Some((cert.as_path(), key.as_path())),
            _ => None,
        };
        let config = pki::client_config(&[&self.ca], identity, &[alpn]).unwrap();
        let authority = self.authority();
        let tcp = tokio::net::TcpStream::connect(authority).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from(self.server_name.clone()).unwrap(), tcp)
            .await
            .unwrap()
    }

    pub fn authority(&self) -> &str {
        self.url.trim_start_matches("https://")
    }

    /// The `Authorization` header a bearer token identity sends on every request.
    pub(crate) fn authorization(&self) -> Option<String> {
        match &self.identity {
            Identity::Token(token) => Some(format!("Bearer {token}")),
            _ => None,
        }
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Body,
    ) -> http::Request<Body> {
        let mut request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, self.authority());
        if let Some(authorization) = self.authorization() {
            request = request.header(http::header::AUTHORIZATION, authorization);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(body).unwrap()
    }

    /// Sends a request over HTTP/1.1 and returns the response with its body unread.
    pub async fn open(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> http::Response<Incoming> {
        let stream = self.connect(b"http/1.1").await;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(connection.with_upgrades());
        let body = body.map_or_else(Body::empty, |v| Body::from(v.to_string()));
        let mut headers = headers.to_vec();
        if !headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        {
            headers.push(("content-type", "application/json"));
        }
        tokio::time::timeout(
            STEP,
            sender.send_request(self.request(method, path, &headers, body)),
        )
        .await
        .expect("the server answers in time")
        .unwrap()
    }

    /// The same over HTTP/2, as kubectl speaks.
    pub async fn open_h2(&self, method: &str, path: &str) -> http::Response<Incoming> {
        let stream = self.connect(b"h2").await;
        assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(connection);
        let mut request = self.request(method, path, &[], Body::empty());
        *request.uri_mut() = format!("{}{path}", self.url).parse().unwrap();
        request.headers_mut().remove(http::header::HOST);
        tokio::time::timeout(STEP, sender.send_request(request))
            .await
            .expect("the server answers in time")
            .unwrap()
    }

    /// A whole request: status and JSON body (`Value::Null` when not JSON).
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let response = self.open(method, path, headers, body).await;
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call("GET", path, &[], None).await
    }
}

/// Reads a streamed body one JSON line at a time.
pub struct Lines {
    body: Incoming,
    buffer: Vec<u8>,
}

impl Lines {
    pub fn new(response: http::Response<Incoming>) -> Self {
        Self {
            body: response.into_body(),
            buffer: Vec::new(),
        }
    }

    /// The next line, or None at the end of the body. Fails after [`STEP`].
    pub async fn next(&mut self) -> Option<Value> {
        tokio::time::timeout(STEP, async {
            loop {
                if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = self.buffer.drain(..=end).collect();
                    return Some(serde_json::from_slice(&line).unwrap());
                }
                match self.body.frame().await {
                    Some(frame) => {
                        if let Ok(data) = frame.unwrap().into_data() {
                            self.buffer.extend_from_slice(&data);
                        }
                    }
                    None => return None,
                }
            }
        })
        .await
        .expect("the next line arrives in time")
    }
}
