//! The embedded battery core: poolmgrd's gRPC API (`reference/battery-api.md`) served
//! from this process over a redb store. It talks to Hosts only through flintlock's gRPC
//! API at each registered Host's address, as poolmgrd does.
//!
//! Section numbers (§) in this module's comments refer to that reference.

mod claim;
mod config;
mod connections;
mod engine;
mod errors;
mod events;
mod flintlock;
mod hostadmin;
mod lease;
mod lifecycle;
mod model;
mod pooladmin;
mod provision;
mod reconciler;
mod reconcilers;
mod security;
mod server;
mod store;
mod sweeper;
mod time;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use battery_proto::poolmgr::v1alpha1::host_admin_server::HostAdmin as _;
use battery_proto::poolmgr::v1alpha1::{AddHostRequest, Host, UpdateHostRequest};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use config::BatteryConfig;
use engine::Engine;
pub use errors::BatteryError;
pub use security::{ApiSecurity, ServerTls};
use store::{Store, StoreError};

/// How long a shutdown waits for in-flight RPCs before cutting them (poolmgrd forces
/// its stop after 5 s, §6).
const GRACEFUL_STOP: Duration = Duration::from_secs(5);

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
            reconciler::start(&engine, spec);
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
