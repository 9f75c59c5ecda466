//! VM rows, placement reservations and startup recovery (§4.1, §4.2).

use battery_proto::poolmgr::v1alpha1::{Host, VmPhase, VmRecord};
use redb::{ReadableTable, ReadableTableMetadata, WriteTransaction};

use super::db::{
    HOSTS, LEASE_REQUEST_IDS, LEASES, PLACEMENTS, Result, Store, VMS, decode_all, get_decoded,
};
use super::pool_vms::{self, POOL_VMS, delete_vm, put_vm};
use super::pools::pool_exists;
use crate::battery::model::{PoolKey, phase_of};
use crate::battery::time;

/// A placement reservation: a VM is about to be created on `host`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Placement {
    pub(crate) id: u64,
    pub(crate) host: String,
}

/// The outcome of moving a VM to another phase.
#[derive(Debug)]
pub(crate) enum Transition {
    Updated,
    /// Refused: DELETING is terminal (battery's ErrVMDeleting).
    Deleting,
    Missing,
}

/// A DELETING VM's row removed after flintlock deleted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FinishedDeletion {
    pub(crate) pool_exists: bool,
    /// Its lease row still existed (and is now deleted): the deletion was a release.
    pub(crate) released: bool,
}

/// What startup recovery changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Recovery {
    pub(crate) abandoned_claims: usize,
    pub(crate) placements_cleared: u64,
}

impl Store {
    /// Picks a host for a new VM of pool `key` and reserves it (§4.2 PickHost, then
    /// ReservePlacement): among `hosts`, skip unregistered and cordoned ones, then take
    /// the one with the fewest of this pool's VM rows not DELETING or FAILED; ties go to
    /// list order. Reservations count toward a host's vm_count but not toward the pick,
    /// as in poolmgrd, so the provisions of one pass all choose the same host. None when
    /// no host is eligible.
    pub(crate) fn reserve_placement(
        &self,
        key: &PoolKey,
        hosts: &[String],
    ) -> Result<Option<Placement>> {
        self.write(|txn| {
            let registered = txn.open_table(HOSTS)?;
            let vms = pool_vms::rows_of_pool(txn, &txn.open_table(VMS)?, key)?;
            let mut best: Option<(&str, usize)> = None;
            for name in hosts {
                let Some(host) = get_decoded::<&str, Host>(&registered, name.as_str(), "host")?
                else {
                    continue;
                };
                if host.cordoned {
                    continue;
                }
                let load = vms
                    .iter()
                    .filter(|vm| {
                        vm.flintlock_host == *name
                            && !matches!(phase_of(vm), VmPhase::Deleting | VmPhase::Failed)
                    })
                    .count();
                if best.is_none_or(|(_, fewest)| load < fewest) {
                    best = Some((name, load));
                }
            }
            let Some((host, _)) = best else {
                return Ok(None);
            };
            let mut placements = txn.open_table(PLACEMENTS)?;
            let id = placements.last()?.map_or(1, |(id, _)| id.value() + 1);
            placements.insert(id, (host, key.namespace.as_str(), key.name.as_str()))?;
            Ok(Some(Placement {
                id,
                host: host.to_owned(),
            }))
        })
    }

    pub(crate) fn release_placement(&self, id: u64) -> Result<()> {
        self.write(|txn| {
            txn.open_table(PLACEMENTS)?.remove(id)?;
            Ok(())
        })
    }

    /// Writes a new VM row in place of its reservation. The row is written only while its
    /// pool still exists, so a provision finishing after DeletePool's tombstone adds nothing
    /// (false: the caller deletes the MicroVM).
    pub(crate) fn insert_provisioned_vm(&self, placement: u64, vm: &VmRecord) -> Result<bool> {
        self.write(|txn| {
            txn.open_table(PLACEMENTS)?.remove(placement)?;
            if !pool_exists(txn, &PoolKey::of_vm(vm))? {
                return Ok(false);
            }
            put_vm(txn, &mut txn.open_table(VMS)?, None, vm)?;
            Ok(true)
        })
    }

    pub(crate) fn get_vm(&self, uid: &str) -> Result<Option<VmRecord>> {
        self.read(|txn| get_decoded(&txn.open_table(VMS)?, uid, "vm"))
    }

    pub(crate) fn vms_in_phase(&self, phase: VmPhase) -> Result<Vec<VmRecord>> {
        self.read(|txn| {
            let vms: Vec<VmRecord> = decode_all(&txn.open_table(VMS)?, "vm")?;
            Ok(vms.into_iter().filter(|vm| phase_of(vm) == phase).collect())
        })
    }

    /// Moves a VM to `to` (clearing its lease_id when asked); a DELETING row is never moved.
    pub(crate) fn transition_vm(
        &self,
        uid: &str,
        to: VmPhase,
        clear_lease: bool,
    ) -> Result<Transition> {
        self.write(|txn| {
            let mut vms = txn.open_table(VMS)?;
            let Some(mut vm) = get_decoded::<&str, VmRecord>(&vms, uid, "vm")? else {
                return Ok(Transition::Missing);
            };
            if phase_of(&vm) == VmPhase::Deleting {
                return Ok(Transition::Deleting);
            }
            let was = vm.phase;
            vm.phase = to as i32;
            if clear_lease {
                vm.lease_id = None;
            }
            vm.updated_at = Some(time::now());
            put_vm(txn, &mut vms, Some(was), &vm)?;
            Ok(Transition::Updated)
        })
    }

