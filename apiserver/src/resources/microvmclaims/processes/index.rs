//! The processes the API server has seen, by namespace and name, as their agents last
//! reported them: what watches are told changes against, each change stamped with a
//! resourceVersion of the store's counter (no record is written, ADR 44), and what holds
//! a claim in use while its process runs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use battery_api_machinery::status::ApiError;
use battery_types::MicroVMProcess;

use super::object::running;
use crate::meta_store::{Key, MetaStore};
use crate::relay::{AgentRelay, ClaimRef};
use crate::resources::microvmclaims::activity::{ActivityHold, ClaimActivity};
use crate::watch::ChangeType;

pub(super) const RESOURCE: &str = "microvmprocesses";

/// A Host's exec agent: its Host's name and its address.
pub type Agent = (String, String);

/// A process as seen at its agent.
#[derive(Clone)]
pub(super) struct Seen {
    pub(super) agent: Agent,
    pub(super) claim_uid: String,
    pub(super) object: MicroVMProcess,
}

impl Seen {
    fn key(&self) -> (String, String) {
        let meta = &self.object.metadata;
        (
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        )
    }
}

struct Known {
    seen: Seen,
    /// Holds its claim in use while it runs.
    _hold: Option<ActivityHold>,
}

/// The processes last seen, by namespace and name.
pub struct ProcessIndex {
    known: tokio::sync::Mutex<BTreeMap<(String, String), Known>>,
    store: Arc<MetaStore>,
    activity: Arc<ClaimActivity>,
    relay: Arc<AgentRelay>,
}

/// What changed, for watchers.
enum Update {
    Upsert(Box<Seen>),
    Remove((String, String)),
}

/// The object without its resourceVersion, to tell a change from a repeat.
fn unversioned(object: &MicroVMProcess) -> MicroVMProcess {
    let mut object = object.clone();
    object.metadata.resource_version = None;
    object
}

impl ProcessIndex {
    pub(in crate::resources::microvmclaims) fn new(
        store: Arc<MetaStore>,
        activity: Arc<ClaimActivity>,
        relay: Arc<AgentRelay>,
    ) -> Self {
        Self {
            known: tokio::sync::Mutex::default(),
            store,
            activity,
            relay,
        }
    }

    pub(super) fn relay(&self) -> &Arc<AgentRelay> {
        &self.relay
    }

    /// What `agent` reports of `namespace` (every namespace when `None`): each change
    /// since it was last seen is published; the answer is the objects with their
    /// resourceVersions.
    pub(super) async fn observe(
        &self,
        agent: &Agent,
        namespace: Option<&str>,
        seen: Vec<Seen>,
    ) -> Result<Vec<MicroVMProcess>, ApiError> {
        let reported: BTreeSet<(String, String)> = seen.iter().map(Seen::key).collect();
        let gone: Vec<(String, String)> = self
            .known
            .lock()
            .await
            .iter()
            .filter(|(key, known)| {
                known.seen.agent == *agent
                    && namespace.is_none_or(|ns| key.0 == ns)
                    && !reported.contains(*key)
            })
            .map(|(key, _)| key.clone())
            .collect();
        let updates = seen
            .into_iter()
            .map(|seen| Update::Upsert(Box::new(seen)))
            .chain(gone.into_iter().map(Update::Remove))
            .collect();
        self.apply(updates).await
    }

    /// A process the API server just started, stopped or saw end.
    pub(super) async fn seen(&self, seen: Seen) -> Result<MicroVMProcess, ApiError> {
        let mut objects = self.apply(vec![Update::Upsert(Box::new(seen))]).await?;
        objects
            .pop()
            .ok_or_else(|| ApiError::internal(std::io::Error::other("no object")))
    }

    /// A process its agent forgot.
    pub(super) async fn gone(&self, namespace: &str, name: &str) -> Result<(), ApiError> {
        self.apply(vec![Update::Remove((
            namespace.to_owned(),
            name.to_owned(),
        ))])
        .await
        .map(drop)
    }

    /// The agents with a process running or being deleted, whose ends are to be seen.
    pub(super) async fn busy_agents(&self) -> BTreeSet<Agent> {
        self.known
            .lock()
            .await
            .values()
            .filter(|known| running(&known.seen.object))
            .map(|known| known.seen.agent.clone())
            .collect()
    }

    /// The claim `claim` ended: its agent ends and forgets its processes, and watchers
    /// see them go. Only for a claim with a process known, so a claim without any costs
    /// its agent nothing.
    pub fn end_claim(self: &Arc<Self>, claim: ClaimRef) {
        let index = self.clone();
        tokio::spawn(async move {
            let known: Vec<((String, String), Agent)> = index
                .known
                .lock()
                .await
                .iter()
                .filter(|(_, known)| known.seen.claim_uid == claim.uid)
                .map(|(key, known)| (key.clone(), known.seen.agent.clone()))
                .collect();
            let Some((_, (host, address))) = known.first().cloned() else {
                return;
            };
            if let Err(error) = index
                .relay
                .forget_claim_processes(&host, &address, claim)
                .await
            {
                tracing::warn!(%host, error = %error.message(), "the agent did not forget an ended claim's processes; its next list does");
            }
            let removed = known
                .into_iter()
                .map(|(key, _)| Update::Remove(key))
                .collect();
            if let Err(error) = index.apply(removed).await {
                tracing::warn!(error = %error.message(), "publishing an ended claim's processes' end");
            }
        });
    }

    /// Applies `updates` that change something, each with a new resourceVersion, in one
    /// commit; answers the upserted objects as they are now.
    async fn apply(&self, updates: Vec<Update>) -> Result<Vec<MicroVMProcess>, ApiError> {
        let mut known = self.known.lock().await;
        let mut answers = Vec::new();
        let mut changes = Vec::new();
        for update in updates {
            match update {
                Update::Upsert(seen) => {
                    let key = seen.key();
                    match known.get(&key) {
                        Some(old) if unversioned(&old.seen.object) == unversioned(&seen.object) => {
                            answers.push(old.seen.object.clone());
                        }
                        old => {
                            let change = if old.is_some() {
                                ChangeType::Modified
                            } else {
                                ChangeType::Added
                            };
                            changes.push((key, change, *seen));
                        }
                    }
                }
                Update::Remove(key) => {
                    if let Some(old) = known.get(&key) {
                        changes.push((key, ChangeType::Deleted, old.seen.clone()));
                    }
                }
            }
        }
        if changes.is_empty() {
            return Ok(answers);
        }
        let stamped = self
            .store
            .transact(|tx| -> Result<_, ApiError> {
                let mut stamped = Vec::with_capacity(changes.len());
                for (key, change, mut seen) in changes {
                    let rv = tx.next_resource_version();
                    seen.object.metadata.resource_version = Some(rv.to_string());
                    let store_key = Key::new(RESOURCE, Some(&key.0), &key.1);
                    tx.record_change(&store_key, change, rv, Arc::new(seen.object.clone()));
                    stamped.push((key, change, seen));
                }
                Ok(stamped)
            })
            .await?;
        for (key, change, seen) in stamped {
            if change == ChangeType::Deleted {
                known.remove(&key);
                continue;
            }
            answers.push(seen.object.clone());
            let hold = running(&seen.object).then(|| self.activity.hold(&seen.claim_uid));
            known.insert(key, Known { seen, _hold: hold });
        }
        Ok(answers)
    }
}
