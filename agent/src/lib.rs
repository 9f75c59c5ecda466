//! The Exec Agent on each Host: relays the API server's exec sessions to flintlockd's
//! exec API over mTLS.
//!
//! [`config`] turns the command line into a checked [`Config`]; [`build`] makes the
//! server from it (TLS material is parsed here, still before any port is bound);
//! [`Agent::serve`] serves [`relay`] on a listener, each session relayed through the
//! [`flintlock`] client. Given its Host's name, the agent also [`register`]s the Host and
//! reports its [`readiness`] on the Kubernetes API while it serves.

pub mod config;
pub mod flintlock;
pub mod logging;
pub mod readiness;
pub mod register;
pub mod relay;

use std::future::Future;
use std::net::SocketAddr;

use battery_proto::agent::v1alpha1::relay_server::RelayServer;
use thiserror::Error;
use tokio::net::TcpListener;
use tonic::transport::server::{Router, TcpIncoming};
use tonic::transport::{Server, ServerTlsConfig};

pub use config::{Cli, Config, ConfigError};

use crate::flintlock::Flintlock;
use crate::relay::RelayService;

/// The largest gRPC message the agent decodes, from either side: with the relay's
/// bounded queues, what bounds a session's memory.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// stdin the API server may send ahead of the agent reading it, per session.
const STREAM_WINDOW_BYTES: u32 = 256 * 1024;

/// What stops the agent after its configuration was accepted.
#[derive(Debug, Error)]
pub enum AgentError {
    #[error("loading the relay's serving certificate and client CA")]
    ServingTls(#[source] tonic::transport::Error),
    #[error("loading the TLS material for flintlockd")]
    FlintlockTls(#[source] tonic::transport::Error),
    #[error("binding {0}")]
    Bind(SocketAddr, #[source] std::io::Error),
    #[error("serving the relay")]
    Serve(#[source] tonic::transport::Error),
    #[error("making the Kubernetes client (--kubeconfig)")]
    Kube(#[source] anyhow::Error),
}

/// A built agent, not yet listening.
pub struct Agent {
    router: Router,
    /// The Host to register and report, with the flintlockd client its checks call.
    registration: Option<(register::Registration, Flintlock)>,
}

/// Builds the agent's server: parses the TLS material, so a key that does not match
/// its certificate fails here and not on the first handshake.
pub fn build(config: Config) -> Result<Agent, AgentError> {
    let flintlock = Flintlock::new(config.flintlock).map_err(AgentError::FlintlockTls)?;
    let tls = ServerTlsConfig::new()
        .identity(config.identity)
        // Required, not optional: a client without a certificate from this CA is
        // refused in the handshake, before any request is read.
        .client_ca_root(config.client_ca);
    let registration = config.registration.map(|r| (r, flintlock.clone()));
    let relay =
        RelayServer::new(RelayService::new(flintlock)).max_decoding_message_size(MAX_MESSAGE_BYTES);
    let router = Server::builder()
        .tls_config(tls)
        .map_err(AgentError::ServingTls)?
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .add_service(relay);
    Ok(Agent {
        router,
        registration,
    })
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
                let client = register::client(registration.kubeconfig.as_ref())
                    .await
                    .map_err(AgentError::Kube)?;
                Some(tokio_util::task::AbortOnDropHandle::new(tokio::spawn(
                    register::run(registration, client, flintlock),
                )))
            }
            None => None,
        };
        // Exec carries keystrokes and small prompts; Nagle would hold them back.
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        self.router
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
            .map_err(AgentError::Serve)
    }
}

/// Builds, binds `config.listen` and serves until SIGINT or SIGTERM.
pub async fn run(config: Config) -> Result<(), AgentError> {
    let listen = config.listen;
    let agent = build(config)?;
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
