//! flintlock's `microvm.services.api.v1alpha1.MicroVM` service on the simulated Host.

use std::sync::Arc;

use battery_proto::microvm::services::api::v1alpha1::micro_vm_server::MicroVm;
use battery_proto::microvm::services::api::v1alpha1::{
    CreateMicroVmRequest, CreateMicroVmResponse, DeleteMicroVmRequest, GetMicroVmRequest,
    GetMicroVmResponse, ListMessage, ListMicroVMsRequest, ListMicroVMsResponse, ServerInfoResponse,
    VersionInfo,
};
use tonic::{Request, Response, Status};
use tracing::debug;

use super::error::RequestError;
use super::host::Host;
use super::records::VmState;
use super::registry::Lifetime;

pub(super) struct MicroVmService {
    host: Arc<Host>,
}

impl MicroVmService {
    pub(super) fn new(host: Arc<Host>) -> Self {
        Self { host }
    }
}

/// Ends the PENDING MicroVM `uid`'s boot in `outcome` once the provisioning delay
/// has passed, unless the MicroVM is deleted or the Host stops first.
pub(super) fn schedule_boot(host: &Arc<Host>, uid: String, lifetime: &Lifetime, outcome: VmState) {
    let host = Arc::clone(host);
    let cancel = lifetime.cancel.clone();
    lifetime.tasks.spawn(async move {
        tokio::select! {
            () = cancel.cancelled() => {}
            () = tokio::time::sleep(host.provisioning_delay) => {
                host.registry.finish_boot(&uid, outcome).await;
                debug!(host = %host.name, uid, ?outcome, "simulated microvm booted");
            }
        }
    });
}

#[tonic::async_trait]
impl MicroVm for MicroVmService {
    async fn create_micro_vm(
        &self,
        request: Request<CreateMicroVmRequest>,
    ) -> Result<Response<CreateMicroVmResponse>, Status> {
        if self.host.faults.creates_fail() {
            return Err(RequestError::Fault("CreateMicroVM").into());
        }
        let spec = request
            .into_inner()
            .microvm
            .ok_or(RequestError::SpecRequired)?;
        let outcome = self.host.faults.boot_outcome();
        let created = self.host.registry.create(spec).await?;
        debug!(host = %self.host.name, uid = created.uid, "simulated microvm created");
        schedule_boot(&self.host, created.uid, &created.lifetime, outcome);
        Ok(Response::new(CreateMicroVmResponse {
            microvm: Some(created.microvm),
        }))
    }

    async fn delete_micro_vm(
        &self,
        request: Request<DeleteMicroVmRequest>,
    ) -> Result<Response<()>, Status> {
        if self.host.faults.deletes_fail() {
            return Err(RequestError::Fault("DeleteMicroVM").into());
        }
        self.host.faults.deletes_released().await;
        let uid = request.into_inner().uid;
        self.host.registry.delete(&uid).await?;
        debug!(host = %self.host.name, uid, "simulated microvm deleted");
        Ok(Response::new(()))
    }

    async fn get_micro_vm(
        &self,
        request: Request<GetMicroVmRequest>,
    ) -> Result<Response<GetMicroVmResponse>, Status> {
        let microvm = self.host.registry.get(&request.into_inner().uid)?;
        Ok(Response::new(GetMicroVmResponse {
            microvm: Some(microvm),
        }))
    }

    async fn list_micro_v_ms(
        &self,
        request: Request<ListMicroVMsRequest>,
    ) -> Result<Response<ListMicroVMsResponse>, Status> {
        let query = request.into_inner();
        let microvm = self
            .host
            .registry
            .list(&query.namespace, query.name.as_deref());
        Ok(Response::new(ListMicroVMsResponse { microvm }))
    }

    type ListMicroVMsStreamStream =
        tokio_stream::Iter<std::vec::IntoIter<Result<ListMessage, Status>>>;

    async fn list_micro_v_ms_stream(
        &self,
        request: Request<ListMicroVMsRequest>,
    ) -> Result<Response<Self::ListMicroVMsStreamStream>, Status> {
        let query = request.into_inner();
        let messages: Vec<_> = self
            .host
            .registry
            .list(&query.namespace, query.name.as_deref())
            .into_iter()
            .map(|microvm| {
                Ok(ListMessage {
                    microvm: Some(microvm),
                })
            })
            .collect();
        Ok(Response::new(tokio_stream::iter(messages)))
    }

    async fn server_info(
        &self,
        _request: Request<()>,
    ) -> Result<Response<ServerInfoResponse>, Status> {
        Ok(Response::new(ServerInfoResponse {
            version: Some(VersionInfo {
                version: self.host.version.clone(),
            }),
        }))
    }
}
