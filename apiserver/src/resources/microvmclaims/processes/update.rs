//! An update (or patch): a process's metadata changes (labels, annotations), its spec
//! cannot; its agent keeps the new object. Only its claim's Holder may.

use battery_api_machinery::status::ApiError;
use battery_types::{HasResourceInfo, MicroVMProcess};

use super::index::Seen;
use super::object::{kept, served};
use super::storage::ProcessStorage;
use crate::api::RequestContext;
use crate::resources::check_resource_version;

impl ProcessStorage {
    pub(super) async fn relabel(
        &self,
        ctx: &RequestContext,
        new: MicroVMProcess,
    ) -> Result<MicroVMProcess, ApiError> {
        let namespace = new.metadata.namespace.clone().unwrap_or_default();
        let name = new.metadata.name.clone().unwrap_or_default();
        let _guard = self.locks.lock(&Self::key(&namespace, &name)).await;
        let current = self.one(&namespace, &name).await?;
        check_resource_version(&MicroVMProcess::INFO, &current.metadata, &new.metadata)?;
        let target = self.target(ctx, &current, "change a process in").await?;
        let replaced = self
            .index
            .relay()
            .replace_process_object(
                &target.host,
                &target.agent_address,
                (&namespace, &name),
                kept(&new)?,
            )
            .await?;
        self.index
            .seen(Seen {
                object: served(&replaced, &target.host)?,
                agent: (target.host, target.agent_address),
                claim_uid: target.claim.uid,
            })
            .await
    }
}
