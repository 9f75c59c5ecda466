//! `poolmgr.v1alpha1.Lease` (§3.1, §4.3–§4.5). Lease ids are secrets: they are never
//! logged.

use std::sync::Arc;

use battery_proto::poolmgr::v1alpha1::lease_server::Lease;
use battery_proto::poolmgr::v1alpha1::{
    ClaimVmRequest, ClaimVmResponse, HeartbeatRequest, HeartbeatResponse, ListLeasesRequest,
    ListLeasesResponse, ReleaseVmRequest,
};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::claim;
use super::engine::Engine;
use super::errors::internal;
use super::lifecycle::{self, DeleteError};
use super::model::PoolKey;
use super::store::Heartbeat;

pub(crate) struct LeaseService {
    engine: Arc<Engine>,
}

impl LeaseService {
    pub(crate) fn new(engine: Arc<Engine>) -> Self {
        Self { engine }
    }
}

fn lease_not_found(lease_id: &str) -> Status {
    Status::not_found(format!("lease {lease_id} not found"))
}

#[tonic::async_trait]
impl Lease for LeaseService {
    async fn claim_vm(
        &self,
        request: Request<ClaimVmRequest>,
    ) -> Result<Response<ClaimVmResponse>, Status> {
        // The claim runs detached so a vanished caller cannot strand the VM mid-claim;
        // the drop guard tells it the caller is gone.
        let client_gone = CancellationToken::new();
        let guard = client_gone.clone().drop_guard();
        let claimed = self
            .engine
            .detached(claim::claim(
                Arc::clone(&self.engine),
                request.into_inner(),
                client_gone,
            ))
            .await;
        guard.disarm();
        claimed
            .unwrap_or_else(|| Err(Status::unavailable("battery is shutting down")))
            .map(Response::new)
    }

    async fn heartbeat(
        &self,
        request: Request<HeartbeatRequest>,
    ) -> Result<Response<HeartbeatResponse>, Status> {
        let lease_id = request.into_inner().lease_id;
        match self.engine.store.heartbeat(&lease_id).map_err(internal)? {
            Heartbeat::Renewed(expires_at) => Ok(Response::new(HeartbeatResponse {
                expires_at: Some(expires_at),
            })),
            Heartbeat::LeaseNotFound => Err(lease_not_found(&lease_id)),
            Heartbeat::PoolNotFound(key) => Err(Status::not_found(format!("pool {key} not found"))),
        }
    }

    /// §4.5: mark the VM DELETING, delete it through flintlock, then remove the row and
    /// the lease together (VM_DELETED_ON_RELEASE). A flintlock failure leaves the VM
    /// DELETING with its lease, for a retry or the sweeper.
    async fn release_vm(&self, request: Request<ReleaseVmRequest>) -> Result<Response<()>, Status> {
        let lease_id = request.into_inner().lease_id;
        let store = &self.engine.store;
        let Some(lease) = store.get_lease(&lease_id).map_err(internal)? else {
            return Err(lease_not_found(&lease_id));
        };
        if let Some(vm) = store.mark_vm_deleting(&lease.vm_uid).map_err(internal)? {
            match lifecycle::delete_vm(&self.engine, &vm).await {
                Ok(()) => {
                    tracing::info!(pool = %PoolKey::of_lease(&lease), vm = %vm.uid, "VM released");
                }
                Err(DeleteError::Flintlock(err)) => {
                    tracing::warn!(vm = %vm.uid, error = %err, "release: deleting the VM failed; cleanup pending");
                    return Err(Status::unavailable(format!(
                        "vm cleanup pending, retry later: {err}"
                    )));
                }
                Err(DeleteError::Store(err)) => return Err(internal(err)),
            }
        }
        // The VM was already gone (or someone else finished it): drop a leftover lease.
        store.delete_lease(&lease_id).map_err(internal)?;
        Ok(Response::new(()))
    }

    async fn list_leases(
        &self,
        request: Request<ListLeasesRequest>,
    ) -> Result<Response<ListLeasesResponse>, Status> {
        let pool = request
            .into_inner()
            .pool_ref
            .map(|pool| PoolKey::of_ref(Some(&pool)));
        let leases = self
            .engine
            .store
            .list_leases(pool.as_ref())
            .map_err(internal)?;
        Ok(Response::new(ListLeasesResponse { leases }))
    }
}
