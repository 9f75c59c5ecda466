//! HTTPS serving: rustls (TLS 1.2+), HTTP/1.1 and HTTP/2 on one port, with the limits an
//! aggregated API server needs (`reference/aggregated-apiserver.md` §11.4–§11.5):
//! 1,000 concurrent HTTP/2 streams per connection, since the aggregator multiplexes every
//! user's requests and watches over a few connections; header limits large enough for
//! users in many groups. The serving certificate is reloaded when its files change.
//! Client certificates are asked for but not required (kubelet probes come without one),
//! and not verified here: TLS only checks that the client holds the certificate's key,
//! and authentication verifies the chain against the CAs it trusts at that moment, as
//! Go's `tls.RequestClientCert` serving does (ADR 0008).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tower::ServiceExt;

use crate::api::connect::websocket::BulkOutput;
use crate::http::authn::PeerCertificates;
use crate::tls_files::{RELOAD_INTERVAL, Reloading, certified_key, provider};
pub use crate::tls_files::{TlsError, TlsFiles};

/// HTTP/2 streams per connection (Go's aggregated-server recommendation).
const MAX_CONCURRENT_STREAMS: u32 = 1000;
/// Header bytes accepted, as Go's `MaxHeaderBytes` (1 MiB).
const MAX_HEADER_BYTES: u32 = 1 << 20;
/// HTTP/1 header lines: one `X-Remote-Group` line per group adds up.
const MAX_HTTP1_HEADERS: usize = 1000;
/// A client that has not finished its TLS handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections (watches, exec) get to finish after a shutdown signal.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// The TLS a connection upgraded for bulk output (exec) may hold encrypted and unsent: a
/// whole WebSocket frame of output (up to 1 MiB) is then encrypted and handed to the
/// socket in one `writev`, where rustls's default (64 KiB) made it 16 writes and as many
/// wake-ups of the reader.
const BULK_TLS_BUFFER_BYTES: usize = 1024 * 1024;

/// Serves the certificate last loaded from its files.
#[derive(Debug)]
struct ReloadingCert(Reloading<CertifiedKey>);

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current())
    }
}

/// Asks every client for a certificate and accepts any chain whose key the client proves
/// it holds; which CA, if any, vouches for it is authentication's decision, per request.
#[derive(Debug)]
pub struct RequestClientCertificate {
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl Default for RequestClientCertificate {
    fn default() -> Self {
        Self {
            algorithms: provider().signature_verification_algorithms,
        }
    }
}

impl ClientCertVerifier for RequestClientCertificate {
    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // No hints: a client then offers whatever certificate it has.
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A TLS acceptor whose certificate follows its files until the returned task is
/// dropped or aborted.
pub fn acceptor(files: &TlsFiles) -> Result<(TlsAcceptor, tokio::task::JoinHandle<()>), TlsError> {
    let owned = files.clone();
    let cert = Arc::new(ReloadingCert(Reloading::new(
        "the serving certificate",
        vec![files.cert.clone(), files.key.clone()],
        move || certified_key(&owned),
    )?));
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(TlsError::Config)?;
    let mut config = builder
        .with_client_cert_verifier(Arc::new(RequestClientCertificate::default()))
        .with_cert_resolver(cert.clone());
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let reloader = tokio::spawn(async move {
        let mut tick = tokio::time::interval(RELOAD_INTERVAL);
        loop {
            tick.tick().await;
            cert.0.reload_if_changed();
        }
    });
    Ok((TlsAcceptor::from(Arc::new(config)), reloader))
}

fn http_builder() -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .max_headers(MAX_HTTP1_HEADERS)
        .max_buf_size(MAX_HEADER_BYTES as usize);
    builder
        .http2()
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_header_list_size(MAX_HEADER_BYTES);
    builder
}

/// Serves `app` over TLS on `listener` until `shutdown` resolves, then lets open
/// connections finish for a few seconds.
pub async fn serve(
    listener: TcpListener,
    tls: TlsAcceptor,
    app: Router,
    shutdown: impl Future<Output = ()>,
) {
    let builder = Arc::new(http_builder());
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(err) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %err, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Small TLS records and HTTP/2 frames must not wait for the client's delayed ACK
        // (40 ms on Linux): without this a serial bind costs tens of milliseconds.
        if let Err(err) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, error = %err, "setting TCP_NODELAY");
        }
        let tls = tls.clone();
        let app = app.clone();
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(err)) => {
                    tracing::debug!(%peer, error = %err, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let certs = stream
                .get_ref()
                .1
                .peer_certificates()
                .map(PeerCertificates::new);
            let stream = ServedStream::new(stream);
            let bulk = stream.bulk.clone();
            let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                if let Some(certs) = &certs {
                    req.extensions_mut().insert(certs.clone());
                }
                req.extensions_mut().insert(RemoteAddr(peer));
                req.extensions_mut().insert(bulk.clone());
                app.clone().oneshot(req)
            });
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
            if let Err(err) = watcher.watch(conn.into_owned()).await {
                tracing::debug!(%peer, error = %err, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!("closing connections still open after {DRAIN_TIMEOUT:?}");
    }
}

