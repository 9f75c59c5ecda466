//! ResourceQuota on claims. kube-apiserver runs no admission on what it proxies to us, so
//! its `ResourceQuota` plugin never sees a claim: we enforce the namespace's quotas
//! ourselves, on create and atomically with the bind, as `CheckRequest` does
//! (`apiserver:pkg/admission/plugin/resourcequota/controller.go`), and write what claims
//! use into each quota's status, as the quota controller does for what it knows
//! (`kubernetes:pkg/controller/resourcequota/resource_quota_controller.go`).
//!
//! Used is what the claims in the metadata store use, plus what binds in flight have
//! reserved: a bind reserves under its namespace's lock before `ClaimVM` and gives the
//! reservation back when it ends, bound or not. One replica serves beside battery
//! (DESIGN §3), so this in-process lock is all the atomicity needed. Every claim counts
//! for [`COUNT`] until it is deleted, Expired ones too, because the quota controller
//! counts `count/` resources so and writes that entry too: counting anything else made
//! the two overwrite each other's `used`. Only a Bound claim's MicroVM (one holding a
//! lease) uses vCPUs and memory, which the controller cannot compute and leaves to us.
//! See `docs/adr/0017-quotas-on-claims.md` and
//! `docs/adr/0031-claims-count-as-the-quota-controller-counts-them.md`.

mod quantity;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use battery_api_machinery::status::ApiError;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::ResourceQuota;
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::record::Usage;
use super::record::{ClaimRecord, RESOURCE, info};
use crate::meta_store::{Key, MetaStore};
use crate::resources::KeyLocks;

/// The standard object-count name for claims.
pub const COUNT: &str = "count/microvmclaims.battery.liquidmetal-x.dev";
/// The claimed MicroVMs' vCPUs.
pub const VCPUS: &str = "battery.liquidmetal-x.dev/vcpus";
/// The claimed MicroVMs' memory.
pub const MEMORY: &str = "battery.liquidmetal-x.dev/memory";
/// How long after a bind or a release the quotas' status is written, so a burst of binds
/// costs one write per quota.
const STATUS_DEBOUNCE: Duration = Duration::from_millis(250);
/// Namespaces whose quotas' status one pass writes at most; the rest wait for the next.
const STATUS_NAMESPACES_PER_PASS: usize = 256;

/// Where quotas live: the cluster, for `serve`.
pub trait QuotaSource: Send + Sync {
    /// The namespace's ResourceQuotas, at most briefly stale.
    fn quotas<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Arc<Vec<ResourceQuota>>, ApiError>>;
    /// Merges `patch` (a JSON merge patch of `status`) into a quota's status subresource.
    fn patch_quota_status<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        patch: Value,
    ) -> BoxFuture<'a, Result<(), ApiError>>;
}

impl QuotaSource for crate::cluster::Cluster {
    fn quotas<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Arc<Vec<ResourceQuota>>, ApiError>> {
        Box::pin(self.resource_quotas(namespace))
    }

    fn patch_quota_status<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        patch: Value,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(self.patch_resource_quota_status(namespace, name, patch))
    }
}

/// Totals of our resources over some claims.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Totals {
    count: i64,
    vcpus: i64,
    memory_bytes: i64,
}

impl Totals {
    fn add(&mut self, usage: Usage) {
        self.count += 1;
        self.vcpus += usage.vcpus;
        self.memory_bytes += usage.memory_bytes;
    }

    fn one(usage: Usage) -> Self {
        let mut totals = Self::default();
        totals.add(usage);
        totals
    }

    fn get(&self, resource: Resource) -> i64 {
        match resource {
            Resource::Count => self.count,
            Resource::Vcpus => self.vcpus,
            Resource::Memory => self.memory_bytes,
        }
    }
}

/// One of the names a quota may limit claims by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resource {
    Count,
    Vcpus,
    Memory,
}

