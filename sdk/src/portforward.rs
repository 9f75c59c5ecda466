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
mod tests;
