//! The battery operations tests use, with the boilerplate (requests, clones, unwraps)
//! factored out. `try_*` return the gRPC result; the others assert success.

use std::collections::BTreeSet;
use std::time::Duration;

use battery_proto::flintlock::types::MicroVm;
use battery_proto::poolmgr::v1alpha1::{
    AddHostRequest, ClaimVmRequest, ClaimVmResponse, CordonHostRequest, CreatePoolRequest,
    DeletePoolRequest, EventType, GetHostRequest, GetPoolRequest, HeartbeatRequest, Host,
    HostStatus, LeaseRecord, ListHostsRequest, ListLeasesRequest, ListPoolsRequest, Pool, PoolRef,
    PoolSpec, PoolStatus, ReleaseVmRequest, RemoveHostRequest, SubscribeRequest,
    UncordonHostRequest, UpdatePoolRequest,
};
use tonic::Status;

use crate::events::EventLog;
use crate::flintlock::{self, ExecOutput};
use crate::spec::PoolBuilder;
use crate::suite::{HostRef, Suite};
use crate::{expect_ok, ts_nanos};
use battery_embedded::local::insecure_host;
use battery_telemetry::{consistently, eventually};

impl Suite {
    // ----- pools -----

    /// A pool spec in this test's namespace on all of the suite's Hosts.
    pub fn pool(&self, name: &str) -> PoolBuilder {
        PoolBuilder::new(name, self.namespace(), &self.host_names())
    }

    pub fn pool_ref(&self, name: &str) -> PoolRef {
        PoolRef {
            name: name.to_owned(),
            namespace: self.namespace().to_owned(),
        }
    }

    pub async fn try_create_pool(&self, spec: PoolSpec) -> Result<Pool, Status> {
        let req = CreatePoolRequest { spec: Some(spec) };
        self.pool_admin()
            .create_pool(req)
            .await
            .map(|r| r.into_inner())
    }

    pub async fn try_update_pool(&self, spec: PoolSpec) -> Result<Pool, Status> {
        let req = UpdatePoolRequest { spec: Some(spec) };
        self.pool_admin()
            .update_pool(req)
            .await
            .map(|r| r.into_inner())
    }

    pub async fn get_pool(&self, pool: &PoolRef) -> Result<Pool, Status> {
        let req = GetPoolRequest {
            r#ref: Some(pool.clone()),
        };
        self.pool_admin()
            .get_pool(req)
            .await
            .map(|r| r.into_inner())
    }

    pub async fn list_pools(&self, namespace: Option<&str>) -> Vec<Pool> {
        let req = ListPoolsRequest {
            namespace: namespace.map(str::to_owned),
        };
        expect_ok(self.pool_admin().list_pools(req).await, "ListPools")
            .into_inner()
            .pools
    }

    pub async fn delete_pool(&self, pool: &PoolRef, force: bool) -> Result<(), Status> {
        let req = DeletePoolRequest {
            r#ref: Some(pool.clone()),
            force,
        };
        self.pool_admin().delete_pool(req).await.map(|_| ())
    }

    /// CreatePool, asserting success.
    pub async fn create_pool(&self, spec: PoolSpec) -> PoolRef {
        let pool = PoolRef {
            name: spec.name.clone(),
            namespace: spec.namespace.clone(),
        };
        let created = expect_ok(self.try_create_pool(spec).await, "CreatePool");
        let got = created.spec.expect("CreatePool returns the spec");
        assert_eq!(
            (got.name, got.namespace),
            (pool.name.clone(), pool.namespace.clone())
        );
        pool
    }

    /// UpdatePool, asserting success.
    pub async fn update_pool(&self, spec: PoolSpec) -> Pool {
        expect_ok(self.try_update_pool(spec).await, "UpdatePool")
    }

    /// CreatePool, then wait until `size` VMs are available.
    pub async fn create_ready_pool(&self, spec: PoolSpec) -> PoolRef {
        let size = spec.size;
        let pool = self.create_pool(spec).await;
        self.wait_counts(&pool, size, 0).await;
        pool
    }

    pub async fn status(&self, pool: &PoolRef) -> PoolStatus {
        let got = expect_ok(self.get_pool(pool).await, "GetPool");
        got.status.expect("GetPool returns a status")
    }

