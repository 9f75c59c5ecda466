//! Ports of a claim's MicroVM, reached from this machine: [`Claim::connect_port`] for one
//! connection as a stream, [`Claim::port_forward`] for a local listener, as
//! `kubectl port-forward` gives one for a Pod.
//!
//! Each connection is one WebSocket to the claim's `portforward` subresource, speaking
//! kubelet's port-forward protocol (`v4.channel.k8s.io`) for one port (`ports=<port>`):
//! channel 0 carries the data and channel 1 the server's error, and each begins with
//! the port, which is checked and not taken for data. The guest's port is reached
//! through the guest's sshd (`direct-tcpip`), so the guest needs sshd trusting battery's
//! SSH CA, as a terminal does.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::{Pin, pin};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use battery_telemetry::error_chain;
use battery_types::channel::{self, port_forward};
use bytes::{Buf as _, Bytes};
use futures::{Sink, Stream, StreamExt as _};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{AbortHandle, JoinSet};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use crate::claim::Claim;
use crate::client::Client;
use crate::error::Error;

/// The channels of the one port a WebSocket forwards: the query's first port's.
const DATA: u8 = port_forward::data_channel(0);
const ERROR: u8 = port_forward::error_channel(0);
/// The most data sent in one frame, and the buffer of each direction of a forwarded
/// connection.
const CHUNK: usize = 64 * 1024;
/// Failures kept for [`PortForward::errors`] until read; beyond that they are only logged.
const ERRORS_KEPT: usize = 64;
/// The wait after a failed accept (out of file descriptors, say), so that the listener
/// does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What one frame from the server carries, once its channel is known.
#[derive(Debug, PartialEq, Eq)]
enum Incoming {
    Data(Bytes),
    Error(Bytes),
    /// A port prefix, an empty frame, or a channel this port does not have.
    Nothing,
}

/// The server's two channels for one port. Each begins with the port, two bytes
/// little-endian, as kubelet sends it: checked, then dropped.
#[derive(Debug)]
struct Channels {
    port: u16,
    /// Whether the data and the error channel have had their port.
    prefixed: [bool; 2],
}

impl Channels {
    fn new(port: u16) -> Self {
        Self {
            port,
            prefixed: [false; 2],
        }
    }

    /// Reads one binary frame: its channel byte, then its payload.
    fn accept(&mut self, mut frame: Bytes) -> io::Result<Incoming> {
        let Some(&channel) = frame.first() else {
            return Ok(Incoming::Nothing);
        };
        let index = match channel {
            DATA => 0,
            ERROR => 1,
            _ => return Ok(Incoming::Nothing),
        };
        frame.advance(1);
        if !self.prefixed[index] {
            let Some(prefix) = frame.get(..2) else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the server's port-forward channel began without its port",
                ));
            };
            let port = u16::from_le_bytes([prefix[0], prefix[1]]);
            if port != self.port {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the server forwards port {port}, not the port {} asked for",
                        self.port
                    ),
                ));
            }
            self.prefixed[index] = true;
            frame.advance(2);
        }
        Ok(match (frame.is_empty(), channel) {
            (true, _) => Incoming::Nothing,
            (false, DATA) => Incoming::Data(frame),
            (false, _) => Incoming::Error(frame),
        })
    }
}

/// The WebSocket under a [`PortStream`]: kube's upgraded connection, or a test's.
trait Socket: Stream<Item = Result<Message, WsError>> + Sink<Message, Error = WsError> + Send {}

impl<T> Socket for T where
    T: Stream<Item = Result<Message, WsError>> + Sink<Message, Error = WsError> + Send
{
}

/// One TCP connection to a port of a claim's MicroVM, from [`Claim::connect_port`]: what
/// is written goes to the guest's port, what the guest sends is read, and the guest
/// closing the connection is end of file.
///
/// Shutting it down closes the whole connection, as the protocol has no half-close: what
/// the guest sends after that may be lost. A failure the server reports (nothing
/// listening on the port, the guest's connection failing, the claim released) fails the
/// read that reaches it, and every read and write after it, with the server's message,
/// as `connecting to port 80 in the MicroVM: ...`.
pub struct PortStream {
    socket: Pin<Box<dyn Socket>>,
    channels: Channels,
    /// What the reader has not taken of the last data frame.
    unread: Bytes,
    /// How reading failed, to fail every later read and write the same way.
    failed: Option<(io::ErrorKind, String)>,
    /// The server has closed the WebSocket.
    ended: bool,
}

