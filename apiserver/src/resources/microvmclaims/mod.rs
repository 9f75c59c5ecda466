//! `microvmclaims`: a claim is bound inside its create (DESIGN §4): battery's `ClaimVM`
//! is called with a `request_id` derived from the claim's uid, the Bound claim is recorded
//! in one durable write, and the response is already Bound (ADR 22: a lease no record
//! holds is released at start). The metadata store keeps the claim's
//! metadata, spec and status, and battery's lease id (a secret that never leaves it);
//! battery's lease list says whether the lease still lives.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use battery_api_machinery::status::ApiError;
use battery_api_machinery::table::TableColumnDefinition;
use battery_types::validation::FieldError;
use battery_types::{
    ClaimPhase, HasResourceInfo, LeaseSettings, MicroVMClaim, MicroVMClaimSpec, MicroVMClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::broadcast;

use super::hosts::HostDirectory;
use super::pools::PoolStorage;
use super::{KeyLocks, check_resource_version, commit};
use crate::api::{Deleted, ListPage, RequestContext, Storage, StoredItem};
use crate::battery::objects;
use crate::battery::{BatteryClient, BatteryEvent, EventKind, Failure, LeaseId};
use crate::meta_store::{Key, MetaStore, StoreError};
use crate::metrics::{BindOutcome, Metrics};
use crate::watch::ChangeType;

mod config;
mod exec;
mod lease;
mod quota;
mod recovery;
mod stored;

pub use config::ClaimConfig;
pub use exec::{ClaimExec, ClaimPortForward, DEFAULT_MAX_SESSIONS, ExecSessions};
pub use lease::ClaimLeases;
pub use quota::{ClaimQuotas, QuotaSource};

const RESOURCE: &str = "microvmclaims";
/// ABORTED from ClaimVM means the MicroVM was deleted under the claim: battery says
/// retry. We retry this often, with growing pauses, before answering 409.
const ABORTED_RETRIES: u32 = 4;
/// ReleaseVM answers UNAVAILABLE while the Host cannot delete the MicroVM yet.
const RELEASE_RETRIES: u32 = 5;

/// What the metadata store keeps of a claim.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct ClaimRecord {
    metadata: ObjectMeta,
    spec: MicroVMClaimSpec,
    #[serde(default)]
    status: MicroVMClaimStatus,
    /// battery's lease id, while the claim holds a lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lease: Option<LeaseId>,
    /// The pool's lease lifetime when the claim was bound, for the `lease` subresource's
    /// `leaseDurationSeconds` even after the pool is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lease_duration_seconds: Option<i32>,
    /// What its MicroVM uses, for quotas (recorded where quotas apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    usage: Option<quota::Usage>,
}

/// What a claim's record keeps of its lease beside the status.
#[derive(Debug, Clone, Default)]
struct LeaseRecord {
    lease: Option<LeaseId>,
    duration_seconds: Option<i32>,
    usage: Option<quota::Usage>,
}

impl ClaimRecord {
    /// Its namespace and Pool.
    fn pool(&self) -> (&str, &str) {
        let namespace = self.metadata.namespace.as_deref().unwrap_or_default();
        (namespace, self.spec.pool_ref.name.as_str())
    }

    /// Its lease, as a read asks battery about it; `None` when it holds none.
    fn leased(&self) -> Option<Leased<'_>> {
        self.lease.as_ref()?;
        let (namespace, pool) = self.pool();
        Some(Leased {
            uid: self.metadata.uid.as_deref().unwrap_or_default(),
            namespace,
            pool,
            expires: self.status.lease_expires_at.as_ref(),
        })
    }

    fn lease_record(&self) -> LeaseRecord {
        LeaseRecord {
            lease: self.lease.clone(),
            duration_seconds: self.lease_duration_seconds,
            usage: self.usage,
        }
    }
}

/// A claim that holds a lease, as a read asks battery about it.
struct Leased<'a> {
    uid: &'a str,
    namespace: &'a str,
    pool: &'a str,
    /// The expiry its record holds.
    expires: Option<&'a MicroTime>,
}

