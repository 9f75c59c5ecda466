//! The Pools' storage: what its verbs share. Its work is split by job into the files
//! beside it (`update`, `deletion`, `adopt`), each an `impl PoolStorage` that imports
//! this file and `record`, never `mod.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::SystemTime;

use battery_api_machinery::status::ApiError;
use battery_types::{ClaimLimits, LeaseSettings, Pool, PoolSpec, PoolStatus};
use futures::future::{BoxFuture, Shared};

use super::record::{Kept, PoolRecord, Respec, info, key};
use super::respec;
use super::respecified::Respecifications;
use crate::battery::objects::{self, PoolMeta};
use crate::battery::{BatteryClient, BatteryError, BatteryPool, Failure};
use crate::clock::server_now;
use crate::meta_store::{Key, MetaStore, StoreError, Txn};
use crate::metrics::{Metrics, PoolCounts};
use crate::resources::hosts::HostDirectory;
use crate::resources::{KeyLocks, commit};
use crate::watch::ChangeType;

/// How long a bind trusts what it last saw of its Pool (`BindSettings`). Our own writes and
/// battery's events about the Pool refresh them at once; this bounds how long a change
/// made with `poolmgrctl` goes unseen.
const BIND_SETTINGS_TTL: std::time::Duration = std::time::Duration::from_secs(10);
const BIND_SETTINGS_CAPACITY: u64 = 10_000;

pub(super) fn counts(status: &PoolStatus) -> PoolCounts {
    PoolCounts {
        available: status.available.into(),
        leased: status.leased.into(),
        provisioning: status.provisioning.into(),
        quarantined: status.quarantined.into(),
    }
}

/// What a bind reads of its Pool: the lease settings, the limits on its claims and the
/// size of its MicroVMs.
#[derive(Debug, Clone)]
pub(crate) struct BindSettings {
    pub(crate) lease: LeaseSettings,
    pub(crate) claim_limits: Option<ClaimLimits>,
    pub(crate) vcpu: i32,
    pub(crate) memory_in_mb: i32,
}

impl BindSettings {
    fn of(spec: &PoolSpec) -> Self {
        Self {
            lease: spec.lease.clone(),
            claim_limits: spec.claim_limits.clone(),
            vcpu: spec.template.vcpu,
            memory_in_mb: spec.template.memory_in_mb,
        }
    }
}

/// What a create of a claim reads of its Pool's record.
pub(crate) struct ClaimTerms {
    /// Being deleted: new claims on it are refused.
    pub(crate) deleting: bool,
    /// The token the Pool gives its claims' guests (`spec.serviceAccountToken`).
    pub(crate) service_account_token: Option<battery_types::ServiceAccountToken>,
}

/// A DeletePool call in flight, shared by every request and event that asks for it.
pub(super) type Deletion = Shared<BoxFuture<'static, Result<(), Arc<BatteryError>>>>;

pub struct PoolStorage {
    pub(super) battery: BatteryClient,
    pub(super) store: Arc<MetaStore>,
    pub(super) hosts: Arc<HostDirectory>,
    pub(super) locks: KeyLocks,
    pub(super) metrics: Arc<Metrics>,
    /// What a bind needs of each Pool, as last read or written, so it needs no `GetPool`.
    bind_settings: moka::sync::Cache<Key, BindSettings>,
    /// battery's DeletePool calls in flight, one per Pool (`deletion`).
    pub(super) deletions: Mutex<HashMap<Key, Deletion>>,
    /// When we changed each Pool's spec in battery or deleted it (`respecified.rs`).
    pub(super) respecified: Respecifications,
    /// The UpdatePool calls in flight, one per Pool, and the changes waiting for them.
    pub(super) respecs: Arc<respec::Coalescer<Key, Respec, BatteryPool, BatteryError>>,
    /// For the tasks a deletion or an UpdatePool leaves running.
    pub(super) this: Weak<PoolStorage>,
    /// Whether claims' ServiceAccount tokens can be had: only with a cluster (not `dev`).
    pub(super) serves_tokens: std::sync::atomic::AtomicBool,
}

