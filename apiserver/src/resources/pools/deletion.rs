//! Deleting a Pool. battery's DeletePool first cancels the Pool's MicroVMs still booting
//! and waits for their cleanup, and cut short it starts the Pool's reconciler again
//! (`docs/reference/battery-behaviour.md` §7): it can outlast a request, and must not be
//! cut. So the call runs in a task of its own, one per Pool, with battery's deadline
//! ([`crate::battery::DELETE_POOL_TIMEOUT`]); a request waits for it a while, and if it
//! has not ended, answers that the Pool is being deleted, and the task finishes the
//! deletion when battery does. While MicroVMs of the Pool are leased battery refuses, and
//! the Pool drains instead (DESIGN §4) until its last lease goes.

use std::sync::Arc;
use std::time::Duration;

use battery_api_machinery::status::ApiError;
use battery_types::Pool;
use futures::FutureExt as _;

use super::record::{Kept, PoolRecord, info, key, shared_error};
use super::storage::{Deletion, PoolStorage};
use crate::api::Deleted;
use crate::battery::objects::{self, PoolMeta};
use crate::battery::{BatteryError, Failure, Rpc};
use crate::clock::server_now;
use crate::watch::ChangeType;

/// How long a delete request waits for battery's DeletePool before it answers that the
/// Pool is being deleted: well inside kube-apiserver's 60 s.
const DELETE_WAIT: Duration = Duration::from_secs(20);

impl PoolStorage {
    /// battery's DeletePool of the Pool, started now or joined if one runs. When battery
    /// has deleted it, the task removes the Pool's record too (through `observe`), so a
    /// deletion no request waited for still finishes.
    pub(super) fn battery_delete(&self, namespace: &str, name: &str) -> Deletion {
        let key = key(namespace, name);
        let mut running = self.deletions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(deletion) = running.get(&key) {
            return deletion.clone();
        }
        let started = self.respecified.sending(namespace, name);
        let battery = self.battery.clone();
        let this = self.this.clone();
        let (task_key, namespace, name) = (key.clone(), namespace.to_owned(), name.to_owned());
        let task = tokio::spawn(async move {
            let result = battery
                .delete_pool(&namespace, &name)
                .await
                .map_err(Arc::new);
            let Some(this) = this.upgrade() else {
                return result;
            };
            this.respecified.answered(&namespace, &name, started);
            this.deletions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&task_key);
            let gone = match &result {
                Ok(()) => true,
                Err(err) => err.failure() == Failure::NotFound,
            };
            if gone && let Err(err) = this.observe(&namespace, &name, |_| Ok(())).await {
                tracing::warn!(error = %err, %namespace, %name, "recording a deleted pool");
            }
            result
        });
        let deletion = task
            .map(|joined| {
                joined.unwrap_or_else(|_| Err(Arc::new(BatteryError::interrupted(Rpc::DeletePool))))
            })
            .boxed()
            .shared();
        running.insert(key, deletion.clone());
        deletion
    }

    /// `Storage::delete`: the Pool goes when battery has deleted it; it is marked deleting
    /// while battery takes longer than a request, or refuses because MicroVMs of it are
    /// leased.
    pub(super) async fn delete_pool(&self, mut pool: Pool) -> Result<Deleted<Pool>, ApiError> {
        let namespace = pool.metadata.namespace.clone().unwrap_or_default();
        let name = pool.metadata.name.clone().unwrap_or_default();
        let deletion = self.battery_delete(&namespace, &name);
        let answered = tokio::time::timeout(DELETE_WAIT, deletion).await;
        let _guard = self.locks.lock(&key(&namespace, &name)).await;
        match answered {
            Ok(Ok(())) => {}
            Ok(Err(err)) if err.failure() == Failure::NotFound => {}
            Ok(Err(err)) if err.failure() == Failure::PoolHasLeases => {
                return self.drain(pool).await;
            }
            // battery may have deleted it without our hearing: ask before answering.
            Ok(Err(err)) if !err.is_definitive() => {
                match self.battery.pool(&namespace, &name).await {
                    Err(gone) if gone.failure() == Failure::NotFound => {}
                    _ => return Err(shared_error(&err, &name)),
                }
            }
            Ok(Err(err)) => return Err(shared_error(&err, &name)),
            // Still cancelling the Pool's boots: it goes when battery is done (above).
            Err(_) => {
                let current = self
                    .battery
                    .pool(&namespace, &name)
                    .await
                    .map_err(|e| e.into_api_error(info(), &name))?;
                return self.mark_deleting(pool, current).await;
            }
        }
        crate::failpoint::crash_point("pool-delete:deleted");
        // The task's `observe` may have recorded it gone already: nothing then to write.
        if self
            .store
            .get::<PoolRecord>(&key(&namespace, &name))?
            .is_some()
        {
            self.commit(&mut pool, ChangeType::Deleted, Kept::default())
                .await?;
        }
        pool.status = None;
        Ok(Deleted::Gone(pool))
    }

    /// MicroVMs of the Pool are still leased: battery refuses until they go. Stop it
    /// provisioning (size 0, unless it already is), mark the Pool, and finish when the
    /// last one is released or expires (`observe`).
    async fn drain(&self, pool: Pool) -> Result<Deleted<Pool>, ApiError> {
        let namespace = pool.metadata.namespace.clone().unwrap_or_default();
        let name = pool.metadata.name.clone().unwrap_or_default();
        let mut drained = pool.spec.clone();
        drained.size = Some(0);
        let hosts = self.resolve_hosts(&pool.spec).await?;
        let draining = self
            .respecify(&namespace, &name, &drained, hosts)
            .await
            .map_err(|e| shared_error(&e, &name))?;
        self.mark_deleting(pool, draining).await
    }

    /// Records the Pool as being deleted, as battery now holds it.
    async fn mark_deleting(
        &self,
        mut pool: Pool,
        battery_pool: crate::battery::BatteryPool,
    ) -> Result<Deleted<Pool>, ApiError> {
        if pool.metadata.deletion_timestamp.is_none() {
            pool.metadata.deletion_timestamp = Some(server_now());
            pool.metadata.deletion_grace_period_seconds = Some(0);
        }
        let previous = pool.status.take().map(|s| s.conditions).unwrap_or_default();
        let meta = PoolMeta {
            metadata: pool.metadata,
            placement: pool.spec.placement,
            claim_limits: pool.spec.claim_limits,
            service_account_token: pool.spec.service_account_token,
            previous: &previous,
            rejected: None,
        };
        let mut pool = objects::pool(meta, battery_pool);
        self.commit(&mut pool, ChangeType::Modified, Kept::default())
            .await?;
        Ok(Deleted::Pending(pool))
    }
}