    /// Waits until the pool's status satisfies `pred`.
    pub async fn wait_status(
        &self,
        pool: &PoolRef,
        what: &str,
        pred: impl Fn(&PoolStatus) -> bool,
    ) -> PoolStatus {
        let what = format!("pool {}: {what}", pool.name);
        eventually(self.timing().timeout, &what, async || {
            let status = self.status(pool).await;
            if pred(&status) {
                Ok(status)
            } else {
                Err(format!("{status:?}"))
            }
        })
        .await
    }

    /// Waits until exactly `available` VMs are available and `leased` leased, with
    /// nothing provisioning.
    pub async fn wait_counts(&self, pool: &PoolRef, available: i32, leased: i32) -> PoolStatus {
        let what = format!("available={available} leased={leased} provisioning=0");
        self.wait_status(pool, &what, |s| {
            s.available_count == available && s.leased_count == leased && s.provisioning_count == 0
        })
        .await
    }

    /// Asserts the pool stays at exactly these counts (nothing provisioned) for a while.
    pub async fn hold_counts(&self, pool: &PoolRef, available: i32, leased: i32) {
        let what = format!(
            "pool {} to stay at available={available} leased={leased} provisioning=0",
            pool.name
        );
        consistently(self.timing().settle(), &what, async || {
            let s = self.status(pool).await;
            if s.available_count == available
                && s.leased_count == leased
                && s.provisioning_count == 0
            {
                Ok(())
            } else {
                Err(format!("{s:?}"))
            }
        })
        .await;
    }

    // ----- leases -----

    pub async fn claim(&self, pool: &PoolRef, request_id: &str) -> Result<ClaimVmResponse, Status> {
        let req = ClaimVmRequest {
            pool: Some(pool.clone()),
            request_id: request_id.to_owned(),
        };
        self.lease_client()
            .claim_vm(req)
            .await
            .map(|r| r.into_inner())
    }

    /// ClaimVM without a request_id, asserting success.
    pub async fn claim_ok(&self, pool: &PoolRef) -> ClaimVmResponse {
        expect_ok(self.claim(pool, "").await, "ClaimVM")
    }

    /// Heartbeat; returns the new `expires_at` in nanoseconds since the epoch.
    pub async fn heartbeat(&self, lease_id: &str) -> Result<i128, Status> {
        let req = HeartbeatRequest {
            lease_id: lease_id.to_owned(),
        };
        let resp = self.lease_client().heartbeat(req).await?.into_inner();
        Ok(ts_nanos(&resp.expires_at))
    }

    pub async fn release(&self, lease_id: &str) -> Result<(), Status> {
        let req = ReleaseVmRequest {
            lease_id: lease_id.to_owned(),
        };
        self.lease_client().release_vm(req).await.map(|_| ())
    }

    pub async fn leases(&self, pool: Option<&PoolRef>) -> Vec<LeaseRecord> {
        let req = ListLeasesRequest {
            pool_ref: pool.cloned(),
        };
        expect_ok(self.lease_client().list_leases(req).await, "ListLeases")
            .into_inner()
            .leases
    }

    /// The lease with this id, from ListLeases over all pools.
    pub async fn lease(&self, lease_id: &str) -> Option<LeaseRecord> {
        self.leases(None)
            .await
            .into_iter()
            .find(|l| l.lease_id == lease_id)
    }

    // ----- events -----

    /// Subscribes: to one pool (events checked to be that pool's), or to all pools
    /// (keeping only this test's namespaces).
    pub async fn subscribe(&self, pool: Option<&PoolRef>) -> EventLog {
        let req = SubscribeRequest {
            pool: pool.cloned(),
        };
        let stream = expect_ok(self.events_client().subscribe(req).await, "Subscribe").into_inner();
        EventLog::new(
            stream,
            pool.cloned(),
            self.namespace(),
            self.timing().timeout,
        )
    }

    /// Waits until the VMs `log` shows in flight for `pool` (provisioned, not ended) are
    /// exactly the pool's provisioning ones, and returns them: their rows are written,
    /// so cancelling them now hook-fails each. Callers first wait for earlier VMs in
    /// flight to end, so those are not taken for new ones.
    pub async fn wait_in_flight(&self, log: &mut EventLog, pool: &PoolRef) -> Vec<String> {
        let what = format!("pool {}: VMs in flight, each seen provisioned", pool.name);
        eventually(self.timing().timeout, &what, async || {
            // What has arrived, without waiting for more.
            log.observe(Duration::ZERO).await;
            let in_flight = log.in_flight(pool);
            let provisioning = self.status(pool).await.provisioning_count;
            if !in_flight.is_empty() && usize::try_from(provisioning) == Ok(in_flight.len()) {
                Ok(in_flight)
            } else {
                Err(format!(
                    "{provisioning} provisioning, in flight by the events: {in_flight:?}"
                ))
            }
        })
        .await
    }