/// Which claims a read asks battery about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ask {
    /// Only those whose record alone cannot tell (lists and exec, ADR 21 and 25).
    Unfollowed,
    /// Every one, as a get does: a lease another client of battery released shows as
    /// gone at once.
    Everyone,
}

/// Why a bind did not bind, and how that counts.
struct BindFailure {
    error: ApiError,
    /// `Ambiguous` when battery may have leased anyway (the answer was lost).
    outcome: BindOutcome,
}

impl BindFailure {
    /// Refused for good: nothing was leased.
    fn refused(error: ApiError) -> Self {
        Self {
            error,
            outcome: BindOutcome::Refused,
        }
    }
}

/// The API server itself failed (its metadata store).
impl From<ApiError> for BindFailure {
    fn from(error: ApiError) -> Self {
        Self {
            error,
            outcome: BindOutcome::Failed,
        }
    }
}

impl From<StoreError> for BindFailure {
    fn from(error: StoreError) -> Self {
        ApiError::from(error).into()
    }
}

fn key(namespace: &str, name: &str) -> Key {
    Key::new(RESOURCE, Some(namespace), name)
}

fn info() -> &'static battery_types::ResourceInfo {
    &MicroVMClaim::INFO
}

/// What every claim's `request_id` starts with: a lease with it that no claim's record
/// holds was left by a bind that never answered (see `recover`).
const REQUEST_ID_PREFIX: &str = "microvmclaim/";

/// battery's `request_id` for a claim: stable across retries and restarts, unique per
/// claim, well under battery's 255 bytes.
fn request_id(uid: &str) -> String {
    format!("{REQUEST_ID_PREFIX}{uid}")
}

/// The request ids of the binds between their `ClaimVM` and their claim's record (or
/// their release), which `recover` must not take for left over. One per create in flight,
/// which the server's request limits bound.
#[derive(Default)]
struct BindsInFlight(std::sync::Mutex<HashSet<String>>);

impl BindsInFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Holds `request_id` in flight until the guard drops.
    fn enter(self: &Arc<Self>, request_id: &str) -> InFlight {
        self.lock().insert(request_id.to_owned());
        InFlight {
            binds: self.clone(),
            request_id: request_id.to_owned(),
        }
    }
}

struct InFlight {
    binds: Arc<BindsInFlight>,
    request_id: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.binds.lock().remove(&self.request_id);
    }
}

/// Cheap to clone: a bind runs detached from its request (see `create`).
#[derive(Clone)]
pub struct ClaimStorage {
    battery: BatteryClient,
    store: Arc<MetaStore>,
    pools: Arc<PoolStorage>,
    locks: Arc<KeyLocks>,
    /// battery's events, so a bind waiting for a MicroVM wakes on `VM_AVAILABLE`.
    events: broadcast::Sender<BatteryEvent>,
    /// How long a create waits for a MicroVM when the pool has none available.
    bind_wait: Duration,
    metrics: Arc<Metrics>,
    /// Live exec sessions, ended when their claim loses its lease.
    exec_sessions: Arc<ExecSessions>,
    /// Claims' env and files: read at bind, kept in memory, written at bind.
    config: Arc<ClaimConfig>,
    /// The namespaces' ResourceQuotas, enforced on creates.
    quotas: Arc<ClaimQuotas>,
    /// Whether the follower is subscribed to battery's events and has applied what they
    /// held so far, so a MicroVM battery deleted reaches the records within its batch
    /// window (see `lease_followed`).
    following: Arc<AtomicBool>,
    binds_in_flight: Arc<BindsInFlight>,
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
        Self {
            battery,
            store: store.clone(),
            pools,
            locks: Arc::default(),
            events,
            bind_wait,
            metrics,
            exec_sessions,
            config: Arc::new(ClaimConfig::new(
                None,
                None,
                Arc::new(crate::agent_relay::AgentRelay::new(None)),
            )),
            quotas: Arc::new(ClaimQuotas::new(store, None)),
            following: Arc::default(),
            binds_in_flight: Arc::default(),
        }
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

