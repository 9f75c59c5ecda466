//! The Hosts battery knows, with the labels we keep for them: what Pools and claims ask
//! of a Host without going through the `hosts` storage.

use std::collections::BTreeMap;
use std::sync::Arc;

use battery_api_machinery::status::ApiError;
use tokio::sync::Notify;

use super::readiness;
use super::record::{HostRecord, info, key};
use crate::battery::BatteryClient;
use crate::battery::objects;
use crate::meta_store::MetaStore;

/// The Hosts battery knows, with the labels we keep for them: what Pools'
/// `placement.nodeSelector` is resolved against.
pub struct HostDirectory {
    pub(super) battery: BatteryClient,
    pub(super) store: Arc<MetaStore>,
    /// Woken whenever a Host is added, changed or removed, so Pools are re-resolved.
    pub(super) changed: Notify,
}

impl HostDirectory {
    pub fn new(battery: BatteryClient, store: Arc<MetaStore>) -> Self {
        Self {
            battery,
            store,
            changed: Notify::new(),
        }
    }

    /// Names of the Hosts whose labels include all of `selector`, in battery's order. A
    /// Host being deleted matches no selector, not even the empty one.
    pub async fn matching(
        &self,
        selector: &BTreeMap<String, String>,
    ) -> Result<Vec<String>, ApiError> {
        let hosts = self
            .battery
            .hosts()
            .await
            .map_err(|e| e.into_api_error(info(), ""))?;
        let mut names = Vec::new();
        for host in hosts {
            let record = self.store.get::<HostRecord>(&key(&host.name))?;
            if record.as_ref().is_some_and(|r| r.leaving.is_some()) {
                continue;
            }
            let labels = record.and_then(|r| r.metadata.labels).unwrap_or_default();
            if selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
                names.push(host.name);
            }
        }
        Ok(names)
    }

    /// The exec agent's address of the Host `name`, if its agent registered one.
    pub fn agent_address(&self, name: &str) -> Result<Option<String>, ApiError> {
        Ok(self
            .store
            .get::<HostRecord>(&key(name))?
            .and_then(|r| r.agent_address))
    }

    /// What its claims' `HostReady` says of the Host `name`.
    pub fn readiness(&self, name: &str) -> Result<objects::HostReadiness, ApiError> {
        Ok(self.agent_and_readiness(name)?.1)
    }

    /// The exec agent's address of the Host `name` and what its claims' `HostReady` says,
    /// from one read of its record: what a bind shows of its Host.
    pub fn agent_and_readiness(
        &self,
        name: &str,
    ) -> Result<(Option<String>, objects::HostReadiness), ApiError> {
        let record = self.store.get::<HostRecord>(&key(name))?;
        let readiness = readiness::of_record(record.as_ref(), k8s_openapi::jiff::Timestamp::now());
        Ok((record.and_then(|r| r.agent_address), readiness))
    }

    /// Resolves when a Host changed since the last call returned.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}
