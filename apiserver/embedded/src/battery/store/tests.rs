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
    assert!(!store.remove_vm("vm-1").expect("remove"));
    assert!(store.claim_available_vm(&key).expect("claim").is_none());
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
        Tombstone::Leased(1)
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

#[test]
fn recovery_deletes_abandoned_claims_and_clears_placements() {
    let (store, key) = pool_with_vm(VmPhase::Available);
    add_vm(&store, &vm(&key, "vm-2", "h", VmPhase::PreLeaseHookRunning));
    add_vm(&store, &vm(&key, "vm-3", "h", VmPhase::Leased));
    let mut orphan = vm(&key, "vm-4", "h", VmPhase::Leased);
    orphan.lease_id = Some("gone".into());
    add_vm(&store, &orphan);
    add_vm(&store, &vm(&key, "vm-5", "h", VmPhase::CreateHookRunning));
    store
        .reserve_placement(&key, &["h".to_owned()])
        .expect("reserve")
        .expect("placement");

    let recovery = store.recover().expect("recover");
    assert_eq!(recovery.abandoned_claims, 3);
    assert_eq!(recovery.placements_cleared, 1);
    let deleting: Vec<String> = store
        .vms_in_phase(VmPhase::Deleting)
        .expect("list")
        .into_iter()
        .map(|vm| vm.uid)
        .collect();
    assert_eq!(deleting, ["vm-2", "vm-3", "vm-4"]);
    assert_eq!(
        store.get_host_with_count("h").expect("host").map(|h| h.1),
        Some(5)
    );
}

#[test]
fn placement_picks_the_least_loaded_eligible_host() {
    let store = store();
    for name in ["a", "b", "c"] {
        assert!(store.insert_host(&host(name)).expect("host"));
    }
    let key = PoolKey::new("ns", "p");
    assert!(
        store
            .insert_pool(&spec("ns", "p", &["a", "b", "c"]))
            .expect("pool")
    );
    let hosts: Vec<String> = ["x", "c", "b", "a"]
        .iter()
        .map(|h| (*h).to_owned())
        .collect();
    store.set_cordon("a", Some("maintenance")).expect("cordon");
    // Unregistered "x" and cordoned "a" are skipped; ties go to list order; reservations count.
    let picks: Vec<String> = (0..4)
        .map(|_| {
            store
                .reserve_placement(&key, &hosts)
                .expect("reserve")
                .expect("a host")
                .host
        })
        .collect();
    assert_eq!(picks, ["c", "b", "c", "b"]);
    let counts: Vec<i32> = store
        .list_hosts_with_counts()
        .expect("list")
        .into_iter()
        .map(|(_, count)| count)
        .collect();
    assert_eq!(counts, [0, 2, 2]);
    // Other pools' VMs and this pool's DELETING VMs do not count.
    let other = PoolKey::new("ns", "other");
    assert!(
        store
            .insert_pool(&spec("ns", "other", &["b"]))
            .expect("pool")
    );
    add_vm(&store, &vm(&other, "o-1", "b", VmPhase::Available));
    store.set_cordon("a", None).expect("uncordon");
    let pick = store
        .reserve_placement(&key, &hosts)
        .expect("reserve")
        .expect("host");
    assert_eq!(pick.host, "a");
    store.set_cordon("a", Some("again")).expect("cordon");
    store.set_cordon("b", Some("again")).expect("cordon");
    store.set_cordon("c", Some("again")).expect("cordon");
    assert!(
        store
            .reserve_placement(&key, &hosts)
            .expect("reserve")
            .is_none()
    );
}

#[test]
fn provisioned_rows_need_their_pool() {
    let (store, key) = pool_with_vm(VmPhase::Available);
    let placement = store
        .reserve_placement(&key, &["h".to_owned()])
        .expect("reserve")
        .expect("placement");
    store.tombstone_pool(&key, true).expect("tombstone");
    assert!(
        !store
            .insert_provisioned_vm(placement.id, &vm(&key, "late", "h", VmPhase::Provisioning))
            .expect("insert")
    );
    assert!(store.get_vm("late").expect("get").is_none());
    // The reservation is released either way.
    assert_eq!(
        store.get_host_with_count("h").expect("host").map(|h| h.1),
        Some(1)
    );
}