    fn object(record: ClaimRecord) -> MicroVMClaim {
        let mut claim = MicroVMClaim::new(
            record.metadata.name.as_deref().unwrap_or_default(),
            record.spec,
        );
        claim.metadata = record.metadata;
        claim.status = Some(record.status);
        claim
    }

    /// Writes the claim's record (`lease` kept as given) with a new resourceVersion and
    /// tells watchers.
    async fn commit(
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
        let record = |claim: &MicroVMClaim| ClaimRecord {
            metadata: claim.metadata.clone(),
            spec: claim.spec.clone(),
            status: claim.status.clone().unwrap_or_default(),
            lease: secrets.lease,
            lease_duration_seconds: secrets.duration_seconds,
            usage: secrets.usage,
        };
        commit(&self.store, &key, claim, change, record, |_| Ok(())).await?;
        // Released, expired or deleted: its MicroVM is no longer the Holder's to use.
        if leaseless && let Some(uid) = &claim.metadata.uid {
            self.exec_sessions.end_claim(uid);
            self.config.forget(uid);
        }
        if leaseless {
            self.quotas
                .changed(claim.metadata.namespace.as_deref().unwrap_or_default());
        }
        Ok(())
    }

    /// The request ids of the leases battery still holds, for telling claims of `pools`
    /// (a claim's namespace and Pool) Bound or Expired. battery is asked only of their
    /// Pool when they share one (a get, an exec, a page of one Pool's claims costs what
    /// that Pool holds, not what battery holds), else of every lease; not at all when
    /// `pools` is empty.
    async fn live_request_ids<'a>(
        &self,
        mut pools: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> Result<HashSet<String>, ApiError> {
        let Some(first) = pools.next() else {
            return Ok(HashSet::new());
        };
        let pool = pools.all(|pool| pool == first).then_some(first);
        self.battery
            .leased_request_ids(pool)
            .await
            .map_err(|e| e.into_api_error(info(), ""))
    }

    /// Told by the follower whether it keeps up with battery's events.
    pub fn set_following(&self, following: bool) {
        self.following.store(following, Ordering::Relaxed);
    }

    /// Whether the record of a claim holding a lease that expires at `expires` alone
    /// tells that battery still holds it (ADR 21): the follower keeps up, and the expiry
    /// (battery's own, or reckoned from before the `ClaimVM`, never later than battery's)
    /// is ahead. Lists and exec trust it, so they cost no listing of the Pool's leases (a
    /// get asks battery, ADR 25). A MicroVM battery deleted meanwhile (a forced Pool
    /// deletion) reaches the record within the follower's batch window, which ends exec
    /// sessions; until then flintlock refuses to exec in it, and exec asks battery
    /// (`Ask::Everyone`) before it answers.
    fn lease_followed(&self, expires: Option<&MicroTime>) -> bool {
        let ahead = expires.is_some_and(|expires| expires.0 > Timestamp::now());
        ahead && self.following.load(Ordering::Relaxed)
    }

