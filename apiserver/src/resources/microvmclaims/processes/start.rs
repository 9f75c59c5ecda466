//! A create: the process starts in its claim's MicroVM, through the agent of the
//! claim's Host, as the claim's Holder only; the answer is already Running.

use battery_api_machinery::status::ApiError;
use battery_types::{HasResourceInfo, MicroVMProcess};

use super::index::Seen;
use super::object::{kept, served};
use super::storage::ProcessStorage;
use crate::api::RequestContext;
use crate::relay::ProcessStart;
use crate::resources::microvmclaims::config::session_env;

impl ProcessStorage {
    pub(super) async fn start(
        &self,
        ctx: &RequestContext,
        mut process: MicroVMProcess,
    ) -> Result<MicroVMProcess, ApiError> {
        let namespace = process.metadata.namespace.clone().unwrap_or_default();
        let name = process.metadata.name.clone().unwrap_or_default();
        let _guard = self.locks.lock(&Self::key(&namespace, &name)).await;
        let target = self.target(ctx, &process, "start a process in").await?;
        // Unique in the namespace, whichever Host runs the one of that name.
        if self
            .all(Some(&namespace))
            .await?
            .iter()
            .any(|object| object.metadata.name.as_deref() == Some(name.as_str()))
        {
            return Err(ApiError::already_exists(&MicroVMProcess::INFO, &name));
        }
        process.status = None;
        let own = process
            .spec
            .env
            .iter()
            .map(|var| (var.name.clone(), var.value.clone()))
            .collect();
        let start = ProcessStart {
            namespace,
            name,
            claim: target.claim.clone(),
            microvm_uid: target.microvm_uid.clone(),
            object: kept(&process)?,
            command: process.spec.command.clone(),
            env: session_env(&target.env, own),
            working_dir: process.spec.working_dir.clone(),
            stdin: process.spec.stdin,
        };
        let started = self
            .index
            .relay()
            .start_process(&target.host, &target.agent_address, start)
            .await?;
        self.index
            .seen(Seen {
                object: served(&started, &target.host)?,
                agent: (target.host, target.agent_address),
                claim_uid: target.claim.uid,
            })
            .await
    }
}
