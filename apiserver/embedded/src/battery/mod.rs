//! The embedded battery core: poolmgrd's gRPC API (`reference/battery-api.md`) served
//! from this process over a redb store. It talks to Hosts only through flintlock's gRPC
//! API at each registered Host's address, as poolmgrd does.
//!
//! Section numbers (§) in this module's comments refer to that reference.

mod claim;
mod connections;
mod engine;
mod events;
mod flintlock;
mod hostadmin;
mod lease;
mod lifecycle;
mod model;
mod pooladmin;
mod provision;
mod reconciler;
mod security;
mod server;
mod store;
mod sweeper;
mod time;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use battery_proto::poolmgr::v1alpha1::host_admin_server::HostAdmin as _;
use battery_proto::poolmgr::v1alpha1::{AddHostRequest, Host, UpdateHostRequest};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use engine::Engine;
pub use security::{ApiSecurity, ServerTls};
use store::{Store, StoreError};

/// How long a shutdown waits for in-flight RPCs before cutting them (poolmgrd forces
/// its stop after 5 s, §6).
const GRACEFUL_STOP: Duration = Duration::from_secs(5);

/// The embedded battery's settings. The defaults are poolmgrd's, whose internal timings
/// are not configurable there (§6); here they are, so tests can run fast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatteryConfig {
    /// Where the store file lives; None keeps the store in memory.
    pub data_dir: Option<PathBuf>,
    /// How often the sweeper retries deletions, expires leases and warns (10 s).
    pub sweep_interval: Duration,
    /// How far ahead of expiry VM_EXPIRING_SOON is emitted (30 s).
    pub warning_window: Duration,
    /// Each pool reconciler's tick (10 s).
    pub reconcile_interval: Duration,
    /// How often a new MicroVM's state is polled until CREATED (2 s).
    pub create_poll_interval: Duration,
    /// How long a new MicroVM may take to reach CREATED (60 s).
    pub create_timeout: Duration,
    /// How often the guest agent is probed (1 s).
    pub guest_agent_interval: Duration,
    /// How long the guest agent may take to answer (30 s).
    pub guest_agent_timeout: Duration,
    /// The timeout given to each hook command; zero means none (0).
    pub exec_timeout: Duration,
    /// How long a Subscribe stream waits before reading the outbox again after a read
    /// that was not a full batch (1 s; zero also means 1 s, as in poolmgrd).
    pub event_poll_interval: Duration,
    /// Not poolmgrd's: an extension of the embedded battery that wakes Subscribe streams
    /// on each commit instead of polling, for speed where poolmgrd's latency is not what
    /// is under test (false: poll, as poolmgrd does).
    pub extension_events_on_commit: bool,
    /// For tests only, not poolmgrd's: a pause after each full batch of events a Subscribe
    /// stream sends, so a replay stalls between its batches of 100 (zero: none, as in
    /// poolmgrd).
    pub replay_batch_pause: Duration,
    /// How the gRPC port is secured (`api_server`); plaintext without a token by default.
    pub api: ApiSecurity,
}

impl Default for BatteryConfig {
    fn default() -> Self {
        Self {
            data_dir: None,
            sweep_interval: Duration::from_secs(10),
            warning_window: Duration::from_secs(30),
            reconcile_interval: Duration::from_secs(10),
            create_poll_interval: Duration::from_secs(2),
            create_timeout: Duration::from_secs(60),
            guest_agent_interval: Duration::from_secs(1),
            guest_agent_timeout: Duration::from_secs(30),
            exec_timeout: Duration::ZERO,
            event_poll_interval: events::DEFAULT_POLL_INTERVAL,
            extension_events_on_commit: false,
            replay_batch_pause: Duration::ZERO,
            api: ApiSecurity::default(),
        }
    }
}

