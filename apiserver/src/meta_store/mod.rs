//! The metadata store (DESIGN §3): what battery cannot hold — Kubernetes object metadata,
//! the few spec fields battery has no place for — plus the one
//! resourceVersion counter and the last battery event id seen. An embedded, transactional,
//! crash-safe redb database on the same volume as battery's, keyed by battery's identity
//! of each object (`<resource>/<namespace>/<name>`), behind a log that makes its commits
//! durable (ADR 39).
//!
//! Every write goes through [`MetaStore::transact`]: one redb write transaction, one
//! resourceVersion per changed object, one record in the log, and the watch changes
//! published in commit order once the record is durable. Writes committed together share
//! one `fdatasync` (ADR 23); one that commits alone syncs at once, on its worker (ADR 47).

mod log;
mod txn;

use std::collections::VecDeque;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use battery_locks::blocking;
use prometheus_client::metrics::histogram::Histogram;
use redb::{Database, Durability, ReadableDatabase, ReadableTable};
use serde::de::DeserializeOwned;

use crate::failpoint::crash_point;
use crate::watch::{Change, WatchHub};
use log::{Log, Record};
use txn::{
    BATTERY_EVENT_ID, COUNTERS, INTENTS, LOG_SEQUENCE, OBJECTS, RESOURCE_VERSION, decode, replay,
    sync_err, tx_err,
};
pub use txn::{Key, StoreError, Txn};

/// How long the log grows before a checkpoint makes redb durable and empties it. A
/// checkpoint writes the pages the commits since the last one dirtied, and holds the
/// writers meanwhile: about 10 ms on our test machine's disk (`docs/performance.md`), once
/// in some 450 binds. The log replayed at open is this long at most.
const CHECKPOINT_BYTES: u64 = 1 << 20;

/// How much of the log's file is written ahead of its records (ADR 46): the records
/// between two checkpoints, with room for those written while a checkpoint runs.
const PREALLOCATED_BYTES: u64 = 2 * CHECKPOINT_BYTES;

/// Bucket bounds of the write histogram, in seconds: a durable commit takes from tens
/// of microseconds (a fast disk's cache) to tens of milliseconds.
const WRITE_BUCKETS: [f64; 8] = [0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25];

/// How many changes the watch window keeps.
const WATCH_WINDOW: usize = 10_000;

/// The memory redb may spend caching pages (its default is 1 GiB, which a busy store
/// fills). 10,000 claims take some 20 MB of pages; reads past the cache come from the
/// kernel's page cache.
const PAGE_CACHE_BYTES: usize = 32 << 20;

/// A page of stored records.
pub struct Page<T> {
    pub records: Vec<T>,
    /// The resourceVersion the page is consistent with.
    pub resource_version: u64,
    /// How many records follow the page.
    pub rest: usize,
}

/// A commit of [`MetaStore::transact_ahead`] or [`MetaStore::transact_beside`], on its
/// way to the disk. Dropped, it gets there all the same.
#[must_use = "a commit written ahead may not be durable yet"]
pub struct Durable(tokio::task::JoinHandle<Result<(), StoreError>>);

impl Durable {
    /// Waits until the commit is durable.
    pub async fn wait(self) -> Result<(), StoreError> {
        match self.0.await {
            Ok(done) => done,
            Err(err) => match err.try_into_panic() {
                Ok(panic) => std::panic::resume_unwind(panic),
                Err(_) => Err(StoreError::Stopped),
            },
        }
    }
}

/// The writer lock held: one writer at a time commits and queues its record.
type Writing<'a> = tokio::sync::MutexGuard<'a, ()>;

/// The commits made and the changes of those not yet durable.
#[derive(Default)]
struct Unsynced {
    /// How many commits were made since the store opened.
    commits: u64,
    /// Each commit not yet durable, with its changes, in commit order: published by the
    /// sync that makes it durable.
    changes: VecDeque<(u64, Vec<Change>)>,
}

