//! Follows battery's event stream: every new event updates the Pool it names (counts,
//! conditions, a blocked deletion finishing) and expires the claim whose MicroVM battery
//! deleted, each with a new resourceVersion so watches see it. battery replays its whole
//! history on each subscription, so events up to the last id applied (kept durably) are
//! skipped, and a resubscription after an error loses nothing.
//!
//! The follower keeps up ("follows") once it has applied an event battery recorded after
//! the subscription began: every event before it, the replay, came first, since battery
//! sends in id order and records in time order. Nothing else tells the replay's end:
//! poolmgrd sends it in batches of 100 with its database reads between them, and then
//! polls for new events every second, so no pause in the stream marks it
//! (`docs/reference/battery-behaviour.md` §4, ADR 37). Until then reads that would trust
//! the follower's records ask battery instead (`ClaimStorage::lease_followed`).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::microvmclaims::ClaimStorage;
use super::pools::PoolStorage;
use crate::battery::{BatteryClient, BatteryError, BatteryEvent, EventKind};
use crate::cluster::Cluster;
use crate::meta_store::{MetaStore, StoreError, Txn};
use crate::metrics::Metrics;

/// Events applied per batch: during a replay, a pool named by many events is re-read
/// once per batch instead of once per event.
const BATCH: usize = 256;
/// How long a batch waits for more events after its first. Binds make one event each;
/// without the wait, every bind would cost a `GetPool` and a durable write of the last
/// event id. Binds waiting for a MicroVM are told of each event as it arrives.
const BATCH_WINDOW: Duration = Duration::from_millis(5);
/// The least time from one batch's apply to the next's: while events keep coming (serial
/// binds, a few milliseconds apart), a batch waits this long, so the Pools' `GetPool` and
/// durable writes, which binds wait behind on battery and on the disk, happen once per
/// this interval, not once per bind. A Pool's counts and an expiry show at most this late.
const APPLY_INTERVAL: Duration = Duration::from_millis(50);
/// Pause before resubscribing after the stream failed.
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(1);
/// MicroVMs whose boot start the follower remembers: those booting now, each forgotten
/// when it is AVAILABLE, fails or goes. Past this, a failed boot is reported as a failed
/// hook even when a Pool change of ours cancelled it.
const BOOTING_REMEMBERED: usize = 100_000;

