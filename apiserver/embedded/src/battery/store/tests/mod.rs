//! The store's transactions: the rules battery's SQLite store enforces.

use battery_proto::flintlock::types::MicroVmSpec;
use battery_proto::poolmgr::v1alpha1::{
    EventType, Host, HostTls, LeaseRecord, PoolSpec, VmPhase, VmRecord,
};

use super::*;
use crate::battery::model::{PoolKey, VmCounts, phase_of};
use crate::battery::time;

fn store() -> Store {
    Store::open(None).expect("in-memory store")
}

fn spec(namespace: &str, name: &str, hosts: &[&str]) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        namespace: namespace.into(),
        microvm_template: Some(MicroVmSpec::default()),
        flintlock_hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
        heartbeat_expiry_threshold: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
        ..PoolSpec::default()
    }
}

fn host(name: &str) -> Host {
    Host {
        name: name.into(),
        address: "127.0.0.1:1".into(),
        tls: Some(HostTls {
            insecure: true,
            ..HostTls::default()
        }),
        ..Host::default()
    }
}

fn vm(key: &PoolKey, uid: &str, host: &str, phase: VmPhase) -> VmRecord {
    VmRecord {
        uid: uid.into(),
        pool_name: key.name.clone(),
        pool_namespace: key.namespace.clone(),
        flintlock_host: host.into(),
        phase: phase as i32,
        ..VmRecord::default()
    }
}

/// Writes a VM row through a placement, as provisioning does.
fn add_vm(store: &Store, record: &VmRecord) {
    let key = PoolKey::of_vm(record);
    let placement = store
        .reserve_placement(&key, std::slice::from_ref(&record.flintlock_host))
        .expect("reserve")
        .expect("an eligible host");
    assert!(
        store
            .insert_provisioned_vm(placement.id, record)
            .expect("insert")
    );
}

fn lease(key: &PoolKey, id: &str, uid: &str, request_id: &str) -> LeaseRecord {
    let now = time::now();
    LeaseRecord {
        lease_id: id.into(),
        vm_uid: uid.into(),
        pool_name: key.name.clone(),
        pool_namespace: key.namespace.clone(),
        claimed_at: Some(now),
        last_heartbeat_at: Some(now),
        expires_at: Some(time::add(&now, std::time::Duration::from_secs(60))),
        request_id: request_id.into(),
    }
}

/// A pool "ns/p" on host "h" with one VM "vm-1" in `phase`.
fn pool_with_vm(phase: VmPhase) -> (Store, PoolKey) {
    let store = store();
    assert!(store.insert_host(&host("h")).expect("host"));
    assert!(store.insert_pool(&spec("ns", "p", &["h"])).expect("pool"));
    let key = PoolKey::new("ns", "p");
    add_vm(&store, &vm(&key, "vm-1", "h", phase));
    (store, key)
}

/// Claims vm-1 (AVAILABLE) up to PRE_LEASE_HOOK_RUNNING.
fn claim(store: &Store, key: &PoolKey) -> VmRecord {
    let picked = store.claim_available_vm(key).expect("claim").expect("a VM");
    assert_eq!(phase_of(&picked), VmPhase::Leased);
    assert!(picked.lease_id.is_none());
    assert!(matches!(
        store
            .transition_vm(&picked.uid, VmPhase::PreLeaseHookRunning, false)
            .expect("phase"),
        Transition::Updated
    ));
    picked
}

