//! `hosts`: battery's host registry (HostAdmin) holds each Host's flintlockd address,
//! TLS files, cordon and version; the metadata store holds its Kubernetes metadata (its
//! labels are what Pools select), the exec agent's address and the agent's readiness
//! report.

use std::collections::BTreeMap;
use std::sync::Arc;

use battery_api_machinery::status::ApiError;
use battery_api_machinery::table::TableColumnDefinition;
use battery_types::conditions;
use battery_types::validation::FieldError;
use battery_types::{HasResourceInfo, Host};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Notify;

use super::{KeyLocks, check_resource_version, commit};
use crate::api::{Deleted, RequestContext, Storage};
use crate::battery::objects::{self, HostMeta};
use crate::battery::{BatteryClient, BatteryHost, Failure};
use crate::meta_store::{Key, MetaStore};
use crate::watch::ChangeType;

const RESOURCE: &str = "hosts";

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct HostRecord {
    metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    agent_address: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    conditions: Vec<Condition>,
}

fn key(name: &str) -> Key {
    Key::new(RESOURCE, None, name)
}

fn info() -> &'static battery_types::ResourceInfo {
    &Host::INFO
}

fn adopted_metadata(name: &str) -> ObjectMeta {
    let uid = uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("{RESOURCE}//{name}").as_bytes(),
    );
    ObjectMeta {
        name: Some(name.to_owned()),
        uid: Some(uid.to_string()),
        resource_version: Some("0".to_owned()),
        generation: Some(1),
        ..ObjectMeta::default()
    }
}

/// The Hosts battery knows, with the labels we keep for them: what Pools'
/// `placement.nodeSelector` is resolved against.
pub struct HostDirectory {
    battery: BatteryClient,
    store: Arc<MetaStore>,
    /// Woken whenever a Host is added, changed or removed, so Pools are re-resolved.
    changed: Notify,
}

impl HostDirectory {
    pub fn new(battery: BatteryClient, store: Arc<MetaStore>) -> Self {
        Self {
            battery,
            store,
            changed: Notify::new(),
        }
    }

    /// Names of the Hosts whose labels include all of `selector`, in battery's order.
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
            let labels = self
                .store
                .get::<HostRecord>(&key(&host.name))?
                .and_then(|r| r.metadata.labels)
                .unwrap_or_default();
            if selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
                names.push(host.name);
            }
        }
        Ok(names)
    }

    /// Resolves when a Host changed since the last call returned.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

pub struct HostStorage {
    directory: Arc<HostDirectory>,
    locks: KeyLocks,
}

impl HostStorage {
    pub fn new(directory: Arc<HostDirectory>) -> Self {
        Self {
            directory,
            locks: KeyLocks::default(),
        }
    }

    fn battery(&self) -> &BatteryClient {
        &self.directory.battery
    }

    fn store(&self) -> &MetaStore {
        &self.directory.store
    }

    fn assemble(&self, record: Option<HostRecord>, host: BatteryHost) -> Host {
        let record = record.unwrap_or_else(|| HostRecord {
            metadata: adopted_metadata(&host.name),
            ..HostRecord::default()
        });
        let meta = HostMeta {
            metadata: record.metadata,
            agent_address: record.agent_address,
            conditions: record.conditions,
        };
        objects::host(meta, host)
    }

    async fn read(&self, name: &str) -> Result<Host, ApiError> {
        let host = self
            .battery()
            .host(name)
            .await
            .map_err(|e| e.into_api_error(info(), name))?;
        let record = self.store().get::<HostRecord>(&key(name))?;
        Ok(self.assemble(record, host))
    }

