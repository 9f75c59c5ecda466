//! `poolmgr.v1alpha1.PoolAdmin` (§3.2, §4.2, §4.7).

use std::sync::Arc;

use battery_proto::poolmgr::v1alpha1::pool_admin_server::PoolAdmin;
use battery_proto::poolmgr::v1alpha1::{
    CreatePoolRequest, DeletePoolRequest, EventType, GetPoolRequest, HookFailurePolicy,
    ListPoolsRequest, ListPoolsResponse, Pool, PoolSpec, ReplenishmentStrategyType,
    UpdatePoolRequest, VmRecord,
};
use futures::future::join_all;
use tokio::sync::{OwnedMutexGuard, RwLockReadGuard};
use tonic::{Request, Response, Status};

use super::engine::Engine;
use super::errors::internal;
use super::lifecycle;
use super::model::{PoolKey, VmCounts, has_static_network};
use super::reconciler;
use super::store::Tombstone;

pub(crate) struct PoolAdminService {
    engine: Arc<Engine>,
}

impl PoolAdminService {
    pub(crate) fn new(engine: Arc<Engine>) -> Self {
        Self { engine }
    }

    /// Every flintlock_hosts entry must be a registered host.
    fn check_hosts(&self, spec: &PoolSpec) -> Result<(), Status> {
        let unknown = self
            .engine
            .store
            .unknown_hosts(&spec.flintlock_hosts)
            .map_err(internal)?;
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(Status::invalid_argument(format!(
                "spec.flintlock_hosts: unknown hosts {}; add them with HostAdmin.AddHost first",
                unknown.join(", ")
            )))
        }
    }

    fn pool(&self, spec: PoolSpec) -> Result<Response<Pool>, Status> {
        let counts = self
            .engine
            .store
            .pool_counts(&PoolKey::of_spec(&spec))
            .map_err(internal)?;
        Ok(Response::new(to_pool(spec, counts)))
    }
}

fn to_pool(spec: PoolSpec, counts: VmCounts) -> Pool {
    Pool {
        spec: Some(spec),
        status: Some(counts.status()),
    }
}

/// CreatePool/UpdatePool's spec rules, in battery's order (§3.2).
pub(crate) fn validate_spec(spec: &PoolSpec) -> Result<(), Status> {
    let invalid = |msg: &str| Err(Status::invalid_argument(msg));
    if spec.name.is_empty() {
        return invalid("spec.name is required");
    }
    if spec.namespace.is_empty() {
        return invalid("spec.namespace is required");
    }
    let strategy = spec
        .replenishment_strategy
        .and_then(|s| ReplenishmentStrategyType::try_from(s.r#type).ok())
        .unwrap_or(ReplenishmentStrategyType::Unspecified);
    if strategy == ReplenishmentStrategyType::Unspecified {
        return invalid(
            "spec.replenishment_strategy.type must be IMMEDIATE_ON_LEASE, MIN_SIZE_THRESHOLD or REPLACE_ON_DELETE",
        );
    }
    let min_size = spec.replenishment_strategy.and_then(|s| s.min_size);
    if strategy == ReplenishmentStrategyType::MinSizeThreshold && min_size.is_none_or(|m| m <= 0) {
        return invalid(
            "spec.replenishment_strategy.min_size must be set and > 0 for MIN_SIZE_THRESHOLD",
        );
    }
    let policy = HookFailurePolicy::try_from(spec.hook_failure_policy)
        .unwrap_or(HookFailurePolicy::Unspecified);
    if policy == HookFailurePolicy::Unspecified {
        return invalid("spec.hook_failure_policy must be DELETE_AND_REPLACE or QUARANTINE");
    }
    let Some(template) = &spec.microvm_template else {
        return invalid("spec.microvm_template is required");
    };
    let holds_several = spec.size > 1
        || strategy == ReplenishmentStrategyType::ImmediateOnLease
        || policy == HookFailurePolicy::Quarantine;
    if has_static_network(template) && holds_several {
        return invalid(
            "spec.microvm_template sets an interface guest_mac or static address, which only a pool of at most one VM may do (size <= 1, not IMMEDIATE_ON_LEASE, not QUARANTINE); use DHCP",
        );
    }
    Ok(())
}

/// Restarts a pool's reconciler if DeletePool is cut short while waiting for it to stop
/// (§3.2: the pool is kept and its reconciler restarted).
struct RestartOnDrop {
    engine: Arc<Engine>,
    key: PoolKey,
    armed: bool,
}

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        if self.armed {
            restart(&self.engine, &self.key);
        }
    }
}

fn restart(engine: &Arc<Engine>, key: &PoolKey) {
    match engine.store.get_pool(key) {
        Ok(Some(spec)) => reconciler::start(engine, spec),
        Ok(None) => {}
        Err(err) => tracing::warn!(pool = %key, error = %err, "restarting the reconciler failed"),
    }
}

