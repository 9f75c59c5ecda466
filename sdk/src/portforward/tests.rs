use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::SinkExt as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::protocol::Role;

use super::*;

const REFUSED: &str = "connecting to port 80 in the MicroVM: connection refused";

fn frame(channel: u8, payload: &[u8]) -> Bytes {
    channel::frame(channel, payload).into()
}

#[test]
fn each_channel_begins_with_the_port_then_carries_data_or_the_error() {
    let mut channels = Channels::new(8080);
    let port = 8080u16.to_le_bytes();
    assert_eq!(
        channels.accept(frame(DATA, &port)).unwrap(),
        Incoming::Nothing
    );
    assert_eq!(
        channels.accept(frame(DATA, b"hi")).unwrap(),
        Incoming::Data(Bytes::from_static(b"hi"))
    );
    // Data that happens to look like the port is data once the port has been.
    assert_eq!(
        channels.accept(frame(DATA, &port)).unwrap(),
        Incoming::Data(Bytes::copy_from_slice(&port))
    );
    assert_eq!(
        channels.accept(frame(ERROR, &port)).unwrap(),
        Incoming::Nothing
    );
    assert_eq!(
        channels.accept(frame(ERROR, b"boom")).unwrap(),
        Incoming::Error(Bytes::from_static(b"boom"))
    );
    // Another port's channels, and empty frames, are nothing to this one.
    assert_eq!(channels.accept(frame(2, &port)).unwrap(), Incoming::Nothing);
    assert_eq!(channels.accept(Bytes::new()).unwrap(), Incoming::Nothing);
    assert_eq!(
        channels.accept(frame(DATA, b"")).unwrap(),
        Incoming::Nothing
    );

    // The port and data in one frame: the rest is data.
    let mut merged = Channels::new(80);
    assert_eq!(
        merged.accept(frame(DATA, &[80, 0, b'x'])).unwrap(),
        Incoming::Data(Bytes::from_static(b"x"))
    );
}

#[test]
fn a_channel_without_the_port_asked_for_is_invalid_data() {
    let error = Channels::new(80).accept(frame(DATA, &[81, 0])).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    assert_eq!(
        error.to_string(),
        "the server forwards port 81, not the port 80 asked for"
    );
    // Little-endian: 0x1f90 is 8080, 0x901f is not.
    assert!(
        Channels::new(8080)
            .accept(frame(ERROR, &[0x1f, 0x90]))
            .is_err()
    );
    let short = Channels::new(80).accept(frame(ERROR, &[80])).unwrap_err();
    assert_eq!(short.kind(), io::ErrorKind::InvalidData);
}

type Server = WebSocketStream<DuplexStream>;

/// A [`PortStream`] for `port` and the server's end of its WebSocket, in memory.
async fn pair(port: u16) -> (PortStream, Server) {
    let (client, server) = tokio::io::duplex(CHUNK);
    let client = WebSocketStream::from_raw_socket(client, Role::Client, None).await;
    let server = WebSocketStream::from_raw_socket(server, Role::Server, None).await;
    (PortStream::new(client, port), server)
}

/// The server's side of the protocol, for one port: the port first on both channels,
/// then each data frame back (an echo server in the guest), but for `fail`, to which
/// it answers on the error channel and closes, as for a guest port that refuses.
async fn serve<S>(mut server: WebSocketStream<S>, port: u16)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    for channel in [DATA, ERROR] {
        let prefix = frame(channel, &port.to_le_bytes());
        if server.send(Message::Binary(prefix)).await.is_err() {
            return;
        }
    }
    while let Some(Ok(message)) = server.next().await {
        let Message::Binary(data) = message else {
            continue;
        };
        if data[1..] == *b"fail" {
            let refused = frame(ERROR, REFUSED.as_bytes());
            let _ = server.send(Message::Binary(refused)).await;
            let _ = server.close(None).await;
            return;
        }
        if server.send(Message::Binary(data)).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn a_stream_reads_the_guests_bytes_and_writes_data_frames() {
    let (mut stream, mut server) = pair(80).await;
    for channel in [DATA, ERROR] {
        let prefix = frame(channel, &80u16.to_le_bytes());
        server.send(Message::Binary(prefix)).await.unwrap();
    }
    server
        .send(Message::Binary(frame(DATA, b"hello")))
        .await
        .unwrap();
    let mut hello = [0; 5];
    stream.read_exact(&mut hello).await.unwrap();
    assert_eq!(&hello, b"hello");

    // Sent without a flush, as on a TCP stream.
    stream.write_all(b"ping").await.unwrap();
    assert_eq!(
        server.next().await.unwrap().unwrap(),
        Message::Binary(frame(DATA, b"ping"))
    );
    // Shutting down closes the WebSocket; the server's close is then end of file.
    stream.shutdown().await.unwrap();
    assert!(matches!(
        server.next().await.unwrap().unwrap(),
        Message::Close(_)
    ));
    assert!(server.next().await.is_none());
    let mut rest = Vec::new();
    assert_eq!(stream.read_to_end(&mut rest).await.unwrap(), 0);
}

#[tokio::test]
async fn the_guest_closing_is_end_of_file() {
    let (mut stream, mut server) = pair(80).await;
    for channel in [DATA, ERROR] {
        let prefix = frame(channel, &80u16.to_le_bytes());
        server.send(Message::Binary(prefix)).await.unwrap();
    }
    for part in [&b"HTTP/1.0 200 OK\r\n"[..], b"\r\nbody"] {
        server
            .send(Message::Binary(frame(DATA, part)))
            .await
            .unwrap();
    }
    server.close(None).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    assert_eq!(response, b"HTTP/1.0 200 OK\r\n\r\nbody");
}

#[tokio::test]
async fn the_error_channel_fails_the_stream_with_the_servers_message() {
    let (mut stream, server) = pair(80).await;
    tokio::spawn(serve(server, 80));
    stream.write_all(b"fail").await.unwrap();
    let mut buf = Vec::new();
    let error = stream.read_to_end(&mut buf).await.unwrap_err();
    assert_eq!(error.to_string(), REFUSED);
    assert!(buf.is_empty());
    // And so is every later read and write.
    assert_eq!(
        stream.read(&mut [0; 8]).await.unwrap_err().to_string(),
        REFUSED
    );
    assert_eq!(stream.write(b"x").await.unwrap_err().to_string(), REFUSED);
}

#[tokio::test]
async fn another_port_on_the_wire_fails_the_stream() {
    let (mut stream, mut server) = pair(80).await;
    let prefix = frame(DATA, &443u16.to_le_bytes());
    server.send(Message::Binary(prefix)).await.unwrap();
    let error = stream.read(&mut [0; 8]).await.unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidData);
}