impl PortStream {
    fn new(socket: impl Socket + 'static, port: u16) -> Self {
        Self {
            socket: Box::pin(socket),
            channels: Channels::new(port),
            unread: Bytes::new(),
            failed: None,
            ended: false,
        }
    }

    /// The guest's port.
    pub fn port(&self) -> u16 {
        self.channels.port
    }

    fn failure(&self) -> Option<io::Error> {
        self.failed
            .as_ref()
            .map(|(kind, message)| io::Error::new(*kind, message.clone()))
    }

    /// Remembers `error` as the connection's end, and gives it.
    fn fail(&mut self, error: io::Error) -> io::Error {
        self.failed = Some((error.kind(), error.to_string()));
        error
    }
}

impl fmt::Debug for PortStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PortStream")
            .field("port", &self.channels.port)
            .field("failed", &self.failed)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl AsyncRead for PortStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.unread.is_empty() {
                let len = this.unread.len().min(buf.remaining());
                buf.put_slice(&this.unread[..len]);
                this.unread.advance(len);
                return Poll::Ready(Ok(()));
            }
            if let Some(error) = this.failure() {
                return Poll::Ready(Err(error));
            }
            if this.ended {
                return Poll::Ready(Ok(()));
            }
            let frame = match ready!(this.socket.poll_next_unpin(cx)) {
                None | Some(Ok(Message::Close(_))) => {
                    this.ended = true;
                    continue;
                }
                Some(Err(error)) => return Poll::Ready(Err(this.fail(ws_error(error)))),
                Some(Ok(Message::Binary(frame))) => frame,
                // tungstenite answers pings itself, and v4 sends nothing else.
                Some(Ok(_)) => continue,
            };
            match this.channels.accept(frame) {
                Ok(Incoming::Data(data)) => this.unread = data,
                Ok(Incoming::Error(message)) => {
                    let message = String::from_utf8_lossy(&message).into_owned();
                    return Poll::Ready(Err(this.fail(io::Error::other(message))));
                }
                Ok(Incoming::Nothing) => {}
                Err(error) => return Poll::Ready(Err(this.fail(error))),
            }
        }
    }
}

impl AsyncWrite for PortStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        // The server's reason beats the broken pipe a write after it would find.
        if let Some(error) = self.failure() {
            return Poll::Ready(Err(error));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        ready!(self.socket.as_mut().poll_ready(cx)).map_err(ws_error)?;
        let chunk = &buf[..buf.len().min(CHUNK)];
        self.socket
            .as_mut()
            .start_send(Message::Binary(channel::frame(DATA, chunk).into()))
            .map_err(ws_error)?;
        // Sent now, as a TCP stream's write is, rather than left in the WebSocket's buffer
        // for a flush a caller used to TCP would not make. The frame is taken either way:
        // a flush still pending goes on at the next write, a failed one fails it.
        let _ = self.socket.as_mut().poll_flush(cx);
        Poll::Ready(Ok(chunk.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.socket.as_mut().poll_flush(cx).map_err(ws_error)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.ended {
            return Poll::Ready(Ok(()));
        }
        match ready!(self.socket.as_mut().poll_close(cx)) {
            Ok(()) | Err(WsError::ConnectionClosed | WsError::AlreadyClosed) => Poll::Ready(Ok(())),
            Err(error) => Poll::Ready(Err(ws_error(error))),
        }
    }
}

fn ws_error(error: WsError) -> io::Error {
    match error {
        WsError::Io(error) => error,
        WsError::ConnectionClosed | WsError::AlreadyClosed => io::Error::new(
            io::ErrorKind::BrokenPipe,
            "the port-forward connection is closed",
        ),
        other => io::Error::other(other),
    }
}

/// A local listener whose connections go to a port of a claim's MicroVM, from
/// [`Claim::port_forward`]: each accepted connection is a [`PortStream`] of its own,
/// copied both ways, so that one failing ends that connection only. A failure is logged
/// (`warn`) and yielded by [`PortForward::errors`].
///
/// Dropping it stops listening and closes the connections it forwarded. It does not keep
/// the claim: once the claim is released, connections fail.
#[derive(Debug)]
pub struct PortForward {
    local_addr: SocketAddr,
    port: u16,
    errors: mpsc::Receiver<ForwardError>,
    listener: AbortHandle,
}

impl Drop for PortForward {
    fn drop(&mut self) {
        // The listener and every connection are the task's: they end with it.
        self.listener.abort();
    }
}

impl PortForward {
    /// The local address it listens on, with the port chosen when asked for port 0.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The guest's port that connections go to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The connections that failed, as they fail; it ends only with the `PortForward`.
    /// Up to 64 not yet read are kept; failures beyond those are only logged.
    pub fn errors(&mut self) -> impl Stream<Item = ForwardError> + '_ {
        futures::stream::poll_fn(|cx| self.errors.poll_recv(cx))
    }
}