    /// Creates the pool of `spec`, whose create hooks hold its VMs in flight, and waits
    /// until all `size` of them are: returns the pool, its event log and those VMs.
    pub async fn create_booting(
        &self,
        spec: PoolSpec,
        size: i32,
    ) -> (PoolRef, EventLog, Vec<String>) {
        let pool = self.create_pool(spec).await;
        let mut log = self.subscribe(Some(&pool)).await;
        self.wait_status(&pool, &format!("{size} VMs in flight"), |s| {
            s.provisioning_count == size
        })
        .await;
        let booting = self.wait_in_flight(&mut log, &pool).await;
        (pool, log, booting)
    }

    /// Waits until each of `vms` has VM_HOOK_FAILED, and checks it had nothing between
    /// its provisioning and that.
    pub async fn wait_hook_failed(&self, log: &mut EventLog, vms: &[String]) {
        for uid in vms {
            log.wait_vm(uid, EventType::VmHookFailed).await;
            assert_eq!(
                log.types_of(uid)[..2],
                [EventType::VmProvisioned, EventType::VmHookFailed],
                "VM {uid} was hook-failed while in flight:\n{}",
                log.describe()
            );
        }
    }

    // ----- hosts -----

    pub async fn get_host(&self, name: &str) -> Result<HostStatus, Status> {
        let req = GetHostRequest {
            name: name.to_owned(),
        };
        self.host_admin()
            .get_host(req)
            .await
            .map(|r| r.into_inner())
    }

    pub async fn list_hosts(&self) -> Vec<HostStatus> {
        expect_ok(
            self.host_admin().list_hosts(ListHostsRequest {}).await,
            "ListHosts",
        )
        .into_inner()
        .hosts
    }

    pub async fn vm_count(&self, host: &str) -> i32 {
        expect_ok(self.get_host(host).await, "GetHost").vm_count
    }

    pub async fn add_host(&self, host: Host, skip_validation: bool) -> Result<Host, Status> {
        let name = host.name.clone();
        let req = AddHostRequest {
            host: Some(host),
            skip_validation,
        };
        let added = self
            .host_admin()
            .add_host(req)
            .await
            .map(|r| r.into_inner());
        if added.is_ok() {
            self.added_hosts.lock().expect("lock").push(name);
        }
        added
    }

    pub async fn update_host(&self, host: Host, skip_validation: bool) -> Result<Host, Status> {
        let req = battery_proto::poolmgr::v1alpha1::UpdateHostRequest {
            host: Some(host),
            skip_validation,
        };
        self.host_admin()
            .update_host(req)
            .await
            .map(|r| r.into_inner())
    }

    pub async fn remove_host(&self, name: &str) -> Result<(), Status> {
        let req = RemoveHostRequest {
            name: name.to_owned(),
        };
        self.host_admin().remove_host(req).await.map(|_| ())
    }

    pub async fn cordon(&self, name: &str, reason: &str) -> Result<Host, Status> {
        let req = CordonHostRequest {
            name: name.to_owned(),
            reason: reason.to_owned(),
        };
        self.host_admin()
            .cordon_host(req)
            .await
            .map(|r| r.into_inner())
    }

    pub async fn uncordon(&self, name: &str) -> Result<Host, Status> {
        let req = UncordonHostRequest {
            name: name.to_owned(),
        };
        self.host_admin()
            .uncordon_host(req)
            .await
            .map(|r| r.into_inner())
    }

    /// Registers (with the version check) another name for the suite's Host `of`, so a
    /// test can cordon, fill and remove "its own" Host without touching shared ones.
    pub async fn add_alias_host(&self, label: &str, of: usize) -> HostRef {
        let target = &self.hosts()[of % self.hosts().len()];
        let name = format!("{}-{label}", self.namespace());
        let host = insecure_host(&name, &target.address);
        expect_ok(self.add_host(host, false).await, "AddHost (alias)");
        HostRef {
            name,
            address: target.address.clone(),
        }
    }

