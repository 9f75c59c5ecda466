//! `hosts`: battery's host registry (HostAdmin) holds each Host's flintlockd address,
//! TLS files, cordon and version; the metadata store holds its Kubernetes metadata (its
//! labels are what Pools select), the exec agent's address, the agent's readiness
//! report and when it came, battery's view when last recorded and, once deletion began,
//! the state of its graceful removal (`leaving.rs`, `removal.rs`). An exec agent may write only its
//! own Host; a Host whose report says not ready, or is stale, is cordoned in battery so
//! that new MicroVMs go elsewhere (`readiness.rs`, `cordon.rs`).
//!
//! battery has no host events, so [`HostStorage::sync`], run on a short interval, is how
//! a Host added, changed or removed by another client (HostAdmin, `poolmgrctl`) reaches
//! lists, watches and Pools' placement, and how readiness moves the cordon.

pub mod certificate;
mod cordon;
mod directory;
mod leaving;
mod readiness;
mod record;
mod removal;
pub mod ssh_certificate;
mod status;
mod storage;
mod sync;

pub use directory::HostDirectory;
pub use status::HostStatusWriter;
pub use storage::HostStorage;

use std::collections::BTreeMap;

use battery_api_machinery::status::ApiError;
use battery_api_machinery::table::TableColumnDefinition;
use battery_types::validation::FieldError;
use battery_types::{Host, conditions};
use serde_json::Value;

use super::check_resource_version;
use crate::api::{Deleted, RequestContext, Storage};
use crate::battery::objects::{self, HostMeta};
use crate::watch::ChangeType;
use record::{HostRecord, RESOURCE, info, key};
use storage::hold_agent_to_own_host;

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
