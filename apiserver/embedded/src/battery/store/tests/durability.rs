//! Events, the file store, its schema and the pool index.

use super::*;
use crate::battery::store::db::{META, SCHEMA_VERSION, SCHEMA_VERSION_KEY, VMS, decode_all};
use redb::ReadableTable;

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
