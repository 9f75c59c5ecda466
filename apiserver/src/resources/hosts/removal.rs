//! A Host's graceful deletion, in the order battery requires (`reference/battery-api.md`
//! §4.8: cordon, drop it from each pool spec, wait for `vm_count` to reach 0, remove).
//! The delete is accepted at once: the Host is cordoned, marked with a
//! deletionTimestamp, and matches no Pool's selector from then on, so re-resolution
//! takes it out of every Pool's placement. Each `sync` then moves it on: while MicroVMs
//! remain, its idle ones are retired (ADR 0009) and its `Draining` condition says how
//! many remain and which claims hold them; at `vm_count` 0 it is removed from battery
//! and its record goes (a DELETED watch event). The state lives in the Host's record,
//! so a restart of this server resumes where it stopped.

use battery_api_machinery::status::ApiError;
use battery_types::Host;

use super::leaving::{Leaving, PoolName, claims_on};
use super::record::{HostRecord, Observed, info, key};
use super::storage::HostStorage;
use crate::api::Deleted;
use crate::battery::{BatteryClient, BatteryHost, Failure, LeaseId};
use crate::clock::server_now;
use crate::watch::ChangeType;

impl HostStorage {
    /// Accepts the deletion of `host`: cordons it and marks it. A Host no Pool places on
    /// and with no MicroVM is removed at once.
    pub(super) async fn begin_deletion(&self, mut host: Host) -> Result<Deleted<Host>, ApiError> {
        let name = host.metadata.name.clone().unwrap_or_default();
        let _guard = self.locks.lock(&key(&name)).await;
        if self.leaving(&name)?.is_some() {
            let record = self.store().get::<HostRecord>(&key(&name))?;
            let current = self
                .battery()
                .host(&name)
                .await
                .map_err(|e| e.into_api_error(info(), &name))?;
            return Ok(Deleted::Pending(self.assemble(record, current)?));
        }
        let pools: Vec<PoolName> = self
            .battery()
            .pools(None)
            .await
            .map_err(|e| e.into_api_error(info(), &name))?
            .into_iter()
            .filter(|p| p.hosts.contains(&name))
            .map(|p| PoolName {
                namespace: p.namespace,
                name: p.name,
            })
            .collect();
        let vm_count = host.status.as_ref().map_or(0, |s| s.vm_count);
        if pools.is_empty() && vm_count == 0 && self.remove(&name).await?.is_none() {
            self.commit(&mut host, ChangeType::Deleted, None).await?;
            self.directory.changed.notify_one();
            return Ok(Deleted::Gone(host));
        }
        self.battery()
            .cordon_host(&name, "the Host is being deleted")
            .await
            .map_err(|e| e.into_api_error(info(), &name))?;
        let current = self
            .battery()
            .host(&name)
            .await
            .map_err(|e| e.into_api_error(info(), &name))?;
        let leaving = Leaving {
            pools,
            refused: None,
        };
        let mut record = self
            .store()
            .get::<HostRecord>(&key(&name))?
            .unwrap_or_default();
        record.metadata = host.metadata;
        record.metadata.deletion_timestamp = Some(server_now());
        record.metadata.deletion_grace_period_seconds = Some(0);
        record.leaving = Some(leaving.clone());
        let mut object = self.assemble(Some(record), current)?;
        self.commit(&mut object, ChangeType::Modified, Some(leaving))
            .await?;
        // Out of every Pool's placement now, not at the next poll.
        self.directory.changed.notify_one();
        tracing::info!(host = %name, "deleting a Host: cordoned, waiting for its MicroVMs to go");
        Ok(Deleted::Pending(object))
    }