/// Why the embedded battery could not start.
#[derive(Debug, thiserror::Error)]
pub enum BatteryError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("reading the listener's address: {0}")]
    Listener(#[source] std::io::Error),
    #[error("building gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("setting up the gRPC port's TLS")]
    Tls(#[source] tonic::transport::Error),
}

/// A running embedded battery.
pub struct EmbeddedBattery {
    engine: Arc<Engine>,
    address: SocketAddr,
    stop_server: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl EmbeddedBattery {
    /// Opens/creates the store, runs battery's startup recovery, starts reconcilers and
    /// the sweeper, and serves PoolAdmin, Lease, Events, HostAdmin, grpc.health.v1
    /// (overall "" SERVING) and server reflection on `listener`.
    pub async fn start(config: BatteryConfig, listener: TcpListener) -> Result<Self, BatteryError> {
        let address = listener.local_addr().map_err(BatteryError::Listener)?;
        let store = Store::open(config.data_dir.as_deref())?;
        // §4.1: before anything is served.
        let recovery = store.recover()?;
        if recovery.abandoned_claims > 0 || recovery.placements_cleared > 0 {
            tracing::info!(
                abandoned_claims = recovery.abandoned_claims,
                placements_cleared = recovery.placements_cleared,
                "startup recovery"
            );
        }
        let engine = Engine::new(config, store);
        connect_stored_hosts(&engine)?;
        let pools = engine.store.list_pools()?;
        let services = server::build(Arc::clone(&engine), &engine.config.api).await?;
        for spec in pools {
            engine.reconcilers.start(&engine, spec);
        }
        engine.spawn(sweeper::run(Arc::clone(&engine)));
        let (stop_server, stop) = oneshot::channel();
        let server = services.serve(listener, stop);
        tracing::info!(%address, "embedded battery serving");
        Ok(Self {
            engine,
            address,
            stop_server: Some(stop_server),
            server: Some(server),
        })
    }

    /// The address the gRPC server listens on.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Registers `host` through HostAdmin's own handlers, in this process: `AddHost`, or
    /// `UpdateHost` when the store knows it under an old address. What an operator's
    /// `poolmgrctl host add` does, without needing the port's credentials.
    pub async fn register_host(&self, host: Host) -> Result<(), tonic::Status> {
        let admin = hostadmin::HostAdminService::new(Arc::clone(&self.engine));
        let added = admin
            .add_host(tonic::Request::new(AddHostRequest {
                host: Some(host.clone()),
                skip_validation: false,
            }))
            .await;
        match added {
            Err(status) if status.code() == tonic::Code::AlreadyExists => admin
                .update_host(tonic::Request::new(UpdateHostRequest {
                    host: Some(host),
                    skip_validation: false,
                }))
                .await
                .map(drop),
            other => other.map(drop),
        }
    }

    /// Stops gracefully: reconcilers are cancelled (their provisions in flight fail
    /// through the hook-failure policy), event streams are cut, in-flight RPCs get up to
    /// 5 s, then the reconcilers are waited for, every other task stopped and the store
    /// closed. Health stays SERVING throughout, as poolmgrd's does.
    pub async fn shutdown(mut self) {
        self.engine.shutdown_token().cancel();
        if let Some(stop) = self.stop_server.take() {
            // The server may already have ended; nothing to stop then.
            let _ = stop.send(());
        }
        if let Some(mut server) = self.server.take() {
            match tokio::time::timeout(GRACEFUL_STOP, &mut server).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(err))) => tracing::warn!(error = %err, "gRPC server ended with an error"),
                Ok(Err(err)) => tracing::warn!(error = %err, "gRPC server task failed"),
                Err(_) => {
                    server.abort();
                    // Aborted on purpose; its JoinError carries nothing new.
                    let _ = server.await;
                }
            }
        }
        self.engine.stop_background().await;
        self.engine.store.close();
        tracing::info!(address = %self.address, "embedded battery stopped");
    }
}

impl Drop for EmbeddedBattery {
    /// Without `shutdown`, still stop serving and let every background loop end.
    fn drop(&mut self) {
        self.engine.shutdown_token().cancel();
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

/// §4.8: every stored host is dialled at startup; one that fails (bad TLS, missing
/// files) is skipped with a warning, stays listed, and can be fixed with UpdateHost.
fn connect_stored_hosts(engine: &Engine) -> Result<(), StoreError> {
    for host in engine.store.list_hosts()? {
        let channel = match connections::dial(&host.address, host.tls.as_ref()) {
            Ok(channel) => Some(channel),
            Err(err) => {
                tracing::warn!(host = %host.name, error = %err, "dialling a stored host failed; fix it with UpdateHost");
                None
            }
        };
        engine
            .hosts
            .install(&host.name, &host.address, channel, None);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// poolmgrd's values, none of which it lets you configure but the sweep interval and
    /// the warning window (§6).
    #[test]
    fn defaults_are_poolmgrds() {
        let config = BatteryConfig::default();
        let secs = Duration::from_secs;
        assert_eq!(
            [
                config.sweep_interval,
                config.warning_window,
                config.reconcile_interval,
                config.create_poll_interval,
                config.create_timeout,
                config.guest_agent_interval,
                config.guest_agent_timeout,
                config.exec_timeout,
                config.event_poll_interval,
                config.replay_batch_pause,
            ],
            [
                secs(10),
                secs(30),
                secs(10),
                secs(2),
                secs(60),
                secs(1),
                secs(30),
                Duration::ZERO,
                secs(1),
                Duration::ZERO,
            ]
        );
        assert!(!config.extension_events_on_commit);
        assert_eq!(GRACEFUL_STOP, secs(5));
        assert_eq!(lifecycle::DELETE_TIMEOUT, secs(30));
        assert_eq!(flintlock::SERVER_INFO_TIMEOUT, secs(10));
    }
}