    /// The uids of the claims in `leased` whose lease battery no longer holds: the one
    /// place a read decides that a Bound claim has expired (`reference/
    /// battery-operator.md` §1.3: a read that finds the lease gone). With
    /// [`Ask::Unfollowed`], a claim whose record alone tells (`lease_followed`) is taken
    /// as live without asking battery.
    async fn released<'a>(
        &self,
        leased: impl IntoIterator<Item = Leased<'a>>,
        ask: Ask,
    ) -> Result<HashSet<String>, ApiError> {
        let asked: Vec<Leased<'a>> = leased
            .into_iter()
            .filter(|claim| ask == Ask::Everyone || !self.lease_followed(claim.expires))
            .collect();
        let live = self
            .live_request_ids(asked.iter().map(|claim| (claim.namespace, claim.pool)))
            .await?;
        Ok(asked
            .into_iter()
            .filter(|claim| !live.contains(&request_id(claim.uid)))
            .map(|claim| claim.uid.to_owned())
            .collect())
    }

    /// Claims as a read sees them: Expired once battery no longer holds their lease
    /// (`released`).
    async fn as_read(
        &self,
        records: Vec<ClaimRecord>,
        ask: Ask,
    ) -> Result<Vec<ClaimRecord>, ApiError> {
        let released = self
            .released(records.iter().filter_map(ClaimRecord::leased), ask)
            .await?;
        Ok(records
            .into_iter()
            .map(|record| {
                let uid = record.metadata.uid.as_deref().unwrap_or_default();
                if released.contains(uid) {
                    expire(record)
                } else {
                    record
                }
            })
            .collect())
    }

    /// One claim as a read sees it ([`ClaimStorage::as_read`]).
    async fn one_as_read(&self, record: ClaimRecord, ask: Ask) -> Result<ClaimRecord, ApiError> {
        let released = self.released(record.leased(), ask).await?;
        Ok(if released.is_empty() {
            record
        } else {
            expire(record)
        })
    }

    /// Calls `ClaimVM`, retrying ABORTED and waiting (bounded) for a MicroVM when the pool
    /// has none available. The lease's expiry is reckoned from the pool's `threshold`:
    /// reading it back from battery would cost a listing of the pool's leases per bind.
    async fn claim_vm(
        &self,
        namespace: &str,
        pool: &str,
        request_id: &str,
        name: &str,
        threshold: Option<battery_types::Duration>,
    ) -> Result<crate::battery::Lease, BindFailure> {
        let deadline = tokio::time::Instant::now() + self.bind_wait;
        let mut aborted = 0;
        loop {
            // Subscribe before asking, so a VM_AVAILABLE between the answer and the wait
            // is not missed.
            let mut events = self.events.subscribe();
            let asked = Timestamp::now();
            let err = match self.battery.claim_vm(namespace, pool, request_id).await {
                Ok(lease) => return Ok(lease.asked_at(asked, threshold)),
                Err(err) => err,
            };
            match err.failure() {
                Failure::Aborted if aborted < ABORTED_RETRIES => {
                    aborted += 1;
                    tokio::time::sleep(Duration::from_millis(50 << aborted)).await;
                }
                Failure::Exhausted => {
                    if !wait_for_available(&mut events, namespace, pool, deadline).await {
                        return Err(BindFailure {
                            error: ApiError::too_many_requests(
                                format!(
                                    "pool {namespace}/{pool} has no MicroVM available; retry later"
                                ),
                                crate::battery::RETRY_AFTER_SECONDS,
                            ),
                            outcome: BindOutcome::Exhausted,
                        });
                    }
                }
                Failure::NotFound => {
                    return Err(BindFailure::refused(ApiError::not_found(
                        &battery_types::Pool::INFO,
                        pool,
                    )));
                }
                _ => {
                    return Err(BindFailure {
                        outcome: if err.is_definitive() {
                            BindOutcome::Refused
                        } else {
                            BindOutcome::Ambiguous
                        },
                        error: err.into_api_error(info(), name),
                    });
                }
            }
        }
    }

    /// The bind of `create`, timed and counted by its outcome.
    async fn bind(
        &self,
        claim: MicroVMClaim,
        resolved: config::Resolved,
    ) -> Result<MicroVMClaim, ApiError> {
        let started = Instant::now();
        let bound = self.bind_steps(claim, resolved).await;
        let outcome = bound
            .as_ref()
            .map_or_else(|f| f.outcome, |_| BindOutcome::Bound);
        self.metrics.record_bind(outcome, started.elapsed());
        bound.map_err(|f| f.error)
    }

    /// Calls `ClaimVM`, writes the claim's files, records the bound claim; a bind that
    /// cannot finish releases what battery leased.
    async fn bind_steps(
        &self,
        mut claim: MicroVMClaim,
        resolved: config::Resolved,
    ) -> Result<MicroVMClaim, BindFailure> {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let pool = claim.spec.pool_ref.name.clone();
        let key = key(&namespace, &name);
        let _guard = self.locks.lock(&key).await;
        if self.store.get::<ClaimRecord>(&key)?.is_some() {
            return Err(BindFailure::refused(ApiError::already_exists(
                info(),
                &name,
            )));
        }
        if self.pools.is_deleting(&namespace, &pool)? {
            return Err(BindFailure::refused(
                ApiError::conflict(
                    info(),
                    &name,
                    format!("pool {namespace}/{pool} is being deleted"),
                )
                .with_specific_reason("PoolDeleting"),
            ));
        }
        // Held until the claim is recorded Bound (or the bind fails), so quotas count it.
        let usage = self.quotas.usage_of(&self.pools, &namespace, &pool).await;
        let _reservation = match usage {
            Some(usage) => self
                .quotas
                .reserve(&namespace, &name, &uid, usage)
                .await
                .map_err(BindFailure::refused)?,
            None => None,
        };
        let request_id = request_id(&uid);
        // Until the claim is recorded: `recover` leaves its lease alone meanwhile.
        let _in_flight = self.binds_in_flight.enter(&request_id);
        // Usually cached; a Pool battery lacks is ClaimVM's to refuse.
        let settings = self.pools.lease_settings(&namespace, &pool).await.ok();
        let threshold = settings.as_ref().map(|s| s.expiry_threshold);
        let lease = match self
            .claim_vm(&namespace, &pool, &request_id, &name, threshold)
            .await
        {
            Ok(lease) => lease,
            Err(failure) if failure.outcome == BindOutcome::Ambiguous => {
                // battery may have leased: the create fails, so whatever it leased is
                // released, now if battery answers, else at the next start.
                let this = self.clone();
                tokio::spawn(async move {
                    if let Err(err) = this
                        .release_abandoned(&namespace, &pool, &request_id, &name)
                        .await
                    {
                        tracing::warn!(error = %err, "releasing an abandoned bind; the next start releases it");
                    }
                });
                return Err(failure);
            }
            // battery said no: nothing was leased, so nothing is left behind.
            Err(failure) => return Err(failure),
        };
        crate::failpoint::crash_point("bind:claimed");
        let lease_id = lease.id.clone();
        let secrets = LeaseRecord {
            lease: None,
            duration_seconds: settings.as_ref().and_then(lease_seconds),
            usage,
        };
        if let Err(failure) = self
            .finish_bind(&mut claim, lease, secrets, resolved.files)
            .await
        {
            // Released before the create answers. If battery does not release for
            // certain, the next start releases every lease no claim holds (`recover`),
            // or the lease expires, whichever comes first.
            if let Err(err) = release(&self.battery, &lease_id, &name).await {
                tracing::warn!(error = %err, claim = %name, "releasing an unfinished bind; the next start releases it");
            }
            return Err(failure);
        }
        self.config.remember(&uid, resolved.env);
        Ok(claim)
    }

    /// The steps of a bind after battery leased: the bound status, the claim's files,
    /// the record that holds the lease.
    async fn finish_bind(
        &self,
        claim: &mut MicroVMClaim,
        lease: crate::battery::Lease,
        mut secrets: LeaseRecord,
        files: Vec<config::FileContent>,
    ) -> Result<(), BindFailure> {
        secrets.lease = Some(bind_status(claim, self.pools.hosts(), lease)?);
        self.config
            .write_files(claim, files)
            .await
            .map_err(BindFailure::refused)?;
        Ok(self.commit(claim, secrets, ChangeType::Added).await?)
    }

    /// Marks claims whose MicroVM battery deleted (expiry, or a forced pool deletion) as
    /// Expired, and tells watchers.
    pub async fn observe(&self, event: &BatteryEvent) -> Result<(), ApiError> {
        if !event.kind.deletes_vm() || event.kind == EventKind::VmDeletedOnRelease {
            return Ok(());
        }
        let (records, _) = self
            .store
            .list::<ClaimRecord>(RESOURCE, Some(&event.namespace))?;
        let holds_vm = |r: &ClaimRecord| {
            r.lease.is_some()
                && r.status
                    .micro_vm
                    .as_ref()
                    .is_some_and(|vm| vm.uid == event.vm_uid)
        };
        let Some(record) = records.into_iter().find(holds_vm) else {
            return Ok(());
        };
        let key = key(
            record.metadata.namespace.as_deref().unwrap_or_default(),
            record.metadata.name.as_deref().unwrap_or_default(),
        );
        let _guard = self.locks.lock(&key).await;
        // Again under the claim's lock: a delete may have released and removed it since.
        let Some(record) = self.store.get::<ClaimRecord>(&key)?.filter(holds_vm) else {
            return Ok(());
        };
        let expired = expire(record);
        let secrets = expired.lease_record();
        let mut claim = Self::object(expired);
        self.commit(&mut claim, secrets, ChangeType::Modified).await
    }

    /// Brings every Bound claim's `HostReady` in line with what the Host directory says
    /// of its Host now, recording (and telling watchers of) those that changed, so get,
    /// list and watch show it. Run on the Host follow loop: a report, or its going stale,
    /// reaches the claims within one loop.
    pub async fn refresh_host_ready(&self) -> Result<(), ApiError> {
        let (records, _) = self.store.list::<ClaimRecord>(RESOURCE, None)?;
        // Many claims share a Host: read each Host's readiness once per pass.
        let mut hosts: HashMap<String, objects::HostReadiness> = HashMap::new();
        for record in records {
            let Some(host) = bound_host(&record) else {
                continue;
            };
            if !hosts.contains_key(&host) {
                let readiness = self.pools.hosts().readiness(&host)?;
                hosts.insert(host.clone(), readiness);
            }
            let readiness = &hosts[&host];
            let mut status = record.status.clone();
            if !objects::refresh_host_ready(&mut status, readiness, record.metadata.generation) {
                continue;
            }
            // Again under the claim's lock: a release or an expiry may have raced the list.
            let key = key(
                record.metadata.namespace.as_deref().unwrap_or_default(),
                record.metadata.name.as_deref().unwrap_or_default(),
            );
            let _guard = self.locks.lock(&key).await;
            let Some(mut current) = self.store.get::<ClaimRecord>(&key)? else {
                continue;
            };
            let generation = current.metadata.generation;
            if bound_host(&current).as_deref() != Some(host.as_str())
                || !objects::refresh_host_ready(&mut current.status, readiness, generation)
            {
                continue;
            }
            let secrets = current.lease_record();
            let mut claim = Self::object(current);
            self.commit(&mut claim, secrets, ChangeType::Modified)
                .await?;
        }
        Ok(())
    }
}

