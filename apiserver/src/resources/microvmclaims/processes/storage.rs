//! What the process verbs share: the claims (whose Holder rule and Hosts they use), the
//! index of what was seen, and a lock per process name, so two creates of one name
//! cannot both start.

use std::collections::BTreeMap;
use std::sync::Arc;

use battery_api_machinery::status::ApiError;
use battery_types::{HasResourceInfo, MicroVMProcess};
use futures::future::join_all;

use super::index::Agent;
use super::index::{ProcessIndex, Seen};
use super::object::served;
use crate::meta_store::Key;
use crate::resources::KeyLocks;
use crate::resources::microvmclaims::exec::{ClaimSessions, Target};
use crate::resources::microvmclaims::storage::ClaimStorage;

/// The `microvmprocesses` storage.
pub struct ProcessStorage {
    pub(super) claims: Arc<ClaimStorage>,
    pub(super) index: Arc<ProcessIndex>,
    pub(super) locks: KeyLocks,
}

impl ProcessStorage {
    pub fn new(claims: Arc<ClaimStorage>) -> Self {
        Self {
            index: claims.process_index(),
            claims,
            locks: KeyLocks::default(),
        }
    }

    /// What `agent` reports of `namespace` (all when `None`).
    pub(super) async fn ask(
        &self,
        agent: &Agent,
        namespace: Option<&str>,
    ) -> Result<Vec<Seen>, ApiError> {
        let (host, address) = agent;
        let processes = self
            .index
            .relay()
            .list_processes(host, address, namespace.unwrap_or_default())
            .await?;
        processes
            .iter()
            .map(|process| {
                Ok(Seen {
                    agent: agent.clone(),
                    claim_uid: process.claim_uid.clone(),
                    object: served(process, host)?,
                })
            })
            .collect()
    }

    /// Every process of `namespace` (all when `None`), live from the agents of its Bound
    /// claims' Hosts, by namespace and name.
    pub(super) async fn all(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<MicroVMProcess>, ApiError> {
        let (agents, _) = self.claims.agents(namespace)?;
        let asked = join_all(agents.iter().map(|agent| async move {
            let seen = self.ask(agent, namespace).await?;
            self.index.observe(agent, namespace, seen).await
        }))
        .await;
        let mut all = BTreeMap::new();
        for objects in asked {
            for object in objects? {
                let key = (
                    object.metadata.namespace.clone().unwrap_or_default(),
                    object.metadata.name.clone().unwrap_or_default(),
                );
                all.insert(key, object);
            }
        }
        Ok(all.into_values().collect())
    }

    /// The process `name` of `namespace`.
    pub(super) async fn one(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<MicroVMProcess, ApiError> {
        self.all(Some(namespace))
            .await?
            .into_iter()
            .find(|object| object.metadata.name.as_deref() == Some(name))
            .ok_or_else(|| ApiError::not_found(&MicroVMProcess::INFO, name))
    }

    /// The claim of `process`, if `ctx`'s user is its Holder and may `act` on it.
    pub(super) async fn target(
        &self,
        ctx: &crate::api::RequestContext,
        process: &MicroVMProcess,
        act: &str,
    ) -> Result<Target, ApiError> {
        self.claims.target(ctx, &process.spec.claim_name, act).await
    }

    /// The lock of the process `namespace/name`.
    pub(super) fn key(namespace: &str, name: &str) -> Key {
        Key::new(super::index::RESOURCE, Some(namespace), name)
    }
}