/// A connector as the listener's, to in-memory servers (see [`serve`]) for port 80;
/// while `refuse` is set, it fails as a claim gone would.
fn connector(
    refuse: Arc<AtomicBool>,
) -> impl Fn() -> Pin<Box<dyn Future<Output = Result<PortStream, Error>> + Send>> {
    move || {
        let refuse = refuse.load(Ordering::SeqCst);
        Box::pin(async move {
            if refuse {
                return Err(Error::ClaimNotFound {
                    name: "c".to_owned(),
                });
            }
            let (stream, server) = pair(80).await;
            tokio::spawn(serve(server, 80));
            Ok(stream)
        })
    }
}

/// Whether `text` written to `connection` comes back, written and read at once so
/// that more than the buffers on the way hold can go round.
async fn echoes(connection: &mut TcpStream, text: &[u8]) -> bool {
    let (mut from, mut to) = connection.split();
    let mut echo = vec![0; text.len()];
    let (written, read) = tokio::join!(to.write_all(text), from.read_exact(&mut echo));
    written.is_ok() && read.is_ok() && echo == text
}

/// Whether `connection` reads end of file or an error (a reset) rather than data.
async fn closed(connection: &mut TcpStream) -> bool {
    !matches!(connection.read(&mut [0; 8]).await, Ok(n) if n > 0)
}

