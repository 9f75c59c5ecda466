//! The two ways a VM leaves: the hook-failure policy (§4.1) and the deletion of a
//! DELETING VM through flintlock with its bookkeeping (§4.4, §4.5, §4.7).

use std::time::Duration;

use battery_proto::poolmgr::v1alpha1::{EventType, HookFailurePolicy, VmPhase, VmRecord};

use super::engine::Engine;
use super::flintlock::FlintlockError;
use super::model::{PoolKey, phase_of};
use super::reconciler::Nudge;
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

/// Applies the pool's hook-failure policy to a VM whose create or pre-lease hook failed:
/// QUARANTINE makes it QUARANTINED (lease_id cleared); DELETE_AND_REPLACE (also for an
/// unknown policy or a vanished pool) deletes it through flintlock and removes its row
/// with no DELETING phase. Either way VM_HOOK_FAILED follows. A VM that DeletePool
/// already marked DELETING is left to it, with no event.
pub(crate) async fn hook_failed(engine: &Engine, vm: &VmRecord) {
    let key = PoolKey::of_vm(vm);
    let policy = match engine.store.get_pool(&key) {
        Ok(pool) => pool
            .and_then(|spec| HookFailurePolicy::try_from(spec.hook_failure_policy).ok())
            .unwrap_or(HookFailurePolicy::DeleteAndReplace),
        Err(err) => {
            tracing::warn!(pool = %key, error = %err, "reading the hook-failure policy failed");
            HookFailurePolicy::DeleteAndReplace
        }
    };
    if policy == HookFailurePolicy::Quarantine {
        match engine
            .store
            .transition_vm(&vm.uid, VmPhase::Quarantined, true)
        {
            Ok(Transition::Updated) => {
                tracing::info!(pool = %key, vm = %vm.uid, "hook failed; VM quarantined");
                engine.emit(&key, &vm.uid, EventType::VmHookFailed);
            }
            Ok(Transition::Deleting | Transition::Missing) => {}
            Err(err) => {
                tracing::warn!(pool = %key, vm = %vm.uid, error = %err, "quarantining failed")
            }
        }
        return;
    }
    match engine.store.get_vm(&vm.uid) {
        Ok(Some(row)) if phase_of(&row) != VmPhase::Deleting => {}
        Ok(_) => return,
        Err(err) => {
            tracing::warn!(pool = %key, vm = %vm.uid, error = %err, "hook-failure cleanup: reading the VM failed");
            return;
        }
    }
    let deleted = match engine.hosts.client(&vm.flintlock_host) {
        Ok(client) => client.delete(&vm.uid, DELETE_TIMEOUT).await,
        Err(err) => Err(err),
    };
    if let Err(err) = deleted {
        // battery removes the row regardless; the MicroVM may be left on the host.
        tracing::warn!(pool = %key, vm = %vm.uid, host = %vm.flintlock_host, error = %err, "hook-failure cleanup: deleting the MicroVM failed");
    }
    match engine.store.remove_vm(&vm.uid) {
        Ok(true) => {
            // No nudge: the next tick replaces it, so a hook that always fails costs
            // one VM per tick rather than a tight create/delete loop.
            tracing::info!(pool = %key, vm = %vm.uid, "hook failed; VM deleted for replacement");
            engine.emit(&key, &vm.uid, EventType::VmHookFailed);
        }
        Ok(false) => {}
        Err(err) => {
            tracing::warn!(pool = %key, vm = %vm.uid, error = %err, "hook-failure cleanup: removing the VM failed")
        }
    }
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
