//! ClaimVM (§4.3): request_id replay, the atomic pick, pre-lease hooks and the lease
//! commit, with battery's status codes (§3.1).

use std::sync::Arc;

use battery_proto::poolmgr::v1alpha1::{
    ClaimVmRequest, ClaimVmResponse, EventType, HookFailurePolicy, HostInfo, LeaseRecord, PoolSpec,
    VmPhase, VmRecord,
};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::engine::Engine;
use super::errors::internal;
use super::flintlock::FlintlockError;
use super::lifecycle;
use super::model::{PoolKey, phase_of};
use super::reconcilers::Nudge;
use super::store::{LeaseCommit, StoreError, Transition};
use super::time;

/// battery's limit on ClaimVMRequest.request_id, in bytes.
pub(crate) const MAX_REQUEST_ID_BYTES: usize = 255;

/// Why a pre-lease hook failed; each gives INTERNAL and the hook-failure policy.
#[derive(Debug, thiserror::Error)]
enum HookError {
    #[error(transparent)]
    Flintlock(#[from] FlintlockError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the claim was cancelled by the client")]
    Cancelled,
}

fn deleted_during_claim(uid: &str) -> Status {
    Status::aborted(format!("vm {uid} was deleted during the claim, retry"))
}

/// The request_id rule checked before anything else (§3.1).
pub(crate) fn check_request_id(request_id: &str) -> Result<(), Status> {
    if request_id.len() > MAX_REQUEST_ID_BYTES {
        return Err(Status::invalid_argument(format!(
            "request_id is {} bytes, at most {MAX_REQUEST_ID_BYTES} allowed",
            request_id.len()
        )));
    }
    Ok(())
}

/// Serves one claim. `client_gone` is cancelled if the caller goes away; the claim runs
/// detached from the RPC, so this only cuts short a pre-lease hook (a hook failure), as
/// a cancelled context does in battery.
pub(crate) async fn claim(
    engine: Arc<Engine>,
    request: ClaimVmRequest,
    client_gone: CancellationToken,
) -> Result<ClaimVmResponse, Status> {
    check_request_id(&request.request_id)?;
    let key = PoolKey::of_ref(request.pool.as_ref());
    let store = &engine.store;
    let Some(pool) = store.get_pool(&key).map_err(internal)? else {
        return Err(Status::not_found(format!("pool {key} not found")));
    };
    let request_id = request.request_id;
    if !request_id.is_empty()
        && let Some(lease) = store.lease_by_request_id(&request_id).map_err(internal)?
    {
        return replay(&engine, &key, &request_id, &lease).await;
    }
    let Some(vm) = store.claim_available_vm(&key).map_err(internal)? else {
        return Err(Status::resource_exhausted(format!(
            "no available vm in pool {key}"
        )));
    };
    match run_pre_lease_hooks(&engine, &pool, &vm, &client_gone).await {
        Ok(true) => {}
        Ok(false) => return Err(deleted_during_claim(&vm.uid)),
        Err(err) => {
            // Also when a forced DeletePool removed the MicroVM under a running hook, as
            // in poolmgrd (its drain design accepts this).
            tracing::warn!(pool = %key, vm = %vm.uid, error = %err, "pre-lease hook failed");
            hook_failed(&engine, &pool, &vm).await;
            return Err(Status::internal(format!("pre-lease hook: {err}")));
        }
    }
    let now = time::now();
    let lease = LeaseRecord {
        lease_id: uuid::Uuid::new_v4().to_string(),
        vm_uid: vm.uid.clone(),
        pool_name: key.name.clone(),
        claimed_at: Some(now),
        last_heartbeat_at: Some(now),
        expires_at: Some(time::add_proto(
            &now,
            pool.heartbeat_expiry_threshold.as_ref(),
        )),
        pool_namespace: key.namespace.clone(),
        request_id: request_id.clone(),
    };
    match store.commit_lease(&lease) {
        Ok(LeaseCommit::Committed) => {}
        Ok(LeaseCommit::VmGone) => return Err(deleted_during_claim(&vm.uid)),
        Ok(LeaseCommit::RequestIdTaken) => {
            // A concurrent claim with this request_id won: this VM goes back, and the
            // caller gets the winner's lease.
            match store.transition_vm(&vm.uid, VmPhase::Available, true) {
                Ok(Transition::Updated) => {}
                Ok(Transition::Deleting | Transition::Missing) => {
                    return Err(deleted_during_claim(&vm.uid));
                }
                Err(err) => {
                    tracing::warn!(pool = %key, vm = %vm.uid, error = %err, "returning a VM to the pool failed");
                    hook_failed(&engine, &pool, &vm).await;
                    return Err(Status::internal(format!("return vm to available: {err}")));
                }
            }
            return match store.lease_by_request_id(&request_id).map_err(internal)? {
                Some(winner) => replay(&engine, &key, &request_id, &winner).await,
                None => Err(Status::aborted(format!(
                    "concurrent claim for request_id {request_id:?} already ended, retry"
                ))),
            };
        }
        Err(err) => {
            tracing::warn!(pool = %key, vm = %vm.uid, error = %err, "committing a lease failed");
            hook_failed(&engine, &pool, &vm).await;
            return Err(Status::internal(format!("lease vm: {err}")));
        }
    }
    tracing::info!(pool = %key, vm = %vm.uid, "VM claimed");
    engine.emit(&key, &vm.uid, EventType::VmClaimed);
    engine.nudge(&key, Nudge::Claimed);
    Ok(response(&engine, lease.lease_id, &vm).await)
}

/// A claim retried with a request_id that already has a lease (§4.3 step 2): the same
/// lease again, expiry untouched, no event.
async fn replay(
    engine: &Engine,
    key: &PoolKey,
    request_id: &str,
    lease: &LeaseRecord,
) -> Result<ClaimVmResponse, Status> {
    if !key.owns_lease(lease) {
        return Err(Status::invalid_argument(format!(
            "request_id {request_id:?} was used to claim from pool {}, not {key}",
            PoolKey::of_lease(lease)
        )));
    }
    let vm = engine.store.get_vm(&lease.vm_uid).map_err(internal)?;
    match vm {
        Some(vm) if phase_of(&vm) != VmPhase::Deleting => {
            tracing::info!(pool = %key, vm = %vm.uid, "claim replayed");
            Ok(response(engine, lease.lease_id.clone(), &vm).await)
        }
        _ => Err(Status::aborted(format!(
            "lease {} for request_id {request_id:?} is being released, retry",
            lease.lease_id
        ))),
    }
}

/// Step 4: PRE_LEASE_HOOK_RUNNING, then each pre-lease command. False when a forced
/// DeletePool took the VM first.
async fn run_pre_lease_hooks(
    engine: &Engine,
    pool: &PoolSpec,
    vm: &VmRecord,
    client_gone: &CancellationToken,
) -> Result<bool, HookError> {
    match engine
        .store
        .transition_vm(&vm.uid, VmPhase::PreLeaseHookRunning, false)?
    {
        Transition::Updated => {}
        Transition::Deleting | Transition::Missing => return Ok(false),
    }
    let client = engine.hosts.client(&vm.flintlock_host)?;
    for command in &pool.pre_lease_commands {
        tokio::select! {
            result = client.run_hook(&vm.uid, command, engine.config.exec_timeout) => result?,
            () = client_gone.cancelled() => return Err(HookError::Cancelled),
        }
    }
    Ok(true)
}

/// The pool's hook-failure policy for a claim's VM; a VM deleted for it nudges the
/// reconciler, so REPLACE_ON_DELETE tops up at once (poolmgrd's ClaimVM does; a create
/// hook's failure does not).
async fn hook_failed(engine: &Engine, pool: &PoolSpec, vm: &VmRecord) {
    lifecycle::hook_failed(engine, pool, vm).await;
    if pool.hook_failure_policy != HookFailurePolicy::Quarantine as i32 {
        engine.nudge(&PoolKey::of_vm(vm), Nudge::Deleted);
    }
}

/// Step 7: network interfaces from flintlock (best effort) and the host's registered
/// name and address.
async fn response(engine: &Engine, lease_id: String, vm: &VmRecord) -> ClaimVmResponse {
    let network_interfaces = match engine.hosts.client(&vm.flintlock_host) {
        Ok(client) => client.network_interfaces(&vm.uid).await,
        Err(_) => Default::default(),
    };
    ClaimVmResponse {
        lease_id,
        vm_uid: vm.uid.clone(),
        network_interfaces,
        host: Some(HostInfo {
            name: vm.flintlock_host.clone(),
            address: engine.hosts.address(&vm.flintlock_host).unwrap_or_default(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    #[test]
    fn request_id_limit_is_255_bytes() {
        assert!(check_request_id("").is_ok());
        assert!(check_request_id(&"a".repeat(255)).is_ok());
        let status = check_request_id(&"a".repeat(256)).expect_err("too long");
        assert_eq!(status.code(), Code::InvalidArgument);
        // Bytes, not characters: 128 two-byte characters are 256 bytes.
        assert!(check_request_id(&"é".repeat(128)).is_err());
    }
}
