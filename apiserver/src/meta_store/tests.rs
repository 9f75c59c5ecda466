use super::*;
use crate::watch::ChangeType;
use redb::Database;

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

#[tokio::test]
async fn a_failed_transaction_changes_nothing_and_publishes_nothing() {
    let store = Arc::new(MetaStore::in_memory().unwrap());
    let mut rx = store.hub().subscribe(0).unwrap().receiver;
    let res: Result<(), TestError> = store
        .transact(|tx| {
            let rv = tx.next_resource_version();
            tx.put(&key("a", "x"), &Rec { n: 1 })?;
            tx.record_change(&key("a", "x"), ChangeType::Added, rv, Arc::new(()));
            Err(TestError::Refused)
        })
        .await;
    assert!(matches!(res, Err(TestError::Refused)));
    assert_eq!(store.get::<Rec>(&key("a", "x")).unwrap(), None);
    assert_eq!(store.resource_version().unwrap(), 0);
    assert!(rx.try_recv().is_err());
}

#[tokio::test]
async fn resource_versions_increase_across_transactions_and_lists_filter_by_namespace() {
    let store = Arc::new(MetaStore::in_memory().unwrap());
    for (ns, name, n) in [("a", "x", 1), ("a", "y", 2), ("b", "x", 3)] {
        store
            .transact(|tx| -> Result<(), StoreError> {
                let rv = tx.next_resource_version();
                assert_eq!(rv, u64::from(n));
                tx.put(&key(ns, name), &Rec { n })
            })
            .await
            .unwrap();
    }
    let (in_a, rv) = store.list::<Rec>("pools", Some("a")).unwrap();
    assert_eq!(in_a, [Rec { n: 1 }, Rec { n: 2 }]);
    assert_eq!(rv, 3);
    let (all, _) = store.list::<Rec>("pools", None).unwrap();
    assert_eq!(all.len(), 3);
    assert!(store.list::<Rec>("hosts", None).unwrap().0.is_empty());
}

#[tokio::test]
async fn a_namespace_prefix_does_not_match_a_longer_namespace() {
    let store = Arc::new(MetaStore::in_memory().unwrap());
    store
        .transact(|tx| -> Result<(), StoreError> {
            tx.put(&key("ab", "x"), &Rec { n: 1 })?;
            tx.put(&key("a", "x"), &Rec { n: 2 })
        })
        .await
        .unwrap();
    assert_eq!(
        store.list::<Rec>("pools", Some("a")).unwrap().0,
        [Rec { n: 2 }]
    );
}

