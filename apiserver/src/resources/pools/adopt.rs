//! Following battery's Pools: adopting those another client made, and placing every
//! Pool again when the Hosts change.

use battery_api_machinery::status::ApiError;
use tokio::sync::OwnedMutexGuard;

use super::record::{Kept, PoolRecord, info, key, shared_error};
use super::storage::{PoolStorage, counts};
use crate::battery::BatteryPool;
use crate::watch::ChangeType;

impl PoolStorage {
    /// Records every Pool battery has that we have no record of, so each gets its
    /// metadata (uid, creationTimestamp, resourceVersion) once.
    pub async fn adopt_all(&self) -> Result<(), ApiError> {
        for pool in self.every_pool().await? {
            // Pools that battery reports no event for still get their gauges.
            self.metrics
                .set_pool_counts(&pool.namespace, &pool.name, counts(&pool.counts));
            // Read under the lock: a create in flight records the Pool itself.
            let (_guard, record) = self.lock_record(&pool).await?;
            if record.is_none() {
                self.observe_locked(&pool.namespace, &pool.name, None, |_| Ok(()))
                    .await?;
            }
        }
        Ok(())
    }

    /// Every Pool battery has: what adopting and re-resolving go through.
    async fn every_pool(&self) -> Result<Vec<BatteryPool>, ApiError> {
        self.battery
            .pools(None)
            .await
            .map_err(|e| e.into_api_error(info(), ""))
    }

    /// Takes `pool`'s lock and reads its record under it.
    async fn lock_record(
        &self,
        pool: &BatteryPool,
    ) -> Result<(OwnedMutexGuard<()>, Option<PoolRecord>), ApiError> {
        let key = key(&pool.namespace, &pool.name);
        let guard = self.locks.lock(&key).await;
        let record = self.store.get::<PoolRecord>(&key)?;
        Ok((guard, record))
    }

    /// Re-resolves every Pool's `placement.nodeSelector` after a Host was added, changed
    /// or removed, and tells battery where the Pools whose Hosts changed may now run.
    pub async fn reresolve_all(&self) -> Result<(), ApiError> {
        for pool in self.every_pool().await? {
            let (_guard, record) = self.lock_record(&pool).await?;
            let was_rejected = record.as_ref().is_some_and(|r| r.rejected.is_some());
            // The spec the Pool shows: one on its way to battery goes with the new Hosts.
            let spec = self.assemble(record.clone(), pool.clone()).spec;
            let hosts = self.resolve_hosts(&spec).await?;
            if hosts == pool.hosts && !was_rejected {
                continue;
            }
            // battery may refuse the new placement (a static address on several Hosts);
            // the Pool then says so in its Ready condition until a Host change fixes it.
            let rejected = match self
                .respecify(&pool.namespace, &pool.name, &spec, hosts)
                .await
            {
                Ok(_) => None,
                Err(err) => match err.refusal() {
                    Some(message) => Some(message.to_owned()),
                    None => return Err(shared_error(&err, &pool.name)),
                },
            };
            let current = self
                .battery
                .pool(&pool.namespace, &pool.name)
                .await
                .map_err(|e| e.into_api_error(info(), &pool.name))?;
            let mut record =
                record.unwrap_or_else(|| PoolRecord::adopted(&pool.namespace, &pool.name));
            record.rejected = rejected.clone();
            let kept = Kept {
                rejected,
                pending: record.pending.clone(),
            };
            let mut object = self.assemble(Some(record), current);
            self.commit(&mut object, ChangeType::Modified, kept).await?;
        }
        Ok(())
    }
}