/// DeletePool's detached part (§4.7 step 5): VM_DELETED_ON_POOL_DELETE for every VM,
/// then all flintlock deletes concurrently; failures are left to the sweeper.
async fn drain(engine: Arc<Engine>, key: PoolKey, vms: Vec<VmRecord>) {
    for vm in &vms {
        engine.emit(&key, &vm.uid, EventType::VmDeletedOnPoolDelete);
    }
    let engine = &engine;
    join_all(vms.iter().map(|vm| async move {
        if let Err(err) = lifecycle::delete_vm(engine, vm).await {
            tracing::warn!(pool = %PoolKey::of_vm(vm), vm = %vm.uid, error = %err, "pool delete: VM deletion failed; the sweeper retries");
        }
    }))
    .await;
}

/// A spec that passed CreatePool/UpdatePool's checks, with the locks its write needs.
struct Admitted<'a> {
    key: PoolKey,
    _pool: OwnedMutexGuard<()>,
    _host_refs: RwLockReadGuard<'a, ()>,
}

impl PoolAdminService {
    /// The checks CreatePool and UpdatePool share, in battery's order (§3.2): the spec,
    /// then the pool's lock and a share of the host references' lock (both held by the
    /// caller until its write, so RemoveHost cannot slip between the check and the
    /// write), then the hosts.
    /// A valid spec gets `allow_guest_agent = true`, stored and returned so, as poolmgrd's
    /// validator sets it.
    async fn admit(&self, spec: &mut PoolSpec) -> Result<Admitted<'_>, Status> {
        validate_spec(spec)?;
        if let Some(template) = spec.microvm_template.as_mut() {
            template.allow_guest_agent = true;
        }
        let key = PoolKey::of_spec(spec);
        let pool = self.engine.lock_pool(&key).await;
        let host_refs = self.engine.host_refs.read().await;
        self.check_hosts(spec)?;
        Ok(Admitted {
            key,
            _pool: pool,
            _host_refs: host_refs,
        })
    }
}

#[tonic::async_trait]
impl PoolAdmin for PoolAdminService {
    async fn create_pool(
        &self,
        request: Request<CreatePoolRequest>,
    ) -> Result<Response<Pool>, Status> {
        let mut spec = request.into_inner().spec.unwrap_or_default();
        let Admitted { key, .. } = &self.admit(&mut spec).await?;
        if !self.engine.store.insert_pool(&spec).map_err(internal)? {
            return Err(Status::already_exists(format!("pool {key} already exists")));
        }
        tracing::info!(pool = %key, "pool created");
        reconciler::start(&self.engine, spec.clone());
        self.pool(spec)
    }

    async fn update_pool(
        &self,
        request: Request<UpdatePoolRequest>,
    ) -> Result<Response<Pool>, Status> {
        let mut spec = request.into_inner().spec.unwrap_or_default();
        let Admitted { key, .. } = &self.admit(&mut spec).await?;
        if !self.engine.store.replace_pool(&spec).map_err(internal)? {
            return Err(Status::not_found(format!("pool {key} not found")));
        }
        tracing::info!(pool = %key, "pool updated");
        // A new spec applies to new VMs only: no rollout, no scale-down (§4.2).
        reconciler::start(&self.engine, spec.clone());
        self.pool(spec)
    }