#[tokio::test]
async fn state_survives_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.redb");
    {
        let store = Arc::new(MetaStore::open(&path).unwrap());
        store
            .transact(|tx| -> Result<(), StoreError> {
                tx.next_resource_version();
                tx.put(&key("a", "x"), &Rec { n: 7 })?;
                tx.set_last_battery_event_id(42)
            })
            .await
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

#[tokio::test]
async fn watchers_see_committed_changes_in_order() {
    let store = Arc::new(MetaStore::in_memory().unwrap());
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
        .await
        .unwrap();
    assert_eq!(rx.try_recv().unwrap().name, "x");
    assert_eq!(rx.try_recv().unwrap().resource_version, 2);
}

#[tokio::test]
async fn pages_resume_after_their_key_and_count_what_follows() {
    let store = Arc::new(MetaStore::in_memory().unwrap());
    // "a-b/..." sorts before "a/...": pages follow the keys' byte order.
    let records = [("a", "x", 1), ("a", "z", 2), ("a-b", "y", 3), ("c", "w", 4)];
    store
        .transact(|tx| -> Result<(), StoreError> {
            for (ns, name, n) in records {
                tx.put(&key(ns, name), &Rec { n })?;
            }
            tx.put(&Key::new("zones", Some("a"), "x"), &Rec { n: 9 })
        })
        .await
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

/// What a kill at this instant would leave (the page cache outlives a process): a copy
/// of the store's file and of its log.
fn crash_files(path: &Path, name: &str) -> std::path::PathBuf {
    let copy = path.with_file_name(format!("{name}.redb"));
    std::fs::copy(path, &copy).unwrap();
    std::fs::copy(log_path(path), log_path(&copy)).unwrap();
    copy
}

/// [`crash_files`], opened.
fn crash_copy(path: &Path, name: &str) -> MetaStore {
    MetaStore::open(&crash_files(path, name)).unwrap()
}

/// A store on disk in a directory of its own (removed when dropped), and its path.
fn store_in_a_new_directory() -> (tempfile::TempDir, PathBuf, Arc<MetaStore>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.redb");
    let store = Arc::new(MetaStore::open(&path).unwrap());
    (dir, path, store)
}

fn put_added(tx: &mut Txn, key: &Key, n: u32) -> Result<u64, StoreError> {
    let rv = tx.next_resource_version();
    tx.put(key, &Rec { n })?;
    tx.record_change(key, ChangeType::Added, rv, Arc::new(()));
    Ok(rv)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_writes_are_durable_when_they_return_and_published_once_in_order() {
    let (_dir, path, store) = store_in_a_new_directory();
    let mut rx = store.hub().subscribe(0).unwrap().receiver;
    // A commit whose sync has not come yet is seen by readers, not told to watchers.
    let unsynced = key("a", "unsynced");
    {
        let writing = store.writer.lock().await;
        store
            .write(&writing, |tx| put_added(tx, &unsynced, 0))
            .unwrap();
    }
    assert_eq!(store.get::<Rec>(&unsynced).unwrap(), Some(Rec { n: 0 }));
    assert!(rx.try_recv().is_err());
    assert!(
        logged(&path).is_empty(),
        "its record waits for a sync to write it"
    );

    let writes: Vec<_> = (1..=64)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .transact(|tx| put_added(tx, &key("a", &format!("c{n}")), n))
                    .await
            })
        })
        .collect();
    let mut rvs = vec![1];
    for write in writes {
        rvs.push(write.await.unwrap().unwrap());
    }
    let after = crash_copy(&path, "after");
    assert_eq!(after.get::<Rec>(&unsynced).unwrap(), Some(Rec { n: 0 }));
    for n in 1..=64 {
        let stored = after.get::<Rec>(&key("a", &format!("c{n}"))).unwrap();
        assert_eq!(
            stored,
            Some(Rec { n }),
            "c{n} durable once its write returned"
        );
    }
    assert_eq!(after.resource_version().unwrap(), 65);
    rvs.sort_unstable();
    let published: Vec<u64> = std::iter::from_fn(|| rx.try_recv().ok())
        .map(|change| change.resource_version)
        .collect();
    assert_eq!(
        published, rvs,
        "every change once, in resourceVersion order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_written_ahead_or_beside_are_read_at_once_and_told_to_watchers_once_durable() {
    let (_dir, path, store) = store_in_a_new_directory();
    let mut rx = store.hub().subscribe(0).unwrap().receiver;
    let waited = key("a", "waited");
    let (rv, durable) = store
        .transact_ahead(|tx| put_added(tx, &waited, 1))
        .await
        .unwrap();
    assert_eq!(store.get::<Rec>(&waited).unwrap(), Some(Rec { n: 1 }));
    // Nobody waits for this one: its own thread makes it durable and tells watchers.
    let unwaited = key("a", "unwaited");
    let (_, ignored) = store
        .transact_ahead(|tx| put_added(tx, &unwaited, 2))
        .await
        .unwrap();
    drop(ignored);
    durable.wait().await.unwrap();
    let after = crash_copy(&path, "after");
    assert_eq!(after.get::<Rec>(&waited).unwrap(), Some(Rec { n: 1 }));
    let told = rx.recv().await.unwrap();
    assert_eq!((told.name.as_str(), told.resource_version), ("waited", rv));
    assert_eq!(rx.recv().await.unwrap().name, "unwaited");
    let after = crash_copy(&path, "later");
    assert_eq!(after.get::<Rec>(&unwaited).unwrap(), Some(Rec { n: 2 }));

    // One made beside the caller is durable once waited for.
    let beside = key("a", "beside");
    let written = beside.clone();
    store
        .transact_beside(move |tx| put_added(tx, &written, 3).map(drop))
        .wait()
        .await
        .unwrap();
    let after = crash_copy(&path, "beside");
    assert_eq!(after.get::<Rec>(&beside).unwrap(), Some(Rec { n: 3 }));
    assert_eq!(rx.recv().await.unwrap().name, "beside");
}

