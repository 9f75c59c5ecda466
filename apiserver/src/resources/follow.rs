//! Follows battery's event stream: every new event updates the Pool it names (counts,
//! conditions, a blocked deletion finishing) and expires the claim whose MicroVM battery
//! deleted, each with a new resourceVersion so watches see it. battery replays its whole
//! history on each subscription, so events up to the last id applied (kept durably) are
//! skipped, and a resubscription after an error loses nothing.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

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
        futures::pin_mut!(stream);
        let mut last = self.store.last_battery_event_id()?;
        let mut applied_at: Option<Instant> = None;
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
            // A batch the window closed holds all battery had sent: the replay is done.
            let caught_up = batch.len() < BATCH;
            let fresh: Vec<BatteryEvent> = batch.into_iter().filter(|e| e.id > last).collect();
            if let Some(newest) = fresh.iter().map(|e| e.id).max() {
                applied_at = Some(Instant::now());
                if !self.apply(&fresh, newest).await {
                    self.store
                        .transact(|tx| tx.set_last_battery_event_id(newest))
                        .await?;
                }
                last = newest;
            }
            if caught_up {
                self.claims.set_following(true);
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

    /// One Warning Event (reason `HookFailed`) on the Pool per battery event id.
    async fn warn_hook_failed(&self, event: &BatteryEvent) {
        let Some(cluster) = &self.cluster else {
            return;
        };
        let Ok(pool) = self.pools.read(&event.namespace, &event.pool).await else {
            // The pool is gone: there is nothing to attach the Event to.
            return;
        };
        let message = format!(
            "a hook failed in MicroVM {}; the pool's hook failure policy was applied",
            event.vm_uid
        );
        if let Err(err) = cluster
            .warn_pool(&pool.metadata, event.id, "HookFailed", message)
            .await
        {
            tracing::warn!(error = %err, event = event.id, "recording a HookFailed Event");
        }
    }

    /// Applies `events`, the newest of them `newest`; answers whether `newest` was
    /// recorded as the last applied, with the last Pool's write (one commit a batch, not
    /// two, which binds would wait behind).
    async fn apply(&self, events: &[BatteryEvent], newest: u64) -> bool {
        let mut pools = BTreeSet::new();
        for event in events {
            self.metrics.record_event(event.created_at);
            if let Err(err) = self.claims.observe(event).await {
                tracing::warn!(error = %err, event = event.id, "applying a battery event to claims");
            }
            pools.insert((event.namespace.clone(), event.pool.clone()));
            if event.kind == EventKind::VmHookFailed {
                self.warn_hook_failed(event).await;
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
