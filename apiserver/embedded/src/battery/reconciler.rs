//! One reconciler task per pool (§4.2): it tops the pool up at start, every
//! `reconcile_interval`, and on claim or delete nudges as its strategy reacts. Like
//! poolmgrd's, a pass waits for every provision it started; stopping a reconciler
//! (UpdatePool, DeletePool, shutdown) cancels those still in flight, which then fail
//! through the hook-failure policy of the spec the reconciler was started with.

use std::sync::Arc;

use battery_proto::poolmgr::v1alpha1::{PoolSpec, ReplenishmentStrategyType};
use futures::future::join_all;
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::engine::Engine;
use super::model::{PoolKey, VmCounts, has_static_network};
use super::provision::{self, ProvisionError};
use super::reconcilers::Nudge;

fn strategy(spec: &PoolSpec) -> ReplenishmentStrategyType {
    spec.replenishment_strategy
        .and_then(|s| ReplenishmentStrategyType::try_from(s.r#type).ok())
        .unwrap_or(ReplenishmentStrategyType::Unspecified)
}

/// IMMEDIATE_ON_LEASE reacts to claims and REPLACE_ON_DELETE to deletions;
/// MIN_SIZE_THRESHOLD only to its ticks.
fn reacts_to(strategy: ReplenishmentStrategyType, nudge: Nudge) -> bool {
    matches!(
        (strategy, nudge),
        (ReplenishmentStrategyType::ImmediateOnLease, Nudge::Claimed)
            | (ReplenishmentStrategyType::ReplaceOnDelete, Nudge::Deleted)
    )
}

/// How many VMs a pass provisions (§4.2's formulas; quarantined VMs never count).
/// A static-network template gets at most one VM, and only while the pool has no VM row.
pub(crate) fn shortfall(spec: &PoolSpec, counts: &VmCounts) -> usize {
    let size = i64::from(spec.size);
    let [available, claiming, leased, provisioning] = [
        counts.available,
        counts.claiming,
        counts.leased,
        counts.provisioning,
    ]
    .map(i64::from);
    let missing = match strategy(spec) {
        ReplenishmentStrategyType::ImmediateOnLease => size - (available + claiming + provisioning),
        ReplenishmentStrategyType::MinSizeThreshold => {
            let min_size = spec
                .replenishment_strategy
                .and_then(|s| s.min_size)
                .map_or(0, i64::from);
            if available < min_size {
                size - (available + claiming + leased + provisioning)
            } else {
                0
            }
        }
        ReplenishmentStrategyType::ReplaceOnDelete => {
            size - (available + claiming + leased + provisioning)
        }
        ReplenishmentStrategyType::Unspecified => 0,
    };
    let missing = usize::try_from(missing).unwrap_or(0);
    let is_static = spec
        .microvm_template
        .as_ref()
        .is_some_and(has_static_network);
    if is_static {
        if counts.rows == 0 { missing.min(1) } else { 0 }
    } else {
        missing
    }
}

/// Starts the pool's reconciler with `spec`, stopping a running one without waiting for
/// it (poolmgrd's UpdatePool): its provisions in flight are cancelled.
pub(crate) fn start(engine: &Arc<Engine>, spec: PoolSpec) {
    let key = PoolKey::of_spec(&spec);
    let for_task = Arc::clone(engine);
    engine
        .reconcilers
        .start(key, engine.shutdown_token(), move |stop, inbox| {
            run(for_task, Arc::new(spec), stop, inbox)
        });
}

async fn run(
    engine: Arc<Engine>,
    spec: Arc<PoolSpec>,
    stop: CancellationToken,
    mut nudges: mpsc::Receiver<Nudge>,
) {
    let strategy = strategy(&spec);
    // The first tick is immediate: the pass at start.
    let mut ticker = tokio::time::interval(engine.config.reconcile_interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            _ = ticker.tick() => {}
            Some(nudge) = nudges.recv() => {
                if !reacts_to(strategy, nudge) {
                    continue;
                }
            }
        }
        pass(&engine, &spec, &stop).await;
    }
}

/// One pass: count, then provision the shortfall concurrently and wait until every one
/// of them is AVAILABLE or failed (§4.2). Ticks and nudges wait meanwhile; a failed
/// provision is retried by a later pass, with no backoff.
async fn pass(engine: &Arc<Engine>, spec: &Arc<PoolSpec>, stop: &CancellationToken) {
    let key = PoolKey::of_spec(spec);
    let counts = match engine.store.pool_counts(&key) {
        Ok(counts) => counts,
        Err(err) => {
            tracing::warn!(pool = %key, error = %err, "reconcile: counting VMs failed");
            return;
        }
    };
    let missing = shortfall(spec, &counts);
    if missing == 0 {
        return;
    }
    tracing::debug!(pool = %key, missing, "reconcile: provisioning");
    let results = join_all((0..missing).map(|_| provision::provision(engine, spec, stop))).await;
    for err in results.into_iter().filter_map(Result::err) {
        if matches!(err, ProvisionError::Cancelled) {
            tracing::debug!(pool = %key, "provision cancelled before its VM had a row");
        } else {
            tracing::warn!(pool = %key, error = %err, "provision failed; retrying next tick");
        }
    }
}

#[cfg(test)]
mod tests {
    use battery_proto::flintlock::types::{MicroVmSpec, NetworkInterface};
    use battery_proto::poolmgr::v1alpha1::ReplenishmentStrategy;

    use super::*;

    fn spec(kind: ReplenishmentStrategyType, size: i32, min_size: Option<i32>) -> PoolSpec {
        PoolSpec {
            size,
            replenishment_strategy: Some(ReplenishmentStrategy {
                r#type: kind as i32,
                min_size,
            }),
            microvm_template: Some(MicroVmSpec::default()),
            ..PoolSpec::default()
        }
    }

    fn counts(
        available: i32,
        claiming: i32,
        leased: i32,
        provisioning: i32,
        quarantined: i32,
    ) -> VmCounts {
        VmCounts {
            available,
            claiming,
            leased,
            provisioning,
            quarantined,
            rows: available + claiming + leased + provisioning + quarantined,
        }
    }

    #[test]
    fn immediate_on_lease_keeps_size_warm_and_grows_with_leases() {
        let s = spec(ReplenishmentStrategyType::ImmediateOnLease, 3, None);
        assert_eq!(shortfall(&s, &counts(0, 0, 0, 0, 0)), 3);
        assert_eq!(shortfall(&s, &counts(1, 1, 5, 0, 0)), 1);
        assert_eq!(shortfall(&s, &counts(1, 0, 0, 2, 4)), 0);
        assert_eq!(shortfall(&s, &counts(4, 0, 0, 0, 0)), 0);
    }

    #[test]
    fn min_size_threshold_refills_to_size_below_min() {
        let s = spec(ReplenishmentStrategyType::MinSizeThreshold, 5, Some(2));
        assert_eq!(shortfall(&s, &counts(2, 0, 0, 0, 0)), 0);
        assert_eq!(shortfall(&s, &counts(1, 0, 2, 0, 0)), 2);
        assert_eq!(shortfall(&s, &counts(1, 1, 2, 1, 3)), 0);
        assert_eq!(shortfall(&s, &counts(0, 0, 0, 0, 9)), 5);
    }

    #[test]
    fn replace_on_delete_keeps_the_total() {
        let s = spec(ReplenishmentStrategyType::ReplaceOnDelete, 3, None);
        assert_eq!(shortfall(&s, &counts(0, 0, 2, 0, 0)), 1);
        assert_eq!(shortfall(&s, &counts(1, 1, 1, 0, 0)), 0);
        assert_eq!(shortfall(&s, &counts(0, 0, 0, 0, 2)), 3);
    }

    #[test]
    fn zero_or_negative_size_provisions_nothing() {
        let s = spec(ReplenishmentStrategyType::ReplaceOnDelete, 0, None);
        assert_eq!(shortfall(&s, &counts(0, 0, 0, 0, 0)), 0);
        let s = spec(ReplenishmentStrategyType::ImmediateOnLease, -2, None);
        assert_eq!(shortfall(&s, &counts(0, 0, 0, 0, 0)), 0);
    }

    #[test]
    fn static_templates_get_one_vm_only_when_the_pool_has_no_row() {
        let mut s = spec(ReplenishmentStrategyType::ReplaceOnDelete, 1, None);
        if let Some(template) = s.microvm_template.as_mut() {
            template.interfaces.push(NetworkInterface {
                guest_mac: Some("02:00:00:00:00:01".into()),
                ..NetworkInterface::default()
            });
        }
        assert_eq!(shortfall(&s, &counts(0, 0, 0, 0, 0)), 1);
        // A quarantined (or any other) row blocks a replacement.
        assert_eq!(shortfall(&s, &counts(0, 0, 0, 0, 1)), 0);
        let deleting = VmCounts {
            rows: 1,
            ..VmCounts::default()
        };
        assert_eq!(shortfall(&s, &deleting), 0);
    }

    #[test]
    fn nudges_match_strategies() {
        use ReplenishmentStrategyType::*;
        assert!(reacts_to(ImmediateOnLease, Nudge::Claimed));
        assert!(!reacts_to(ImmediateOnLease, Nudge::Deleted));
        assert!(reacts_to(ReplaceOnDelete, Nudge::Deleted));
        assert!(!reacts_to(ReplaceOnDelete, Nudge::Claimed));
        assert!(!reacts_to(MinSizeThreshold, Nudge::Claimed));
        assert!(!reacts_to(MinSizeThreshold, Nudge::Deleted));
    }
}
