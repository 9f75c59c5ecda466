//! Pools, their VM counts, and DeletePool's tombstone transaction (§4.7).

use battery_proto::poolmgr::v1alpha1::{LeaseRecord, PoolSpec, VmPhase, VmRecord};
use prost::Message;
use redb::{ReadableTable, WriteTransaction};

use super::db::{LEASE_REQUEST_IDS, LEASES, POOLS, Result, Store, VMS, decode_all, get_decoded};
use super::pool_vms::{self, POOL_VMS, put_vm};
use crate::battery::model::{PoolKey, VmCounts};
use crate::battery::time;

/// The outcome of DeletePool's tombstone transaction.
#[derive(Debug)]
pub(crate) enum Tombstone {
    NotFound,
    /// Refused without `force`: some VM is LEASED or PRE_LEASE_HOOK_RUNNING.
    Leased,
    /// The pool row and its leases are gone; these VMs are now DELETING with no lease.
    Deleted(Vec<VmRecord>),
}

impl Store {
    /// Inserts a new pool; false when one with that (namespace, name) exists.
    pub(crate) fn insert_pool(&self, spec: &PoolSpec) -> Result<bool> {
        self.write(|txn| {
            let mut pools = txn.open_table(POOLS)?;
            let key = (spec.namespace.as_str(), spec.name.as_str());
            if pools.get(key)?.is_some() {
                return Ok(false);
            }
            pools.insert(key, spec.encode_to_vec().as_slice())?;
            Ok(true)
        })
    }

    /// Replaces an existing pool's whole spec; false when there is no such pool.
    pub(crate) fn replace_pool(&self, spec: &PoolSpec) -> Result<bool> {
        self.write(|txn| {
            let mut pools = txn.open_table(POOLS)?;
            let key = (spec.namespace.as_str(), spec.name.as_str());
            if pools.get(key)?.is_none() {
                return Ok(false);
            }
            pools.insert(key, spec.encode_to_vec().as_slice())?;
            Ok(true)
        })
    }

    pub(crate) fn get_pool(&self, key: &PoolKey) -> Result<Option<PoolSpec>> {
        self.read(|txn| {
            let pools = txn.open_table(POOLS)?;
            get_decoded(&pools, (key.namespace.as_str(), key.name.as_str()), "pool")
        })
    }

    /// A pool with its VM counts, read in one snapshot.
    pub(crate) fn get_pool_with_counts(
        &self,
        key: &PoolKey,
    ) -> Result<Option<(PoolSpec, VmCounts)>> {
        self.read(|txn| {
            let pools = txn.open_table(POOLS)?;
            let Some(spec) = get_decoded::<(&str, &str), PoolSpec>(
                &pools,
                (key.namespace.as_str(), key.name.as_str()),
                "pool",
            )?
            else {
                return Ok(None);
            };
            let counts = pool_vms::counts(&txn.open_table(POOL_VMS)?, key)?;
            Ok(Some((spec, counts)))
        })
    }

    /// Pools ordered by (namespace, name) with their VM counts; `namespace` filters
    /// exactly when set (`Some("")` means namespace "").
    pub(crate) fn list_pools_with_counts(
        &self,
        namespace: Option<&str>,
    ) -> Result<Vec<(PoolSpec, VmCounts)>> {
        self.read(|txn| {
            let specs: Vec<PoolSpec> = decode_all(&txn.open_table(POOLS)?, "pool")?;
            let by_pool = pool_vms::counts_by_pool(&txn.open_table(POOL_VMS)?)?;
            Ok(specs
                .into_iter()
                .filter(|spec| namespace.is_none_or(|ns| spec.namespace == ns))
                .map(|spec| {
                    let counts = by_pool
                        .get(&PoolKey::of_spec(&spec))
                        .copied()
                        .unwrap_or_default();
                    (spec, counts)
                })
                .collect())
        })
    }

    /// Every stored pool spec.
    pub(crate) fn list_pools(&self) -> Result<Vec<PoolSpec>> {
        self.read(|txn| decode_all(&txn.open_table(POOLS)?, "pool"))
    }

    pub(crate) fn pool_counts(&self, key: &PoolKey) -> Result<VmCounts> {
        self.read(|txn| pool_vms::counts(&txn.open_table(POOL_VMS)?, key))
    }

    /// DeletePool's tombstone (§4.7 step 4): delete the pool row; without `force` refuse
    /// while any VM is leased or mid-claim; mark every VM of the pool DELETING with its
    /// lease_id cleared; delete all the pool's leases (and their request_id entries).
    pub(crate) fn tombstone_pool(&self, key: &PoolKey, force: bool) -> Result<Tombstone> {
        self.write(|txn| {
            let mut pools = txn.open_table(POOLS)?;
            let pool_key = (key.namespace.as_str(), key.name.as_str());
            if pools.get(pool_key)?.is_none() {
                return Ok(Tombstone::NotFound);
            }
            let mut vms_table = txn.open_table(VMS)?;
            let vms = pool_vms::rows_of_pool(txn, &vms_table, key)?;
            if !force && VmCounts::tally(&vms).leased_or_claiming() > 0 {
                return Ok(Tombstone::Leased);
            }
            pools.remove(pool_key)?;
            let now = time::now();
            let mut deleted = Vec::with_capacity(vms.len());
            for mut vm in vms {
                let was = vm.phase;
                vm.phase = VmPhase::Deleting as i32;
                vm.lease_id = None;
                vm.updated_at = Some(now);
                put_vm(txn, &mut vms_table, Some(was), &vm)?;
                deleted.push(vm);
            }
            delete_pool_leases(txn, key)?;
            Ok(Tombstone::Deleted(deleted))
        })
    }
}

/// Whether the pool row exists, inside a write transaction.
pub(super) fn pool_exists(txn: &WriteTransaction, key: &PoolKey) -> Result<bool> {
    let pools = txn.open_table(POOLS)?;
    Ok(pools
        .get((key.namespace.as_str(), key.name.as_str()))?
        .is_some())
}

fn delete_pool_leases(txn: &WriteTransaction, key: &PoolKey) -> Result<()> {
    let mut leases = txn.open_table(LEASES)?;
    let mut request_ids = txn.open_table(LEASE_REQUEST_IDS)?;
    let doomed: Vec<LeaseRecord> = decode_all::<&str, LeaseRecord>(&leases, "lease")?
        .into_iter()
        .filter(|lease| key.owns_lease(lease))
        .collect();
    for lease in doomed {
        leases.remove(lease.lease_id.as_str())?;
        if !lease.request_id.is_empty() {
            request_ids.remove(lease.request_id.as_str())?;
        }
    }
    Ok(())
}
