//! `microvmclaims`: a claim is bound inside its create (DESIGN §4): battery's `ClaimVM`
//! is called with a `request_id` derived from the claim's uid, the Bound claim is recorded
//! in one durable write, and the response is already Bound (ADR 22: a lease no record
//! holds is released at start). The metadata store keeps the claim's
//! metadata, spec and status, and battery's lease id (a secret that never leaves it);
//! battery's lease list says whether the lease still lives.
//!
//! `ClaimStorage`'s work is split by job, as k8s.io's `registry/<kind>/` splits storage
//! from strategy: `bind`, `read` (Expired once battery lets the lease go), `follow`
//! (battery's events, the Hosts' readiness), `table`, `lease` (the subresource, and
//! release), `recovery` and `stored`; this file holds the record and the `Storage` verbs.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use battery_api_machinery::status::ApiError;
use battery_api_machinery::table::TableColumnDefinition;
use battery_types::validation::FieldError;
use battery_types::{HasResourceInfo, MicroVMClaim, MicroVMClaimSpec, MicroVMClaimStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::broadcast;

use super::pools::PoolStorage;
use super::{KeyLocks, check_resource_version, commit};
use crate::api::{Deleted, ListPage, RequestContext, Storage, StoredItem};
use crate::battery::{BatteryClient, BatteryEvent, LeaseId};
use crate::meta_store::{Key, MetaStore};
use crate::metrics::Metrics;
use crate::watch::ChangeType;

mod bind;
mod config;
mod exec;
mod follow;
mod lease;
mod quota;
mod read;
mod recovery;
mod stored;
mod table;

use bind::BindsInFlight;
use lease::release;
use read::{Ask, Leased};

pub use config::ClaimConfig;
pub use exec::{ClaimExec, ClaimPortForward, DEFAULT_MAX_SESSIONS, ExecSessions};
pub use lease::ClaimLeases;
pub use quota::{ClaimQuotas, QuotaSource};

const RESOURCE: &str = "microvmclaims";

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

fn key(namespace: &str, name: &str) -> Key {
    Key::new(RESOURCE, Some(namespace), name)
}

fn info() -> &'static battery_types::ResourceInfo {
    &MicroVMClaim::INFO
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
                Arc::new(crate::relay::AgentRelay::new(None)),
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
}

impl Storage for ClaimStorage {
    type Object = MicroVMClaim;

    fn table_columns(&self) -> Vec<TableColumnDefinition> {
        table::columns()
    }

    fn table_cells(&self, claim: &MicroVMClaim) -> Vec<Value> {
        table::ClaimRow::of(claim).cells()
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["spec.poolRef.name", "status.phase"]
    }

    fn field_value(&self, claim: &MicroVMClaim, field: &str) -> Option<String> {
        table::ClaimRow::of(claim).field(field)
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