/// A lease's lifetime in whole seconds, as `coordination.k8s.io` Leases give it.
fn lease_seconds(settings: &LeaseSettings) -> Option<i32> {
    i32::try_from(settings.expiry_threshold.as_nanos() / 1_000_000_000).ok()
}

/// Fills a claim's status from battery's answer and what `hosts` says of its Host's exec
/// agent (its address and readiness), returning the lease id to keep.
fn bind_status(
    claim: &mut MicroVMClaim,
    hosts: &HostDirectory,
    lease: crate::battery::Lease,
) -> Result<LeaseId, ApiError> {
    let agent_address = hosts.agent_address(&lease.host_name)?;
    let readiness = hosts.readiness(&lease.host_name)?;
    let (status, id) =
        objects::bound_status(lease, agent_address, &readiness, claim.metadata.generation);
    claim.status = Some(status);
    Ok(id)
}

/// The Host of a Bound claim's MicroVM.
fn bound_host(record: &ClaimRecord) -> Option<String> {
    if record.status.phase != Some(battery_types::ClaimPhase::Bound) {
        return None;
    }
    record.status.host.as_ref().map(|h| h.node_name.clone())
}

/// The record of a claim whose lease is gone.
fn expire(mut record: ClaimRecord) -> ClaimRecord {
    record.lease = None;
    objects::expire(&mut record.status, record.metadata.generation);
    record
}