    fn commit(&self, object: &mut Host, change: ChangeType) -> Result<(), ApiError> {
        let key = key(object.metadata.name.as_deref().unwrap_or_default());
        let record = |host: &Host| HostRecord {
            metadata: host.metadata.clone(),
            agent_address: host.spec.agent_address.clone(),
            conditions: host
                .status
                .as_ref()
                .map(|s| s.conditions.clone())
                .unwrap_or_default(),
        };
        commit(self.store(), &key, object, change, record, |_| Ok(()))?;
        self.directory.changed.notify_one();
        Ok(())
    }

    /// Records every Host battery has that we have no record of (registered with
    /// `poolmgrctl`, or by the embedded battery of `dev`), so each gets its metadata once.
    pub async fn adopt_all(&self) -> Result<(), ApiError> {
        let hosts = self
            .battery()
            .hosts()
            .await
            .map_err(|e| e.into_api_error(info(), ""))?;
        for host in hosts {
            let key = key(&host.name);
            let _guard = self.locks.lock(&key).await;
            if self.store().get::<HostRecord>(&key)?.is_none() {
                let mut object = self.assemble(None, host);
                object.metadata.creation_timestamp = Some(crate::api::server_now());
                self.commit(&mut object, ChangeType::Added)?;
            }
        }
        Ok(())
    }

    /// Cordons or uncordons the Host in battery to match `unschedulable`.
    async fn set_cordon(&self, name: &str, unschedulable: bool) -> Result<(), ApiError> {
        let result = if unschedulable {
            self.battery()
                .cordon_host(name, "spec.unschedulable is true")
                .await
        } else {
            self.battery().uncordon_host(name).await
        };
        result.map_err(|e| e.into_api_error(info(), name))
    }
}

fn ready(host: &Host) -> String {
    host.status
        .as_ref()
        .and_then(|s| conditions::find_status_condition(&s.conditions, conditions::READY))
        .map_or_else(|| "Unknown".to_owned(), |c| c.status.clone())
}

impl Storage for HostStorage {
    type Object = Host;

    fn table_columns(&self) -> Vec<TableColumnDefinition> {
        vec![
            TableColumnDefinition::new("Address", "string", "The Host's flintlockd address.", 0),
            TableColumnDefinition::new(
                "Ready",
                "string",
                "The status of the Ready condition the Host's agent reports.",
                0,
            ),
            TableColumnDefinition::new(
                "Cordoned",
                "boolean",
                "Whether battery places new MicroVMs on the Host.",
                0,
            ),
            TableColumnDefinition::new(
                "Version",
                "string",
                "The flintlockd version battery last saw.",
                0,
            ),
        ]
    }

    fn table_cells(&self, host: &Host) -> Vec<Value> {
        vec![
            host.spec.address.clone().into(),
            ready(host).into(),
            host.spec.unschedulable.into(),
            host.status
                .as_ref()
                .and_then(|s| s.flintlock_version.clone())
                .unwrap_or_default()
                .into(),
        ]
    }

    fn validate(&self, host: &Host) -> Vec<FieldError> {
        host.spec.validate()
    }

    async fn get(&self, _ctx: &RequestContext, name: &str) -> Result<Host, ApiError> {
        self.read(name).await
    }

    async fn list(&self, _ctx: &RequestContext) -> Result<(Vec<Host>, u64), ApiError> {
        let (records, rv) = self.store().list::<HostRecord>(RESOURCE, None)?;
        let mut records: BTreeMap<String, HostRecord> = records
            .into_iter()
            .map(|r| (r.metadata.name.clone().unwrap_or_default(), r))
            .collect();
        let hosts = self
            .battery()
            .hosts()
            .await
            .map_err(|e| e.into_api_error(info(), ""))?;
        let items = hosts
            .into_iter()
            .map(|h| {
                let record = records.remove(&h.name);
                self.assemble(record, h)
            })
            .collect();
        Ok((items, rv))
    }

