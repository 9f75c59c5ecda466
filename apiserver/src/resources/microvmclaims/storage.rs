//! The claims' storage: what its verbs share. Its work is split by job into the files
//! beside it (`bind`, `read`, `follow`, `lease`, `recovery`, `stored`, `access`), each an
//! `impl ClaimStorage` that imports this file and `record`, never `mod.rs`.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use battery_api_machinery::status::ApiError;
use battery_types::MicroVMClaim;
use tokio::sync::broadcast;

use super::activity::{self, ClaimActivity};
use super::config::ClaimConfig;
use super::exec::ExecSessions;
use super::limited::LimitedClaims;
use super::processes::index::ProcessIndex;
use super::quota::{ClaimQuotas, QuotaSource};
use super::record::{ClaimRecord, LeaseRecord, key};
use super::token::Rotations;
use crate::battery::{BatteryClient, BatteryEvent};
use crate::meta_store::MetaStore;
use crate::metrics::Metrics;
use crate::resources::hosts::HostDirectory;
use crate::resources::pools::PoolStorage;
use crate::resources::{KeyLocks, commit};
use crate::watch::ChangeType;

/// The request ids of the binds between their `ClaimVM` and their claim's record (or
/// their release), which `recover` must not take for left over. One per create in flight,
/// which the server's request limits bound.
#[derive(Default)]
pub(super) struct BindsInFlight(std::sync::Mutex<HashSet<String>>);

impl BindsInFlight {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Holds `request_id` in flight until the guard drops.
    pub(super) fn enter(self: &Arc<Self>, request_id: &str) -> InFlight {
        self.lock().insert(request_id.to_owned());
        InFlight {
            binds: self.clone(),
            request_id: request_id.to_owned(),
        }
    }
}

pub(super) struct InFlight {
    binds: Arc<BindsInFlight>,
    request_id: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.binds.lock().remove(&self.request_id);
    }
}

/// Cheap to clone: a bind outlives a request that goes away (see `create`).
#[derive(Clone)]
pub struct ClaimStorage {
    pub(super) battery: BatteryClient,
    pub(super) store: Arc<MetaStore>,
    pub(super) pools: Arc<PoolStorage>,
    /// The Hosts, for where a claim's MicroVM runs and its agent listens.
    pub(super) hosts: Arc<HostDirectory>,
    pub(super) locks: Arc<KeyLocks>,
    /// battery's events, so a bind waiting for a MicroVM wakes on `VM_AVAILABLE`.
    pub(super) events: broadcast::Sender<BatteryEvent>,
    /// How long a create waits for a MicroVM when the pool has none available.
    pub(super) bind_wait: Duration,
    pub(super) metrics: Arc<Metrics>,
    /// Live exec sessions, ended when their claim loses its lease.
    pub(super) exec_sessions: Arc<ExecSessions>,
    /// Claims' env and files: read at bind, kept in memory, written at bind.
    pub(super) config: Arc<ClaimConfig>,
    /// The namespaces' ResourceQuotas, enforced on creates.
    pub(super) quotas: Arc<ClaimQuotas>,
    /// Whether the follower is subscribed to battery's events and has applied what they
    /// held so far, so a MicroVM battery deleted reaches the records within its batch
    /// window (see `lease_followed`).
    pub(super) following: Arc<AtomicBool>,
    pub(super) binds_in_flight: Arc<BindsInFlight>,
    /// The claims' use, which their exec sessions keep, for idle timeouts.
    pub(super) activity: Arc<ClaimActivity>,
    /// The Bound claims under an idle timeout or a maximum lifetime (`limits`).
    pub(super) limited: Arc<LimitedClaims>,
    /// The token rotations of the Bound claims whose guests have a ServiceAccount token.
    pub(super) rotations: Arc<Rotations>,
    /// The background processes last seen in the claims' MicroVMs, forgotten with their
    /// claim.
    pub(super) processes: Arc<ProcessIndex>,
}

