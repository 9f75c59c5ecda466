//! Registered flintlock Hosts (§4.8) and their VM counts.

use std::collections::HashMap;

use battery_proto::poolmgr::v1alpha1::{Host, HostTls, PoolSpec, VmRecord};
use prost::Message;
use redb::{ReadTransaction, ReadableTable, WriteTransaction};

use super::db::{HOSTS, PLACEMENTS, POOLS, Result, Store, VMS, decode_all, get_decoded};
use crate::battery::time;

/// The outcome of RemoveHost's transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HostRemoval {
    NotFound,
    /// Refused: these pools name the host, or VMs or reservations are on it.
    InUse {
        pools: Vec<String>,
        vm_count: i32,
    },
    Removed,
}

impl Store {
    /// Stores a new host; false when the name is taken.
    pub(crate) fn insert_host(&self, host: &Host) -> Result<bool> {
        self.write(|txn| {
            let mut hosts = txn.open_table(HOSTS)?;
            if hosts.get(host.name.as_str())?.is_some() {
                return Ok(false);
            }
            hosts.insert(host.name.as_str(), host.encode_to_vec().as_slice())?;
            Ok(true)
        })
    }

    /// Replaces a host's address and TLS, keeping its name and cordon state.
    pub(crate) fn update_host(
        &self,
        name: &str,
        address: &str,
        tls: Option<HostTls>,
    ) -> Result<Option<Host>> {
        self.modify_host(name, |host| {
            host.address = address.to_owned();
            host.tls = tls;
        })
    }

    /// Cordons (`Some(reason)`) or uncordons (`None`) a host.
    pub(crate) fn set_cordon(&self, name: &str, reason: Option<&str>) -> Result<Option<Host>> {
        self.modify_host(name, |host| match reason {
            Some(reason) => {
                host.cordoned = true;
                host.cordoned_reason = reason.to_owned();
                host.cordoned_at = host.updated_at;
            }
            None => {
                host.cordoned = false;
                host.cordoned_reason.clear();
                host.cordoned_at = None;
            }
        })
    }

    /// Applies `change` to a stored host with `updated_at` already set to now.
    fn modify_host(&self, name: &str, change: impl FnOnce(&mut Host)) -> Result<Option<Host>> {
        self.write(|txn| {
            let mut hosts = txn.open_table(HOSTS)?;
            let Some(mut host) = get_decoded::<&str, Host>(&hosts, name, "host")? else {
                return Ok(None);
            };
            host.updated_at = Some(time::now());
            change(&mut host);
            hosts.insert(name, host.encode_to_vec().as_slice())?;
            Ok(Some(host))
        })
    }

    pub(crate) fn get_host(&self, name: &str) -> Result<Option<Host>> {
        self.read(|txn| get_decoded(&txn.open_table(HOSTS)?, name, "host"))
    }

    /// A host with its vm_count, read in one snapshot.
    pub(crate) fn get_host_with_count(&self, name: &str) -> Result<Option<(Host, i32)>> {
        self.read(|txn| {
            let Some(host) = get_decoded::<&str, Host>(&txn.open_table(HOSTS)?, name, "host")?
            else {
                return Ok(None);
            };
            let count = vm_counts_read(txn)?.get(name).copied().unwrap_or(0);
            Ok(Some((host, count)))
        })
    }

    /// Hosts ordered by name, with their vm_count.
    pub(crate) fn list_hosts_with_counts(&self) -> Result<Vec<(Host, i32)>> {
        self.read(|txn| {
            let hosts: Vec<Host> = decode_all(&txn.open_table(HOSTS)?, "host")?;
            let counts = vm_counts_read(txn)?;
            Ok(hosts
                .into_iter()
                .map(|host| {
                    let count = counts.get(&host.name).copied().unwrap_or(0);
                    (host, count)
                })
                .collect())
        })
    }

    pub(crate) fn list_hosts(&self) -> Result<Vec<Host>> {
        self.read(|txn| decode_all(&txn.open_table(HOSTS)?, "host"))
    }

    /// The names in `names` that are not registered hosts, in order, without repeats.
    pub(crate) fn unknown_hosts(&self, names: &[String]) -> Result<Vec<String>> {
        self.read(|txn| {
            let hosts = txn.open_table(HOSTS)?;
            let mut unknown: Vec<String> = Vec::new();
            for name in names {
                if hosts.get(name.as_str())?.is_none() && !unknown.contains(name) {
                    unknown.push(name.clone());
                }
            }
            Ok(unknown)
        })
    }

    /// Removes a host unless a pool spec names it or it has VMs (any phase) or placement
    /// reservations (§3.3), all checked in the removing transaction.
    pub(crate) fn remove_host(&self, name: &str) -> Result<HostRemoval> {
        self.write(|txn| {
            let mut hosts = txn.open_table(HOSTS)?;
            if hosts.get(name)?.is_none() {
                return Ok(HostRemoval::NotFound);
            }
            let pools: Vec<String> =
                decode_all::<(&str, &str), PoolSpec>(&txn.open_table(POOLS)?, "pool")?
                    .into_iter()
                    .filter(|spec| spec.flintlock_hosts.iter().any(|h| h == name))
                    .map(|spec| format!("{}/{}", spec.namespace, spec.name))
                    .collect();
            let vm_count = vm_counts_write(txn)?.get(name).copied().unwrap_or(0);
            if !pools.is_empty() || vm_count > 0 {
                return Ok(HostRemoval::InUse { pools, vm_count });
            }
            hosts.remove(name)?;
            Ok(HostRemoval::Removed)
        })
    }
}

/// HostStatus.vm_count per host: VM rows in any phase plus placement reservations.
fn tally(vms: &[VmRecord], placements: impl Iterator<Item = String>) -> HashMap<String, i32> {
    let mut counts: HashMap<String, i32> = HashMap::new();
    for vm in vms {
        *counts.entry(vm.flintlock_host.clone()).or_default() += 1;
    }
    for host in placements {
        *counts.entry(host).or_default() += 1;
    }
    counts
}

fn placement_hosts(
    table: &impl ReadableTable<u64, (&'static str, &'static str, &'static str)>,
) -> Result<Vec<String>> {
    let mut hosts = Vec::new();
    for entry in table.iter()? {
        let (_, value) = entry?;
        hosts.push(value.value().0.to_owned());
    }
    Ok(hosts)
}

fn vm_counts_read(txn: &ReadTransaction) -> Result<HashMap<String, i32>> {
    let vms: Vec<VmRecord> = decode_all(&txn.open_table(VMS)?, "vm")?;
    let placements = placement_hosts(&txn.open_table(PLACEMENTS)?)?;
    Ok(tally(&vms, placements.into_iter()))
}

fn vm_counts_write(txn: &WriteTransaction) -> Result<HashMap<String, i32>> {
    let vms: Vec<VmRecord> = decode_all(&txn.open_table(VMS)?, "vm")?;
    let placements = placement_hosts(&txn.open_table(PLACEMENTS)?)?;
    Ok(tally(&vms, placements.into_iter()))
}