    async fn create(&self, _ctx: &RequestContext, mut host: Host) -> Result<Host, ApiError> {
        let name = host.metadata.name.clone().unwrap_or_default();
        let _guard = self.locks.lock(&key(&name)).await;
        let added = self
            .battery()
            .add_host(&name, &host.spec)
            .await
            .map_err(|e| e.into_api_error(info(), &name))?;
        if host.spec.unschedulable {
            self.set_cordon(&name, true).await?;
        }
        let mut status = added.status;
        status.conditions = Vec::new();
        host.status = Some(status);
        self.commit(&mut host, ChangeType::Added)?;
        Ok(host)
    }

    async fn update(
        &self,
        _ctx: &RequestContext,
        _old: Host,
        mut new: Host,
    ) -> Result<Host, ApiError> {
        let name = new.metadata.name.clone().unwrap_or_default();
        let _guard = self.locks.lock(&key(&name)).await;
        let current = self.read(&name).await?;
        check_resource_version(info(), &current.metadata, &new.metadata)?;
        if current.spec.address != new.spec.address || current.spec.tls != new.spec.tls {
            self.battery()
                .update_host(&name, &new.spec)
                .await
                .map_err(|e| e.into_api_error(info(), &name))?;
        }
        if current.spec.unschedulable != new.spec.unschedulable {
            self.set_cordon(&name, new.spec.unschedulable).await?;
        }
        let refreshed = self
            .battery()
            .host(&name)
            .await
            .map_err(|e| e.into_api_error(info(), &name))?;
        let mut status = refreshed.status;
        status.conditions = current.status.map(|s| s.conditions).unwrap_or_default();
        new.status = Some(status);
        self.commit(&mut new, ChangeType::Modified)?;
        Ok(new)
    }

    async fn delete(
        &self,
        _ctx: &RequestContext,
        mut host: Host,
    ) -> Result<Deleted<Host>, ApiError> {
        let name = host.metadata.name.clone().unwrap_or_default();
        let _guard = self.locks.lock(&key(&name)).await;
        match self.battery().remove_host(&name).await {
            Ok(()) => {}
            Err(err) if err.failure() == Failure::NotFound => {}
            Err(err) if err.failure() == Failure::HostInUse => {
                let count = host.status.as_ref().map_or(0, |s| s.vm_count);
                return Err(ApiError::conflict(
                    info(),
                    &name,
                    format!(
                        "the Host still has {count} MicroVM(s) or is named by a Pool: cordon it (spec.unschedulable), change the Pools' placement, and wait for its vmCount to reach 0"
                    ),
                ));
            }
            Err(err) => return Err(err.into_api_error(info(), &name)),
        }
        self.commit(&mut host, ChangeType::Deleted)?;
        Ok(Deleted::Gone(host))
    }
}

/// `hosts/<name>/status`: the exec agent's readiness report. Only `conditions` is the
/// agent's to write; the rest of the status is battery's.
pub struct HostStatusWriter(pub Arc<HostStorage>);

impl crate::api::Subresource for HostStatusWriter {
    type Object = Host;

    async fn get(&self, _ctx: &RequestContext, name: &str) -> Result<Host, ApiError> {
        self.0.read(name).await
    }

    async fn update(
        &self,
        _ctx: &RequestContext,
        name: &str,
        new: Host,
        dry_run: bool,
    ) -> Result<Host, ApiError> {
        let storage = &self.0;
        let _guard = storage.locks.lock(&key(name)).await;
        let mut current = storage.read(name).await?;
        if new
            .metadata
            .resource_version
            .as_deref()
            .is_some_and(|rv| !rv.is_empty())
        {
            check_resource_version(info(), &current.metadata, &new.metadata)?;
        }
        let report = new.status.unwrap_or_default();
        let errors = report.validate();
        if !errors.is_empty() {
            return Err(ApiError::invalid(info(), name, &errors));
        }
        let mut status = current.status.take().unwrap_or_default();
        status.conditions = report.conditions;
        current.status = Some(status);
        if !dry_run {
            storage.commit(&mut current, ChangeType::Modified)?;
        }
        Ok(current)
    }
}