    // ----- the Hosts themselves (flintlock) -----

    /// The distinct flintlock addresses of the suite's Hosts.
    pub fn host_addresses(&self) -> Vec<String> {
        let set: BTreeSet<String> = self.hosts().iter().map(|h| h.address.clone()).collect();
        set.into_iter().collect()
    }

    /// Where the MicroVM `uid` exists, if anywhere.
    pub async fn locate_vm(&self, uid: &str) -> Option<(String, MicroVm)> {
        for address in self.host_addresses() {
            let found = flintlock::get_vm(&address, uid).await;
            let found = expect_ok(found, &format!("flintlock GetMicroVM on {address}"));
            if let Some(vm) = found {
                return Some((address, vm));
            }
        }
        None
    }

    /// The MicroVM `uid`, which must exist on some Host.
    pub async fn expect_vm(&self, uid: &str) -> (String, MicroVm) {
        self.locate_vm(uid)
            .await
            .unwrap_or_else(|| panic!("MicroVM {uid} exists on no Host"))
    }

    /// Asserts the MicroVM `uid` exists on no Host right now.
    pub async fn expect_vm_gone(&self, uid: &str) {
        if let Some((address, vm)) = self.locate_vm(uid).await {
            panic!("MicroVM {uid} still exists on {address}: {vm:?}");
        }
    }

    /// Waits until the MicroVM `uid` exists on no Host.
    pub async fn wait_vm_gone(&self, uid: &str) {
        eventually(
            self.timing().timeout,
            &format!("MicroVM {uid} to be deleted"),
            async || match self.locate_vm(uid).await {
                Some((address, _)) => Err(format!("still on {address}")),
                None => Ok(()),
            },
        )
        .await;
    }

    /// The MicroVMs battery made for `pool` that exist on the Hosts (flintlock id
    /// `<pool name>-<8 chars>` in the pool's namespace).
    pub async fn pool_vms_on_hosts(&self, pool: &PoolRef) -> Vec<MicroVm> {
        let prefix = format!("{}-", pool.name);
        let mut vms = Vec::new();
        for address in self.host_addresses() {
            let listed = flintlock::list_vms(&address, &pool.namespace).await;
            let listed = expect_ok(listed, &format!("flintlock ListMicroVMs on {address}"));
            vms.extend(listed.into_iter().filter(|vm| {
                vm.spec.as_ref().is_some_and(|s| {
                    s.namespace == pool.namespace
                        && s.id
                            .strip_prefix(&prefix)
                            .is_some_and(|rest| rest.len() == 8)
                })
            }));
        }
        vms
    }

    /// Waits until no MicroVM of `pool` exists on any Host.
    pub async fn wait_pool_vms_gone(&self, pool: &PoolRef) {
        let what = format!("pool {}'s MicroVMs to be deleted from the Hosts", pool.name);
        eventually(self.timing().timeout, &what, async || {
            let left = self.pool_vms_on_hosts(pool).await.len();
            if left == 0 {
                Ok(())
            } else {
                Err(format!("{left} left"))
            }
        })
        .await;
    }

    /// Runs `command` (shell) in the MicroVM `uid` through its Host's exec API.
    pub async fn exec_in_vm(&self, uid: &str, command: &str) -> ExecOutput {
        let (address, _) = self.expect_vm(uid).await;
        let out = flintlock::exec(&address, uid, command).await;
        expect_ok(out, &format!("exec {command:?} in {uid}"))
    }

    // ----- cleanup of a shared battery -----

    pub(crate) async fn clean_up_external(&self) {
        let ns = self.namespace().to_owned();
        for pool in self.list_pools(None).await {
            let Some(spec) = pool.spec else { continue };
            if spec.namespace.starts_with(&ns) {
                let pool_ref = PoolRef {
                    name: spec.name,
                    namespace: spec.namespace,
                };
                let _ = self.delete_pool(&pool_ref, true).await;
            }
        }
        let added: Vec<String> = self.added_hosts.lock().expect("lock").clone();
        for name in added {
            let _ = self.cordon(&name, "battery conformance cleanup").await;
            let deadline = tokio::time::Instant::now() + self.timing().timeout;
            while tokio::time::Instant::now() < deadline {
                match self.remove_host(&name).await {
                    Ok(()) => break,
                    Err(s) if s.code() == tonic::Code::NotFound => break,
                    Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
                }
            }
        }
    }
}
