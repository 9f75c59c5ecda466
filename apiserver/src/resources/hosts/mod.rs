//! `hosts`: battery's host registry (HostAdmin) holds each Host's flintlockd address,
//! TLS files, cordon and version; the metadata store holds its Kubernetes metadata (its
//! labels are what Pools select), the exec agent's address, the agent's readiness
//! report and when it came, battery's view when last recorded and, once deletion began,
//! the state of its graceful removal (`leaving.rs`). An exec agent may write only its
//! own Host; a Host whose report says not ready, or is stale, is cordoned in battery so
//! that new MicroVMs go elsewhere (`readiness.rs`).
//!
//! battery has no host events, so [`HostStorage::sync`], run on a short interval, is how
//! a Host added, changed or removed by another client (HostAdmin, `poolmgrctl`) reaches
//! lists, watches and Pools' placement, and how readiness moves the cordon.

pub mod certificate;
mod directory;
mod leaving;
mod readiness;
pub mod ssh_certificate;
mod status;
mod sync;

pub use directory::HostDirectory;
pub use status::HostStatusWriter;

use std::collections::BTreeMap;
use std::sync::Arc;

use battery_api_machinery::status::ApiError;
use battery_api_machinery::table::TableColumnDefinition;
use battery_types::validation::FieldError;
use battery_types::{HasResourceInfo, Host, HostSpec, HostStatus};
use battery_types::{agent_identity, conditions};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{KeyLocks, check_resource_version, commit};
use crate::api::{Deleted, RequestContext, Storage};
use crate::battery::objects::{self, HostMeta};
use crate::battery::{BatteryClient, BatteryHost};
use crate::meta_store::{Key, MetaStore};
use crate::watch::ChangeType;

const RESOURCE: &str = "hosts";
/// battery's cordon reason for a Host its admin marked unschedulable.
const ADMIN_CORDON_REASON: &str = "spec.unschedulable is true";

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct HostRecord {
    metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    agent_address: Option<String>,
    /// The agent's report; `Draining` is ours and derived on read, never kept here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    conditions: Vec<Condition>,
    /// battery's view of the Host when the record was last written: what `sync` compares
    /// battery's answers with, so another client's change gets a resourceVersion even
    /// across a restart of this server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    observed: Option<Observed>,
    /// Set from the moment the Host's deletion is accepted until battery removed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    leaving: Option<leaving::Leaving>,
    /// When the agent last reported, and the cordon the API server keeps while the Host
    /// is not ready (`readiness.rs`).
    #[serde(default)]
    reporting: readiness::Reporting,
}

/// battery's part of a Host: its spec without `agentAddress`, its status without
/// conditions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Observed {
    spec: HostSpec,
    status: HostStatus,
}

impl Observed {
    fn of(host: &BatteryHost) -> Self {
        Self {
            spec: host.spec.clone(),
            status: host.status.clone(),
        }
    }

    fn of_object(host: &Host) -> Self {
        let mut spec = host.spec.clone();
        spec.agent_address = None;
        let mut status = host.status.clone().unwrap_or_default();
        status.conditions = Vec::new();
        Self { spec, status }
    }
}

fn key(name: &str) -> Key {
    Key::new(RESOURCE, None, name)
}

fn info() -> &'static battery_types::ResourceInfo {
    &Host::INFO
}

