//! The Exec Agent on each Host: relays the API server's exec sessions to flintlockd's
//! exec API over mTLS.
//!
//! [`config`] turns the command line into a checked [`Config`]; [`start`] makes the
//! server from it (TLS material is parsed here, still before any port is bound), getting
//! its serving certificate from the API server ([`certificate`]) when so configured;
//! [`Agent::serve`] serves [`relay`] on a listener, each session relayed through the
//! [`flintlock`] client. Given its Host's name, the agent also [`register`]s the Host and
//! reports its [`readiness`] on the Kubernetes API while it serves.

pub mod certificate;
pub mod config;
mod exec_reply;
pub mod flintlock;
mod forward;
pub mod logging;
pub mod processes;
pub mod readiness;
pub mod register;
pub mod relay;
pub mod ssh;
mod terminal;
#[cfg(feature = "test-util")]
pub mod testing;

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
use tokio_util::task::AbortOnDropHandle;
use tonic::transport::Server;
use tonic::transport::server::Router;

pub use config::{Cli, Config, ConfigError, Serving};
pub use flintlock::MAX_MESSAGE_BYTES;

use crate::certificate::{CertificateError, ServingCertificate};
use crate::flintlock::Flintlock;
use crate::relay::RelayService;
use crate::ssh::SshIdentity;

/// stdin the API server may send ahead of the agent reading it, per session.
const STREAM_WINDOW_BYTES: u32 = 256 * 1024;
/// The TLS a connection may hold encrypted and unsent: a session's output (messages of up
/// to 1 MiB) is encrypted and handed to the socket in few large `writev`s, where rustls's
/// default (64 KiB) made it a write, and a wake-up of the API server, every 64 KiB. Its
/// clients are API servers, a few connections, so this bounds little memory.
const TLS_BUFFER_BYTES: usize = 1024 * 1024;
/// How long a client may take over its TLS handshake before it is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const ACCEPT_QUEUE: usize = 64;
/// TLS handshakes in progress at once. Anyone who reaches the port can start one, so
/// more connections are closed at once rather than each given a task.
const MAX_HANDSHAKES: usize = 128;