    async fn delete_pool(
        &self,
        request: Request<DeletePoolRequest>,
    ) -> Result<Response<()>, Status> {
        let request = request.into_inner();
        let key = PoolKey::of_ref(request.r#ref.as_ref());
        let _lock = self.engine.lock_pool(&key).await;
        let store = &self.engine.store;
        let not_found = || Status::not_found(format!("pool {key} not found"));
        let leased = |n: i32| {
            Status::failed_precondition(format!(
                "pool {key} has {n} leased VMs, release them or delete with force"
            ))
        };
        let Some((_, counts)) = store.get_pool_with_counts(&key).map_err(internal)? else {
            return Err(not_found());
        };
        if !request.force && counts.leased_or_claiming() > 0 {
            return Err(leased(counts.leased_or_claiming()));
        }
        // Stop the reconciler and wait for it and any earlier one still exiting: their
        // provisions in flight are hook-failed first, and none adds a VM after the
        // tombstone. Only the caller's deadline bounds the wait (§3.2).
        let mut guard = RestartOnDrop {
            engine: Arc::clone(&self.engine),
            key: key.clone(),
            armed: true,
        };
        self.engine.reconcilers.stop(&key).wait().await;
        guard.armed = false;
        let vms = match store.tombstone_pool(&key, request.force) {
            Ok(Tombstone::Deleted(vms)) => vms,
            Ok(Tombstone::NotFound) => return Err(not_found()),
            Ok(Tombstone::Leased) => {
                // A claim landed after the first count: poolmgrd's recount names no number.
                restart(&self.engine, &key);
                return Err(Status::failed_precondition(format!(
                    "pool {key} has leased VMs, release them or delete with force"
                )));
            }
            Err(err) => {
                restart(&self.engine, &key);
                return Err(internal(err));
            }
        };
        tracing::info!(pool = %key, vms = vms.len(), force = request.force, "pool deleted");
        // Detached from the caller: a cancelled DeletePool still emits and deletes.
        let engine = Arc::clone(&self.engine);
        self.engine.detached(drain(engine, key, vms)).await;
        Ok(Response::new(()))
    }

    async fn get_pool(&self, request: Request<GetPoolRequest>) -> Result<Response<Pool>, Status> {
        let key = PoolKey::of_ref(request.into_inner().r#ref.as_ref());
        match self
            .engine
            .store
            .get_pool_with_counts(&key)
            .map_err(internal)?
        {
            Some((spec, counts)) => Ok(Response::new(to_pool(spec, counts))),
            None => Err(Status::not_found(format!("pool {key} not found"))),
        }
    }

    async fn list_pools(
        &self,
        request: Request<ListPoolsRequest>,
    ) -> Result<Response<ListPoolsResponse>, Status> {
        // Presence matters: unset lists every namespace, Some("") only namespace "".
        let namespace = request.into_inner().namespace;
        let pools = self
            .engine
            .store
            .list_pools_with_counts(namespace.as_deref())
            .map_err(internal)?
            .into_iter()
            .map(|(spec, counts)| to_pool(spec, counts))
            .collect();
        Ok(Response::new(ListPoolsResponse { pools }))
    }
}

#[cfg(test)]
mod tests {
    use battery_proto::flintlock::types::{MicroVmSpec, NetworkInterface, StaticAddress};
    use battery_proto::poolmgr::v1alpha1::ReplenishmentStrategy;
    use tonic::Code;

    use super::*;

    fn valid() -> PoolSpec {
        PoolSpec {
            name: "p".into(),
            namespace: "ns".into(),
            microvm_template: Some(MicroVmSpec::default()),
            size: 2,
            replenishment_strategy: Some(ReplenishmentStrategy {
                r#type: ReplenishmentStrategyType::ReplaceOnDelete as i32,
                min_size: None,
            }),
            hook_failure_policy: HookFailurePolicy::DeleteAndReplace as i32,
            ..PoolSpec::default()
        }
    }

    fn rejected(spec: &PoolSpec, needle: &str) {
        let status = validate_spec(spec).expect_err(needle);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains(needle), "{}", status.message());
    }

    #[test]
    fn accepts_a_valid_spec_including_size_zero() {
        assert!(validate_spec(&valid()).is_ok());
        let mut spec = valid();
        spec.size = 0;
        assert!(validate_spec(&spec).is_ok());
    }

    #[test]
    fn rejects_in_battery_order() {
        let mut spec = valid();
        spec.name.clear();
        spec.namespace.clear();
        rejected(&spec, "spec.name");
        spec.name = "p".into();
        rejected(&spec, "spec.namespace");

        let mut spec = valid();
        spec.replenishment_strategy = None;
        spec.hook_failure_policy = 0;
        rejected(&spec, "replenishment_strategy.type");
        spec.replenishment_strategy = Some(ReplenishmentStrategy {
            r#type: 42,
            min_size: None,
        });
        rejected(&spec, "replenishment_strategy.type");
        spec.replenishment_strategy = Some(ReplenishmentStrategy {
            r#type: ReplenishmentStrategyType::MinSizeThreshold as i32,
            min_size: Some(0),
        });
        rejected(&spec, "min_size");
        spec.replenishment_strategy = Some(ReplenishmentStrategy {
            r#type: ReplenishmentStrategyType::MinSizeThreshold as i32,
            min_size: Some(1),
        });
        rejected(&spec, "hook_failure_policy");
        spec.hook_failure_policy = HookFailurePolicy::Quarantine as i32;
        spec.microvm_template = None;
        rejected(&spec, "microvm_template is required");
    }

    #[test]
    fn static_network_needs_a_single_vm_pool() {
        let mut spec = valid();
        spec.size = 1;
        if let Some(template) = spec.microvm_template.as_mut() {
            template.interfaces.push(NetworkInterface {
                address: Some(StaticAddress {
                    address: "10.0.0.2/24".into(),
                    ..StaticAddress::default()
                }),
                ..NetworkInterface::default()
            });
        }
        assert!(validate_spec(&spec).is_ok());
        let mut bigger = spec.clone();
        bigger.size = 2;
        rejected(&bigger, "guest_mac or static address");
        let mut quarantine = spec.clone();
        quarantine.hook_failure_policy = HookFailurePolicy::Quarantine as i32;
        rejected(&quarantine, "guest_mac or static address");
        let mut immediate = spec;
        immediate.replenishment_strategy = Some(ReplenishmentStrategy {
            r#type: ReplenishmentStrategyType::ImmediateOnLease as i32,
            min_size: None,
        });
        rejected(&immediate, "guest_mac or static address");
    }
}