    /// One step of a deletion under way (called by `sync` with the Host's lock held):
    /// keep it cordoned, retire its idle MicroVMs, or remove it once none remain.
    /// Answers whether the Host went.
    pub(super) async fn advance_deletion(
        &self,
        record: HostRecord,
        host: BatteryHost,
    ) -> Result<bool, ApiError> {
        let name = host.name.clone();
        let mut leaving = record.leaving.clone().unwrap_or_default();
        if !host.spec.unschedulable {
            // Someone uncordoned it behind our back; battery must not place on it.
            self.battery()
                .cordon_host(&name, "the Host is being deleted")
                .await
                .map_err(|e| e.into_api_error(info(), &name))?;
        }
        if host.status.vm_count == 0 {
            match self.remove(&name).await? {
                None => {
                    let mut object = self.assemble(Some(record), host)?;
                    self.commit(&mut object, ChangeType::Deleted, None).await?;
                    tracing::info!(host = %name, "removed a deleted Host from battery");
                    return Ok(true);
                }
                Some(refusal) => leaving.refused = Some(refusal),
            }
        } else {
            leaving.refused = None;
            let held = claims_on(self.store(), &name)?.len();
            let idle = usize::try_from(host.status.vm_count)
                .unwrap_or_default()
                .saturating_sub(held);
            if idle > 0 {
                retire_idle(self.battery(), &name, &mut leaving.pools, idle).await;
            }
        }
        let unchanged = record.leaving.as_ref() == Some(&leaving)
            && record.observed.as_ref() == Some(&Observed::of(&host));
        if !unchanged {
            let mut record = record;
            record.leaving = Some(leaving.clone());
            let mut object = self.assemble(Some(record), host)?;
            self.commit(&mut object, ChangeType::Modified, Some(leaving))
                .await?;
        }
        Ok(false)
    }

    /// RemoveHost; answers battery's refusal, if it refused (a Pool it could not take the
    /// Host out of still names it). Gone already counts as removed.
    async fn remove(&self, name: &str) -> Result<Option<String>, ApiError> {
        match self.battery().remove_host(name).await {
            Ok(()) => Ok(None),
            Err(err) if err.failure() == Failure::NotFound => Ok(None),
            Err(err) if err.failure() == Failure::HostInUse => Ok(Some(
                "a Pool still places MicroVMs on the Host, or MicroVMs remain on it".to_owned(),
            )),
            Err(err) => Err(err.into_api_error(info(), name)),
        }
    }
}

/// Retires up to `idle` unleased MicroVMs on `host` (ADR 0009), and drops from `pools`
/// each Pool that can have none left there. battery deletes a MicroVM only on release,
/// and ClaimVM picks any AVAILABLE MicroVM of a pool, not one on a given Host: so a pool
/// is claimed from until its MicroVMs on `host` are found, and every lease taken is
/// released. The ones claimed on other Hosts are released too (released MicroVMs are
/// never returned); the pool's replenishment replaces them on its remaining Hosts.
///
/// A pool is claimed from only when it has nothing provisioning (the Host is cordoned,
/// so then each of its idle MicroVMs there is AVAILABLE), and at most once in full: the
/// churn on other Hosts is bounded by one pass per pool. A lease this loses (a crash,
/// battery down) expires, and battery deletes its MicroVM all the same.
async fn retire_idle(
    battery: &BatteryClient,
    host: &str,
    pools: &mut Vec<PoolName>,
    mut idle: usize,
) {
    let mut taken: Vec<LeaseId> = Vec::new();
    let mut done = Vec::new();
    for (index, pool) in pools.iter().enumerate() {
        if idle == 0 {
            break;
        }
        let counts = match battery.pool(&pool.namespace, &pool.name).await {
            Ok(p) => p.counts,
            Err(err) => {
                // A pool gone took its MicroVMs with it; otherwise the next sync retries.
                if err.failure() == Failure::NotFound {
                    done.push(index);
                }
                continue;
            }
        };
        if counts.provisioning > 0 {
            continue;
        }
        let mut finished = true;
        for _ in 0..counts.available {
            if idle == 0 {
                finished = false;
                break;
            }
            let request_id = format!("host-drain-{}", uuid::Uuid::new_v4());
            match battery
                .claim_vm(&pool.namespace, &pool.name, &request_id)
                .await
            {
                Ok(lease) => {
                    if lease.host_name == host {
                        idle -= 1;
                    }
                    taken.push(lease.id);
                }
                Err(status) => {
                    // Exhausted by claims racing ours: nothing more to take now.
                    tracing::debug!(error = %status, %host, pool = %pool.name, "claiming an idle MicroVM to retire");
                    break;
                }
            }
        }
        if finished {
            done.push(index);
        }
    }
    for index in done.into_iter().rev() {
        pools.remove(index);
    }
    for lease in taken {
        if let Err(status) = battery.release_vm(&lease).await {
            tracing::warn!(error = %status, %host, "releasing a MicroVM retired from a deleted Host; its lease expires instead");
        }
    }
}
