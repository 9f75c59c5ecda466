//! Small domain types shared by the store, the services and the background tasks.

use std::fmt;

use battery_proto::flintlock::types::MicroVmSpec;
use battery_proto::poolmgr::v1alpha1::{
    LeaseRecord, PoolRef, PoolSpec, PoolStatus, VmPhase, VmRecord,
};

/// A pool's identity: (namespace, name), shown as `namespace/name` as battery does.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PoolKey {
    pub(crate) namespace: String,
    pub(crate) name: String,
}

impl PoolKey {
    pub(crate) fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// An unset ref is the empty (namespace, name): it names no pool, so lookups answer
    /// NOT_FOUND as battery's do.
    pub(crate) fn of_ref(pool: Option<&PoolRef>) -> Self {
        pool.map_or_else(
            || Self::new("", ""),
            |r| Self::new(r.namespace.clone(), r.name.clone()),
        )
    }

    pub(crate) fn of_spec(spec: &PoolSpec) -> Self {
        Self::new(spec.namespace.clone(), spec.name.clone())
    }

    pub(crate) fn of_vm(vm: &VmRecord) -> Self {
        Self::new(vm.pool_namespace.clone(), vm.pool_name.clone())
    }

    pub(crate) fn of_lease(lease: &LeaseRecord) -> Self {
        Self::new(lease.pool_namespace.clone(), lease.pool_name.clone())
    }

    pub(crate) fn owns_lease(&self, lease: &LeaseRecord) -> bool {
        lease.pool_namespace == self.namespace && lease.pool_name == self.name
    }
}

impl fmt::Display for PoolKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A stored VM's phase.
pub(crate) fn phase_of(vm: &VmRecord) -> VmPhase {
    phase_named(vm.phase)
}

/// The phase a stored number names. An unknown number (never written by this code)
/// counts as FAILED, which like battery's FAILED counts nowhere.
pub(crate) fn phase_named(number: i32) -> VmPhase {
    VmPhase::try_from(number).unwrap_or(VmPhase::Failed)
}

/// A pool's VMs tallied the way battery's reconciler and PoolStatus count them (§1.1, §4.2).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VmCounts {
    pub(crate) available: i32,
    /// PRE_LEASE_HOOK_RUNNING, or LEASED without a committed lease.
    pub(crate) claiming: i32,
    /// LEASED with a committed lease (the VM row carries its lease_id).
    pub(crate) leased: i32,
    /// PROVISIONING + CREATE_HOOK_RUNNING.
    pub(crate) provisioning: i32,
    pub(crate) quarantined: i32,
    /// Every row, in any phase (DELETING and FAILED included).
    pub(crate) rows: i32,
}

impl VmCounts {
    pub(crate) fn tally<'a>(vms: impl IntoIterator<Item = &'a VmRecord>) -> Self {
        let mut counts = Self::default();
        for vm in vms {
            counts.count(phase_of(vm), vm.lease_id.is_some());
        }
        counts
    }

    /// Counts one VM row in `phase`, holding a lease_id or not.
    pub(crate) fn count(&mut self, phase: VmPhase, leased: bool) {
        self.rows += 1;
        match phase {
            VmPhase::Available => self.available += 1,
            VmPhase::PreLeaseHookRunning => self.claiming += 1,
            VmPhase::Leased if leased => self.leased += 1,
            VmPhase::Leased => self.claiming += 1,
            VmPhase::Provisioning | VmPhase::CreateHookRunning => self.provisioning += 1,
            VmPhase::Quarantined => self.quarantined += 1,
            VmPhase::Deleting | VmPhase::Failed => {}
        }
    }

    /// VMs that DeletePool without `force` refuses to take: LEASED or PRE_LEASE_HOOK_RUNNING.
    pub(crate) fn leased_or_claiming(&self) -> i32 {
        self.leased + self.claiming
    }

    /// PoolStatus: leased_count includes in-flight claims; DELETING and FAILED count nowhere.
    pub(crate) fn status(&self) -> PoolStatus {
        PoolStatus {
            available_count: self.available,
            leased_count: self.leased + self.claiming,
            provisioning_count: self.provisioning,
            quarantined_count: self.quarantined,
        }
    }
}

/// Whether a template pins an interface's MAC or address, which only a single-VM pool
/// may do (§3.2, §4.2).
pub(crate) fn has_static_network(template: &MicroVmSpec) -> bool {
    template
        .interfaces
        .iter()
        .any(|iface| iface.guest_mac.is_some() || iface.address.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(phase: VmPhase, lease: Option<&str>) -> VmRecord {
        VmRecord {
            phase: phase as i32,
            lease_id: lease.map(str::to_owned),
            ..VmRecord::default()
        }
    }

    #[test]
    fn tallies_like_battery() {
        let vms = [
            vm(VmPhase::Available, None),
            vm(VmPhase::Available, None),
            vm(VmPhase::PreLeaseHookRunning, None),
            vm(VmPhase::Leased, None),
            vm(VmPhase::Leased, Some("l")),
            vm(VmPhase::Provisioning, None),
            vm(VmPhase::CreateHookRunning, None),
            vm(VmPhase::Quarantined, None),
            vm(VmPhase::Deleting, Some("l2")),
            vm(VmPhase::Failed, None),
        ];
        let counts = VmCounts::tally(&vms);
        assert_eq!(
            counts,
            VmCounts {
                available: 2,
                claiming: 2,
                leased: 1,
                provisioning: 2,
                quarantined: 1,
                rows: 10,
            }
        );
        assert_eq!(counts.leased_or_claiming(), 3);
        assert_eq!(
            counts.status(),
            PoolStatus {
                available_count: 2,
                leased_count: 3,
                provisioning_count: 2,
                quarantined_count: 1,
            }
        );
    }

    #[test]
    fn pool_key_display_and_ownership() {
        let key = PoolKey::new("ns", "p");
        assert_eq!(key.to_string(), "ns/p");
        assert_eq!(PoolKey::of_ref(None), PoolKey::new("", ""));
        let mut record = vm(VmPhase::Available, None);
        record.pool_namespace = "ns".into();
        record.pool_name = "p".into();
        assert_eq!(PoolKey::of_vm(&record), key);
        record.pool_namespace = "other".into();
        assert_ne!(PoolKey::of_vm(&record), key);
    }
}