impl Resource {
    const ALL: [Self; 3] = [Self::Count, Self::Vcpus, Self::Memory];

    fn name(self) -> &'static str {
        match self {
            Self::Count => COUNT,
            Self::Vcpus => VCPUS,
            Self::Memory => MEMORY,
        }
    }

    /// An amount as kube-apiserver would print it.
    fn print(self, amount: i64) -> String {
        match self {
            Self::Count | Self::Vcpus => quantity::decimal(amount),
            Self::Memory => quantity::binary(amount),
        }
    }
}

/// A limit of one quota on one of our resources.
#[derive(Debug, Clone)]
struct Hard {
    resource: Resource,
    milli: i128,
    /// As the quota gives it: kube-apiserver stores quantities in canonical form, which
    /// is how its refusal prints them.
    given: String,
}

/// What one ResourceQuota limits of claims.
#[derive(Debug, Clone)]
struct Limits {
    quota: String,
    hard: Vec<Hard>,
}

impl Limits {
    /// The quota's limits on our resources; `None` when it names none of them, or has
    /// scopes: every scope (Terminating, BestEffort, PriorityClass...) is about Pods, and
    /// `Matches` with the object-count evaluator's `MatchesNoScopeFunc` never matches a
    /// scoped quota to other objects.
    fn of(quota: &ResourceQuota) -> Option<Self> {
        let spec = quota.spec.as_ref()?;
        if spec.scopes.as_ref().is_some_and(|s| !s.is_empty()) || spec.scope_selector.is_some() {
            return None;
        }
        let given = spec.hard.as_ref()?;
        let hard: Vec<Hard> = Resource::ALL
            .into_iter()
            .filter_map(|resource| {
                let value = given.get(resource.name())?;
                let Some(milli) = quantity::parse_milli(&value.0) else {
                    tracing::warn!(quota = ?quota.metadata.name, resource = resource.name(), value = %value.0, "ignoring a limit that is not a quantity");
                    return None;
                };
                Some(Hard {
                    resource,
                    milli,
                    given: value.0.clone(),
                })
            })
            .collect();
        (!hard.is_empty()).then(|| Self {
            quota: quota.metadata.name.clone().unwrap_or_default(),
            hard,
        })
    }

    /// `CheckRequest`'s test: what is used plus what is asked must stay within every
    /// limit; the refusal names the quota and, for each limit exceeded, the amounts, in
    /// `prettyPrint`'s form (sorted `name=value`, comma-separated).
    fn admit(&self, used: &Totals, requested: &Totals) -> Result<(), String> {
        let mut exceeded: Vec<&Hard> = self
            .hard
            .iter()
            .filter(|h| {
                let after = used.get(h.resource) + requested.get(h.resource);
                i128::from(after) * 1000 > h.milli
            })
            .collect();
        if exceeded.is_empty() {
            return Ok(());
        }
        exceeded.sort_by_key(|h| h.resource.name());
        let list = |amount: &dyn Fn(&Hard) -> String| {
            exceeded
                .iter()
                .map(|h| format!("{}={}", h.resource.name(), amount(h)))
                .collect::<Vec<_>>()
                .join(",")
        };
        Err(format!(
            "exceeded quota: {}, requested: {}, used: {}, limited: {}",
            self.quota,
            list(&|h| h.resource.print(requested.get(h.resource))),
            list(&|h| h.resource.print(used.get(h.resource))),
            list(&|h| h.given.clone()),
        ))
    }

