//! Changing a Pool. Its record is written first, with the new spec pending, so the next
//! change is checked against it at once; then battery is told, together with the changes
//! that arrive meanwhile (`respec`), and the record settles on battery's answer: the new
//! spec, or the old one if battery refused it.

use std::sync::Arc;

use battery_api_machinery::status::ApiError;
use battery_types::{Pool, PoolSpec};

use super::record::{Kept, Pending, PoolRecord, Respec, info, key, shared_error};
use super::storage::PoolStorage;
use crate::battery::objects::{self, PoolMeta};
use crate::battery::{BatteryError, BatteryPool, Rpc};
use crate::resources::check_resource_version;
use crate::watch::ChangeType;

/// What the first half of an update wrote.
pub(super) enum Written {
    /// A change battery holds nothing of (labels, placement to the same Hosts, claim
    /// limits, the claims' token): done.
    Recorded(Pool),
    /// A spec or Hosts to tell battery.
    ToTell { pool: Pool, hosts: Vec<String> },
}

impl PoolStorage {
    /// The first half of an update, under the Pool's lock: checks the resourceVersion
    /// against the record and writes the change, its spec pending if battery is to be
    /// told.
    pub(super) async fn write_update(&self, new: Pool) -> Result<Written, ApiError> {
        let namespace = new.metadata.namespace.clone().unwrap_or_default();
        let name = new.metadata.name.clone().unwrap_or_default();
        // One read of battery serves both the existence check and the change check.
        let mut battery_now = self
            .battery
            .pool(&namespace, &name)
            .await
            .map_err(|e| e.into_api_error(info(), &name))?;
        let record = self
            .store
            .get::<PoolRecord>(&key(&namespace, &name))?
            .unwrap_or_else(|| PoolRecord::adopted(&namespace, &name));
        check_resource_version(info(), &record.metadata, &new.metadata)?;
        let hosts = self.resolve_hosts(&new.spec).await?;
        let mut wanted = new.spec.clone();
        wanted.placement = None;
        wanted.claim_limits = None;
        wanted.service_account_token = None;
        // A change still pending may differ from this one: battery is told this one after.
        let unchanged =
            record.pending.is_none() && battery_now.spec == wanted && battery_now.hosts == hosts;
        let pending = (!unchanged).then(|| Pending {
            spec: wanted,
            generation: new.metadata.generation.unwrap_or_default(),
        });
        if let Some(pending) = &pending {
            battery_now.spec = pending.spec.clone();
        }
        let meta = PoolMeta {
            metadata: new.metadata,
            placement: new.spec.placement,
            claim_limits: new.spec.claim_limits,
            service_account_token: new.spec.service_account_token,
            previous: &record.conditions,
            rejected: None,
        };
        let mut pool = objects::pool(meta, battery_now);
        let kept = Kept {
            rejected: None,
            pending: pending.clone(),
        };
        self.commit(&mut pool, ChangeType::Modified, kept).await?;
        Ok(match pending {
            None => Written::Recorded(pool),
            Some(_) => Written::ToTell { pool, hosts },
        })
    }

    /// The second half of an update, once battery answered the call that carried it:
    /// the record loses the pending spec, unless a later change's replaced it, and shows
    /// what battery holds.
    pub(super) async fn settle_update(
        &self,
        written: Pool,
        told: Result<BatteryPool, Arc<BatteryError>>,
    ) -> Result<Pool, ApiError> {
        let namespace = written.metadata.namespace.clone().unwrap_or_default();
        let name = written.metadata.name.clone().unwrap_or_default();
        let key = key(&namespace, &name);
        let generation = written.metadata.generation.unwrap_or_default();
        let _guard = self.locks.lock(&key).await;
        let record = self.store.get::<PoolRecord>(&key)?.filter(|r| {
            r.pending
                .as_ref()
                .is_some_and(|p| p.generation == generation)
        });
        let Some(mut record) = record else {
            // A later change (or the Pool's deletion) is on its way: answered as written.
            return told.map(|_| written).map_err(|e| shared_error(&e, &name));
        };
        record.pending = None;
        let now = match &told {
            Ok(pool) => pool.clone(),
            // battery keeps the spec it had, and so does the Pool.
            Err(_) => self
                .battery
                .pool(&namespace, &name)
                .await
                .map_err(|e| e.into_api_error(info(), &name))?,
        };
        let kept = Kept {
            rejected: record.rejected.clone(),
            pending: None,
        };
        let mut settled = self.assemble(Some(record), now);
        self.commit(&mut settled, ChangeType::Modified, kept)
            .await?;
        told.map(|_| settled).map_err(|e| shared_error(&e, &name))
    }

    /// Tells battery the Pool's new spec and Hosts, with the other changes to the Pool
    /// that arrive while an UpdatePool of it is in flight (`respec`). The change is
    /// queued when this is called, so under the Pool's lock it is queued under it.
    pub(super) fn respecify(
        &self,
        namespace: &str,
        name: &str,
        spec: &PoolSpec,
        hosts: Vec<String>,
    ) -> impl Future<Output = Result<BatteryPool, Arc<BatteryError>>> + use<> {
        let this = self.this.clone();
        let change = Respec {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            spec: spec.clone(),
            hosts,
        };
        self.respecs
            .submit(key(namespace, name), change, move |change| {
                let this = this.clone();
                async move {
                    match this.upgrade() {
                        Some(this) => this.update_in_battery(change).await,
                        None => Err(BatteryError::interrupted(Rpc::UpdatePool)),
                    }
                }
            })
    }

    /// Tells battery the Pool's new spec and Hosts, unless it holds them already:
    /// UpdatePool restarts the Pool's reconciler, which cancels the Pool's MicroVMs still
    /// booting, so it is called only for a real change.
    async fn update_in_battery(&self, change: Respec) -> Result<BatteryPool, BatteryError> {
        let Respec {
            namespace,
            name,
            spec,
            hosts,
        } = change;
        let current = self.battery.pool(&namespace, &name).await?;
        let mut wanted = spec.clone();
        wanted.placement = None;
        wanted.claim_limits = None;
        wanted.service_account_token = None;
        if current.spec == wanted && current.hosts == hosts {
            return Ok(current);
        }
        let started = self.respecified.sending(&namespace, &name);
        let updated = self
            .battery
            .update_pool(&namespace, &name, &spec, hosts)
            .await;
        self.respecified.answered(&namespace, &name, started);
        updated
    }
}
