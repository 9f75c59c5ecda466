//! The Hosts' storage: what its verbs share. Its work is split by job into the files
//! beside it (`sync`, `status`, `removal`, `cordon`, `certificate`), each an
//! `impl HostStorage` that imports this file and `record`, never `mod.rs`.

use std::sync::Arc;

use battery_api_machinery::status::ApiError;
use battery_types::{Host, agent_identity, conditions};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::directory::HostDirectory;
use super::leaving::{self, Leaving};
use super::readiness;
use super::record::{
    ADMIN_CORDON_REASON, HostRecord, Observed, Reporting, adopted_metadata, info, key,
};
use crate::api::RequestContext;
use crate::battery::objects::{self, HostMeta};
use crate::battery::{BatteryClient, BatteryHost};
use crate::meta_store::MetaStore;
use crate::resources::{KeyLocks, commit};
use crate::watch::ChangeType;

/// Holds an exec agent to its own Host, as the Node authorizer holds a kubelet to its
/// Node: a user whose identity names Host `h` (`battery_types::agent_identity`) may write
/// Host `h` and its status, and no other Host. Anyone else is left to authorization.
pub(super) fn hold_agent_to_own_host(ctx: &RequestContext, name: &str) -> Result<(), ApiError> {
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

pub struct HostStorage {
    pub(super) directory: Arc<HostDirectory>,
    pub(super) locks: KeyLocks,
}

impl HostStorage {
    pub fn new(directory: Arc<HostDirectory>) -> Self {
        Self {
            directory,
            locks: KeyLocks::default(),
        }
    }

    pub(super) fn battery(&self) -> &BatteryClient {
        &self.directory.battery
    }

    pub(super) fn store(&self) -> &Arc<MetaStore> {
        &self.directory.store
    }

    pub(super) fn assemble(
        &self,
        record: Option<HostRecord>,
        host: BatteryHost,
    ) -> Result<Host, ApiError> {
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

    pub(super) async fn read(&self, name: &str) -> Result<Host, ApiError> {
        let host = self
            .battery()
            .host(name)
            .await
            .map_err(|e| e.into_api_error(info(), name))?;
        let record = self.store().get::<HostRecord>(&key(name))?;
        self.assemble(record, host)
    }

    /// The graceful deletion under way of the Host `name`, if any.
    pub(super) fn leaving(&self, name: &str) -> Result<Option<Leaving>, ApiError> {
        Ok(self
            .store()
            .get::<HostRecord>(&key(name))?
            .and_then(|r| r.leaving))
    }

    /// Writes `object`'s record with a new resourceVersion and tells watchers, keeping
    /// the agent's reporting as recorded. Callers whose change can move a Pool's
    /// placement wake the directory themselves.
    pub(super) async fn commit(
        &self,
        object: &mut Host,
        change: ChangeType,
        leaving: Option<Leaving>,
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
    pub(super) async fn commit_reporting(
        &self,
        object: &mut Host,
        change: ChangeType,
        leaving: Option<Leaving>,
        reporting: Reporting,
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
    pub(super) async fn set_cordon(&self, name: &str, unschedulable: bool) -> Result<(), ApiError> {
        let result = if unschedulable {
            self.battery().cordon_host(name, ADMIN_CORDON_REASON).await
        } else {
            self.battery().uncordon_host(name).await
        };
        result.map_err(|e| e.into_api_error(info(), name))
    }
}
