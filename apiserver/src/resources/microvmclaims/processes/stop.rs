//! Stopping a process, for `microvmprocesses/<name>/stop` (it stays, to be read) and for
//! a delete (it goes once it ended): SIGTERM, then SIGKILL after its grace period, sent
//! by its agent (ADR 44). Only its claim's Holder may.

use battery_api_machinery::params::FieldValidation;
use battery_api_machinery::status::ApiError;
use battery_types::{MicroVMProcess, MicroVMProcessSpec};

use super::index::Seen;
use super::object::{running, served};
use super::storage::ProcessStorage;
use crate::api::{Deleted, RequestContext, Subresource};

impl ProcessStorage {
    /// Stops `process`; with `delete`, its agent forgets it once it ended.
    pub(super) async fn stop(
        &self,
        ctx: &RequestContext,
        process: MicroVMProcess,
        delete: bool,
    ) -> Result<Deleted<MicroVMProcess>, ApiError> {
        let namespace = process.metadata.namespace.clone().unwrap_or_default();
        let name = process.metadata.name.clone().unwrap_or_default();
        let act = if delete {
            "delete a process in"
        } else {
            "stop a process in"
        };
        let target = self.target(ctx, &process, act).await?;
        let grace = u32::try_from(process.spec.grace_period_seconds()).unwrap_or(0);
        let stopped = self
            .index
            .relay()
            .stop_process(
                &target.host,
                &target.agent_address,
                (&namespace, &name),
                grace,
                delete,
            )
            .await?;
        let object = served(&stopped, &target.host)?;
        if delete && !running(&object) {
            self.index.gone(&namespace, &name).await?;
            return Ok(Deleted::Gone(object));
        }
        let seen = Seen {
            object,
            agent: (target.host, target.agent_address),
            claim_uid: target.claim.uid,
        };
        let object = self.index.seen(seen).await?;
        Ok(if delete {
            Deleted::Pending(object)
        } else {
            Deleted::Gone(object)
        })
    }
}

/// `microvmprocesses/<name>/stop`: a POST (its body is not read) stops the process and
/// answers it, still running; it is kept, its end to be read.
pub struct ProcessStop(pub std::sync::Arc<ProcessStorage>);

impl Subresource for ProcessStop {
    type Object = MicroVMProcess;

    async fn get(&self, ctx: &RequestContext, name: &str) -> Result<MicroVMProcess, ApiError> {
        let namespace = ctx.namespace.as_deref().unwrap_or_default();
        self.0.one(namespace, name).await
    }

    fn decode(
        &self,
        _ctx: &RequestContext,
        _name: &str,
        _value: serde_json::Value,
        _validation: FieldValidation,
    ) -> Result<(MicroVMProcess, Vec<String>), ApiError> {
        // Nothing of the body is used: a stop has no options beyond the spec's grace.
        Ok((
            MicroVMProcess::new("", MicroVMProcessSpec::default()),
            Vec::new(),
        ))
    }

    async fn update(
        &self,
        ctx: &RequestContext,
        name: &str,
        _new: MicroVMProcess,
        dry_run: bool,
        _field_manager: &str,
    ) -> Result<MicroVMProcess, ApiError> {
        let process = self.get(ctx, name).await?;
        if dry_run {
            return Ok(process);
        }
        match self.0.stop(ctx, process, false).await? {
            Deleted::Gone(object) | Deleted::Pending(object) => Ok(object),
        }
    }
}
