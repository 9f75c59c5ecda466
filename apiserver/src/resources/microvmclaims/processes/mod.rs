//! `microvmprocesses`: background processes in Bound claims' MicroVMs (ADR 44), held by
//! the exec agents of the claims' Hosts and served live from their process tables:
//! nothing is stored here. `object` (the served object), `index` (what was last seen,
//! for watches and the claims' activity) and `storage` sit below the jobs: `start`,
//! `stop` (and the `stop` subresource), `update` (metadata), `attach` and `follow`; this
//! file holds the `Storage` verbs.

mod attach;
mod follow;
pub(in crate::resources::microvmclaims) mod index;
mod object;
mod start;
mod stop;
mod storage;
mod table;
mod update;

use battery_api_machinery::status::ApiError;
use battery_api_machinery::table::TableColumnDefinition;
use battery_types::validation::FieldError;
use battery_types::{MicroVMProcess, MicroVMProcessSpec};
use serde_json::Value;

use crate::api::{Deleted, RequestContext, Storage};

pub use attach::ProcessAttach;
pub use stop::ProcessStop;
pub use storage::ProcessStorage;

impl Storage for ProcessStorage {
    type Object = MicroVMProcess;

    fn table_columns(&self) -> Vec<TableColumnDefinition> {
        table::columns()
    }

    fn table_cells(&self, process: &MicroVMProcess) -> Vec<Value> {
        table::cells(process)
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["spec.claimName", "status.phase"]
    }

    fn field_value(&self, process: &MicroVMProcess, field: &str) -> Option<String> {
        table::field(process, field)
    }

    fn validate(&self, process: &MicroVMProcess) -> Vec<FieldError> {
        process.spec.validate()
    }

    fn validate_update(&self, old: &MicroVMProcess, new: &MicroVMProcess) -> Vec<FieldError> {
        MicroVMProcessSpec::validate_update(&old.spec, &new.spec)
    }

    async fn get(&self, ctx: &RequestContext, name: &str) -> Result<MicroVMProcess, ApiError> {
        self.one(ctx.namespace.as_deref().unwrap_or_default(), name)
            .await
    }

    async fn list(&self, ctx: &RequestContext) -> Result<(Vec<MicroVMProcess>, u64), ApiError> {
        let items = self.all(ctx.namespace.as_deref()).await?;
        // Read after the objects, so it is at least each of theirs.
        let resource_version = self.claims.store.resource_version()?;
        Ok((items, resource_version))
    }

    async fn create(
        &self,
        ctx: &RequestContext,
        process: MicroVMProcess,
    ) -> Result<MicroVMProcess, ApiError> {
        self.start(ctx, process).await
    }

    async fn update(
        &self,
        ctx: &RequestContext,
        _old: MicroVMProcess,
        new: MicroVMProcess,
    ) -> Result<MicroVMProcess, ApiError> {
        self.relabel(ctx, new).await
    }

    async fn delete(
        &self,
        ctx: &RequestContext,
        process: MicroVMProcess,
    ) -> Result<Deleted<MicroVMProcess>, ApiError> {
        self.stop(ctx, process, true).await
    }
}
