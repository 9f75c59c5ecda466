//! The sweeper (§4.4): every `sweep_interval` it retries the deletion of DELETING VMs,
//! expires leases, and warns once per distinct expires_at inside `warning_window`.

use std::collections::HashMap;
use std::sync::Arc;

use battery_proto::poolmgr::v1alpha1::{EventType, LeaseRecord, VmPhase};
use futures::future::join_all;
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
    expire_leases(engine).await;
    warn_expiring(engine, warned);
}

/// Step 1: every DELETING VM is deleted again; the bookkeeping emits the right
/// VM_DELETED_* event if its pool still exists, nothing otherwise.
async fn retry_deletions(engine: &Engine) {
    let vms = match engine.store.vms_in_phase(VmPhase::Deleting) {
        Ok(vms) => vms,
        Err(err) => {
            tracing::warn!(error = %err, "sweeper: listing DELETING VMs failed");
            return;
        }
    };
    join_all(vms.iter().map(|vm| async move {
        if let Err(err) = lifecycle::delete_vm(engine, vm).await {
            tracing::warn!(vm = %vm.uid, host = %vm.flintlock_host, error = %err, "sweeper: VM deletion failed; retrying next sweep");
        }
    }))
    .await;
}

/// Step 2: leases with expires_at <= now lose their row and their VM
/// (VM_DELETED_DUE_TO_EXPIRY).
async fn expire_leases(engine: &Engine) {
    let Some(leases) = all_leases(engine) else {
        return;
    };
    let now = time::now();
    let expired = leases
        .iter()
        .filter(|lease| time::nanos(lease.expires_at.as_ref()) <= time::nanos(Some(&now)));
    join_all(expired.map(|lease| expire(engine, lease, &now))).await;
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

/// Every lease; `None` (logged) when the store cannot list them, and the step waits for
/// the next sweep.
fn all_leases(engine: &Engine) -> Option<Vec<LeaseRecord>> {
    engine
        .store
        .list_leases(None)
        .inspect_err(|err| tracing::warn!(error = %err, "sweeper: listing leases failed"))
        .ok()
}

/// Step 3: VM_EXPIRING_SOON once per distinct expires_at within the warning window.
fn warn_expiring(engine: &Engine, warned: &mut Warnings) {
    let Some(leases) = all_leases(engine) else {
        return;
    };
    let now = time::now();
    let horizon = time::add(&now, engine.config.warning_window);
    for lease in warned.due(&leases, &now, &horizon) {
        engine.emit(
            &PoolKey::of_lease(lease),
            &lease.vm_uid,
            EventType::VmExpiringSoon,
        );
    }
}

/// The in-memory record of the expires_at each lease was warned about (a restart may
/// repeat a warning, as in battery).
#[derive(Default)]
struct Warnings {
    by_lease: HashMap<String, Timestamp>,
}

impl Warnings {
    /// Leases to warn now: expires_at in (now, horizon] and not yet warned at that value.
    /// Forgets leases that are gone.
    fn due<'a>(
        &mut self,
        leases: &'a [LeaseRecord],
        now: &Timestamp,
        horizon: &Timestamp,
    ) -> Vec<&'a LeaseRecord> {
        self.by_lease
            .retain(|id, _| leases.iter().any(|lease| &lease.lease_id == id));
        let (now, horizon) = (time::nanos(Some(now)), time::nanos(Some(horizon)));
        let mut due = Vec::new();
        for lease in leases {
            let Some(expires_at) = lease.expires_at else {
                continue;
            };
            let at = time::nanos(Some(&expires_at));
            if at <= now || at > horizon {
                continue;
            }
            if self.by_lease.get(&lease.lease_id) != Some(&expires_at) {
                self.by_lease.insert(lease.lease_id.clone(), expires_at);
                due.push(lease);
            }
        }
        due
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

    fn at(seconds: i64) -> Timestamp {
        Timestamp { seconds, nanos: 0 }
    }

    fn ids(due: &[&LeaseRecord]) -> Vec<String> {
        due.iter().map(|lease| lease.lease_id.clone()).collect()
    }

    #[test]
    fn warns_once_per_distinct_expiry() {
        let mut warned = Warnings::default();
        let leases = vec![lease("a", 120), lease("b", 200), lease("c", 90)];
        // now = 100, window 30 s: only "a" (120) is inside; "c" already expired.
        assert_eq!(ids(&warned.due(&leases, &at(100), &at(130))), ["a"]);
        assert!(warned.due(&leases, &at(105), &at(135)).is_empty());
        // A heartbeat moves expires_at: warned again once it is inside the window.
        let renewed = vec![lease("a", 150), lease("b", 200)];
        assert!(warned.due(&renewed, &at(110), &at(140)).is_empty());
        assert_eq!(ids(&warned.due(&renewed, &at(121), &at(151))), ["a"]);
        // Gone leases are forgotten.
        assert!(warned.due(&[], &at(121), &at(151)).is_empty());
        assert!(warned.by_lease.is_empty());
    }
}