/// The client's address, for logs and rate limits.
#[derive(Debug, Clone, Copy)]
pub struct RemoteAddr(pub SocketAddr);

/// A connection as `serve` serves it: its TLS stream, whose send buffer grows once a
/// request on it enables [`BulkOutput`].
struct ServedStream {
    tls: TlsStream<TcpStream>,
    bulk: BulkOutput,
    enlarged: bool,
}

impl ServedStream {
    fn new(tls: TlsStream<TcpStream>) -> Self {
        Self {
            tls,
            bulk: BulkOutput::default(),
            enlarged: false,
        }
    }

    /// The TLS stream, its buffer enlarged first if bulk output was enabled since.
    fn writer(&mut self) -> Pin<&mut TlsStream<TcpStream>> {
        if !self.enlarged && self.bulk.is_enabled() {
            self.tls
                .get_mut()
                .1
                .set_buffer_limit(Some(BULK_TLS_BUFFER_BYTES));
            self.enlarged = true;
        }
        Pin::new(&mut self.tls)
    }
}

impl AsyncRead for ServedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tls).poll_read(cx, buf)
    }
}

impl AsyncWrite for ServedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().writer().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().writer().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tls.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().writer().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().writer().poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use rustls::pki_types::ServerName;

    use super::*;

    /// A connection `serve` accepted, and the client's end of it (kept open).
    async fn served_connection() -> (
        ServedStream,
        tokio_rustls::client::TlsStream<TcpStream>,
        tempfile::TempDir,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let pki = crate::dev::pki::write_dev_pki(dir.path()).unwrap();
        let (tls, _reloader) = acceptor(&TlsFiles {
            cert: pki.serving_cert.clone(),
            key: pki.serving_key.clone(),
        })
        .unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for cert in crate::tls_files::certificates(&pki.ca_cert).unwrap() {
            roots.add(cert).unwrap();
        }
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dialled = TcpStream::connect(listener.local_addr().unwrap());
        let (accepted, dialled) = tokio::join!(listener.accept(), dialled);
        let name = ServerName::try_from("localhost").unwrap();
        let (server, client) = tokio::join!(
            tls.accept(accepted.unwrap().0),
            tokio_rustls::TlsConnector::from(Arc::new(client)).connect(name, dialled.unwrap()),
        );
        (ServedStream::new(server.unwrap()), client.unwrap(), dir)
    }

    /// How much plaintext the connection's TLS takes before anything reaches the socket.
    fn taken_unsent(stream: &mut ServedStream) -> usize {
        let tls = Pin::into_inner(stream.writer()).get_mut().1;
        tls.writer()
            .write(&vec![0; 4 * BULK_TLS_BUFFER_BYTES])
            .unwrap()
    }

    #[tokio::test]
    async fn a_connection_holds_a_frame_of_output_only_once_bulk_output_is_enabled() {
        let (mut plain, _client, _dir) = served_connection().await;
        assert!(
            taken_unsent(&mut plain) <= 64 * 1024,
            "a connection without bulk output keeps rustls's default"
        );

        let (mut bulk, _client, _dir) = served_connection().await;
        bulk.bulk.enable();
        let taken = taken_unsent(&mut bulk);
        assert!(
            taken > BULK_TLS_BUFFER_BYTES * 9 / 10 && taken <= BULK_TLS_BUFFER_BYTES,
            "took {taken} bytes"
        );
    }
}