/// The store, with the watch hub its commits feed.
pub struct MetaStore {
    db: Database,
    /// Where commits become durable; `None` in memory, where a commit is final at once.
    log: Option<Log>,
    /// Orders commits and their records in the log. Async, so a writer waiting while a
    /// checkpoint holds it parks its task, not its worker thread.
    writer: tokio::sync::Mutex<()>,
    /// Held only for moments, by a writer adding its commit and a sync taking them.
    unsynced: Mutex<Unsynced>,
    /// How many commits are durable (a count of `Unsynced::commits`).
    durable: tokio::sync::watch::Sender<u64>,
    /// Whether a writer is syncing for all that wait.
    syncing: AtomicBool,
    /// Whether a checkpoint is under way.
    checkpointing: AtomicBool,
    hub: Arc<WatchHub>,
    /// How long each write takes, from its start until its commit is durable, for
    /// `/metrics` (a bind's share of the disk).
    write_duration: Histogram,
}

impl MetaStore {
    /// Opens (or creates) the store in `path`, its log beside it, and applies the log's
    /// records that redb lacks. A store written before the log opens as it is.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = Database::builder()
            .set_cache_size(PAGE_CACHE_BYTES)
            .create(path)
            .map_err(|e| StoreError::Open(e.into()))?;
        let (log, parsed) =
            Log::open(&log_path(path), PREALLOCATED_BYTES).map_err(StoreError::Log)?;
        if parsed.torn {
            tracing::warn!(
                "dropped the torn tail of the metadata store's log: a commit no writer was answered for"
            );
        }
        let replay = !parsed.records.is_empty() || parsed.torn;
        let store = Self::with_database(db, Some(log), parsed.records)?;
        if replay {
            store.checkpoint_now()?;
        }
        Ok(store)
    }

    /// A store in memory, for `dev` without a data directory and for tests.
    pub fn in_memory() -> Result<Self, StoreError> {
        let db = Database::builder()
            .set_cache_size(PAGE_CACHE_BYTES)
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(|e| StoreError::Open(e.into()))?;
        Self::with_database(db, None, Vec::new())
    }

    /// The store on `db`, with the tables made and `records` applied to them, in one
    /// commit that the caller's checkpoint makes durable.
    fn with_database(
        db: Database,
        log: Option<Log>,
        records: Vec<Record>,
    ) -> Result<Self, StoreError> {
        let mut tx = db.begin_write().map_err(tx_err)?;
        tx.set_durability(Durability::None).map_err(tx_err)?;
        tx.open_table(OBJECTS).map_err(tx_err)?;
        tx.open_table(INTENTS).map_err(tx_err)?;
        let rv = replay(&tx, records)?;
        tx.commit().map_err(tx_err)?;
        Ok(Self {
            db,
            log,
            writer: tokio::sync::Mutex::default(),
            unsynced: Mutex::default(),
            durable: tokio::sync::watch::Sender::new(0),
            syncing: AtomicBool::new(false),
            checkpointing: AtomicBool::new(false),
            hub: Arc::new(WatchHub::new(WATCH_WINDOW, rv)),
            write_duration: Histogram::new(WRITE_BUCKETS.iter().copied()),
        })
    }

    /// The histogram of [`MetaStore::transact`]'s durations, for `/metrics` to serve.
    pub fn write_duration(&self) -> Histogram {
        self.write_duration.clone()
    }

    /// The hub that watchers subscribe to.
    pub fn hub(&self) -> &Arc<WatchHub> {
        &self.hub
    }

    /// The newest resourceVersion handed out.
    pub fn resource_version(&self) -> Result<u64, StoreError> {
        self.counter(RESOURCE_VERSION)
    }

    /// The id of the last battery event applied, 0 when none.
    pub fn last_battery_event_id(&self) -> Result<u64, StoreError> {
        self.counter(BATTERY_EVENT_ID)
    }

    fn counter(&self, name: &str) -> Result<u64, StoreError> {
        let tx = self.db.begin_read().map_err(tx_err)?;
        let table = tx.open_table(COUNTERS).map_err(tx_err)?;
        Ok(table.get(name).map_err(tx_err)?.map_or(0, |v| v.value()))
    }

    /// The record stored under `key`.
    pub fn get<T: DeserializeOwned>(&self, key: &Key) -> Result<Option<T>, StoreError> {
        let tx = self.db.begin_read().map_err(tx_err)?;
        let table = tx.open_table(OBJECTS).map_err(tx_err)?;
        let encoded = key.encode();
        table
            .get(encoded.as_str())
            .map_err(tx_err)?
            .map(|v| decode(&encoded, v.value()))
            .transpose()
    }

    /// Every record of `resource` (in `namespace`, if given), in key order, with the
    /// resourceVersion the list is consistent with.
    pub fn list<T: DeserializeOwned>(
        &self,
        resource: &str,
        namespace: Option<&str>,
    ) -> Result<(Vec<T>, u64), StoreError> {
        let page = self.page(resource, namespace, None, usize::MAX)?;
        Ok((page.records, page.resource_version))
    }

    /// At most `limit` records of `resource` (in `namespace`, if given) after the one
    /// whose `namespace/name` is `after`, in key order, and how many more there are: a
    /// page of a list reads its own records, not the whole list's.
    pub fn page<T: DeserializeOwned>(
        &self,
        resource: &str,
        namespace: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<T>, StoreError> {
        self.page_read(resource, namespace, after, limit, decode)
    }

    /// [`MetaStore::page`] with each record's key and JSON as stored, for a reader that
    /// needs only parts of it.
    pub fn page_stored(
        &self,
        resource: &str,
        namespace: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page<(String, Vec<u8>)>, StoreError> {
        self.page_read(resource, namespace, after, limit, |key, bytes| {
            Ok((key.to_owned(), bytes.to_vec()))
        })
    }

    /// A page, each record read by `read(key, bytes)`.
    fn page_read<T>(
        &self,
        resource: &str,
        namespace: Option<&str>,
        after: Option<&str>,
        limit: usize,
        read: impl Fn(&str, &[u8]) -> Result<T, StoreError>,
    ) -> Result<Page<T>, StoreError> {
        let tx = self.db.begin_read().map_err(tx_err)?;
        let table = tx.open_table(OBJECTS).map_err(tx_err)?;
        let counters = tx.open_table(COUNTERS).map_err(tx_err)?;
        let resource_version = counters
            .get(RESOURCE_VERSION)
            .map_err(tx_err)?
            .map_or(0, |v| v.value());
        let prefix = Key::prefix(resource, namespace);
        let after = after.map(|after| format!("{resource}/{after}"));
        let start = match &after {
            Some(after) if after.as_str() >= prefix.as_str() => Bound::Excluded(after.as_str()),
            _ => Bound::Included(prefix.as_str()),
        };
        let mut records = Vec::new();
        let mut rest = 0;
        for entry in table
            .range::<&str>((start, Bound::Unbounded))
            .map_err(tx_err)?
        {
            let (k, v) = entry.map_err(tx_err)?;
            if !k.value().starts_with(&prefix) {
                break;
            }
            if records.len() < limit {
                records.push(read(k.value(), v.value())?);
            } else {
                rest += 1;
            }
        }
        Ok(Page {
            records,
            resource_version,
            rest,
        })
    }

    /// Runs `f` in one write transaction and returns once the commit is durable and the
    /// changes `f` recorded are published to watchers. Nothing is committed or published
    /// if `f` fails.
    ///
    /// The commit goes to redb without syncing and is queued in the log as one record
    /// (ADR 39), then waits for a sync. The first writer that finds none under way writes
    /// every record queued so far and syncs them with one `fdatasync` (ADR 23, ADR 52): a
    /// lone writer at once, on its worker (ADR 47), writers at concurrency in groups.
    /// Readers see the commit before it is durable: a crash in between loses it, and its
    /// writer was answered nothing.
    pub async fn transact<R, E>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Txn) -> Result<R, E>,
    ) -> Result<R, E>
    where
        E: From<StoreError>,
    {
        let started = std::time::Instant::now();
        let (out, commit) = self.write_and_checkpoint(f).await?;
        self.durable_through(commit).await?;
        self.write_duration.observe(started.elapsed().as_secs_f64());
        Ok(out)
    }

    /// [`MetaStore::transact`] that returns once the commit is written, while a thread of
    /// its own makes it durable (ADR 48): readers see it at once, watchers once it is
    /// durable, and [`Durable::wait`] waits for that. A crash before then loses it, so a
    /// writer answers nothing that depends on it until then, or writes nothing a restart
    /// cannot rebuild without it.
    pub async fn transact_ahead<R, E>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Txn) -> Result<R, E>,
    ) -> Result<(R, Durable), E>
    where
        E: From<StoreError>,
    {
        let started = std::time::Instant::now();
        let (out, commit) = self.write_and_checkpoint(f).await?;
        let store = self.clone();
        // Handed to a thread once the caller's task yields, as a rule with its answer
        // written: that thread's wake-up is not in series with the caller.
        let durable = Durable(tokio::spawn(async move {
            let synced = store.clone();
            store
                .beside(async move {
                    synced.durable_through(commit).await?;
                    synced
                        .write_duration
                        .observe(started.elapsed().as_secs_f64());
                    Ok(())
                })
                .wait()
                .await
        }));
        Ok((out, durable))
    }

    /// [`MetaStore::transact`] on a thread of its own, beside the caller's work (ADR 48):
    /// the caller goes on at once, and [`Durable::wait`] waits for the commit.
    pub fn transact_beside(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Txn) -> Result<(), StoreError> + Send + 'static,
    ) -> Durable {
        let store = self.clone();
        self.beside(async move { store.transact(f).await })
    }

    /// Runs `work` on a blocking-pool thread, where a lone commit's sync does not hold
    /// the caller's worker: one thread per commit under way, which tokio's pool caps (512),
    /// queueing the rest.
    fn beside(
        &self,
        work: impl Future<Output = Result<(), StoreError>> + Send + 'static,
    ) -> Durable {
        let runtime = tokio::runtime::Handle::current();
        Durable(tokio::task::spawn_blocking(move || {
            let done = runtime.block_on(work);
            if let Err(err) = &done {
                tracing::warn!(error = %err, "making a commit of the metadata store durable");
            }
            done
        }))
    }

    /// Writes `f`'s commit (see [`MetaStore::write`]) and starts a checkpoint when the log
    /// is long enough.
    async fn write_and_checkpoint<R, E>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Txn) -> Result<R, E>,
    ) -> Result<(R, u64), E>
    where
        E: From<StoreError>,
    {
        let (out, commit, log_end) = {
            let writing = self.writer.lock().await;
            let (out, commit) = self.write(&writing, f)?;
            (out, commit, self.log.as_ref().map_or(0, Log::end))
        };
        if log_end >= CHECKPOINT_BYTES && !self.checkpointing.swap(true, Ordering::AcqRel) {
            let store = self.clone();
            tokio::task::spawn_blocking(move || {
                if let Err(err) = store.checkpoint() {
                    tracing::warn!(error = %err, "checkpointing the metadata store; the next write tries again");
                }
                store.checkpointing.store(false, Ordering::Release);
            });
        }
        Ok((out, commit))
    }

    /// Runs `f` in a write transaction, commits it without syncing and queues its
    /// record in the log; returns the commit's number. The record and the changes it
    /// recorded wait for the sync that makes it durable.
    fn write<R, E>(
        &self,
        _writing: &Writing<'_>,
        f: impl FnOnce(&mut Txn) -> Result<R, E>,
    ) -> Result<(R, u64), E>
    where
        E: From<StoreError>,
    {
        if let Some(log) = &self.log {
            // Its record would never be written: nothing is committed, nothing queued.
            log.usable().map_err(StoreError::Log)?;
        }
        let mut tx = self.db.begin_write().map_err(tx_err)?;
        tx.set_durability(Durability::None).map_err(tx_err)?;
        let (rv, seq) = {
            let counters = tx.open_table(COUNTERS).map_err(tx_err)?;
            let get = |name| -> Result<u64, StoreError> {
                Ok(counters.get(name).map_err(tx_err)?.map_or(0, |v| v.value()))
            };
            (get(RESOURCE_VERSION)?, get(LOG_SEQUENCE)? + 1)
        };
        let mut txn = Txn {
            tx,
            rv,
            changes: Vec::new(),
            ops: Vec::new(),
        };
        let out = f(&mut txn)?;
        let Txn {
            tx,
            rv,
            changes,
            ops,
        } = txn;
        {
            let mut counters = tx.open_table(COUNTERS).map_err(tx_err)?;
            counters.insert(RESOURCE_VERSION, rv).map_err(tx_err)?;
            counters.insert(LOG_SEQUENCE, seq).map_err(tx_err)?;
        }
        tx.commit().map_err(tx_err)?;
        // Queued, not written: a commit answered before it is durable (ADR 48) leaves the
        // write to its sync, off its answer's path (ADR 52). Queued before the commit is
        // counted, so a sync that counts it writes it.
        if let Some(log) = &self.log {
            log.queue(
                &Record {
                    seq,
                    resource_version: rv,
                    ops,
                }
                .encode(),
            );
        }
        let mut unsynced = self.lock_unsynced();
        unsynced.commits += 1;
        let commit = unsynced.commits;
        unsynced.changes.push_back((commit, changes));
        Ok((out, commit))
    }

    /// Waits until commit number `commit` is durable, syncing for every writer waiting
    /// when no other does.
    async fn durable_through(&self, commit: u64) -> Result<(), StoreError> {
        let mut durable = self.durable.subscribe();
        loop {
            if *durable.borrow_and_update() >= commit {
                return Ok(());
            }
            if self.syncing.swap(true, Ordering::AcqRel) {
                // Another writer syncs; its sync may not cover this commit, so look again.
                // The sender lives as long as `self`.
                let _ = durable.changed().await;
                continue;
            }
            // A commit alone syncs on its worker: handing the worker's other tasks to
            // another thread would cost this bind that thread's wake-up, and its answer
            // another once the sync is done (ADR 47). Commits together sync on a thread of
            // their own, so the worker's other tasks go on meanwhile.
            let alone = self.lock_unsynced().changes.len() <= 1;
            let synced = if alone {
                self.sync()
            } else {
                blocking(|| self.sync())
            };
            if let Err(err) = synced {
                // Let the others try for themselves.
                self.syncing.store(false, Ordering::Release);
                self.durable.send_modify(|_| {});
                return Err(err);
            }
        }
    }

    /// Makes every commit so far durable: writes their records queued in the log and
    /// syncs it with one `fdatasync`; then publishes their changes in commit order.
    fn sync(&self) -> Result<(), StoreError> {
        let (through, claims) = {
            let unsynced = self.lock_unsynced();
            // Only a store on disk has crash points to aim at.
            let claims =
                self.log.is_some() && unsynced.changes.iter().any(|(_, c)| changes_a_claim(c));
            (unsynced.commits, claims)
        };
        if let Some(log) = &self.log
            && through > *self.durable.borrow()
        {
            if log.write_queued().map_err(StoreError::Log)? && claims {
                crash_point("commit:logged");
            }
            log.sync().map_err(StoreError::Log)?;
        }
        let mut synced = Vec::new();
        {
            let mut unsynced = self.lock_unsynced();
            while unsynced.changes.front().is_some_and(|(c, _)| *c <= through) {
                synced.extend(unsynced.changes.pop_front().map(|(_, c)| c));
            }
        }
        if claims {
            crash_point("commit:synced");
        }
        self.hub.publish(synced.into_iter().flatten());
        // Before telling the waiters, so those this sync did not cover elect another. That
        // one may tell them first: the count never goes back.
        self.syncing.store(false, Ordering::Release);
        self.durable
            .send_modify(|durable| *durable = through.max(*durable));
        Ok(())
    }

    fn lock_unsynced(&self) -> std::sync::MutexGuard<'_, Unsynced> {
        self.unsynced.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes redb durable and starts the log again, holding the writers meanwhile.
    fn checkpoint(&self) -> Result<(), StoreError> {
        let writing = self.writer.blocking_lock();
        self.checkpoint_with(&writing)
    }

    /// [`MetaStore::checkpoint`] where no writer can be: at open.
    fn checkpoint_now(&self) -> Result<(), StoreError> {
        let writing = self
            .writer
            .try_lock()
            .expect("no writer while the store opens");
        self.checkpoint_with(&writing)
    }

    fn checkpoint_with(&self, _writing: &Writing<'_>) -> Result<(), StoreError> {
        let Some(log) = &self.log else {
            return Ok(());
        };
        // An empty durable commit makes every commit before it durable in redb, with
        // the sequence number of the last: from here on the log's records are redundant.
        let tx = self.db.begin_write().map_err(sync_err)?;
        tx.commit().map_err(sync_err)?;
        crash_point("commit:checkpointed");
        log.rewind().map_err(StoreError::Log)?;
        Ok(())
    }
}

/// Whether a commit's changes include a claim's: the commits whose crash points the
/// crash tests aim at, as binds are what they check (a Host's record is written at start).
fn changes_a_claim(changes: &[Change]) -> bool {
    changes.iter().any(|c| c.resource == "microvmclaims")
}

/// The log beside the store's file at `path`.
fn log_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".log");
    PathBuf::from(name)
}

#[cfg(test)]
mod tests;