#[test]
fn pools_are_unique_and_listed_by_namespace_presence() {
    let store = store();
    assert!(store.insert_pool(&spec("a", "p", &[])).expect("insert"));
    assert!(!store.insert_pool(&spec("a", "p", &[])).expect("again"));
    assert!(store.insert_pool(&spec("b", "p", &[])).expect("insert"));
    assert!(store.insert_pool(&spec("", "q", &[])).expect("insert"));
    assert_eq!(store.list_pools_with_counts(None).expect("all").len(), 3);
    let only_empty = store.list_pools_with_counts(Some("")).expect("ns ''");
    assert_eq!(only_empty.len(), 1);
    assert_eq!(only_empty[0].0.name, "q");
    assert_eq!(
        store.list_pools_with_counts(Some("a")).expect("ns a").len(),
        1
    );
    assert!(!store.replace_pool(&spec("c", "p", &[])).expect("missing"));
    let mut resized = spec("a", "p", &[]);
    resized.size = 7;
    assert!(store.replace_pool(&resized).expect("replace"));
    let stored = store.get_pool(&PoolKey::new("a", "p")).expect("get");
    assert_eq!(stored.map(|s| s.size), Some(7));
}

#[test]
fn deleting_is_terminal() {
    let (store, key) = pool_with_vm(VmPhase::Available);
    store.mark_vm_deleting("vm-1").expect("mark").expect("row");
    assert!(matches!(
        store
            .transition_vm("vm-1", VmPhase::Available, false)
            .expect("transition"),
        Transition::Deleting
    ));
    assert!(matches!(
        store
            .transition_vm("missing", VmPhase::Available, false)
            .expect("transition"),
        Transition::Missing
    ));
    assert!(store.claim_available_vm(&key).expect("claim").is_none());
    // The DELETE_AND_REPLACE hook-failure policy removes a row whatever its phase.
    assert!(store.remove_vm("vm-1").expect("remove"));
    assert!(!store.remove_vm("vm-1").expect("remove again"));
}

#[test]
fn a_lease_commits_with_its_vm_and_request_ids_are_unique() {
    let (store, key) = pool_with_vm(VmPhase::Available);
    add_vm(&store, &vm(&key, "vm-2", "h", VmPhase::Available));
    let first = claim(&store, &key);
    assert_eq!(
        store
            .commit_lease(&lease(&key, "l1", &first.uid, "rid"))
            .expect("commit"),
        LeaseCommit::Committed
    );
    let row = store.get_vm(&first.uid).expect("get").expect("row");
    assert_eq!(phase_of(&row), VmPhase::Leased);
    assert_eq!(row.lease_id.as_deref(), Some("l1"));
    let found = store
        .lease_by_request_id("rid")
        .expect("lookup")
        .expect("lease");
    assert_eq!(found.lease_id, "l1");

    let second = claim(&store, &key);
    assert_eq!(
        store
            .commit_lease(&lease(&key, "l2", &second.uid, "rid"))
            .expect("commit"),
        LeaseCommit::RequestIdTaken
    );
    // Nothing of the losing commit was written.
    assert!(store.get_lease("l2").expect("get").is_none());
    let loser = store.get_vm(&second.uid).expect("get").expect("row");
    assert_eq!(phase_of(&loser), VmPhase::PreLeaseHookRunning);

    // Empty request_ids never conflict.
    store
        .transition_vm(&second.uid, VmPhase::PreLeaseHookRunning, false)
        .expect("phase");
    assert_eq!(
        store
            .commit_lease(&lease(&key, "l3", &second.uid, ""))
            .expect("commit"),
        LeaseCommit::Committed
    );
    assert_eq!(store.list_leases(Some(&key)).expect("list").len(), 2);
    assert!(
        store
            .list_leases(Some(&PoolKey::new("ns", "other")))
            .expect("list")
            .is_empty()
    );

    // The request_id is free again once its lease is gone.
    assert!(store.delete_lease("l1").expect("delete"));
    assert!(store.lease_by_request_id("rid").expect("lookup").is_none());
}

#[test]
fn a_lease_does_not_commit_for_a_deleted_vm() {
    let (store, key) = pool_with_vm(VmPhase::Available);
    let picked = claim(&store, &key);
    store.mark_vm_deleting(&picked.uid).expect("mark");
    assert_eq!(
        store
            .commit_lease(&lease(&key, "l1", &picked.uid, "rid"))
            .expect("commit"),
        LeaseCommit::VmGone
    );
    assert!(store.lease_by_request_id("rid").expect("lookup").is_none());
}