/// Holds an exec agent to its own Host, as the Node authorizer holds a kubelet to its
/// Node: a user whose identity names Host `h` (`battery_types::agent_identity`) may write
/// Host `h` and its status, and no other Host. Anyone else is left to authorization.
fn hold_agent_to_own_host(ctx: &RequestContext, name: &str) -> Result<(), ApiError> {
    match agent_identity::agent_host(&ctx.user.name, &ctx.user.groups) {
        Some(host) if host != name => Err(ApiError::forbidden_object(
            info(),
            name,
            format!(
                "user {:?} is the exec agent of Host {host:?} and may write only Host {host:?}",
                ctx.user.name
            ),
        )),
        _ => Ok(()),
    }
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

    fn store(&self) -> &Arc<MetaStore> {
        &self.directory.store
    }

    fn assemble(&self, record: Option<HostRecord>, host: BatteryHost) -> Result<Host, ApiError> {
        let record = record.unwrap_or_else(|| HostRecord {
            metadata: adopted_metadata(&host.name),
            ..HostRecord::default()
        });
        // A stale report shows as AgentNotReporting; the admin's cordon as they set it.
        let mut conditions = record.conditions.clone();
        if let Some(ready) = readiness::effective_ready(
            &record.conditions,
            &record.reporting,
            k8s_openapi::jiff::Timestamp::now(),
        ) {
            conditions::set_status_condition(&mut conditions, ready);
        }
        let cordoned_not_ready = record.reporting.cordoned_not_ready;
        let admin_unschedulable = record.reporting.admin_unschedulable;
        let meta = HostMeta {
            metadata: record.metadata,
            agent_address: record.agent_address,
            conditions,
        };
        let mut object = objects::host(meta, host);
        if cordoned_not_ready {
            object.spec.unschedulable = admin_unschedulable;
        }
        if let Some(leaving) = &record.leaving
            && let Some(status) = object.status.as_mut()
        {
            let claims = leaving::claims_on(
                self.store(),
                object.metadata.name.as_deref().unwrap_or_default(),
            )?;
            conditions::set_status_condition(
                &mut status.conditions,
                leaving.condition(&object.metadata, status.vm_count, &claims),
            );
        }
        Ok(object)
    }

    async fn read(&self, name: &str) -> Result<Host, ApiError> {
        let host = self
            .battery()
            .host(name)
            .await
            .map_err(|e| e.into_api_error(info(), name))?;
        let record = self.store().get::<HostRecord>(&key(name))?;
        self.assemble(record, host)
    }

    /// The graceful deletion under way of the Host `name`, if any.
    fn leaving(&self, name: &str) -> Result<Option<leaving::Leaving>, ApiError> {
        Ok(self
            .store()
            .get::<HostRecord>(&key(name))?
            .and_then(|r| r.leaving))
    }

    /// Writes `object`'s record with a new resourceVersion and tells watchers, keeping
    /// the agent's reporting as recorded. Callers whose change can move a Pool's
    /// placement wake the directory themselves.
    async fn commit(
        &self,
        object: &mut Host,
        change: ChangeType,
        leaving: Option<leaving::Leaving>,
    ) -> Result<(), ApiError> {
        let name = object.metadata.name.clone().unwrap_or_default();
        let reporting = self
            .store()
            .get::<HostRecord>(&key(&name))?
            .map(|r| r.reporting)
            .unwrap_or_default();
        self.commit_reporting(object, change, leaving, reporting)
            .await
    }

    /// As [`Self::commit`], with `reporting` recorded.
    async fn commit_reporting(
        &self,
        object: &mut Host,
        change: ChangeType,
        leaving: Option<leaving::Leaving>,
        reporting: readiness::Reporting,
    ) -> Result<(), ApiError> {
        let key = key(object.metadata.name.as_deref().unwrap_or_default());
        let previous = self.store().get::<HostRecord>(&key)?;
        let record = |host: &Host| {
            let conditions: Vec<Condition> = host
                .status
                .iter()
                .flat_map(|s| s.conditions.iter())
                .filter(|c| c.type_ != conditions::DRAINING)
                .cloned()
                .collect();
            // A stale report's AgentNotReporting is derived on read: keep the report.
            let derived = conditions::find_status_condition(&conditions, conditions::READY)
                .is_some_and(|c| {
                    c.reason == conditions::HostReadyReason::AgentNotReporting.as_str()
                });
            let conditions = match (&previous, derived) {
                (Some(previous), true) => previous.conditions.clone(),
                _ => conditions,
            };
            let mut observed = Observed::of_object(host);
            // battery's view: our not-ready cordon is on whatever the admin chose.
            observed.spec.unschedulable |= reporting.cordoned_not_ready;
            HostRecord {
                metadata: host.metadata.clone(),
                agent_address: host.spec.agent_address.clone(),
                conditions,
                observed: Some(observed),
                leaving,
                reporting,
            }
        };
        commit(self.store(), &key, object, change, record, |_| Ok(())).await
    }

    /// Cordons or uncordons the Host in battery to match `unschedulable`.
    async fn set_cordon(&self, name: &str, unschedulable: bool) -> Result<(), ApiError> {
        let result = if unschedulable {
            self.battery().cordon_host(name, ADMIN_CORDON_REASON).await
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
        let mut items: Vec<Host> = hosts
            .into_iter()
            .map(|h| {
                let record = records.remove(&h.name);
                self.assemble(record, h)
            })
            .collect::<Result<_, _>>()?;
        // Battery's order is its own; a list's is by name, which paging relies on.
        items.sort_by_cached_key(crate::api::list_key);
        Ok((items, rv))
    }

    async fn create(&self, ctx: &RequestContext, host: Host) -> Result<Host, ApiError> {
        let name = host.metadata.name.clone().unwrap_or_default();
        hold_agent_to_own_host(ctx, &name)?;
        let _guard = self.locks.lock(&key(&name)).await;
        let mut added = self
            .battery()
            .add_host(&name, &host.spec)
            .await
            .map_err(|e| e.into_api_error(info(), &name))?;
        if host.spec.unschedulable {
            self.set_cordon(&name, true).await?;
            added = self
                .battery()
                .host(&name)
                .await
                .map_err(|e| e.into_api_error(info(), &name))?;
        }
        let meta = HostMeta {
            metadata: host.metadata,
            agent_address: host.spec.agent_address,
            conditions: Vec::new(),
        };
        let mut host = objects::host(meta, added);
        self.commit(&mut host, ChangeType::Added, None).await?;
        self.directory.changed.notify_one();
        Ok(host)
    }

    async fn update(
        &self,
        ctx: &RequestContext,
        _old: Host,
        mut new: Host,
    ) -> Result<Host, ApiError> {
        let name = new.metadata.name.clone().unwrap_or_default();
        hold_agent_to_own_host(ctx, &name)?;
        let _guard = self.locks.lock(&key(&name)).await;
        let current = self.read(&name).await?;
        check_resource_version(info(), &current.metadata, &new.metadata)?;
        let leaving = self.leaving(&name)?;
        if leaving.is_some() {
            // A Host being deleted stays cordoned until battery removes it.
            new.spec.unschedulable = true;
        }
        if current.spec.address != new.spec.address || current.spec.tls != new.spec.tls {
            self.battery()
                .update_host(&name, &new.spec)
                .await
                .map_err(|e| e.into_api_error(info(), &name))?;
        }
        let mut reporting = self
            .store()
            .get::<HostRecord>(&key(&name))?
            .map(|r| r.reporting)
            .unwrap_or_default();
        if current.spec.unschedulable != new.spec.unschedulable {
            if reporting.cordoned_not_ready {
                // battery stays cordoned while the Host is not ready; the admin's choice
                // applies once it is ready again.
                reporting.admin_unschedulable = new.spec.unschedulable;
            } else {
                self.set_cordon(&name, new.spec.unschedulable).await?;
            }
        }
        let refreshed = self
            .battery()
            .host(&name)
            .await
            .map_err(|e| e.into_api_error(info(), &name))?;
        let meta = HostMeta {
            metadata: new.metadata,
            agent_address: new.spec.agent_address,
            conditions: current.status.map(|s| s.conditions).unwrap_or_default(),
        };
        let mut new = objects::host(meta, refreshed);
        if reporting.cordoned_not_ready {
            new.spec.unschedulable = reporting.admin_unschedulable;
        }
        self.commit_reporting(&mut new, ChangeType::Modified, leaving, reporting)
            .await?;
        // Labels or the cordon may have changed what Pools select.
        self.directory.changed.notify_one();
        Ok(new)
    }

    /// A graceful deletion in battery's order (`reference/battery-api.md` §4.8): the
    /// Host is cordoned and leaves every Pool's placement at once; it stays, marked, until
    /// battery has no MicroVM on it, and then is removed (`leaving.rs`).
    async fn delete(&self, ctx: &RequestContext, host: Host) -> Result<Deleted<Host>, ApiError> {
        hold_agent_to_own_host(ctx, host.metadata.name.as_deref().unwrap_or_default())?;
        self.begin_deletion(host).await
    }
}
