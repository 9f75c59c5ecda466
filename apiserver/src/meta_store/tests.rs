use super::*;

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
struct Rec {
    n: u32,
}

#[derive(Debug, thiserror::Error)]
enum TestError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("refused")]
    Refused,
}

fn key(ns: &str, name: &str) -> Key {
    Key::new("pools", Some(ns), name)
}

#[test]
fn a_failed_transaction_changes_nothing_and_publishes_nothing() {
    let store = MetaStore::in_memory().unwrap();
    let mut rx = store.hub().subscribe(0).unwrap().receiver;
    let res: Result<(), TestError> = store.transact(|tx| {
        let rv = tx.next_resource_version();
        tx.put(&key("a", "x"), &Rec { n: 1 })?;
        tx.record_change(&key("a", "x"), ChangeType::Added, rv, Arc::new(()));
        Err(TestError::Refused)
    });
    assert!(matches!(res, Err(TestError::Refused)));
    assert_eq!(store.get::<Rec>(&key("a", "x")).unwrap(), None);
    assert_eq!(store.resource_version().unwrap(), 0);
    assert!(rx.try_recv().is_err());
}

#[test]
fn resource_versions_increase_across_transactions_and_lists_filter_by_namespace() {
    let store = MetaStore::in_memory().unwrap();
    for (ns, name, n) in [("a", "x", 1), ("a", "y", 2), ("b", "x", 3)] {
        store
            .transact(|tx| -> Result<(), StoreError> {
                let rv = tx.next_resource_version();
                assert_eq!(rv, u64::from(n));
                tx.put(&key(ns, name), &Rec { n })
            })
            .unwrap();
    }
    let (in_a, rv) = store.list::<Rec>("pools", Some("a")).unwrap();
    assert_eq!(in_a, [Rec { n: 1 }, Rec { n: 2 }]);
    assert_eq!(rv, 3);
    let (all, _) = store.list::<Rec>("pools", None).unwrap();
    assert_eq!(all.len(), 3);
    assert!(store.list::<Rec>("hosts", None).unwrap().0.is_empty());
}

#[test]
fn a_namespace_prefix_does_not_match_a_longer_namespace() {
    let store = MetaStore::in_memory().unwrap();
    store
        .transact(|tx| -> Result<(), StoreError> {
            tx.put(&key("ab", "x"), &Rec { n: 1 })?;
            tx.put(&key("a", "x"), &Rec { n: 2 })
        })
        .unwrap();
    assert_eq!(
        store.list::<Rec>("pools", Some("a")).unwrap().0,
        [Rec { n: 2 }]
    );
}

#[test]
fn state_survives_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.redb");
    {
        let store = MetaStore::open(&path).unwrap();
        store
            .transact(|tx| -> Result<(), StoreError> {
                tx.next_resource_version();
                tx.put(&key("a", "x"), &Rec { n: 7 })?;
                tx.set_last_battery_event_id(42)
            })
            .unwrap();
    }
    let store = MetaStore::open(&path).unwrap();
    assert_eq!(
        store.get::<Rec>(&key("a", "x")).unwrap(),
        Some(Rec { n: 7 })
    );
    assert_eq!(store.resource_version().unwrap(), 1);
    assert_eq!(store.last_battery_event_id().unwrap(), 42);
    // A watch from before the restart cannot be served from memory.
    assert!(store.hub().subscribe(0).is_err());
}

#[test]
fn watchers_see_committed_changes_in_order() {
    let store = MetaStore::in_memory().unwrap();
    let mut rx = store.hub().subscribe(0).unwrap().receiver;
    store
        .transact(|tx| -> Result<(), StoreError> {
            for name in ["x", "y"] {
                let rv = tx.next_resource_version();
                tx.put(&key("a", name), &Rec { n: 0 })?;
                tx.record_change(&key("a", name), ChangeType::Added, rv, Arc::new(()));
            }
            Ok(())
        })
        .unwrap();
    assert_eq!(rx.try_recv().unwrap().name, "x");
    assert_eq!(rx.try_recv().unwrap().resource_version, 2);
}

#[test]
fn pages_resume_after_their_key_and_count_what_follows() {
    let store = MetaStore::in_memory().unwrap();
    // "a-b/..." sorts before "a/...": pages follow the keys' byte order.
    let records = [("a", "x", 1), ("a", "z", 2), ("a-b", "y", 3), ("c", "w", 4)];
    store
        .transact(|tx| -> Result<(), StoreError> {
            for (ns, name, n) in records {
                tx.put(&key(ns, name), &Rec { n })?;
            }
            tx.put(&Key::new("zones", Some("a"), "x"), &Rec { n: 9 })
        })
        .unwrap();
    let mut after: Option<String> = None;
    let mut seen = Vec::new();
    loop {
        let page = store
            .page::<Rec>("pools", None, after.as_deref(), 1)
            .unwrap();
        let [record] = page.records.as_slice() else {
            panic!("a page of one held {:?}", page.records);
        };
        seen.push(record.n);
        assert_eq!(page.rest, records.len() - seen.len());
        if page.rest == 0 {
            break;
        }
        let (ns, name, _) = records.iter().find(|r| r.2 == record.n).unwrap();
        after = Some(format!("{ns}/{name}"));
    }
    assert_eq!(seen, [3, 1, 2, 4]);

    let in_a = store
        .page::<Rec>("pools", Some("a"), Some("a/x"), 10)
        .unwrap();
    assert_eq!((in_a.records, in_a.rest), (vec![Rec { n: 2 }], 0));
    // A key before the namespace starts it from its first record; one after, nothing.
    let from_before = store
        .page::<Rec>("pools", Some("a"), Some("a-b/y"), 10)
        .unwrap();
    assert_eq!(from_before.records, [Rec { n: 1 }, Rec { n: 2 }]);
    let past = store
        .page::<Rec>("pools", Some("a"), Some("b/"), 10)
        .unwrap();
    assert!(past.records.is_empty());
}