/// A connection through a [`PortForward`] that failed, and was closed.
#[derive(Debug, thiserror::Error)]
#[error("forwarding the connection from {peer} failed")]
#[non_exhaustive]
pub struct ForwardError {
    /// The local end that connected.
    pub peer: SocketAddr,
    /// Why: the server's message (`connecting to port 80 in the MicroVM: ...`), the
    /// connection breaking, or, when the WebSocket could not be opened, an [`Error`] of
    /// this crate (as `error.get_ref()` downcasts to).
    #[source]
    pub error: io::Error,
}

/// Binds `local`, and says to what port.
async fn bind(local: SocketAddr) -> Result<(TcpListener, SocketAddr), Error> {
    let bound = async {
        let listener = TcpListener::bind(local).await?;
        let addr = listener.local_addr()?;
        Ok((listener, addr))
    };
    bound.await.map_err(|source| Error::Local {
        what: format!("listening on {local}"),
        source,
    })
}

/// Forwards each connection `listener` accepts to a stream that `connect` opens.
fn forward_from<C, F>(
    listener: TcpListener,
    local_addr: SocketAddr,
    port: u16,
    connect: C,
) -> PortForward
where
    C: Fn() -> F + Send + 'static,
    F: Future<Output = Result<PortStream, Error>> + Send + 'static,
{
    let (report, errors) = mpsc::channel(ERRORS_KEPT);
    let task = tokio::spawn(accept(listener, port, connect, report));
    PortForward {
        local_addr,
        port,
        errors,
        listener: task.abort_handle(),
    }
}

/// Accepts for as long as the [`PortForward`] lives, each connection on a task of its own.
async fn accept<C, F>(
    listener: TcpListener,
    port: u16,
    connect: C,
    report: mpsc::Sender<ForwardError>,
) where
    C: Fn() -> F,
    F: Future<Output = Result<PortStream, Error>> + Send + 'static,
{
    // Held here, so that aborting this task aborts them too.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((local, peer)) => {
                    let opening = connect();
                    let report = report.clone();
                    connections.spawn(async move {
                        if let Err(error) = forward(local, opening).await {
                            tracing::warn!(%peer, port, error = %error_chain(&error), "a forwarded connection failed");
                            // Full only when nobody reads them: the log has it.
                            let _ = report.try_send(ForwardError { peer, error });
                        }
                    });
                }
                Err(error) => {
                    tracing::warn!(port, %error, "accepting a connection to forward failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            // Reaps the ended ones; `None` (no connection) disables this branch for now.
            Some(_) = connections.join_next() => {}
        }
    }
}

/// Copies between `local` and the stream `opening` gives until the guest's side ends.
/// The local side's end closes the stream, then waits for the guest's side to end.
async fn forward(
    mut local: TcpStream,
    opening: impl Future<Output = Result<PortStream, Error>>,
) -> io::Result<()> {
    // As Go's sockets, and so kubectl's, are: a keystroke or a small request goes at once.
    // Only latency is at stake, so a failure is no reason to give up the connection.
    let _ = local.set_nodelay(true);
    let remote = opening.await.map_err(io::Error::other)?;
    let (from_guest, mut to_guest) = tokio::io::split(remote);
    let (from_local, mut to_local) = local.split();
    let mut downstream = pin!(async {
        tokio::io::copy_buf(
            &mut BufReader::with_capacity(CHUNK, from_guest),
            &mut to_local,
        )
        .await?;
        to_local.shutdown().await
    });
    let upstream = async {
        tokio::io::copy_buf(
            &mut BufReader::with_capacity(CHUNK, from_local),
            &mut to_guest,
        )
        .await?;
        to_guest.shutdown().await
    };
    let sent = tokio::select! {
        // The guest's side is over, and with the WebSocket closed nothing more can go
        // to it: so is the connection.
        ended = &mut downstream => return ended,
        sent = upstream => sent,
    };
    sent?;
    downstream.await
}

/// `127.0.0.1`, at a port the system chooses.
fn loopback() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
}

