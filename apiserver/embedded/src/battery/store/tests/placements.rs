//! Placements, hosts and startup recovery.

use super::*;

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
fn placement_picks_the_host_with_fewest_of_the_pools_rows() {
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
    let pick = || {
        store
            .reserve_placement(&key, &hosts)
            .expect("reserve")
            .map(|placement| placement.host)
    };
    store.set_cordon("a", Some("maintenance")).expect("cordon");
    // Unregistered "x" and cordoned "a" are skipped and ties go to list order. Reservations
    // do not count, so picks in a row (one pass's) all land on one host, as in poolmgrd...
    let picks: Vec<Option<String>> = (0..3).map(|_| pick()).collect();
    assert_eq!(
        picks,
        [Some("c".to_owned()), Some("c".into()), Some("c".into())]
    );
    // ...though they count toward the host's vm_count.
    let counts: Vec<i32> = store
        .list_hosts_with_counts()
        .expect("list")
        .into_iter()
        .map(|(_, count)| count)
        .collect();
    assert_eq!(counts, [0, 0, 3]);
    // This pool's rows count.
    add_vm(&store, &vm(&key, "c-1", "c", VmPhase::Available));
    assert_eq!(pick().as_deref(), Some("b"));
    // Other pools' VMs, and this pool's DELETING or FAILED ones, do not.
    let other = PoolKey::new("ns", "other");
    assert!(
        store
            .insert_pool(&spec("ns", "other", &["c"]))
            .expect("pool")
    );
    add_vm(&store, &vm(&other, "o-1", "c", VmPhase::Available));
    add_vm(&store, &vm(&key, "c-2", "c", VmPhase::Failed));
    add_vm(&store, &vm(&key, "c-3", "c", VmPhase::Available));
    store.mark_vm_deleting("c-3").expect("deleting");
    add_vm(&store, &vm(&key, "b-1", "b", VmPhase::Available));
    assert_eq!(
        pick().as_deref(),
        Some("c"),
        "c and b hold one live VM each"
    );
    store.set_cordon("a", None).expect("uncordon");
    assert_eq!(pick().as_deref(), Some("a"), "a holds none");
    for name in ["a", "b", "c"] {
        store.set_cordon(name, Some("again")).expect("cordon");
    }
    assert_eq!(pick(), None);
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
