//! The Exec Agent on each Host: relays the API server's exec sessions to flintlockd's
//! exec API over mTLS.
//!
//! [`config`] turns the command line into a checked [`Config`]; [`build`] makes the
//! server from it (TLS material is parsed here, still before any port is bound), or
//! [`build_with`] with a serving certificate from the API server ([`certificate`]);
//! [`Agent::serve`] serves [`relay`] on a listener, each session relayed through the
//! [`flintlock`] client.

pub mod certificate;
pub mod config;
pub mod flintlock;
pub mod logging;
pub mod relay;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use battery_proto::agent::v1alpha1::relay_server::RelayServer;
use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls::server::WebPkiClientVerifier;
use thiserror::Error;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Server;
use tonic::transport::server::Router;

pub use config::{Cli, Config, ConfigError, Serving};

use crate::certificate::{CertificateError, ServingCertificate};
use crate::flintlock::Flintlock;
use crate::relay::RelayService;

/// The largest gRPC message the agent decodes, from either side: with the relay's
/// bounded queues, what bounds a session's memory.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// stdin the API server may send ahead of the agent reading it, per session.
const STREAM_WINDOW_BYTES: u32 = 256 * 1024;
/// How long a client may take over its TLS handshake before it is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const ACCEPT_QUEUE: usize = 64;

/// What stops the agent after its configuration was accepted.
#[derive(Debug, Error)]
pub enum AgentError {
    #[error("loading the relay's serving certificate")]
    ServingCertificate(#[source] CertificateError),
    #[error("loading the client CA (--client-ca-file)")]
    ClientCa(#[source] anyhow::Error),
    #[error(
        "the serving certificate comes from the API server: start with `run`, or build \
         with `build_with` and a certificate from `certificate::first`"
    )]
    NoServingCertificate,
    #[error("reaching the API server for the serving certificate")]
    ApiServer(#[source] kube::Error),
    #[error("loading the TLS material for flintlockd")]
    FlintlockTls(#[source] tonic::transport::Error),
    #[error("binding {0}")]
    Bind(SocketAddr, #[source] std::io::Error),
    #[error("serving the relay")]
    Serve(#[source] tonic::transport::Error),
}

/// A built agent, not yet listening.
pub struct Agent {
    router: Router,
    tls: TlsAcceptor,
}

/// Builds the agent's server with the serving certificate of `--tls-cert-file`: parses
/// the TLS material, so a key that does not match its certificate fails here and not on
/// the first handshake.
pub fn build(config: Config) -> Result<Agent, AgentError> {
    let serving = match &config.serving {
        Serving::Files { cert, key } => {
            ServingCertificate::from_pem(cert, key).map_err(AgentError::ServingCertificate)?
        }
        Serving::FromApiServer { .. } => return Err(AgentError::NoServingCertificate),
    };
    build_with(config, Arc::new(serving))
}

/// Builds the agent's server, serving the relay with whatever `serving` holds at each
/// handshake.
pub fn build_with(config: Config, serving: Arc<ServingCertificate>) -> Result<Agent, AgentError> {
    let flintlock = Flintlock::new(config.flintlock).map_err(AgentError::FlintlockTls)?;
    let tls = tls_acceptor(&config.client_ca, serving)?;
    let relay =
        RelayServer::new(RelayService::new(flintlock)).max_decoding_message_size(MAX_MESSAGE_BYTES);
    let router = Server::builder()
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .add_service(relay);
    Ok(Agent { router, tls })
}

/// TLS as tonic would set it up, but with a certificate resolver that renewal swaps
/// (tonic's own TLS config is fixed once built).
fn tls_acceptor(
    client_ca: &[u8],
    serving: Arc<ServingCertificate>,
) -> Result<TlsAcceptor, AgentError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(client_ca) {
        let cert = cert.map_err(|e| AgentError::ClientCa(e.into()))?;
        roots
            .add(cert)
            .map_err(|e| AgentError::ClientCa(e.into()))?;
    }
    // Required, not optional: a client without a certificate from this CA is refused
    // in the handshake, before any request is read.
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| AgentError::ClientCa(e.into()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| AgentError::ClientCa(e.into()))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(serving);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

impl Agent {
    /// Serves until `shutdown` completes, then lets open sessions finish.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), AgentError> {
        let (connections, incoming) = mpsc::channel(ACCEPT_QUEUE);
        let accepting = tokio::spawn(accept(listener, self.tls, connections));
        let served = self
            .router
            .serve_with_incoming_shutdown(ReceiverStream::new(incoming), shutdown)
            .await
            .map_err(AgentError::Serve);
        accepting.abort();
        served
    }
}

/// Accepts connections and hands each to the server once its handshake is done; each
/// handshake runs on its own, so a slow client holds up no one else.
async fn accept(
    listener: TcpListener,
    tls: TlsAcceptor,
    connections: mpsc::Sender<Result<TlsStream<TcpStream>, std::io::Error>>,
) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accepting a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Exec carries keystrokes and small prompts; Nagle would hold them back.
        if let Err(error) = tcp.set_nodelay(true) {
            tracing::debug!(%error, %peer, "setting TCP_NODELAY");
        }
        let tls = tls.clone();
        let connections = connections.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let _ = connections.send(Ok(stream)).await;
                }
                Ok(Err(error)) => tracing::debug!(%error, %peer, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

/// Builds, binds `config.listen` and serves until SIGINT or SIGTERM. With
/// `--serving-certificate-from-api-server` it first gets its certificate from the API
/// server and keeps renewing it while it serves.
pub async fn run(config: Config) -> Result<(), AgentError> {
    let listen = config.listen;
    let agent = match &config.serving {
        Serving::Files { .. } => build(config)?,
        Serving::FromApiServer { host } => {
            let host = host.clone();
            let client = kube::Client::try_default()
                .await
                .map_err(AgentError::ApiServer)?;
            let (key, issued, serving) = certificate::first(&client, &host)
                .await
                .map_err(AgentError::ServingCertificate)?;
            let agent = build_with(config, serving.clone())?;
            tokio::spawn(certificate::keep_renewed(
                client, host, key, issued, serving,
            ));
            agent
        }
    };
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| AgentError::Bind(listen, source))?;
    let address = listener
        .local_addr()
        .map_err(|source| AgentError::Bind(listen, source))?;
    tracing::info!(%address, "serving the exec relay");
    agent.serve(listener, shutdown_signal()).await
}

/// Completes on SIGINT or SIGTERM (how a DaemonSet's pod is stopped).
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        }
        Err(error) => {
            tracing::warn!(%error, "cannot watch SIGTERM; stopping on SIGINT only");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("stopping: open sessions may finish");
}
