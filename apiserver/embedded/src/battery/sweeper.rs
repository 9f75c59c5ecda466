//! The sweeper (§4.4): every `sweep_interval` it retries the deletion of DELETING VMs,
//! then, in expires_at order, expires leases and warns once per distinct expires_at
//! inside `warning_window`, one at a time as poolmgrd's does.

use std::collections::HashMap;
use std::sync::Arc;

use battery_proto::poolmgr::v1alpha1::{EventType, LeaseRecord, VmPhase};
use prost_types::Timestamp;
use tokio::time::MissedTickBehavior;

use super::engine::Engine;
use super::lifecycle;
use super::model::PoolKey;
use super::time;

/// Runs until shutdown.
pub(crate) async fn run(engine: Arc<Engine>) {
    let period = engine.config.sweep_interval;
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut warned = Warnings::default();
    let shutdown = engine.shutdown_token().clone();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        sweep(&engine, &mut warned).await;
    }
}

async fn sweep(engine: &Engine, warned: &mut Warnings) {
    retry_deletions(engine).await;
    expire_and_warn(engine, warned).await;
}

/// Step 1: every DELETING VM is deleted again, one after another; the bookkeeping emits
/// the right VM_DELETED_* event if its pool still exists, nothing otherwise.
async fn retry_deletions(engine: &Engine) {
    let vms = match engine.store.vms_in_phase(VmPhase::Deleting) {
        Ok(vms) => vms,
        Err(err) => {
            tracing::warn!(error = %err, "sweeper: listing DELETING VMs failed");
            return;
        }
    };
    for vm in &vms {
        if let Err(err) = lifecycle::delete_vm(engine, vm).await {
            tracing::warn!(vm = %vm.uid, host = %vm.flintlock_host, error = %err, "sweeper: VM deletion failed; retrying next sweep");
        }
    }
}

/// Step 2: the leases expiring within `warning_window`, in expires_at order, as
/// poolmgrd's one query returns them: one past its expiry loses its row and its VM
/// (VM_DELETED_DUE_TO_EXPIRY); the others get VM_EXPIRING_SOON once per distinct
/// expires_at.
async fn expire_and_warn(engine: &Engine, warned: &mut Warnings) {
    let mut leases = match engine.store.list_leases(None) {
        Ok(leases) => leases,
        Err(err) => {
            tracing::warn!(error = %err, "sweeper: listing leases failed");
            return;
        }
    };
    let now = time::now();
    let horizon = time::nanos(Some(&time::add(&now, engine.config.warning_window)));
    leases.retain(|lease| time::nanos(lease.expires_at.as_ref()) <= horizon);
    leases.sort_by_key(|lease| time::nanos(lease.expires_at.as_ref()));
    warned.keep_only(&leases);
    for lease in &leases {
        if time::nanos(lease.expires_at.as_ref()) <= time::nanos(Some(&now)) {
            expire(engine, lease, &now).await;
            warned.forget(lease);
        } else if warned.first_for(lease) {
            warn_expiring(engine, lease);
        }
    }
}

async fn expire(engine: &Engine, lease: &LeaseRecord, now: &Timestamp) {
    let key = PoolKey::of_lease(lease);
    let vm = match engine.store.expire_lease(&lease.lease_id, now) {
        Ok(Some(vm)) => vm,
        Ok(None) => return,
        Err(err) => {
            tracing::warn!(pool = %key, vm = %lease.vm_uid, error = %err, "sweeper: expiring a lease failed");
            return;
        }
    };
    tracing::info!(pool = %key, vm = %vm.uid, "lease expired");
    if let Err(err) = lifecycle::delete_vm(engine, &vm).await {
        tracing::warn!(pool = %key, vm = %vm.uid, error = %err, "sweeper: deleting an expired VM failed; retrying next sweep");
    }
}

/// VM_EXPIRING_SOON, only while the lease's pool exists (poolmgrd reads it first).
fn warn_expiring(engine: &Engine, lease: &LeaseRecord) {
    let key = PoolKey::of_lease(lease);
    match engine.store.get_pool(&key) {
        Ok(Some(_)) => engine.emit(&key, &lease.vm_uid, EventType::VmExpiringSoon),
        Ok(None) => {}
        Err(err) => {
            tracing::warn!(pool = %key, error = %err, "sweeper: reading a lease's pool failed")
        }
    }
}

/// The in-memory record of the expires_at each lease was warned about (a restart may
/// repeat a warning, as in battery).
#[derive(Default)]
struct Warnings {
    by_lease: HashMap<String, Timestamp>,
}

impl Warnings {
    /// Forgets the leases this sweep no longer lists.
    fn keep_only(&mut self, leases: &[LeaseRecord]) {
        self.by_lease
            .retain(|id, _| leases.iter().any(|lease| &lease.lease_id == id));
    }

    fn forget(&mut self, lease: &LeaseRecord) {
        self.by_lease.remove(&lease.lease_id);
    }

    /// True the first time `lease` is seen with its current expires_at (which a
    /// heartbeat moves, re-arming the warning).
    fn first_for(&mut self, lease: &LeaseRecord) -> bool {
        let Some(expires_at) = lease.expires_at else {
            return false;
        };
        self.by_lease.insert(lease.lease_id.clone(), expires_at) != Some(expires_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(id: &str, expires: i64) -> LeaseRecord {
        LeaseRecord {
            lease_id: id.into(),
            expires_at: Some(Timestamp {
                seconds: expires,
                nanos: 0,
            }),
            ..LeaseRecord::default()
        }
    }

    #[test]
    fn warns_once_per_distinct_expiry() {
        let mut warned = Warnings::default();
        let a = lease("a", 120);
        assert!(warned.first_for(&a));
        assert!(!warned.first_for(&a));
        // A heartbeat moves expires_at: warned again.
        let renewed = lease("a", 150);
        assert!(warned.first_for(&renewed));
        assert!(!warned.first_for(&renewed));
        // Leases no longer listed are forgotten, and so warned again if they come back.
        warned.keep_only(&[lease("b", 200)]);
        assert!(warned.by_lease.is_empty());
        assert!(warned.first_for(&renewed));
        warned.forget(&renewed);
        assert!(warned.by_lease.is_empty());
    }
}
