//! `microvmprocesses`: background processes in Bound claims' MicroVMs (ADR 44), held by
//! the exec agents of the claims' Hosts and served live from their process tables:
//! nothing is stored here. `object` (the served object), `index` (what was last seen,
//! for watches and the claims' activity) and `storage` sit below the jobs: `start`,
//! `stop` (and the `stop` subresource), `attach` and `follow`; this file holds the
//! `Storage` verbs.

mod attach;
mod follow;
pub(in crate::resources::microvmclaims) mod index;
mod object;
mod start;
mod stop;
mod storage;
mod table;

use battery_api_machinery::status::ApiError;
use battery_api_machinery::table::TableColumnDefinition;
use battery_types::validation::FieldError;
use battery_types::{HasResourceInfo, MicroVMProcess};
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
        _ctx: &RequestContext,
        _old: MicroVMProcess,
        _new: MicroVMProcess,
    ) -> Result<MicroVMProcess, ApiError> {
        // Not a verb of the resource: the dispatcher refuses it before this.
        Err(ApiError::method_not_allowed(
            &MicroVMProcess::INFO,
            "update",
        ))
    }

    async fn delete(
        &self,
        ctx: &RequestContext,
        process: MicroVMProcess,
    ) -> Result<Deleted<MicroVMProcess>, ApiError> {
        self.stop(ctx, process, true).await
    }
}