async fn wait_for_available(
    events: &mut broadcast::Receiver<BatteryEvent>,
    namespace: &str,
    pool: &str,
    deadline: tokio::time::Instant,
) -> bool {
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Err(_) => return false,
            Ok(Ok(e))
                if e.kind == EventKind::VmAvailable
                    && e.namespace == namespace
                    && e.pool == pool =>
            {
                return true;
            }
            Ok(Ok(_)) => {}
            // Missed events: one of them may have been ours, so try again.
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => return true,
            Ok(Err(broadcast::error::RecvError::Closed)) => return false,
        }
    }
}

/// What a claim's Table row and selectable fields show.
struct ClaimRow<'a> {
    pool: &'a str,
    phase: Option<&'a ClaimPhase>,
    node: Option<&'a str>,
    expires: Option<&'a MicroTime>,
    micro_vm: Option<&'a str>,
    holder: &'a str,
}

impl<'a> ClaimRow<'a> {
    fn of(claim: &'a MicroVMClaim) -> Self {
        let status = claim.status.as_ref();
        ClaimRow {
            pool: &claim.spec.pool_ref.name,
            phase: status.and_then(|s| s.phase.as_ref()),
            node: status
                .and_then(|s| s.host.as_ref())
                .map(|h| h.node_name.as_str()),
            expires: status.and_then(|s| s.lease_expires_at.as_ref()),
            micro_vm: status
                .and_then(|s| s.micro_vm.as_ref())
                .map(|vm| vm.uid.as_str()),
            holder: &claim.spec.service_account_name,
        }
    }

