//! The two ways a VM leaves: the hook-failure policy (§4.1) and the deletion of a
//! DELETING VM through flintlock with its bookkeeping (§4.4, §4.5, §4.7).

use std::time::Duration;

use battery_proto::poolmgr::v1alpha1::{EventType, HookFailurePolicy, PoolSpec, VmPhase, VmRecord};

use super::engine::Engine;
use super::flintlock::FlintlockError;
use super::model::PoolKey;
use super::reconcilers::Nudge;
use super::store::{StoreError, Transition};

/// Deadline of one flintlock DeleteMicroVM (battery's DeletePool per-VM and hook cleanup
/// timeouts are both 30 s).
pub(crate) const DELETE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub(crate) enum DeleteError {
    #[error(transparent)]
    Flintlock(#[from] FlintlockError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Applies the hook-failure policy of `spec` (the reconciler's copy, or the pool as
/// ClaimVM read it; not read again) to a VM whose bring-up or pre-lease hook failed, as
/// poolmgrd does: QUARANTINE makes it QUARANTINED (lease_id cleared) unless it is DELETING
/// or gone; DELETE_AND_REPLACE, and any other value, deletes it through flintlock and
/// removes its row whatever its phase. VM_HOOK_FAILED follows either way.
pub(crate) async fn hook_failed(engine: &Engine, spec: &PoolSpec, vm: &VmRecord) {
    let key = PoolKey::of_vm(vm);
    if spec.hook_failure_policy == HookFailurePolicy::Quarantine as i32 {
        match engine
            .store
            .transition_vm(&vm.uid, VmPhase::Quarantined, true)
        {
            Ok(Transition::Updated) => {
                tracing::info!(pool = %key, vm = %vm.uid, "hook failed; VM quarantined");
            }
            Ok(Transition::Deleting | Transition::Missing) => {
                tracing::debug!(pool = %key, vm = %vm.uid, "hook failed; VM already being deleted");
            }
            Err(err) => {
                tracing::warn!(pool = %key, vm = %vm.uid, error = %err, "quarantining failed");
            }
        }
    } else {
        // No connection: poolmgrd skips the MicroVM and still removes the row.
        if let Ok(client) = engine.hosts.client(&vm.flintlock_host)
            && let Err(err) = client.delete(&vm.uid, DELETE_TIMEOUT).await
        {
            tracing::warn!(pool = %key, vm = %vm.uid, host = %vm.flintlock_host, error = %err, "hook-failure cleanup: deleting the MicroVM failed");
        }
        // No nudge: the next tick replaces it, so a hook that always fails costs one VM
        // per tick rather than a tight create/delete loop.
        match engine.store.remove_vm(&vm.uid) {
            Ok(_) => {
                tracing::info!(pool = %key, vm = %vm.uid, "hook failed; VM deleted for replacement");
            }
            Err(err) => {
                tracing::warn!(pool = %key, vm = %vm.uid, error = %err, "hook-failure cleanup: removing the VM failed");
            }
        }
    }
    engine.emit(&key, &vm.uid, EventType::VmHookFailed);
}

/// Deletes a DELETING VM through its host and finishes the bookkeeping in one
/// transaction: the row, and a lease row if one is left, are removed. When the pool
/// still exists this emits VM_DELETED_ON_RELEASE (a lease row was left: a release) or
/// VM_DELETED_DUE_TO_EXPIRY and nudges the reconciler; for a deleted pool it emits
/// nothing. On a flintlock failure the VM stays DELETING for a retry.
pub(crate) async fn delete_vm(engine: &Engine, vm: &VmRecord) -> Result<(), DeleteError> {
    let client = engine.hosts.client(&vm.flintlock_host)?;
    client.delete(&vm.uid, DELETE_TIMEOUT).await?;
    let Some(finished) = engine.store.finish_vm_deletion(&vm.uid)? else {
        return Ok(());
    };
    if finished.pool_exists {
        let key = PoolKey::of_vm(vm);
        let kind = if finished.released {
            EventType::VmDeletedOnRelease
        } else {
            EventType::VmDeletedDueToExpiry
        };
        engine.emit(&key, &vm.uid, kind);
        engine.nudge(&key, Nudge::Deleted);
    }
    Ok(())
}