impl Client {
    /// One TCP connection to `port` of the MicroVM of the claim `claim` of this client's
    /// namespace, which this client's user holds, as [`Claim::connect_port`]. Nothing
    /// renews that claim's lease meanwhile.
    pub async fn connect_port(&self, claim: &str, port: u16) -> Result<PortStream, Error> {
        self.open_port(claim, port, "").await
    }

    /// Forwards connections to `127.0.0.1`, at a free port ([`PortForward::local_addr`]
    /// says which), to `port` of the MicroVM of the claim `claim`, as
    /// [`Claim::port_forward`]. Nothing renews that claim's lease meanwhile.
    pub async fn port_forward(&self, claim: &str, port: u16) -> Result<PortForward, Error> {
        self.port_forward_on(claim, port, loopback()).await
    }

    /// Forwards connections to `local` (port 0: a free one) to `port` of the MicroVM of
    /// the claim `claim`. The claim is read first, so that a wrong name fails here rather
    /// than at each connection; a local address that cannot be listened on is
    /// [`Error::Local`].
    pub async fn port_forward_on(
        &self,
        claim: &str,
        port: u16,
        local: SocketAddr,
    ) -> Result<PortForward, Error> {
        self.claims()
            .get(claim)
            .await
            .map_err(|e| Error::from_claims(e, ""))?;
        let (listener, local_addr) = bind(local).await?;
        Ok(self.forward(listener, local_addr, claim.to_owned(), port, String::new()))
    }

    async fn open_port(&self, claim: &str, port: u16, pool: &str) -> Result<PortStream, Error> {
        let connection = self
            .connect(claim, "portforward", &format!("ports={port}"), pool)
            .await?;
        Ok(PortStream::new(connection.into_stream(), port))
    }

    fn forward(
        &self,
        listener: TcpListener,
        local_addr: SocketAddr,
        claim: String,
        port: u16,
        pool: String,
    ) -> PortForward {
        let client = self.clone();
        forward_from(listener, local_addr, port, move || {
            let (client, claim, pool) = (client.clone(), claim.clone(), pool.clone());
            async move { client.open_port(&claim, port, &pool).await }
        })
    }
}

impl Claim {
    /// One TCP connection to `port` of the claim's MicroVM (on the guest's loopback),
    /// through the API server: a [`PortStream`] to read and write. Refusals before it
    /// opens are errors as for [`Claim::exec`] (`NotHolder`, `ClaimNotFound`, ...); a
    /// guest port nothing listens on fails the stream's first read with the server's
    /// message.
    ///
    /// ```no_run
    /// # async fn example(claim: battery_sdk::Claim) -> Result<(), Box<dyn std::error::Error>> {
    /// use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    ///
    /// let mut http = claim.connect_port(80).await?;
    /// http.write_all(b"GET / HTTP/1.0\r\n\r\n").await?;
    /// let mut response = Vec::new();
    /// http.read_to_end(&mut response).await?; // the guest's server closes: end of file
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_port(&self, port: u16) -> Result<PortStream, Error> {
        self.client.open_port(self.name(), port, &self.pool).await
    }

    /// Listens on `127.0.0.1`, at a free port, and forwards each connection to `port` of
    /// the claim's MicroVM, as `kubectl port-forward` does for a Pod; until the
    /// [`PortForward`] is dropped.
    ///
    /// ```no_run
    /// # async fn example(claim: battery_sdk::Claim) -> Result<(), battery_sdk::Error> {
    /// use futures::StreamExt as _;
    ///
    /// let mut web = claim.port_forward(80).await?;
    /// println!("the guest's port 80 is at http://{}", web.local_addr());
    /// while let Some(failed) = web.errors().next().await {
    ///     eprintln!("{}", failed.error); // connecting to port 80 in the MicroVM: ...
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn port_forward(&self, port: u16) -> Result<PortForward, Error> {
        self.port_forward_on(port, loopback()).await
    }

    /// Forwards each connection to `local` (port 0: a free one) to `port` of the claim's
    /// MicroVM, as [`Claim::port_forward`]; a local address that cannot be listened on is
    /// [`Error::Local`].
    pub async fn port_forward_on(
        &self,
        port: u16,
        local: SocketAddr,
    ) -> Result<PortForward, Error> {
        let (listener, local_addr) = bind(local).await?;
        Ok(self.client.forward(
            listener,
            local_addr,
            self.name().to_owned(),
            port,
            self.pool.clone(),
        ))
    }
}

#[cfg(test)]
mod tests {
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
            let answer = move |request: &Request,
                               mut response: Response|
                  -> Result<Response, ErrorResponse> {
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
}