#[test]
fn tombstone_refuses_leased_vms_unless_forced() {
    let (store, key) = pool_with_vm(VmPhase::Available);
    add_vm(&store, &vm(&key, "vm-2", "h", VmPhase::Quarantined));
    let picked = claim(&store, &key);
    store
        .commit_lease(&lease(&key, "l1", &picked.uid, "rid"))
        .expect("commit");

    assert!(matches!(
        store.tombstone_pool(&key, false).expect("tombstone"),
        Tombstone::Leased
    ));
    assert!(store.get_pool(&key).expect("get").is_some());

    let Tombstone::Deleted(vms) = store.tombstone_pool(&key, true).expect("tombstone") else {
        panic!("forced delete refused");
    };
    assert_eq!(vms.len(), 2);
    for vm in store.vms_in_phase(VmPhase::Deleting).expect("list") {
        assert!(vm.lease_id.is_none());
    }
    assert!(store.get_pool(&key).expect("get").is_none());
    assert!(store.get_lease("l1").expect("get").is_none());
    assert!(store.lease_by_request_id("rid").expect("lookup").is_none());
    assert!(matches!(
        store.tombstone_pool(&key, true).expect("again"),
        Tombstone::NotFound
    ));
    // The pool is gone, so a finished deletion reports no pool (no event).
    let finished = store
        .finish_vm_deletion(&picked.uid)
        .expect("finish")
        .expect("row");
    assert!(!finished.pool_exists);
}

#[test]
fn finished_deletions_tell_release_from_expiry() {
    let (store, key) = pool_with_vm(VmPhase::Available);
    let picked = claim(&store, &key);
    store
        .commit_lease(&lease(&key, "l1", &picked.uid, ""))
        .expect("commit");
    // A release marks DELETING and keeps the lease row until the deletion is done.
    store.mark_vm_deleting(&picked.uid).expect("mark");
    let finished = store
        .finish_vm_deletion(&picked.uid)
        .expect("finish")
        .expect("row");
    assert!(finished.pool_exists);
    assert!(finished.released);
    assert!(store.get_lease("l1").expect("get").is_none());
    assert!(
        store
            .finish_vm_deletion(&picked.uid)
            .expect("finish")
            .is_none()
    );

    add_vm(&store, &vm(&key, "vm-2", "h", VmPhase::Available));
    let picked = claim(&store, &key);
    store
        .commit_lease(&lease(&key, "l2", &picked.uid, ""))
        .expect("commit");
    let now = time::now();
    // Not expired yet: nothing happens.
    assert!(store.expire_lease("l2", &now).expect("expire").is_none());
    let later = time::add(&now, std::time::Duration::from_secs(61));
    let expired = store
        .expire_lease("l2", &later)
        .expect("expire")
        .expect("vm");
    assert_eq!(phase_of(&expired), VmPhase::Deleting);
    let finished = store
        .finish_vm_deletion(&picked.uid)
        .expect("finish")
        .expect("row");
    assert!(!finished.released);
}

#[test]
fn heartbeat_renews_from_the_pool_threshold() {
    let (store, key) = pool_with_vm(VmPhase::Available);
    let picked = claim(&store, &key);
    store
        .commit_lease(&lease(&key, "l1", &picked.uid, ""))
        .expect("commit");
    let before = time::nanos(Some(&time::now()));
    let Heartbeat::Renewed(expires_at) = store.heartbeat("l1").expect("heartbeat") else {
        panic!("not renewed");
    };
    let delta = time::nanos(Some(&expires_at)) - before;
    assert!((60_000_000_000..61_000_000_000).contains(&delta), "{delta}");
    assert_eq!(
        store.heartbeat("nope").expect("heartbeat"),
        Heartbeat::LeaseNotFound
    );
}

mod durability;
mod placements;