impl ClaimStorage {
    pub fn new(
        battery: BatteryClient,
        store: Arc<MetaStore>,
        pools: Arc<PoolStorage>,
        events: broadcast::Sender<BatteryEvent>,
        bind_wait: Duration,
        metrics: Arc<Metrics>,
        exec_sessions: Arc<ExecSessions>,
    ) -> Self {
        let processes = Arc::new(ProcessIndex::new(
            store.clone(),
            exec_sessions.activity(),
            Arc::new(crate::relay::AgentRelay::new(None)),
        ));
        Self {
            battery,
            store: store.clone(),
            hosts: pools.hosts().clone(),
            pools,
            locks: Arc::default(),
            events,
            bind_wait,
            metrics,
            config: Arc::new(ClaimConfig::new(
                None,
                None,
                Arc::new(crate::relay::AgentRelay::new(None)),
            )),
            quotas: Arc::new(ClaimQuotas::new(store, None)),
            following: Arc::default(),
            binds_in_flight: Arc::default(),
            activity: exec_sessions.activity(),
            limited: Arc::default(),
            rotations: Arc::default(),
            processes,
            exec_sessions,
        }
    }

    /// Reaches the claims' background processes through `relay`.
    #[must_use]
    pub fn with_relay(mut self, relay: Arc<crate::relay::AgentRelay>) -> Self {
        self.processes = Arc::new(ProcessIndex::new(
            self.store.clone(),
            self.activity.clone(),
            relay,
        ));
        self
    }

    /// The background processes last seen in the claims' MicroVMs.
    pub(super) fn process_index(&self) -> Arc<ProcessIndex> {
        self.processes.clone()
    }

    /// How claims' env and files are read and written; without it, as in `dev`, only
    /// literal env values are taken.
    #[must_use]
    pub fn with_config(mut self, config: ClaimConfig) -> Self {
        self.config = Arc::new(config);
        self
    }

    /// Enforces the ResourceQuotas `source` holds on creates.
    #[must_use]
    pub fn with_quotas(mut self, source: Arc<dyn QuotaSource>) -> Self {
        self.quotas = Arc::new(ClaimQuotas::new(self.store.clone(), Some(source)));
        self
    }

    /// The quotas on claims, whose status writer the server runs.
    pub fn quotas(&self) -> Arc<ClaimQuotas> {
        self.quotas.clone()
    }

    /// Writes the claim's record (`lease` kept as given) with a new resourceVersion and
    /// tells watchers.
    pub(super) async fn commit(
        &self,
        claim: &mut MicroVMClaim,
        secrets: LeaseRecord,
        change: ChangeType,
    ) -> Result<(), ApiError> {
        let key = key(
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            claim.metadata.name.as_deref().unwrap_or_default(),
        );
        let leaseless = secrets.lease.is_none();
        let had_token = secrets.token.is_some();
        let record = |claim: &MicroVMClaim| ClaimRecord::of(claim, secrets);
        let activity = activity::key(
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            claim.metadata.name.as_deref().unwrap_or_default(),
        );
        commit(&self.store, &key, claim, change, record, |tx| {
            if change == ChangeType::Deleted {
                tx.delete(&activity)?;
            }
            Ok(())
        })
        .await?;
        // Released, expired or deleted: its MicroVM is no longer the Holder's to use.
        if leaseless && let Some(uid) = &claim.metadata.uid {
            self.exec_sessions.end_claim(uid);
            self.processes.end_claim(crate::relay::ClaimRef {
                namespace: claim.metadata.namespace.clone().unwrap_or_default(),
                name: claim.metadata.name.clone().unwrap_or_default(),
                uid: uid.clone(),
            });
            self.config.forget(uid);
            self.activity.forget(uid);
            self.limited.forget(uid);
            // Its token stops authenticating once its binding Secret is gone.
            self.rotations.end(uid);
            if had_token {
                let namespace = claim.metadata.namespace.clone().unwrap_or_default();
                self.config.end_token(namespace, uid.clone());
            }
        }
        if leaseless {
            self.quotas
                .changed(claim.metadata.namespace.as_deref().unwrap_or_default());
        }
        Ok(())
    }
}
