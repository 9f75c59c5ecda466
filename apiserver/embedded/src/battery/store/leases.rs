//! Leases and their request_id index (§4.3, §4.4).

use battery_proto::poolmgr::v1alpha1::{LeaseRecord, PoolSpec, VmPhase, VmRecord};
use prost::Message;
use prost_types::Timestamp;
use redb::ReadableTable;

use super::db::{LEASE_REQUEST_IDS, LEASES, POOLS, Result, Store, VMS, decode_all, get_decoded};
use super::pool_vms::put_vm;
use super::vms::delete_lease_row;
use crate::battery::model::{PoolKey, phase_of};
use crate::battery::time;

/// The outcome of committing a claim's lease (§4.3 step 5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaseCommit {
    Committed,
    /// The VM row is gone, DELETING, or no longer mid-claim: a forced DeletePool took it.
    VmGone,
    /// Another lease holds this request_id (the unique index): a concurrent claim won.
    RequestIdTaken,
}

/// The outcome of a heartbeat (§4.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Heartbeat {
    LeaseNotFound,
    PoolNotFound(PoolKey),
    Renewed(Timestamp),
}

impl Store {
    pub(crate) fn get_lease(&self, lease_id: &str) -> Result<Option<LeaseRecord>> {
        self.read(|txn| get_decoded(&txn.open_table(LEASES)?, lease_id, "lease"))
    }

    /// The lease created with this request_id, across all pools.
    pub(crate) fn lease_by_request_id(&self, request_id: &str) -> Result<Option<LeaseRecord>> {
        self.read(|txn| {
            let index = txn.open_table(LEASE_REQUEST_IDS)?;
            let Some(lease_id) = index.get(request_id)?.map(|id| id.value().to_owned()) else {
                return Ok(None);
            };
            get_decoded(&txn.open_table(LEASES)?, lease_id.as_str(), "lease")
        })
    }

    /// In one transaction: the VM (still PRE_LEASE_HOOK_RUNNING) becomes LEASED with the
    /// lease's id, and the lease row (and its request_id entry) is inserted.
    pub(crate) fn commit_lease(&self, lease: &LeaseRecord) -> Result<LeaseCommit> {
        self.write(|txn| {
            let mut vms = txn.open_table(VMS)?;
            let Some(mut vm) = get_decoded::<&str, VmRecord>(&vms, lease.vm_uid.as_str(), "vm")?
            else {
                return Ok(LeaseCommit::VmGone);
            };
            if phase_of(&vm) != VmPhase::PreLeaseHookRunning {
                return Ok(LeaseCommit::VmGone);
            }
            let mut index = txn.open_table(LEASE_REQUEST_IDS)?;
            if !lease.request_id.is_empty() {
                if index.get(lease.request_id.as_str())?.is_some() {
                    return Ok(LeaseCommit::RequestIdTaken);
                }
                index.insert(lease.request_id.as_str(), lease.lease_id.as_str())?;
            }
            txn.open_table(LEASES)?
                .insert(lease.lease_id.as_str(), lease.encode_to_vec().as_slice())?;
            vm.phase = VmPhase::Leased as i32;
            vm.lease_id = Some(lease.lease_id.clone());
            vm.updated_at = lease.claimed_at;
            put_vm(
                txn,
                &mut vms,
                Some(VmPhase::PreLeaseHookRunning as i32),
                &vm,
            )?;
            Ok(LeaseCommit::Committed)
        })
    }

    /// Sets last_heartbeat_at = now and expires_at = now + the pool's
    /// heartbeat_expiry_threshold, even when expires_at has passed (§4.4).
    pub(crate) fn heartbeat(&self, lease_id: &str) -> Result<Heartbeat> {
        self.write(|txn| {
            let mut leases = txn.open_table(LEASES)?;
            let Some(mut lease) = get_decoded::<&str, LeaseRecord>(&leases, lease_id, "lease")?
            else {
                return Ok(Heartbeat::LeaseNotFound);
            };
            let pools = txn.open_table(POOLS)?;
            let key = (lease.pool_namespace.as_str(), lease.pool_name.as_str());
            let Some(pool) = get_decoded::<(&str, &str), PoolSpec>(&pools, key, "pool")? else {
                return Ok(Heartbeat::PoolNotFound(PoolKey::of_lease(&lease)));
            };
            let now = time::now();
            let expires_at = time::add_proto(&now, pool.heartbeat_expiry_threshold.as_ref());
            lease.last_heartbeat_at = Some(now);
            lease.expires_at = Some(expires_at);
            leases.insert(lease_id, lease.encode_to_vec().as_slice())?;
            Ok(Heartbeat::Renewed(expires_at))
        })
    }

    /// Leases, all or one pool's, in lease_id order (the table's key order, as poolmgrd's
    /// ORDER BY lease_id).
    pub(crate) fn list_leases(&self, pool: Option<&PoolKey>) -> Result<Vec<LeaseRecord>> {
        let mut leases: Vec<LeaseRecord> =
            self.read(|txn| decode_all(&txn.open_table(LEASES)?, "lease"))?;
        leases.retain(|lease| pool.is_none_or(|key| key.owns_lease(lease)));
        Ok(leases)
    }

    /// Expires one lease if it is still expired at `now` (re-checked here, so a lease just
    /// renewed by a heartbeat survives): deletes the lease row and, when its VM is still
    /// LEASED with it, marks the VM DELETING. Returns that VM.
    pub(crate) fn expire_lease(&self, lease_id: &str, now: &Timestamp) -> Result<Option<VmRecord>> {
        self.write(|txn| {
            let lease = {
                let leases = txn.open_table(LEASES)?;
                match get_decoded::<&str, LeaseRecord>(&leases, lease_id, "lease")? {
                    Some(lease) => lease,
                    None => return Ok(None),
                }
            };
            if time::nanos(lease.expires_at.as_ref()) > time::nanos(Some(now)) {
                return Ok(None);
            }
            delete_lease_row(txn, lease_id)?;
            let mut vms = txn.open_table(VMS)?;
            let Some(mut vm) = get_decoded::<&str, VmRecord>(&vms, lease.vm_uid.as_str(), "vm")?
            else {
                return Ok(None);
            };
            if phase_of(&vm) != VmPhase::Leased || vm.lease_id.as_deref() != Some(lease_id) {
                return Ok(None);
            }
            vm.phase = VmPhase::Deleting as i32;
            vm.updated_at = Some(*now);
            put_vm(txn, &mut vms, Some(VmPhase::Leased as i32), &vm)?;
            Ok(Some(vm))
        })
    }

    /// Deletes a lease row (and its request_id entry); false when it did not exist.
    pub(crate) fn delete_lease(&self, lease_id: &str) -> Result<bool> {
        self.write(|txn| delete_lease_row(txn, lease_id))
    }
}
