//! The gRPC server: poolmgrd's four services, gRPC health (overall "" SERVING) and server
//! reflection v1, on one port (§0).

use std::sync::Arc;

use battery_proto::poolmgr::v1alpha1::events_server::EventsServer;
use battery_proto::poolmgr::v1alpha1::host_admin_server::HostAdminServer;
use battery_proto::poolmgr::v1alpha1::lease_server::LeaseServer;
use battery_proto::poolmgr::v1alpha1::pool_admin_server::PoolAdminServer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::server::NamedService;
use tonic::service::InterceptorLayer;
use tonic::transport::Server;
use tonic::transport::server::Router;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tower::layer::util::{Identity, Stack};

use super::engine::Engine;
use super::errors::BatteryError;
use super::events::EventsService;
use super::hostadmin::HostAdminService;
use super::lease::LeaseService;
use super::pooladmin::PoolAdminService;
use super::security::{ApiSecurity, TokenCheck};

/// The services, ready to serve.
pub(crate) struct Services {
    router: Router<Stack<InterceptorLayer<TokenCheck>, Identity>>,
}

/// Builds every service, behind the port's TLS and token check; nothing is served yet.
pub(crate) async fn build(
    engine: Arc<Engine>,
    security: &ApiSecurity,
) -> Result<Services, BatteryError> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_service_status("", ServingStatus::Serving).await;
    let mut server = Server::builder();
    if let Some(tls) = security.server_tls() {
        server = server.tls_config(tls).map_err(BatteryError::Tls)?;
    }
    let router = server
        // Before every service, as poolmgrd's interceptor: health and reflection too.
        .layer(tonic::service::InterceptorLayer::new(
            security.token_check(),
        ))
        .add_service(health_service)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?)
        .add_service(PoolAdminServer::new(PoolAdminService::new(Arc::clone(
            &engine,
        ))))
        .add_service(LeaseServer::new(LeaseService::new(Arc::clone(&engine))))
        .add_service(EventsServer::new(EventsService::new(Arc::clone(&engine))))
        .add_service(HostAdminServer::new(HostAdminService::new(engine)));
    // "" stays SERVING for good: poolmgrd never changes it, not even while stopping.
    Ok(Services { router })
}

/// Reflection over what is served, in both protocol versions as grpc-go registers them.
/// Only served services are advertised: the descriptor set also holds flintlock's.
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(battery_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .with_service_name(PoolAdminServer::<PoolAdminService>::NAME)
        .with_service_name(LeaseServer::<LeaseService>::NAME)
        .with_service_name(EventsServer::<EventsService>::NAME)
        .with_service_name(HostAdminServer::<HostAdminService>::NAME)
        .with_service_name("grpc.health.v1.Health")
        .with_service_name("grpc.reflection.v1.ServerReflection")
        .with_service_name("grpc.reflection.v1alpha.ServerReflection")
}

impl Services {
    /// Serves on `listener` until `stop` fires (or its sender is dropped), then shuts
    /// down gracefully. Returns the server's task.
    pub(crate) fn serve(
        self,
        listener: TcpListener,
        stop: oneshot::Receiver<()>,
    ) -> JoinHandle<Result<(), tonic::transport::Error>> {
        // Without TCP_NODELAY, a small HTTP/2 frame written after another waits for the
        // client's delayed ACK (40 ms on Linux): tens of milliseconds per bind.
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let server = self.router.serve_with_incoming_shutdown(incoming, async {
            let _ = stop.await;
        });
        tokio::spawn(server)
    }
}