    /// The merge patch that makes the quota's status show our limits and what claims
    /// use, touching no other resource's entries; `None` when it already does.
    fn status_patch(&self, quota: &ResourceQuota, used: &Totals) -> Option<Value> {
        let status = quota.status.clone().unwrap_or_default();
        let current = |map: &Option<BTreeMap<String, _>>, name: &str| {
            map.as_ref()
                .and_then(
                    |m: &BTreeMap<
                        String,
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity,
                    >| m.get(name),
                )
                .map(|q| q.0.clone())
        };
        let mut hard = serde_json::Map::new();
        let mut in_use = serde_json::Map::new();
        let mut changed = false;
        for resource in Resource::ALL {
            let name = resource.name();
            let limit = self.hard.iter().find(|h| h.resource == resource);
            let want_hard = limit.map(|h| h.given.clone());
            let want_used = limit.map(|_| resource.print(used.get(resource)));
            // A limit gone from `spec.hard` goes from the status too (null deletes it).
            for (map, now, want) in [
                (&mut hard, current(&status.hard, name), want_hard),
                (&mut in_use, current(&status.used, name), want_used),
            ] {
                if now != want {
                    changed = true;
                    map.insert(name.to_owned(), want.map_or(Value::Null, Value::String));
                }
            }
        }
        changed.then(|| json!({"status": {"hard": hard, "used": in_use}}))
    }
}

/// The quotas of claims: reservations of binds in flight, and the writer of status.
pub struct ClaimQuotas {
    source: Option<Arc<dyn QuotaSource>>,
    store: Arc<MetaStore>,
    /// One per namespace: a check and its reservation happen as one step.
    locks: KeyLocks,
    /// Per namespace, what each bind in flight (by claim uid) reserved.
    reserved: Mutex<HashMap<String, HashMap<String, Usage>>>,
    /// Namespaces whose quotas' status may be behind.
    dirty: Mutex<HashSet<String>>,
    wake: Notify,
}

/// A bind's hold on quota; dropped when the bind ends, after a successful bind has
/// recorded its claim (which then counts instead).
pub struct Reservation {
    quotas: Arc<ClaimQuotas>,
    namespace: String,
    uid: String,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut reserved = self
            .quotas
            .reserved
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(binds) = reserved.get_mut(&self.namespace) {
            binds.remove(&self.uid);
            if binds.is_empty() {
                reserved.remove(&self.namespace);
            }
        }
        drop(reserved);
        self.quotas.changed(&self.namespace);
    }
}

impl ClaimQuotas {
    /// Quotas from `source`; none at all without one (`dev`).
    pub fn new(store: Arc<MetaStore>, source: Option<Arc<dyn QuotaSource>>) -> Self {
        Self {
            source,
            store,
            locks: KeyLocks::default(),
            reserved: Mutex::default(),
            dirty: Mutex::default(),
            wake: Notify::new(),
        }
    }

    /// Whether any quota can apply: without a cluster there are none.
    pub fn enabled(&self) -> bool {
        self.source.is_some()
    }

    /// What a claim on a Pool of MicroVMs of `vm_size` (vCPUs, MiB) will use, for quotas;
    /// `None` where none apply (`dev`). A Pool battery lacks is ClaimVM's to refuse: the
    /// claim then counts only itself.
    pub fn usage_of(&self, vm_size: Option<(i32, i32)>) -> Option<Usage> {
        self.enabled()
            .then(|| vm_size.map_or_else(Usage::default, |(vcpu, mib)| Usage::of_vm(vcpu, mib)))
    }

    /// Admits the bind of claim `name` (`uid`) using `usage` against every quota of
    /// `namespace`, and reserves that usage until the returned reservation is dropped.
    /// A refusal is the quota plugin's `403 Forbidden`.
    pub async fn reserve(
        self: &Arc<Self>,
        namespace: &str,
        name: &str,
        uid: &str,
        usage: Usage,
    ) -> Result<Option<Reservation>, ApiError> {
        let Some(source) = &self.source else {
            return Ok(None);
        };
        // Under the lock, so that a cold cache is read once, not by every create waiting.
        let _guard = self
            .locks
            .lock(&Key::new("resourcequotas", Some(namespace), ""))
            .await;
        let quotas = source.quotas(namespace).await?;
        let mut limits: Vec<Limits> = quotas.iter().filter_map(Limits::of).collect();
        if limits.is_empty() {
            return Ok(None);
        }
        // The lister's order, by name: the first quota exceeded is the one named.
        limits.sort_by(|a, b| a.quota.cmp(&b.quota));
        let used = self.used(namespace)?;
        let requested = Totals::one(usage);
        for quota in &limits {
            quota
                .admit(&used, &requested)
                .map_err(|why| ApiError::forbidden_object(info(), name, why))?;
        }
        self.reserved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(namespace.to_owned())
            .or_default()
            .insert(uid.to_owned(), usage);
        Ok(Some(Reservation {
            quotas: self.clone(),
            namespace: namespace.to_owned(),
            uid: uid.to_owned(),
        }))
    }

