//! The `pool_vms` index: every VM row's pool and phase, keyed (pool namespace, pool
//! name, phase, uid), with whether the row holds a lease_id. battery answers a claim's
//! pick and a pool's counts from SQLite by the pool's own rows; with this index the
//! embedded battery does too, instead of decoding every VM of every pool for each claim
//! and each GetPool. Every VM row is written through [`put_vm`] and removed through
//! [`delete_vm`], which keep the index in step in the same transaction.

use battery_proto::poolmgr::v1alpha1::{VmPhase, VmRecord};
use prost::Message;
use redb::{ReadableTable, Table, TableDefinition, WriteTransaction};

use super::db::{Result, VMS, decode, decode_all};
use crate::battery::model::{PoolKey, VmCounts, phase_named};

/// (pool namespace, pool name, phase, VM uid) -> the row holds a lease_id.
pub(super) const POOL_VMS: TableDefinition<(&str, &str, i32, &str), bool> =
    TableDefinition::new("pool_vms");

type IndexKey<'a> = (&'a str, &'a str, i32, &'a str);

fn key_of(vm: &VmRecord, phase: i32) -> IndexKey<'_> {
    (&vm.pool_namespace, &vm.pool_name, phase, &vm.uid)
}

/// Writes `vm`'s row and its index entry; `was` is the phase of the row it replaces.
pub(super) fn put_vm(
    txn: &WriteTransaction,
    vms: &mut Table<'_, &'static str, &'static [u8]>,
    was: Option<i32>,
    vm: &VmRecord,
) -> Result<()> {
    let mut index = txn.open_table(POOL_VMS)?;
    if let Some(was) = was {
        index.remove(key_of(vm, was))?;
    }
    index.insert(key_of(vm, vm.phase), vm.lease_id.is_some())?;
    vms.insert(vm.uid.as_str(), vm.encode_to_vec().as_slice())?;
    Ok(())
}

/// Removes `vm`'s row (as stored) and its index entry.
pub(super) fn delete_vm(
    txn: &WriteTransaction,
    vms: &mut Table<'_, &'static str, &'static [u8]>,
    vm: &VmRecord,
) -> Result<()> {
    txn.open_table(POOL_VMS)?.remove(key_of(vm, vm.phase))?;
    vms.remove(vm.uid.as_str())?;
    Ok(())
}

/// The index entries of pool `key`, in (phase, uid) order: each VM's phase, uid and
/// whether it holds a lease, handed to `each` until it returns false.
fn for_each_of_pool(
    index: &impl ReadableTable<IndexKey<'static>, bool>,
    key: &PoolKey,
    from_phase: i32,
    mut each: impl FnMut(i32, &str, bool) -> bool,
) -> Result<()> {
    let start = (key.namespace.as_str(), key.name.as_str(), from_phase, "");
    for entry in index.range::<IndexKey<'_>>(start..)? {
        let (k, leased) = entry?;
        let (namespace, name, phase, uid) = k.value();
        if namespace != key.namespace || name != key.name || !each(phase, uid, leased.value()) {
            break;
        }
    }
    Ok(())
}

/// The uid of the first of pool `key`'s VMs in `phase`, in uid order.
pub(super) fn first_in_phase(
    index: &impl ReadableTable<IndexKey<'static>, bool>,
    key: &PoolKey,
    phase: VmPhase,
) -> Result<Option<String>> {
    let mut first = None;
    for_each_of_pool(index, key, phase as i32, |found, uid, _| {
        if found == phase as i32 {
            first = Some(uid.to_owned());
        }
        false
    })?;
    Ok(first)
}

/// Pool `key`'s VMs tallied as battery counts them.
pub(super) fn counts(
    index: &impl ReadableTable<IndexKey<'static>, bool>,
    key: &PoolKey,
) -> Result<VmCounts> {
    let mut counts = VmCounts::default();
    for_each_of_pool(index, key, i32::MIN, |phase, _, leased| {
        counts.count(phase_named(phase), leased);
        true
    })?;
    Ok(counts)
}

/// Every pool's VMs tallied, by pool. The index is in pool order, so each pool's
/// entries come together and its key is made once.
pub(super) fn counts_by_pool(
    index: &impl ReadableTable<IndexKey<'static>, bool>,
) -> Result<std::collections::HashMap<PoolKey, VmCounts>> {
    let mut by_pool: std::collections::HashMap<PoolKey, VmCounts> = Default::default();
    let mut current: Option<(PoolKey, VmCounts)> = None;
    for entry in index.iter()? {
        let (k, leased) = entry?;
        let (namespace, name, phase, _) = k.value();
        let same = current
            .as_ref()
            .is_some_and(|(key, _)| key.namespace == namespace && key.name == name);
        if !same {
            by_pool.extend(current.take());
            current = Some((PoolKey::new(namespace, name), VmCounts::default()));
        }
        if let Some((_, counts)) = current.as_mut() {
            counts.count(phase_named(phase), leased.value());
        }
    }
    by_pool.extend(current);
    Ok(by_pool)
}

/// Pool `key`'s VM rows, in uid order (the order of the VM table).
pub(super) fn rows_of_pool(
    txn: &WriteTransaction,
    vms: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &PoolKey,
) -> Result<Vec<VmRecord>> {
    let mut uids = Vec::new();
    for_each_of_pool(&txn.open_table(POOL_VMS)?, key, i32::MIN, |_, uid, _| {
        uids.push(uid.to_owned());
        true
    })?;
    uids.sort_unstable();
    let mut rows = Vec::with_capacity(uids.len());
    for uid in uids {
        if let Some(row) = vms.get(uid.as_str())? {
            rows.push(decode("vm", row.value())?);
        }
    }
    Ok(rows)
}

/// Builds the index from the VM rows, for a store written before it existed.
pub(super) fn rebuild(txn: &WriteTransaction) -> Result<()> {
    let vms: Vec<VmRecord> = decode_all(&txn.open_table(VMS)?, "vm")?;
    let mut index = txn.open_table(POOL_VMS)?;
    index.retain(|_, _| false)?;
    for vm in &vms {
        index.insert(key_of(vm, vm.phase), vm.lease_id.is_some())?;
    }
    Ok(())
}