/// What stops the agent after its configuration was accepted.
#[derive(Debug, Error)]
pub enum AgentError {
    #[error("loading the relay's serving certificate")]
    ServingCertificate(#[source] CertificateError),
    #[error("loading the client CA (--client-ca-file)")]
    ClientCa(#[source] anyhow::Error),
    #[error(
        "the serving certificate comes from the API server: build with `start`, or with \
         `build_with` and a certificate from `certificate::first`"
    )]
    NoServingCertificate,
    #[error("loading the TLS material for flintlockd")]
    FlintlockTls(#[source] tonic::transport::Error),
    #[error("binding {0}")]
    Bind(SocketAddr, #[source] std::io::Error),
    #[error("serving the relay")]
    Serve(#[source] tonic::transport::Error),
    #[error("making the Kubernetes client (--kubeconfig)")]
    Kube(#[source] anyhow::Error),
    #[error("loading the process table (--state-dir)")]
    Processes(#[source] processes::LoadError),
}

/// A built agent, not yet listening.
pub struct Agent {
    router: Router,
    tls: TlsAcceptor,
    /// The Host to register and report, with the flintlockd client its checks call.
    registration: Option<(register::Registration, Flintlock)>,
    /// The kube client, when [`start`] already made one and registered the Host.
    kube: Option<kube::Client>,
    /// Keeps a serving certificate from the API server renewed while the agent lives.
    _renewal: Option<AbortOnDropHandle<()>>,
}

/// Builds the agent's server with the serving certificate of `--tls-cert-file`: parses
/// the TLS material, so a key that does not match its certificate fails here and not on
/// the first handshake.
pub fn build(config: Config) -> Result<Agent, AgentError> {
    let serving = match &config.serving {
        Serving::Files { cert, key } => {
            ServingCertificate::from_pem(cert, key).map_err(AgentError::ServingCertificate)?
        }
        Serving::FromApiServer => return Err(AgentError::NoServingCertificate),
    };
    // No API server signs for it: sessions with a terminal are refused, saying why.
    let ssh = SshIdentity::generate()
        .map_err(|source| AgentError::ServingCertificate(CertificateError::SshKey(source)))?;
    build_with(config, Arc::new(serving), Arc::new(ssh))
}

/// Builds the agent's server, serving the relay with whatever `serving` holds at each
/// handshake, and logging in to guests for terminals with whatever `ssh` holds.
pub fn build_with(
    config: Config,
    serving: Arc<ServingCertificate>,
    ssh: Arc<SshIdentity>,
) -> Result<Agent, AgentError> {
    let flintlock = Flintlock::new(config.flintlock).map_err(AgentError::FlintlockTls)?;
    let tls = tls_acceptor(&config.client_ca, serving)?;
    let registration = config.registration.map(|r| (r, flintlock.clone()));
    let processes = processes::Processes::load(flintlock.clone(), &config.state_dir)
        .map_err(AgentError::Processes)?;
    let relay = RelayServer::new(RelayService::new(
        flintlock,
        config.max_sessions,
        ssh,
        processes,
    ))
    .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let router = Server::builder()
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .add_service(relay);
    Ok(Agent {
        router,
        tls,
        registration,
        kube: None,
        _renewal: None,
    })
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
    /// Serves until `shutdown` completes, then lets open sessions finish. Registers and
    /// reports the Host meanwhile, if it has one; the reports stop with the relay.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), AgentError> {
        let _reporting = match self.registration {
            Some((registration, flintlock)) => {
                // [`start`] registered the Host already when it made the client.
                let task = match self.kube {
                    Some(client) => tokio::spawn(register::report(registration, client, flintlock)),
                    None => {
                        let client = register::client(registration.kubeconfig.as_ref())
                            .await
                            .map_err(AgentError::Kube)?;
                        tokio::spawn(register::run(registration, client, flintlock))
                    }
                };
                Some(AbortOnDropHandle::new(task))
            }
            None => None,
        };
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
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
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
        let Ok(permit) = handshakes.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "too many TLS handshakes in progress; closing");
            continue;
        };
        let tls = tls.clone();
        let connections = connections.clone();
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await;
            drop(permit);
            match handshake {
                Ok(Ok(mut stream)) => {
                    stream.get_mut().1.set_buffer_limit(Some(TLS_BUFFER_BYTES));
                    let _ = connections.send(Ok(stream)).await;
                }
                Ok(Err(error)) => tracing::debug!(%error, %peer, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

/// Builds the agent as `config` says. With its serving certificate from the API server
/// it first registers its Host (a certificate is signed only for a Host that exists) and
/// gets the certificate; the agent then keeps it renewed while it lives.
pub async fn start(config: Config) -> Result<Agent, AgentError> {
    if !matches!(config.serving, Serving::FromApiServer) {
        return build(config);
    }
    let registration = config
        .registration
        .as_ref()
        .ok_or(AgentError::NoServingCertificate)?;
    let client = register::client(registration.kubeconfig.as_ref())
        .await
        .map_err(AgentError::Kube)?;
    register::register(&client, registration).await;
    let host = registration.host.clone();
    let ssh = Arc::new(
        SshIdentity::generate()
            .map_err(|source| AgentError::ServingCertificate(CertificateError::SshKey(source)))?,
    );
    let (key, issued, serving) = certificate::first(&client, &host, &ssh)
        .await
        .map_err(AgentError::ServingCertificate)?;
    let mut agent = build_with(config, serving.clone(), ssh.clone())?;
    agent._renewal = Some(AbortOnDropHandle::new(tokio::spawn(
        certificate::keep_renewed(client.clone(), host, key, issued, serving, ssh),
    )));
    agent.kube = Some(client);
    Ok(agent)
}

/// [`start`]s, binds `config.listen` and serves until SIGINT or SIGTERM.
pub async fn run(config: Config) -> Result<(), AgentError> {
    let listen = config.listen;
    let agent = start(config).await?;
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| AgentError::Bind(listen, source))?;
    let address = listener
        .local_addr()
        .map_err(|source| AgentError::Bind(listen, source))?;
    tracing::info!(%address, "serving the exec relay");
    logging::announce(&format!("{}{address}", logging::SERVING_PREFIX));
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