/// The records the log at `path`'s store would replay, or skip as redb's.
fn logged(path: &Path) -> Vec<log::Record> {
    log::parse(&std::fs::read(log_path(path)).unwrap()).records
}

/// Checkpoints `store` on a blocking thread, as its writers do.
async fn checkpoint(store: &Arc<MetaStore>) {
    let store = store.clone();
    tokio::task::spawn_blocking(move || store.checkpoint())
        .await
        .unwrap()
        .unwrap();
}

/// How many bytes of a log's `bytes` its records take.
fn logged_bytes(bytes: &[u8]) -> usize {
    log::parse(bytes)
        .records
        .iter()
        .map(|r| r.encode().len())
        .sum()
}

/// Three commits, the second also recording battery event 7, in a store made in a new
/// directory and left open: only the log holds them (redb has no durable commit of them).
/// Returns the directory (removed when dropped), the store's path and the store.
async fn three_logged_commits() -> (tempfile::TempDir, PathBuf, Arc<MetaStore>) {
    let (dir, path, store) = store_in_a_new_directory();
    for n in 1..=3 {
        store
            .transact(|tx| -> Result<(), StoreError> {
                put_added(tx, &key("a", &format!("x{n}")), n)?;
                if n == 2 {
                    tx.set_last_battery_event_id(7)?;
                }
                Ok(())
            })
            .await
            .unwrap();
    }
    (dir, path, store)
}

#[tokio::test]
async fn commits_only_in_the_log_are_replayed_and_a_torn_tail_is_dropped() {
    let (_dir, path, _store) = three_logged_commits().await;

    let whole = crash_copy(&path, "whole");
    for n in 1..=3 {
        let stored = whole.get::<Rec>(&key("a", &format!("x{n}"))).unwrap();
        assert_eq!(stored, Some(Rec { n }), "x{n} replayed from the log");
    }
    assert_eq!(whole.resource_version().unwrap(), 3);
    assert_eq!(whole.last_battery_event_id().unwrap(), 7);

    // The last record's end not written (a write torn by the crash), or one byte of it
    // changed.
    type Damage = fn(&mut [u8]);
    let damages: [(&str, Damage); 2] = [
        ("cut", |last| {
            let end = last.len();
            last[end - 5..].fill(0);
        }),
        ("flipped", |last| *last.last_mut().unwrap() ^= 1),
    ];
    for (name, damage) in damages {
        let copy = crash_files(&path, name);
        let mut log = std::fs::read(log_path(&copy)).unwrap();
        let end = logged_bytes(&log);
        damage(&mut log[..end]);
        std::fs::write(log_path(&copy), &log).unwrap();
        assert!(log::parse(&log).torn, "{name}");
        let store = Arc::new(MetaStore::open(&copy).unwrap());
        assert_eq!(
            store.get::<Rec>(&key("a", "x2")).unwrap(),
            Some(Rec { n: 2 })
        );
        assert_eq!(store.get::<Rec>(&key("a", "x3")).unwrap(), None, "{name}");
        assert_eq!(store.resource_version().unwrap(), 2, "{name}");
        assert_eq!(store.last_battery_event_id().unwrap(), 7, "{name}");
        // Open made redb durable and started the log again, so the next record follows
        // no torn one.
        assert!(logged(&copy).is_empty());
        store
            .transact(|tx| put_added(tx, &key("a", "x4"), 4))
            .await
            .unwrap();
        let again = crash_copy(&copy, &format!("{name}-again"));
        assert_eq!(
            again.get::<Rec>(&key("a", "x4")).unwrap(),
            Some(Rec { n: 4 })
        );
        assert_eq!(again.resource_version().unwrap(), 3, "{name}");
    }
}