    /// ClaimVM's atomic pick (§4.3 step 3): the first AVAILABLE VM of the pool becomes
    /// LEASED, with no lease yet. battery's query has no ORDER BY; this takes uid order.
    pub(crate) fn claim_available_vm(&self, key: &PoolKey) -> Result<Option<VmRecord>> {
        self.write(|txn| {
            let picked =
                pool_vms::first_in_phase(&txn.open_table(POOL_VMS)?, key, VmPhase::Available)?;
            let mut vms = txn.open_table(VMS)?;
            let Some(mut vm) = picked
                .map(|uid| get_decoded::<&str, VmRecord>(&vms, uid.as_str(), "vm"))
                .transpose()?
                .flatten()
            else {
                return Ok(None);
            };
            vm.phase = VmPhase::Leased as i32;
            vm.lease_id = None;
            vm.updated_at = Some(time::now());
            put_vm(txn, &mut vms, Some(VmPhase::Available as i32), &vm)?;
            Ok(Some(vm))
        })
    }

    /// Marks a VM DELETING, keeping its lease_id so a finished deletion can tell a release
    /// from an expiry. None when the row is gone.
    pub(crate) fn mark_vm_deleting(&self, uid: &str) -> Result<Option<VmRecord>> {
        self.write(|txn| {
            let mut vms = txn.open_table(VMS)?;
            let Some(mut vm) = get_decoded::<&str, VmRecord>(&vms, uid, "vm")? else {
                return Ok(None);
            };
            if phase_of(&vm) != VmPhase::Deleting {
                let was = vm.phase;
                vm.phase = VmPhase::Deleting as i32;
                vm.updated_at = Some(time::now());
                put_vm(txn, &mut vms, Some(was), &vm)?;
            }
            Ok(Some(vm))
        })
    }

    /// After flintlock deleted a DELETING VM: remove its row and, in the same transaction,
    /// its lease row if one is left (a release) and whether its pool still exists (§4.4,
    /// §4.5). None when the row was already removed (or is not DELETING).
    pub(crate) fn finish_vm_deletion(&self, uid: &str) -> Result<Option<FinishedDeletion>> {
        self.write(|txn| {
            let mut vms = txn.open_table(VMS)?;
            let Some(vm) = get_decoded::<&str, VmRecord>(&vms, uid, "vm")? else {
                return Ok(None);
            };
            if phase_of(&vm) != VmPhase::Deleting {
                return Ok(None);
            }
            delete_vm(txn, &mut vms, &vm)?;
            let released = match &vm.lease_id {
                Some(lease_id) => delete_lease_row(txn, lease_id)?,
                None => false,
            };
            Ok(Some(FinishedDeletion {
                pool_exists: pool_exists(txn, &PoolKey::of_vm(&vm))?,
                released,
            }))
        })
    }

    /// Removes a VM row outright, whatever its phase (the DELETE_AND_REPLACE hook-failure
    /// policy, as poolmgrd's DeleteVM). True when it existed.
    pub(crate) fn remove_vm(&self, uid: &str) -> Result<bool> {
        self.write(|txn| {
            let mut vms = txn.open_table(VMS)?;
            match get_decoded::<&str, VmRecord>(&vms, uid, "vm")? {
                Some(vm) => {
                    delete_vm(txn, &mut vms, &vm)?;
                    Ok(true)
                }
                None => Ok(false),
            }
        })
    }

    /// battery's startup recovery (§4.1): every PRE_LEASE_HOOK_RUNNING VM, and every LEASED
    /// VM without a lease row, becomes DELETING (the sweeper then deletes it); placement
    /// reservations are cleared.
    pub(crate) fn recover(&self) -> Result<Recovery> {
        self.write(|txn| {
            let mut vms = txn.open_table(VMS)?;
            let leases = txn.open_table(LEASES)?;
            let mut abandoned = Vec::new();
            for vm in decode_all::<&str, VmRecord>(&vms, "vm")? {
                let orphaned = match phase_of(&vm) {
                    VmPhase::PreLeaseHookRunning => true,
                    VmPhase::Leased => match &vm.lease_id {
                        Some(lease_id) => leases.get(lease_id.as_str())?.is_none(),
                        None => true,
                    },
                    _ => false,
                };
                if orphaned {
                    abandoned.push(vm);
                }
            }
            let now = time::now();
            for mut vm in abandoned.iter().cloned() {
                let was = vm.phase;
                vm.phase = VmPhase::Deleting as i32;
                vm.updated_at = Some(now);
                put_vm(txn, &mut vms, Some(was), &vm)?;
            }
            let mut placements = txn.open_table(PLACEMENTS)?;
            let placements_cleared = placements.len()?;
            placements.retain(|_, _| false)?;
            Ok(Recovery {
                abandoned_claims: abandoned.len(),
                placements_cleared,
            })
        })
    }
}

/// Deletes a lease row and its request_id entry; false when it did not exist.
pub(super) fn delete_lease_row(txn: &WriteTransaction, lease_id: &str) -> Result<bool> {
    let mut leases = txn.open_table(LEASES)?;
    let Some(lease) = get_decoded::<&str, battery_proto::poolmgr::v1alpha1::LeaseRecord>(
        &leases, lease_id, "lease",
    )?
    else {
        return Ok(false);
    };
    leases.remove(lease_id)?;
    if !lease.request_id.is_empty() {
        txn.open_table(LEASE_REQUEST_IDS)?
            .remove(lease.request_id.as_str())?;
    }
    Ok(true)
}