    /// What the namespace's claims and binds in flight use; a claim recorded while its
    /// bind still holds the reservation counts once. Every claim the store holds counts
    /// as one, as the quota controller counts the objects it lists (Expired, and being
    /// deleted, too); only one holding a lease uses its MicroVM's vCPUs and memory. Binds
    /// record their claims and drop their reservations without the namespace's lock, so
    /// the reservations are read first: a bind whose reservation is already gone has
    /// already recorded its claim.
    fn used(&self, namespace: &str) -> Result<Totals, ApiError> {
        let mut usages: HashMap<String, Usage> = self
            .reserved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(namespace)
            .cloned()
            .unwrap_or_default();
        let (records, _) = self.store.list::<ClaimRecord>(RESOURCE, Some(namespace))?;
        usages.extend(records.into_iter().map(|r| {
            let usage = match r.lease {
                Some(_) => r.usage.unwrap_or_default(),
                // Expired: its MicroVM is gone, the object still counts.
                None => Usage::default(),
            };
            (r.metadata.uid.unwrap_or_default(), usage)
        }));
        let mut totals = Totals::default();
        usages.into_values().for_each(|usage| totals.add(usage));
        Ok(totals)
    }

    /// Says a claim of `namespace` took or gave back quota: its quotas' status is
    /// written soon.
    pub fn changed(&self, namespace: &str) {
        if self.source.is_none() {
            return;
        }
        self.dirty
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(namespace.to_owned());
        // A permit is kept if the writer is busy, so no change goes unwritten.
        self.wake.notify_one();
    }

    /// Writes the status of the quotas of namespaces whose claims changed, a short while
    /// after they did, until the server stops. Runs as one background task.
    pub async fn write_status(self: Arc<Self>) {
        let Some(source) = self.source.clone() else {
            return;
        };
        loop {
            self.wake.notified().await;
            tokio::time::sleep(STATUS_DEBOUNCE).await;
            let namespaces: Vec<String> = {
                let mut dirty = self.dirty.lock().unwrap_or_else(PoisonError::into_inner);
                let taken: Vec<String> = dirty
                    .iter()
                    .take(STATUS_NAMESPACES_PER_PASS)
                    .cloned()
                    .collect();
                taken.iter().for_each(|ns| {
                    dirty.remove(ns);
                });
                if !dirty.is_empty() {
                    self.wake.notify_one();
                }
                taken
            };
            for namespace in namespaces {
                if let Err(err) = self.write_namespace(source.as_ref(), &namespace).await {
                    tracing::warn!(%namespace, error = %err, "writing the status of quotas on claims");
                }
            }
        }
    }

    async fn write_namespace(
        &self,
        source: &dyn QuotaSource,
        namespace: &str,
    ) -> Result<(), ApiError> {
        let quotas = source.quotas(namespace).await?;
        let used = self.used(namespace)?;
        for quota in quotas.iter() {
            let Some(limits) = Limits::of(quota) else {
                continue;
            };
            if let Some(patch) = limits.status_patch(quota, &used) {
                source
                    .patch_quota_status(namespace, &limits.quota, patch)
                    .await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