    /// The cells of [`ClaimStorage::table_columns`].
    fn cells(&self) -> Vec<Value> {
        let text = |value: Option<&str>| Value::String(value.unwrap_or_default().to_owned());
        vec![
            self.pool.into(),
            self.phase().into(),
            text(self.node),
            self.expires
                .map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
                .unwrap_or_default()
                .into(),
            text(self.micro_vm),
            self.holder.into(),
        ]
    }

    /// The value of one of [`ClaimStorage::selectable_fields`].
    fn field(&self, field: &str) -> Option<String> {
        match field {
            "spec.poolRef.name" => Some(self.pool.to_owned()),
            "status.phase" => Some(self.phase().to_owned()),
            _ => None,
        }
    }

    fn phase(&self) -> &'a str {
        self.phase.map(ClaimPhase::as_str).unwrap_or_default()
    }
}

impl Storage for ClaimStorage {
    type Object = MicroVMClaim;

    fn table_columns(&self) -> Vec<TableColumnDefinition> {
        vec![
            TableColumnDefinition::new("Pool", "string", "The Pool the MicroVM comes from.", 0),
            TableColumnDefinition::new(
                "Phase",
                "string",
                "Bound, or Expired once the lease ran out.",
                0,
            ),
            TableColumnDefinition::new("Node", "string", "The Host the MicroVM runs on.", 0),
            // A string, not a date: kubectl shows a date column as an age, and a future
            // time has none (battery-operator #161).
            TableColumnDefinition::new(
                "Expires",
                "string",
                "When the lease expires unless renewed.",
                0,
            ),
            TableColumnDefinition::new("MicroVM", "string", "The MicroVM's uid.", 1),
            TableColumnDefinition::new(
                "Holder",
                "string",
                "The ServiceAccount that may use the MicroVM.",
                1,
            ),
        ]
    }

    fn table_cells(&self, claim: &MicroVMClaim) -> Vec<Value> {
        ClaimRow::of(claim).cells()
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["spec.poolRef.name", "status.phase"]
    }

    fn field_value(&self, claim: &MicroVMClaim, field: &str) -> Option<String> {
        ClaimRow::of(claim).field(field)
    }

    fn validate(&self, claim: &MicroVMClaim) -> Vec<FieldError> {
        claim.spec.validate()
    }

    fn validate_update(&self, old: &MicroVMClaim, new: &MicroVMClaim) -> Vec<FieldError> {
        MicroVMClaimSpec::validate_update(&old.spec, &new.spec)
    }

    async fn get(&self, ctx: &RequestContext, name: &str) -> Result<MicroVMClaim, ApiError> {
        let namespace = ctx.namespace.as_deref().unwrap_or_default();
        let record = self
            .store
            .get::<ClaimRecord>(&key(namespace, name))?
            .ok_or_else(|| ApiError::not_found(info(), name))?;
        // battery is asked, even of a followed record (ADR 25).
        Ok(Self::object(self.one_as_read(record, Ask::Everyone).await?))
    }

    async fn list(&self, ctx: &RequestContext) -> Result<(Vec<MicroVMClaim>, u64), ApiError> {
        let page = self.list_page(ctx, None, usize::MAX).await?;
        Ok((page.items, page.resource_version))
    }