#[test]
fn hosts_cordon_and_removal_rules() {
    let (store, key) = pool_with_vm(VmPhase::Available);
    assert!(!store.insert_host(&host("h")).expect("duplicate"));
    let cordoned = store
        .set_cordon("h", Some("why"))
        .expect("cordon")
        .expect("host");
    assert!(cordoned.cordoned);
    assert_eq!(cordoned.cordoned_reason, "why");
    assert!(cordoned.cordoned_at.is_some());
    let uncordoned = store
        .set_cordon("h", None)
        .expect("uncordon")
        .expect("host");
    assert!(!uncordoned.cordoned && uncordoned.cordoned_reason.is_empty());
    assert!(uncordoned.cordoned_at.is_none());
    assert!(store.set_cordon("nope", None).expect("cordon").is_none());

    assert_eq!(
        store.remove_host("h").expect("remove"),
        HostRemoval::InUse {
            pools: vec!["ns/p".into()],
            vm_count: 1
        }
    );
    store.tombstone_pool(&key, true).expect("tombstone");
    assert_eq!(
        store.remove_host("h").expect("remove"),
        HostRemoval::InUse {
            pools: vec![],
            vm_count: 1
        }
    );
    store.finish_vm_deletion("vm-1").expect("finish");
    assert_eq!(
        store.remove_host("h").expect("remove"),
        HostRemoval::Removed
    );
    assert_eq!(
        store.remove_host("h").expect("remove"),
        HostRemoval::NotFound
    );
    assert_eq!(
        store
            .unknown_hosts(&["h".into(), "h".into(), "z".into()])
            .expect("unknown"),
        ["h", "z"]
    );
}

#[test]
fn events_share_one_increasing_sequence() {
    let store = store();
    let a = PoolKey::new("ns", "a");
    let b = PoolKey::new("ns", "b");
    let mut wake = store.watch_events();
    for i in 0..5 {
        let pool = if i % 2 == 0 { &a } else { &b };
        store
            .append_event(pool, &format!("vm-{i}"), EventType::VmProvisioned)
            .expect("append");
    }
    assert!(wake.has_changed().expect("watch"));
    assert_eq!(*wake.borrow_and_update(), 5);
    let all = store.events_after(0, None, 100).expect("all");
    let ids: Vec<i64> = all.iter().map(|e| e.id).collect();
    assert_eq!(ids, [1, 2, 3, 4, 5]);
    assert!(
        all.iter()
            .all(|e| e.payload_json.is_empty() && e.created_at.is_some())
    );
    let only_a: Vec<i64> = store
        .events_after(0, Some(&a), 100)
        .expect("a")
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(only_a, [1, 3, 5]);
    let batch: Vec<i64> = store
        .events_after(1, None, 2)
        .expect("batch")
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(batch, [2, 3]);
    assert!(store.events_after(5, None, 100).expect("none").is_empty());
}

#[test]
fn a_file_store_survives_reopening() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = Store::open(Some(dir.path())).expect("open");
        assert!(store.insert_pool(&spec("ns", "p", &[])).expect("pool"));
        store
            .append_event(&PoolKey::new("ns", "p"), "vm", EventType::VmAvailable)
            .expect("event");
    }
    let store = Store::open(Some(dir.path())).expect("reopen");
    assert!(
        store
            .get_pool(&PoolKey::new("ns", "p"))
            .expect("get")
            .is_some()
    );
    assert_eq!(*store.watch_events().borrow(), 1);
    let next = store
        .append_event(&PoolKey::new("ns", "p"), "vm", EventType::VmClaimed)
        .expect("event");
    assert_eq!(next.id, 2);
}

#[test]
fn a_closed_store_releases_its_file_and_refuses_calls() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(Some(dir.path())).expect("open");
    store.close();
    assert!(matches!(store.read(|_| Ok(())), Err(StoreError::Closed)));
    // The file is free for the next battery even while this handle lives on.
    Store::open(Some(dir.path())).expect("reopen after close");
}

#[test]
fn a_newer_schema_refuses_to_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = Store::open(Some(dir.path())).expect("open");
        store
            .write(|txn| {
                txn.open_table(META)?
                    .insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION + 1)?;
                Ok(())
            })
            .expect("write");
    }
    assert!(matches!(
        Store::open(Some(dir.path())),
        Err(StoreError::TooNew { .. })
    ));
}