/// Why following stopped: the stream broke, or the last event id could not be kept.
#[derive(Debug, thiserror::Error)]
enum FollowError {
    #[error(transparent)]
    Battery(#[from] BatteryError),
    #[error("keeping the last battery event applied")]
    Store(#[from] StoreError),
}

pub struct Follower {
    pub battery: BatteryClient,
    pub store: Arc<MetaStore>,
    pub pools: Arc<PoolStorage>,
    pub claims: Arc<ClaimStorage>,
    /// Every new event, for binds waiting for a MicroVM to become available.
    pub events: broadcast::Sender<BatteryEvent>,
    /// Where hook failures are recorded as Events, when there is a cluster.
    pub cluster: Option<Arc<Cluster>>,
    /// Counts the events applied and how far behind battery they are.
    pub metrics: Arc<Metrics>,
}

impl Follower {
    /// Runs until the task is dropped.
    pub async fn run(self) {
        loop {
            match self.battery.events().await {
                Ok(stream) => {
                    let followed = self.follow(stream).await;
                    self.claims.set_following(false);
                    self.metrics.set_following(false);
                    if let Err(err) = followed {
                        tracing::warn!(error = %err, "battery's event stream ended; resubscribing");
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "subscribing to battery's events");
                }
            }
            tokio::time::sleep(RESUBSCRIBE_AFTER).await;
        }
    }

    async fn follow(
        &self,
        stream: impl futures::Stream<Item = Result<BatteryEvent, BatteryError>>,
    ) -> Result<(), FollowError> {
        // Read before the first event can arrive, so no event of the replay is after it.
        // battery runs beside us (its sidecar), on the same clock.
        let subscribed = SystemTime::now();
        futures::pin_mut!(stream);
        let mut last = self.store.last_battery_event_id()?;
        let mut applied_at: Option<Instant> = None;
        let mut booting = HashMap::new();
        while let Some(first) = stream.next().await {
            let first = first?;
            self.announce(&first, last);
            let mut batch = vec![first];
            let window = Instant::now() + BATCH_WINDOW;
            let deadline = applied_at.map_or(window, |at| window.max(at + APPLY_INTERVAL));
            while batch.len() < BATCH {
                match tokio::time::timeout_at(deadline, stream.next()).await {
                    Ok(Some(event)) => {
                        let event = event?;
                        self.announce(&event, last);
                        batch.push(event);
                    }
                    // The window closed, or the stream ended (after this batch).
                    Ok(None) | Err(_) => break,
                }
            }
            let caught_up = batch
                .iter()
                .any(|e| e.created_at.is_some_and(|at| at >= subscribed));
            let fresh: Vec<BatteryEvent> = batch.into_iter().filter(|e| e.id > last).collect();
            if let Some(newest) = fresh.iter().map(|e| e.id).max() {
                applied_at = Some(Instant::now());
                if !self.apply(&fresh, newest, &mut booting).await {
                    self.store
                        .transact(|tx| tx.set_last_battery_event_id(newest))
                        .await?;
                }
                last = newest;
            }
            if caught_up {
                self.claims.set_following(true);
                self.metrics.set_following(true);
            }
        }
        Ok(())
    }

    /// Tells binds waiting for a MicroVM of a new event (after `last`, the last one
    /// applied), before its batch is applied.
    fn announce(&self, event: &BatteryEvent, last: u64) {
        if event.id > last {
            // Nobody waiting is fine.
            let _ = self.events.send(event.clone());
        }
    }

    /// One Event on the Pool per failed hook battery reports: a Warning (reason
    /// `HookFailed`), unless the MicroVM was booting when we changed or deleted the Pool,
    /// so that battery cancelled its boot (reason `BootCancelled`, Normal): that is no
    /// hook of the user's failing.
    async fn report_hook_failed(&self, event: &BatteryEvent, booted: Option<SystemTime>) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let Ok(pool) = self.pools.read(&event.namespace, &event.pool).await else {
            // The pool is gone: there is nothing to attach the Event to.
            return;
        };
        let failed = event.created_at.unwrap_or_else(SystemTime::now);
        let cancelled = booted.is_some_and(|booted| {
            self.pools
                .cancelled_by_us(&event.namespace, &event.pool, booted, failed)
        });
        let (event_type, reason, message) = if cancelled {
            (
                "Normal",
                "BootCancelled",
                format!(
                    "MicroVM {} was still booting when the Pool was changed or deleted; battery \
                     stopped its boot and applied the pool's hook failure policy",
                    event.vm_uid
                ),
            )
        } else {
            (
                "Warning",
                "HookFailed",
                format!(
                    "a hook failed in MicroVM {}; the pool's hook failure policy was applied",
                    event.vm_uid
                ),
            )
        };
        if let Err(err) = cluster
            .pool_event(&pool.metadata, event.id, event_type, reason, message)
            .await
        {
            tracing::warn!(error = %err, event = event.id, reason, "recording a Pool Event");
        }
    }

    /// Applies `events`, the newest of them `newest`; answers whether `newest` was
    /// recorded as the last applied, with the last Pool's write (one commit a batch, not
    /// two, which binds would wait behind).
    async fn apply(
        &self,
        events: &[BatteryEvent],
        newest: u64,
        booting: &mut HashMap<String, SystemTime>,
    ) -> bool {
        let mut pools = BTreeSet::new();
        for event in events {
            self.metrics.record_event(event.created_at);
            if let Err(err) = self.claims.observe(event).await {
                tracing::warn!(error = %err, event = event.id, "applying a battery event to claims");
            }
            pools.insert((event.namespace.clone(), event.pool.clone()));
            match event.kind {
                EventKind::VmProvisioned if booting.len() < BOOTING_REMEMBERED => {
                    let started = event.created_at.unwrap_or_else(SystemTime::now);
                    booting.insert(event.vm_uid.clone(), started);
                }
                EventKind::VmHookFailed => {
                    let booted = booting.remove(&event.vm_uid);
                    self.report_hook_failed(event, booted).await;
                }
                kind if kind == EventKind::VmAvailable || kind.deletes_vm() => {
                    booting.remove(&event.vm_uid);
                }
                _ => {}
            }
        }
        let mut recorded = false;
        let count = pools.len();
        for (i, (namespace, pool)) in pools.into_iter().enumerate() {
            let last = i + 1 == count;
            let mut written = false;
            let also = |tx: &mut Txn| {
                if last {
                    tx.set_last_battery_event_id(newest)?;
                    written = true;
                }
                Ok(())
            };
            match self.pools.observe(&namespace, &pool, also).await {
                // Committed, if the Pool was written.
                Ok(()) => recorded = written,
                Err(err) => {
                    tracing::warn!(error = %err, %namespace, %pool, "re-reading a pool after battery events");
                }
            }
        }
        recorded
    }
}