#[tokio::test]
async fn records_a_checkpoint_covered_are_not_applied_again() {
    let (_dir, path, store) = three_logged_commits().await;
    let stale_log = std::fs::read(log_path(&path)).unwrap();
    store
        .transact(|tx| -> Result<(), StoreError> {
            tx.next_resource_version();
            tx.delete(&key("a", "x1"))
        })
        .await
        .unwrap();
    checkpoint(&store).await;
    assert!(logged(&path).is_empty());
    // A crash after redb's durable commit, before the log's start was marked: its
    // records are older than what redb holds.
    let copy = crash_files(&path, "checkpointed");
    std::fs::write(log_path(&copy), &stale_log).unwrap();
    let reopened = MetaStore::open(&copy).unwrap();
    assert_eq!(reopened.get::<Rec>(&key("a", "x1")).unwrap(), None);
    assert_eq!(
        reopened.get::<Rec>(&key("a", "x3")).unwrap(),
        Some(Rec { n: 3 })
    );
    assert_eq!(reopened.resource_version().unwrap(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_checkpointed_once_it_outgrows_its_bound() {
    let (_dir, path, store) = store_in_a_new_directory();
    let padding = "p".repeat(2048);
    let writes = CHECKPOINT_BYTES / 2048 + 16;
    for n in 0..writes {
        let padding = padding.clone();
        store
            .transact(|tx| tx.put(&key("a", &format!("big{n}")), &padding))
            .await
            .unwrap();
    }
    // The checkpoint runs beside the writers, on a blocking thread, and holds the
    // writer's lock: once it can be taken after the writes, the checkpoint is done.
    while store.checkpointing.load(Ordering::Acquire) {
        tokio::task::yield_now().await;
    }
    let log_end = store.log.as_ref().unwrap().end();
    assert!(log_end < CHECKPOINT_BYTES, "checkpointed");
    assert!(logged(&path).len() < usize::try_from(writes).unwrap());
    assert_eq!(
        std::fs::metadata(log_path(&path)).unwrap().len(),
        PREALLOCATED_BYTES,
        "records go on blocks written ahead of them"
    );
    let copy = crash_copy(&path, "copy");
    let (all, _) = copy.list::<String>("pools", Some("a")).unwrap();
    assert_eq!(all.len() as u64, writes);
}

/// A checkpoint drops the records still queued (ADR 52): redb's durable commit holds
/// their commits, and the log starts again without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_makes_queued_records_durable_in_redb_and_drops_them() {
    let (_dir, path, store) = store_in_a_new_directory();
    let queued = key("a", "queued");
    {
        let writing = store.writer.lock().await;
        store
            .write(&writing, |tx| put_added(tx, &queued, 1))
            .unwrap();
    }
    checkpoint(&store).await;
    assert_eq!(store.log.as_ref().unwrap().end(), 0);
    store
        .transact(|tx| put_added(tx, &key("a", "after"), 2))
        .await
        .unwrap();
    let records = logged(&path);
    assert_eq!(records.len(), 1, "only the commit after the checkpoint");
    assert_eq!(records[0].seq, 2);
    let copy = crash_copy(&path, "copy");
    assert_eq!(copy.get::<Rec>(&queued).unwrap(), Some(Rec { n: 1 }));
    assert_eq!(
        copy.get::<Rec>(&key("a", "after")).unwrap(),
        Some(Rec { n: 2 })
    );
}

/// Once a write or sync of the log failed, a commit fails before redb takes it: readers
/// never see a commit that could not be made durable, and no record waits for a write
/// that cannot come.
#[tokio::test]
async fn a_broken_log_takes_no_commit() {
    let (_dir, _path, store) = store_in_a_new_directory();
    let log = store.log.as_ref().unwrap();
    log.break_it();
    let refused = store
        .transact(|tx| put_added(tx, &key("a", "refused"), 1))
        .await;
    assert!(matches!(refused, Err(StoreError::Log(_))));
    assert_eq!(store.get::<Rec>(&key("a", "refused")).unwrap(), None);
    assert_eq!(store.resource_version().unwrap(), 0);
    assert_eq!(log.end(), 0, "nothing queued");
}

/// Today's tables, as the store before ADR 39 wrote them, with no log beside them.
#[tokio::test]
async fn a_store_written_before_the_log_opens_with_everything_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("apiserver.redb");
    {
        let db = Database::create(&path).unwrap();
        let tx = db.begin_write().unwrap();
        {
            let mut objects = tx.open_table(OBJECTS).unwrap();
            for (name, n) in [("x", 1), ("y", 2)] {
                let json = serde_json::to_vec(&Rec { n }).unwrap();
                objects
                    .insert(format!("pools/a/{name}").as_str(), json.as_slice())
                    .unwrap();
            }
            tx.open_table(INTENTS)
                .unwrap()
                .insert("microvmclaims/a/c", b"{}".as_slice())
                .unwrap();
            let mut counters = tx.open_table(COUNTERS).unwrap();
            counters.insert(RESOURCE_VERSION, 12).unwrap();
            counters.insert(BATTERY_EVENT_ID, 42).unwrap();
        }
        tx.commit().unwrap();
    }
    assert!(!log_path(&path).exists());

    let store = Arc::new(MetaStore::open(&path).unwrap());
    assert_eq!(
        store.list::<Rec>("pools", Some("a")).unwrap(),
        (vec![Rec { n: 1 }, Rec { n: 2 }], 12)
    );
    assert_eq!(store.resource_version().unwrap(), 12);
    assert_eq!(store.last_battery_event_id().unwrap(), 42);
    assert!(store.hub().subscribe(12).is_ok(), "watches resume after 12");
    let rv = store
        .transact(|tx| -> Result<u64, StoreError> {
            tx.clear_intents()?;
            put_added(tx, &key("a", "z"), 3)
        })
        .await
        .unwrap();
    assert_eq!(rv, 13);
    let copy = crash_copy(&path, "migrated");
    assert_eq!(copy.get::<Rec>(&key("a", "x")).unwrap(), Some(Rec { n: 1 }));
    assert_eq!(copy.get::<Rec>(&key("a", "z")).unwrap(), Some(Rec { n: 3 }));
    assert_eq!(copy.resource_version().unwrap(), 13);
    assert_eq!(copy.last_battery_event_id().unwrap(), 42);
}

/// A log started again holds fewer records than the pass before it: the older records
/// after the newer ones are neither applied nor taken for a torn write.
#[tokio::test]
async fn a_log_started_again_ends_at_its_own_records() {
    let (_dir, path, store) = three_logged_commits().await;
    let older = std::fs::read(log_path(&path)).unwrap();
    let third = logged_bytes(&older) - logged(&path)[2].encode().len();
    store.checkpoint_now().unwrap();
    store
        .transact(|tx| put_added(tx, &key("a", "x1"), 10))
        .await
        .unwrap();
    let bytes = std::fs::read(log_path(&path)).unwrap();
    let parsed = log::parse(&bytes);
    assert_eq!(parsed.records.len(), 1);
    assert!(!parsed.torn);
    assert_eq!(
        log::parse(&bytes[third..]).records,
        log::parse(&older[third..]).records,
        "the older pass's third record is still on disk past the end marker"
    );
    let copy = crash_copy(&path, "again");
    assert_eq!(
        copy.get::<Rec>(&key("a", "x1")).unwrap(),
        Some(Rec { n: 10 })
    );
    assert_eq!(
        copy.get::<Rec>(&key("a", "x3")).unwrap(),
        Some(Rec { n: 3 })
    );
    assert_eq!(copy.resource_version().unwrap(), 4);
}

/// A log as ADR 39 wrote it, records appended up to the file's end and no blocks ahead,
/// opens with its records applied, and from then on has its blocks written ahead.
#[tokio::test]
async fn a_log_written_without_blocks_ahead_is_replayed_and_preallocated() {
    let (_dir, path, _store) = three_logged_commits().await;
    let copy = crash_files(&path, "appended");
    let mut bytes = std::fs::read(log_path(&copy)).unwrap();
    bytes.truncate(logged_bytes(&bytes));
    std::fs::write(log_path(&copy), &bytes).unwrap();
    let reopened = MetaStore::open(&copy).unwrap();
    for n in 1..=3 {
        let stored = reopened.get::<Rec>(&key("a", &format!("x{n}"))).unwrap();
        assert_eq!(stored, Some(Rec { n }), "x{n} replayed");
    }
    assert_eq!(
        std::fs::metadata(log_path(&copy)).unwrap().len(),
        PREALLOCATED_BYTES
    );
    assert!(logged(&copy).is_empty());
}