impl PoolStorage {
    pub fn new(
        battery: BatteryClient,
        store: Arc<MetaStore>,
        hosts: Arc<HostDirectory>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|this| Self {
            battery,
            store,
            hosts,
            locks: KeyLocks::default(),
            metrics,
            bind_settings: crate::cache::bounded(BIND_SETTINGS_TTL, BIND_SETTINGS_CAPACITY),
            deletions: Mutex::default(),
            respecified: Respecifications::default(),
            respecs: Arc::default(),
            this: this.clone(),
            serves_tokens: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Accepts Pools that give their claims' guests a ServiceAccount token: the server
    /// has a cluster to request them from.
    pub fn serve_tokens(&self) {
        self.serves_tokens
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether battery's failed-hook event for a MicroVM of the Pool that started booting
    /// at `booted` and failed at `failed` is our doing: we changed or deleted the Pool in
    /// between, and battery cancels the boots in flight when we do (its event says no
    /// more than that a hook failed).
    pub fn cancelled_by_us(
        &self,
        namespace: &str,
        name: &str,
        booted: SystemTime,
        failed: SystemTime,
    ) -> bool {
        self.respecified.cancelled(namespace, name, booted, failed)
    }

    /// Keeps the Pool's MicroVM gauges at what was just recorded of it.
    pub(super) fn record_counts(&self, pool: &Pool, change: ChangeType) {
        let namespace = pool.metadata.namespace.as_deref().unwrap_or_default();
        let name = pool.metadata.name.as_deref().unwrap_or_default();
        match (change, &pool.status) {
            (ChangeType::Deleted, _) => self.metrics.forget_pool(namespace, name),
            (_, Some(status)) => self
                .metrics
                .set_pool_counts(namespace, name, counts(status)),
            (_, None) => {}
        }
    }

    /// The Pool as battery holds it, with our metadata, and the spec written through the
    /// API while battery is being told it.
    pub(super) fn assemble(&self, record: Option<PoolRecord>, mut pool: BatteryPool) -> Pool {
        let record = record.unwrap_or_else(|| PoolRecord::adopted(&pool.namespace, &pool.name));
        if let Some(pending) = record.pending {
            pool.spec = pending.spec;
        }
        let meta = PoolMeta {
            metadata: record.metadata,
            placement: record.placement,
            claim_limits: record.claim_limits,
            service_account_token: record.service_account_token,
            previous: &record.conditions,
            rejected: record.rejected.as_deref(),
        };
        objects::pool(meta, pool)
    }

    /// What a create of a claim reads of the Pool, from one read of its record: both are
    /// ours alone, so not asked of battery.
    pub(crate) fn claim_terms(&self, namespace: &str, name: &str) -> Result<ClaimTerms, ApiError> {
        let record = self.store.get::<PoolRecord>(&key(namespace, name))?;
        Ok(ClaimTerms {
            deleting: record
                .as_ref()
                .is_some_and(|r| r.metadata.deletion_timestamp.is_some()),
            service_account_token: record.and_then(|r| r.service_account_token),
        })
    }

    pub(crate) async fn read(&self, namespace: &str, name: &str) -> Result<Pool, ApiError> {
        let pool = self
            .battery
            .pool(namespace, name)
            .await
            .map_err(|e| e.into_api_error(info(), name))?;
        let key = key(namespace, name);
        let record = self.store.get::<PoolRecord>(&key)?;
        // battery's spec, not one still pending, with the limits only our record holds.
        let mut settings = BindSettings::of(&pool.spec);
        settings.claim_limits = record.as_ref().and_then(|r| r.claim_limits.clone());
        self.bind_settings.insert(key, settings);
        Ok(self.assemble(record, pool))
    }

    /// What a bind reads of the Pool, from battery only when not seen lately (the limits
    /// on its claims are ours, but they ride with the read this caches).
    pub(crate) async fn bind_settings(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<BindSettings, ApiError> {
        if let Some(settings) = self.bind_settings.get(&key(namespace, name)) {
            return Ok(settings);
        }
        Ok(BindSettings::of(&self.read(namespace, name).await?.spec))
    }

    /// Writes `object`'s record with a new resourceVersion and tells watchers; `kept` is
    /// what the record holds beside the object.
    pub(super) async fn commit(
        &self,
        object: &mut Pool,
        change: ChangeType,
        kept: Kept,
    ) -> Result<(), ApiError> {
        self.commit_with(object, change, kept, |_| Ok(())).await
    }

    /// `commit`, with `also` written in the same transaction.
    pub(super) async fn commit_with(
        &self,
        object: &mut Pool,
        change: ChangeType,
        kept: Kept,
        also: impl FnOnce(&mut Txn) -> Result<(), StoreError>,
    ) -> Result<(), ApiError> {
        let key = key(
            object.metadata.namespace.as_deref().unwrap_or_default(),
            object.metadata.name.as_deref().unwrap_or_default(),
        );
        let record = |pool: &Pool| PoolRecord {
            metadata: pool.metadata.clone(),
            placement: pool.spec.placement.clone(),
            claim_limits: pool.spec.claim_limits.clone(),
            service_account_token: pool.spec.service_account_token.clone(),
            conditions: pool
                .status
                .as_ref()
                .map(|s| s.conditions.clone())
                .unwrap_or_default(),
            rejected: kept.rejected,
            pending: kept.pending,
        };
        commit(&self.store, &key, object, change, record, also).await?;
        match change {
            ChangeType::Deleted => {
                self.bind_settings.invalidate(&key);
                self.respecified.forget(
                    object.metadata.namespace.as_deref().unwrap_or_default(),
                    object.metadata.name.as_deref().unwrap_or_default(),
                );
            }
            _ => self
                .bind_settings
                .insert(key.clone(), BindSettings::of(&object.spec)),
        }
        self.record_counts(object, change);
        Ok(())
    }

    /// The Host names a Pool's selector resolves to, as battery's `flintlock_hosts`.
    pub(super) async fn resolve_hosts(&self, spec: &PoolSpec) -> Result<Vec<String>, ApiError> {
        let selector = spec
            .placement
            .as_ref()
            .map(|p| p.node_selector.clone())
            .unwrap_or_default();
        self.hosts.matching(&selector).await
    }

    /// Re-reads a Pool after battery reported a change to it, records it and tells
    /// watchers; finishes a blocked deletion once battery lets it go.
    /// `also` is written in the same transaction, if the Pool is written (so the follower's
    /// own bookkeeping costs no commit of its own).
    pub async fn observe(
        &self,
        namespace: &str,
        name: &str,
        also: impl FnOnce(&mut Txn) -> Result<(), StoreError> + Send,
    ) -> Result<(), ApiError> {
        let key = key(namespace, name);
        let _guard = self.locks.lock(&key).await;
        let record = self.store.get::<PoolRecord>(&key)?;
        self.observe_locked(namespace, name, record, also).await
    }

    /// `observe` with the Pool's lock held and its record read.
    pub(super) async fn observe_locked(
        &self,
        namespace: &str,
        name: &str,
        record: Option<PoolRecord>,
        also: impl FnOnce(&mut Txn) -> Result<(), StoreError> + Send,
    ) -> Result<(), ApiError> {
        let pool = match self.battery.pool(namespace, name).await {
            Ok(pool) => pool,
            Err(err) if err.failure() == Failure::NotFound => {
                if let Some(record) = record {
                    let mut object = Pool::new(name, PoolSpec::default());
                    object.metadata = record.metadata;
                    self.commit_with(&mut object, ChangeType::Deleted, Kept::default(), also)
                        .await?;
                }
                return Ok(());
            }
            Err(err) => return Err(err.into_api_error(info(), name)),
        };
        let blocked = record.as_ref().is_some_and(|r| {
            r.metadata.deletion_timestamp.is_some()
                && r.metadata.finalizers.as_ref().is_none_or(Vec::is_empty)
        });
        let adopted = record.is_none();
        let mut record = record;
        if let Some(record) = &mut record
            && !self.respecs.busy(&key(namespace, name))
        {
            // Written by a process that ended before telling battery: nobody was
            // answered that it was made, and battery's spec stands.
            record.pending = None;
        }
        let kept = Kept {
            rejected: record.as_ref().and_then(|r| r.rejected.clone()),
            pending: record.as_ref().and_then(|r| r.pending.clone()),
        };
        let mut object = self.assemble(record, pool);
        if blocked {
            // A deletion battery refused while MicroVMs were leased, or that outlasted its
            // request: ask again; the deletion's own task records the Pool gone.
            drop(self.battery_delete(namespace, name));
        }
        if adopted {
            // First sight of a Pool made outside the API: it exists from now on.
            object.metadata.creation_timestamp = Some(server_now());
            return self
                .commit_with(&mut object, ChangeType::Added, Kept::default(), also)
                .await;
        }
        self.commit_with(&mut object, ChangeType::Modified, kept, also)
            .await
    }

    /// The Hosts Pools are placed on, for what a claim's status shows of its Host.
    pub fn hosts(&self) -> &Arc<HostDirectory> {
        &self.hosts
    }
}