/// The `pool_vms` index holds one entry for each VM row, with the row's pool, phase and
/// lease, and each pool's counts read from it are the rows' own.
fn assert_indexed(store: &Store, pools: &[&PoolKey]) {
    let rows: Vec<VmRecord> = store
        .read(|txn| decode_all(&txn.open_table(VMS)?, "vm"))
        .expect("rows");
    let mut from_rows: Vec<_> = rows
        .iter()
        .map(|vm| {
            let pool = (vm.pool_namespace.clone(), vm.pool_name.clone());
            (pool, vm.phase, vm.uid.clone(), vm.lease_id.is_some())
        })
        .collect();
    from_rows.sort();
    let indexed = store
        .read(|txn| {
            let mut indexed = Vec::new();
            for entry in txn.open_table(pool_vms::POOL_VMS)?.iter()? {
                let (key, leased) = entry?;
                let (namespace, name, phase, uid) = key.value();
                let pool = (namespace.to_owned(), name.to_owned());
                indexed.push((pool, phase, uid.to_owned(), leased.value()));
            }
            Ok(indexed)
        })
        .expect("index");
    assert_eq!(indexed, from_rows);
    let listed = store.list_pools_with_counts(None).expect("list");
    for key in pools {
        let own = VmCounts::tally(rows.iter().filter(|vm| PoolKey::of_vm(vm) == **key));
        assert_eq!(store.pool_counts(key).expect("counts"), own, "{key}");
        if let Some((_, in_list)) = listed
            .iter()
            .find(|(spec, _)| PoolKey::of_spec(spec) == **key)
        {
            assert_eq!(*in_list, own, "{key} as ListPools counts it");
        }
    }
}

#[test]
fn the_pool_index_follows_every_vm_write() {
    let store = store();
    assert!(store.insert_host(&host("h")).expect("host"));
    let (a, b) = (PoolKey::new("ns", "a"), PoolKey::new("ns", "b"));
    for key in [&a, &b] {
        assert!(
            store
                .insert_pool(&spec(&key.namespace, &key.name, &["h"]))
                .expect("pool")
        );
    }
    add_vm(&store, &vm(&a, "vm-1", "h", VmPhase::Available));
    add_vm(&store, &vm(&b, "vm-2", "h", VmPhase::Available));
    add_vm(&store, &vm(&a, "vm-3", "h", VmPhase::Available));
    add_vm(&store, &vm(&a, "vm-4", "h", VmPhase::Quarantined));
    assert_indexed(&store, &[&a, &b]);

    // b's pick skips a's VM that sorts before its own.
    let picked = claim(&store, &b);
    assert_eq!(picked.uid, "vm-2");
    assert_indexed(&store, &[&a, &b]);
    store
        .commit_lease(&lease(&b, "l1", "vm-2", "rid"))
        .expect("commit");
    assert_indexed(&store, &[&a, &b]);
    assert!(store.claim_available_vm(&b).expect("claim").is_none());

    assert_eq!(claim(&store, &a).uid, "vm-1");
    store.mark_vm_deleting("vm-1").expect("deleting");
    assert_indexed(&store, &[&a, &b]);
    store.finish_vm_deletion("vm-1").expect("finish");
    assert!(store.remove_vm("vm-4").expect("remove"));
    assert_indexed(&store, &[&a, &b]);

    assert!(matches!(
        store.tombstone_pool(&b, true).expect("tombstone"),
        Tombstone::Deleted(_)
    ));
    assert_indexed(&store, &[&a, &b]);
    assert_eq!(claim(&store, &a).uid, "vm-3");
    store
        .commit_lease(&lease(&a, "l2", "vm-3", ""))
        .expect("commit");
    let later = time::add(&time::now(), std::time::Duration::from_secs(120));
    assert!(store.expire_lease("l2", &later).expect("expire").is_some());
    assert_indexed(&store, &[&a, &b]);
    add_vm(&store, &vm(&a, "vm-5", "h", VmPhase::Available));
    claim(&store, &a);
    store.recover().expect("recover");
    assert_indexed(&store, &[&a, &b]);
    assert_eq!(store.pool_counts(&a).expect("counts").available, 0);
}

#[test]
fn a_store_from_before_the_pool_index_gets_it_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = PoolKey::new("ns", "p");
    {
        let store = Store::open(Some(dir.path())).expect("open");
        assert!(store.insert_host(&host("h")).expect("host"));
        assert!(store.insert_pool(&spec("ns", "p", &["h"])).expect("pool"));
        add_vm(&store, &vm(&key, "vm-1", "h", VmPhase::Available));
        add_vm(&store, &vm(&key, "vm-2", "h", VmPhase::Quarantined));
        // As schema version 1 left it: the rows, no index.
        store
            .write(|txn| {
                txn.delete_table(pool_vms::POOL_VMS)?;
                txn.open_table(META)?.insert(SCHEMA_VERSION_KEY, 1)?;
                Ok(())
            })
            .expect("downgrade");
    }
    let store = Store::open(Some(dir.path())).expect("reopen");
    assert_indexed(&store, &[&key]);
    assert_eq!(claim(&store, &key).uid, "vm-1");
    let version = store
        .read(|txn| {
            Ok(txn
                .open_table(META)?
                .get(SCHEMA_VERSION_KEY)?
                .map(|v| v.value()))
        })
        .expect("version");
    assert_eq!(version, Some(SCHEMA_VERSION));
}
