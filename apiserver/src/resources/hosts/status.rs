//! `hosts/<name>/status`: what the exec agent reports.

use std::sync::Arc;

use battery_api_machinery::status::ApiError;
use battery_types::{Host, conditions};

use super::record::{HostRecord, info, key};
use super::storage::{HostStorage, hold_agent_to_own_host};
use crate::api::RequestContext;
use crate::resources::check_resource_version;
use crate::watch::ChangeType;

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
        ctx: &RequestContext,
        name: &str,
        new: Host,
        dry_run: bool,
        _field_manager: &str,
    ) -> Result<Host, ApiError> {
        hold_agent_to_own_host(ctx, name)?;
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
        let record = storage.store().get::<HostRecord>(&key(name))?;
        // `Draining` is the API server's, not the agent's: it stays as it was. A condition
        // whose status did not change keeps its transition time, whatever the agent sent.
        let draining =
            conditions::find_status_condition(&status.conditions, conditions::DRAINING).cloned();
        let mut reported = record
            .as_ref()
            .map(|r| r.conditions.clone())
            .unwrap_or_default();
        reported.retain(|c| report.conditions.iter().any(|n| n.type_ == c.type_));
        for condition in report.conditions {
            if condition.type_ != conditions::DRAINING {
                conditions::set_status_condition(&mut reported, condition);
            }
        }
        status.conditions = reported.into_iter().chain(draining).collect();
        current.status = Some(status);
        if !dry_run {
            let leaving = storage.leaving(name)?;
            let mut reporting = record.map(|r| r.reporting).unwrap_or_default();
            reporting.reported_at = Some(crate::clock::server_now());
            storage
                .commit_reporting(&mut current, ChangeType::Modified, leaving, reporting)
                .await?;
        }
        Ok(current)
    }
}