    /// Reads only the page's claims, and asks battery only about their leases.
    async fn list_page(
        &self,
        ctx: &RequestContext,
        after: Option<&str>,
        limit: usize,
    ) -> Result<ListPage<MicroVMClaim>, ApiError> {
        let page =
            self.store
                .page::<ClaimRecord>(RESOURCE, ctx.namespace.as_deref(), after, limit)?;
        let items = self
            .as_read(page.records, Ask::Unfollowed)
            .await?
            .into_iter()
            .map(Self::object)
            .collect();
        Ok(ListPage {
            items,
            resource_version: page.resource_version,
            rest: page.rest,
        })
    }

    async fn list_page_stored(
        &self,
        ctx: &RequestContext,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Option<ListPage<StoredItem>>, ApiError> {
        self.stored_page(ctx, after, limit).await.map(Some)
    }

    async fn create(
        &self,
        ctx: &RequestContext,
        mut claim: MicroVMClaim,
    ) -> Result<MicroVMClaim, ApiError> {
        claim.status = None;
        // As the requesting user and before anything is leased: a refusal leaves nothing.
        let resolved = self.config.resolve(&ctx.user, &claim).await?;
        let this = self.clone();
        // Detached, so a client that disconnects mid-bind (kube-apiserver gives up after
        // 60 s) leaves no bind half done: it completes and the claim exists.
        tokio::spawn(async move { this.bind(claim, resolved).await })
            .await
            .map_err(ApiError::internal)?
    }

    async fn update(
        &self,
        _ctx: &RequestContext,
        _old: MicroVMClaim,
        mut new: MicroVMClaim,
    ) -> Result<MicroVMClaim, ApiError> {
        let namespace = new.metadata.namespace.clone().unwrap_or_default();
        let name = new.metadata.name.clone().unwrap_or_default();
        let key = key(&namespace, &name);
        let _guard = self.locks.lock(&key).await;
        let record = self
            .store
            .get::<ClaimRecord>(&key)?
            .ok_or_else(|| ApiError::not_found(info(), &name))?;
        check_resource_version(info(), &record.metadata, &new.metadata)?;
        // Only metadata changes through the main resource; status is battery's.
        let secrets = record.lease_record();
        new.status = Some(record.status);
        self.commit(&mut new, secrets, ChangeType::Modified).await?;
        Ok(new)
    }

    async fn delete(
        &self,
        _ctx: &RequestContext,
        claim: MicroVMClaim,
    ) -> Result<Deleted<MicroVMClaim>, ApiError> {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let key = key(&namespace, &name);
        let _guard = self.locks.lock(&key).await;
        let record = self
            .store
            .get::<ClaimRecord>(&key)?
            .ok_or_else(|| ApiError::not_found(info(), &name))?;
        if let Some(lease) = &record.lease {
            // Before the release, whose deleting the MicroVM would end them less clearly.
            if let Some(uid) = &record.metadata.uid {
                self.exec_sessions.end_claim(uid);
            }
            release(&self.battery, lease, &name).await?;
            crate::failpoint::crash_point("release:released");
        }
        let mut claim = Self::object(record);
        self.commit(&mut claim, LeaseRecord::default(), ChangeType::Deleted)
            .await?;
        Ok(Deleted::Gone(claim))
    }
}

/// `ReleaseVM`, retrying while battery has not released for certain; NotFound means
/// battery already let it go (expiry, a forced pool deletion, an earlier release).
async fn release(battery: &BatteryClient, lease: &LeaseId, name: &str) -> Result<(), ApiError> {
    let mut attempt = 0;
    loop {
        match battery.release_vm(lease).await {
            Ok(()) => return Ok(()),
            Err(err) if err.failure() == Failure::NotFound => return Ok(()),
            // Not released for certain (the Host cannot delete the MicroVM yet, or no
            // answer): the claim keeps its lease and asks again.
            Err(err) if !err.is_definitive() && attempt < RELEASE_RETRIES => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
            }
            Err(err) => return Err(err.into_api_error(info(), name)),
        }
    }
}