#[tokio::test]
async fn the_listener_forwards_connections_each_on_its_own() {
    let refuse = Arc::new(AtomicBool::new(false));
    let (listener, local_addr) = bind(loopback()).await.unwrap();
    let mut forward = forward_from(listener, local_addr, 80, connector(refuse.clone()));
    assert_eq!(forward.local_addr(), local_addr);
    assert_ne!(local_addr.port(), 0);

    let mut a = TcpStream::connect(local_addr).await.unwrap();
    let mut b = TcpStream::connect(local_addr).await.unwrap();
    let mut failing = TcpStream::connect(local_addr).await.unwrap();
    assert!(echoes(&mut a, b"hello from a").await);
    assert!(echoes(&mut b, b"hello from b").await);

    // The guest refuses one connection: that one is closed and reported...
    failing.write_all(b"fail").await.unwrap();
    assert!(closed(&mut failing).await);
    let failed = forward.errors().next().await.unwrap();
    assert_eq!(failed.peer, failing.local_addr().unwrap());
    assert_eq!(failed.error.to_string(), REFUSED);
    // ...and the others, and the listener, go on.
    assert!(echoes(&mut a, b"still a").await);
    assert!(echoes(&mut b, &[7; 3 * CHUNK]).await);

    // A WebSocket that cannot be opened is the SDK's error.
    refuse.store(true, Ordering::SeqCst);
    let mut refused = TcpStream::connect(local_addr).await.unwrap();
    assert!(closed(&mut refused).await);
    let failed = forward.errors().next().await.unwrap();
    let cause = failed
        .error
        .get_ref()
        .and_then(|e| e.downcast_ref::<Error>());
    assert!(
        matches!(cause, Some(Error::ClaimNotFound { .. })),
        "{failed:?}"
    );
    refuse.store(false, Ordering::SeqCst);
    let mut c = TcpStream::connect(local_addr).await.unwrap();
    assert!(echoes(&mut c, b"c").await);

    // Dropped: the connections it forwarded close, and nothing listens any more.
    drop(forward);
    assert!(closed(&mut a).await);
    let mut listening = true;
    for _ in 0..100 {
        listening = TcpStream::connect(local_addr).await.is_ok();
        if !listening {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!listening, "still listening on {local_addr}");
}

#[tokio::test]
async fn the_local_side_closing_closes_the_websocket() {
    let (listener, local_addr) = bind(loopback()).await.unwrap();
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
    let closed_tx = Arc::new(std::sync::Mutex::new(Some(closed_tx)));
    let _forward = forward_from(listener, local_addr, 80, move || {
        let closed_tx = closed_tx.clone();
        async move {
            let (stream, mut server) = pair(80).await;
            tokio::spawn(async move {
                let mut saw_close = false;
                while let Some(Ok(message)) = server.next().await {
                    saw_close |= matches!(message, Message::Close(_));
                }
                if let Some(tx) = closed_tx.lock().unwrap().take() {
                    let _ = tx.send(saw_close);
                }
            });
            Ok(stream)
        }
    });
    let connection = TcpStream::connect(local_addr).await.unwrap();
    drop(connection);
    assert!(closed_rx.await.unwrap(), "no WebSocket close");
}

/// An API server on loopback that upgrades one request: its request line goes to
/// `seen`, then it speaks [`serve`]'s side of the protocol.
async fn api_server(seen: tokio::sync::oneshot::Sender<(String, String)>) -> SocketAddr {
    let listener = TcpListener::bind(loopback()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        #[expect(clippy::result_large_err, reason = "tungstenite's callback, as it is")]
        let answer =
            move |request: &Request, mut response: Response| -> Result<Response, ErrorResponse> {
                let offered = request
                    .headers()
                    .get("sec-websocket-protocol")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let _ = seen.send((request.uri().to_string(), offered));
                response.headers_mut().insert(
                    "sec-websocket-protocol",
                    http::HeaderValue::from_static("v4.channel.k8s.io"),
                );
                Ok(response)
            };
        let ws = tokio_tungstenite::accept_hdr_async(tcp, answer)
            .await
            .unwrap();
        serve(ws, 80).await;
    });
    addr
}

fn client_of(addr: SocketAddr) -> Client {
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    Client::new(kube::Client::try_from(config).unwrap())
}

#[tokio::test]
async fn connect_port_opens_the_claims_portforward_with_the_port() {
    let (seen, request) = tokio::sync::oneshot::channel();
    let client = client_of(api_server(seen).await);
    let mut stream = client.connect_port("c", 80).await.unwrap();
    assert_eq!(stream.port(), 80);
    let (uri, offered) = request.await.unwrap();
    assert!(uri.starts_with("/apis/battery.liquidmetal-x.dev/"), "{uri}");
    assert!(
        uri.ends_with("/namespaces/default/microvmclaims/c/portforward?ports=80"),
        "{uri}"
    );
    assert!(offered.contains("v4.channel.k8s.io"), "{offered}");
    assert!(echoes_stream(&mut stream, b"GET / HTTP/1.0\r\n\r\n").await);
    stream.write_all(b"fail").await.unwrap();
    let error = stream.read(&mut [0; 8]).await.unwrap_err();
    assert_eq!(error.to_string(), REFUSED);
}

async fn echoes_stream(stream: &mut PortStream, text: &[u8]) -> bool {
    let mut echo = vec![0; text.len()];
    stream.write_all(text).await.is_ok()
        && stream.read_exact(&mut echo).await.is_ok()
        && echo == text
}

/// An API server on loopback that refuses one request with `status`, as JSON.
async fn refusing_server(code: u16, status: serde_json::Value) -> SocketAddr {
    let listener = TcpListener::bind(loopback()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        while !request.ends_with(b"\r\n\r\n") {
            let mut byte = [0];
            if tcp.read(&mut byte).await.unwrap() == 0 {
                return;
            }
            request.push(byte[0]);
        }
        let body = status.to_string();
        let response = format!(
            "HTTP/1.1 {code} Refused\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        tcp.write_all(response.as_bytes()).await.unwrap();
    });
    addr
}

#[tokio::test]
async fn a_refusal_before_the_upgrade_is_the_sdks_error() {
    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
        "reason": "Forbidden",
        "message": "microvmclaim c is held by dev: only its Holder may forward its ports",
    });
    let client = client_of(refusing_server(403, status).await);
    let error = client.connect_port("c", 80).await.unwrap_err();
    assert!(matches!(error, Error::NotHolder { .. }), "{error:?}");

    let status = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404,
        "reason": "NotFound", "message": "microvmclaims \"c\" not found",
        "details": {"name": "c", "group": "battery.liquidmetal-x.dev", "kind": "microvmclaims"},
    });
    let client = client_of(refusing_server(404, status).await);
    let error = client.port_forward("c", 80).await.unwrap_err();
    assert!(
        matches!(error, Error::ClaimNotFound { ref name } if name == "c"),
        "{error:?}"
    );
}
