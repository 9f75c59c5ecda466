//! Following battery's Hosts: what another client added, changed or removed is recorded.

use std::collections::BTreeMap;

use battery_api_machinery::status::ApiError;
use battery_types::{Host, HostSpec};

use super::record::{HostRecord, Observed, RESOURCE, info, key};
use super::storage::HostStorage;
use crate::battery::Failure;
use crate::watch::ChangeType;

impl HostStorage {
    /// Brings the records in line with the Hosts battery has, for Hosts another client
    /// added, changed or removed: a new one is adopted (its metadata made once), a
    /// changed one and a removed one are recorded with a new resourceVersion, and a Host
    /// being deleted moves on (`leaving.rs`). Pools are re-resolved when a Host came or
    /// went.
    pub async fn sync(&self) -> Result<(), ApiError> {
        let hosts = self
            .battery()
            .hosts()
            .await
            .map_err(|e| e.into_api_error(info(), ""))?;
        let (records, _) = self.store().list::<HostRecord>(RESOURCE, None)?;
        let mut gone: BTreeMap<String, HostRecord> = records
            .into_iter()
            .map(|r| (r.metadata.name.clone().unwrap_or_default(), r))
            .collect();
        let mut placement_changed = false;
        for host in hosts {
            let listed = gone.remove(&host.name);
            if listed.as_ref().is_some_and(|r| {
                r.leaving.is_none() && r.observed.as_ref() == Some(&Observed::of(&host))
            }) {
                continue;
            }
            placement_changed |= self.sync_one(&host.name).await?;
        }
        for name in gone.into_keys() {
            placement_changed |= self.sync_one(&name).await?;
        }
        placement_changed |= self.follow_readiness().await?;
        if placement_changed {
            self.directory.changed.notify_one();
        }
        Ok(())
    }

    /// Records what battery now says of the Host `name`, under its lock (a create or
    /// delete may have raced the list `sync` read). Answers whether the Host came or went.
    async fn sync_one(&self, name: &str) -> Result<bool, ApiError> {
        let key = key(name);
        let _guard = self.locks.lock(&key).await;
        let record = self.store().get::<HostRecord>(&key)?;
        let host = match self.battery().host(name).await {
            Ok(host) => Some(host),
            Err(err) if err.failure() == Failure::NotFound => None,
            Err(err) => return Err(err.into_api_error(info(), name)),
        };
        match (record, host) {
            (None, None) => Ok(false),
            (None, Some(host)) => {
                let mut object = self.assemble(None, host)?;
                object.metadata.creation_timestamp = Some(crate::clock::server_now());
                self.commit(&mut object, ChangeType::Added, None).await?;
                Ok(true)
            }
            (Some(record), None) => {
                let mut object = Host::new(name, HostSpec::default());
                if let Some(observed) = record.observed {
                    object.spec = observed.spec;
                    object.status = Some(observed.status);
                }
                object.spec.agent_address = record.agent_address;
                object.metadata = record.metadata;
                self.commit(&mut object, ChangeType::Deleted, None).await?;
                Ok(true)
            }
            (Some(record), Some(host)) if record.leaving.is_some() => {
                self.advance_deletion(record, host).await
            }
            (Some(record), Some(host)) => {
                if record.observed.as_ref() == Some(&Observed::of(&host)) {
                    return Ok(false);
                }
                let moved = record
                    .observed
                    .as_ref()
                    .is_none_or(|o| o.spec.unschedulable != host.spec.unschedulable);
                let mut object = self.assemble(Some(record), host)?;
                self.commit(&mut object, ChangeType::Modified, None).await?;
                Ok(moved)
            }
        }
    }
}
