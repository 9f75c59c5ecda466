//! Following battery: claims whose MicroVM battery deleted become Expired, and Bound
//! claims' `HostReady` follows what their Host's agent reports.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use battery_api_machinery::status::ApiError;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

use super::read::expire;
use super::record::{ClaimRecord, RESOURCE, key, object};
use super::storage::ClaimStorage;
use crate::battery::objects;
use crate::battery::{BatteryEvent, EventKind};
use crate::watch::ChangeType;

impl ClaimStorage {
    /// Told by the follower whether it keeps up with battery's events.
    pub fn set_following(&self, following: bool) {
        self.following.store(following, Ordering::Relaxed);
    }

    /// Whether the record of a claim holding a lease that expires at `expires` alone
    /// tells that battery still holds it (ADR 21): the follower keeps up, and the expiry
    /// (battery's own, or reckoned from before the `ClaimVM`, never later than battery's)
    /// is ahead. Lists and exec trust it, so they cost no listing of the Pool's leases (a
    /// get asks battery, ADR 25). A MicroVM battery deleted meanwhile (a forced Pool
    /// deletion) reaches the record within the follower's batch window, which ends exec
    /// sessions; until then flintlock refuses to exec in it, and exec asks battery
    /// (`Ask::Everyone`) before it answers.
    pub(super) fn lease_followed(&self, expires: Option<&MicroTime>) -> bool {
        let ahead = expires.is_some_and(|expires| expires.0 > Timestamp::now());
        ahead && self.following.load(Ordering::Relaxed)
    }

    /// Marks claims whose MicroVM battery deleted (expiry, or a forced pool deletion) as
    /// Expired, and tells watchers.
    pub async fn observe(&self, event: &BatteryEvent) -> Result<(), ApiError> {
        if !event.kind.deletes_vm() || event.kind == EventKind::VmDeletedOnRelease {
            return Ok(());
        }
        let (records, _) = self
            .store
            .list::<ClaimRecord>(RESOURCE, Some(&event.namespace))?;
        let holds_vm = |r: &ClaimRecord| {
            r.lease.is_some()
                && r.status
                    .micro_vm
                    .as_ref()
                    .is_some_and(|vm| vm.uid == event.vm_uid)
        };
        let Some(record) = records.into_iter().find(holds_vm) else {
            return Ok(());
        };
        let key = key(
            record.metadata.namespace.as_deref().unwrap_or_default(),
            record.metadata.name.as_deref().unwrap_or_default(),
        );
        let _guard = self.locks.lock(&key).await;
        // Again under the claim's lock: a delete may have released and removed it since.
        let Some(record) = self.store.get::<ClaimRecord>(&key)?.filter(holds_vm) else {
            return Ok(());
        };
        let expired = expire(record);
        let secrets = expired.lease_record();
        let mut claim = object(expired);
        self.commit(&mut claim, secrets, ChangeType::Modified).await
    }

    /// Brings every Bound claim's `HostReady` in line with what the Host directory says
    /// of its Host now, recording (and telling watchers of) those that changed, so get,
    /// list and watch show it. Run on the Host follow loop: a report, or its going stale,
    /// reaches the claims within one loop.
    pub async fn refresh_host_ready(&self) -> Result<(), ApiError> {
        let (records, _) = self.store.list::<ClaimRecord>(RESOURCE, None)?;
        // Many claims share a Host: read each Host's readiness once per pass.
        let mut hosts: HashMap<String, objects::HostReadiness> = HashMap::new();
        for record in records {
            let Some(host) = bound_host(&record) else {
                continue;
            };
            if !hosts.contains_key(&host) {
                let readiness = self.hosts.readiness(&host)?;
                hosts.insert(host.clone(), readiness);
            }
            let readiness = &hosts[&host];
            let mut status = record.status.clone();
            if !objects::refresh_host_ready(&mut status, readiness, record.metadata.generation) {
                continue;
            }
            // Again under the claim's lock: a release or an expiry may have raced the list.
            let key = key(
                record.metadata.namespace.as_deref().unwrap_or_default(),
                record.metadata.name.as_deref().unwrap_or_default(),
            );
            let _guard = self.locks.lock(&key).await;
            let Some(mut current) = self.store.get::<ClaimRecord>(&key)? else {
                continue;
            };
            let generation = current.metadata.generation;
            if bound_host(&current).as_deref() != Some(host.as_str())
                || !objects::refresh_host_ready(&mut current.status, readiness, generation)
            {
                continue;
            }
            let secrets = current.lease_record();
            let mut claim = object(current);
            self.commit(&mut claim, secrets, ChangeType::Modified)
                .await?;
        }
        Ok(())
    }
}

/// The Host of a Bound claim's MicroVM.
fn bound_host(record: &ClaimRecord) -> Option<String> {
    if record.status.phase != Some(battery_types::ClaimPhase::Bound) {
        return None;
    }
    record.status.host.as_ref().map(|h| h.node_name.clone())
}
