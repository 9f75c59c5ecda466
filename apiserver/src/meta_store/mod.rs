//! The metadata store (DESIGN §3): what battery cannot hold — Kubernetes object metadata,
//! the few spec fields battery has no place for — plus the one
//! resourceVersion counter and the last battery event id seen. An embedded, transactional,
//! crash-safe redb database on the same volume as battery's, keyed by battery's identity
//! of each object (`<resource>/<namespace>/<name>`).
//!
//! Every write goes through [`MetaStore::transact`]: one redb write transaction, one
//! resourceVersion per changed object, and the watch changes published in commit order
//! once the commit is durable. Writes committed together share one fsync (ADR 23).

use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::metrics::histogram::Histogram;
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::watch::{Change, ChangeType, WatchHub, WatchedObject};

const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
/// Where versions before ADR 0022 recorded a bind before its `ClaimVM`; only dropped now.
const INTENTS: TableDefinition<&str, &[u8]> = TableDefinition::new("intents");
const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
const RESOURCE_VERSION: &str = "resourceVersion";
const BATTERY_EVENT_ID: &str = "batteryEventId";

/// Bucket bounds of the write histogram, in seconds: a durable commit takes from tens
/// of microseconds (a fast disk's cache) to tens of milliseconds.
const WRITE_BUCKETS: [f64; 8] = [0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25];

/// How many changes the watch window keeps.
const WATCH_WINDOW: usize = 10_000;

/// The memory redb may spend caching pages (its default is 1 GiB, which a busy store
/// fills). 10,000 claims take some 20 MB of pages; reads past the cache come from the
/// kernel's page cache.
const PAGE_CACHE_BYTES: usize = 32 << 20;

/// A failure of the store itself (disk, corruption, encoding): always a server error.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("opening the metadata store")]
    Open(#[source] redb::Error),
    #[error("metadata store transaction")]
    Transaction(#[source] redb::Error),
    #[error("making the metadata store's commits durable")]
    Sync(#[source] redb::Error),
    #[error("decoding stored record {key}")]
    Decode {
        key: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("encoding record {key}")]
    Encode {
        key: String,
        #[source]
        source: serde_json::Error,
    },
}

fn tx_err(err: impl Into<redb::Error>) -> StoreError {
    StoreError::Transaction(err.into())
}

/// Where an object lives: its resource (REST plural), namespace ("" for cluster
/// scope) and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub resource: &'static str,
    pub namespace: String,
    pub name: String,
}

impl Key {
    pub fn new(resource: &'static str, namespace: Option<&str>, name: &str) -> Self {
        Self {
            resource,
            namespace: namespace.unwrap_or_default().to_owned(),
            name: name.to_owned(),
        }
    }

    fn encode(&self) -> String {
        format!("{}/{}/{}", self.resource, self.namespace, self.name)
    }

    /// The key prefix of a resource, or of a resource in one namespace.
    fn prefix(resource: &str, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) => format!("{resource}/{ns}/"),
            None => format!("{resource}/"),
        }
    }
}

/// A page of stored records.
pub struct Page<T> {
    pub records: Vec<T>,
    /// The resourceVersion the page is consistent with.
    pub resource_version: u64,
    /// How many records follow the page.
    pub rest: usize,
}

/// What the one writer holds: the commits made and the changes not yet durable.
#[derive(Default)]
struct Writer {
    /// How many commits were made since the store opened.
    commits: u64,
    /// The changes of commits not yet durable, in commit order: published by the commit
    /// that makes them durable.
    pending: Vec<Change>,
}

/// The store, with the watch hub its commits feed.
pub struct MetaStore {
    db: Database,
    /// Orders commits, and publishes their changes in that order. Async, so a writer
    /// waiting while a sync holds it parks its task, not its worker thread.
    writer: tokio::sync::Mutex<Writer>,
    /// How many commits are durable (a count of `Writer::commits`).
    durable: tokio::sync::watch::Sender<u64>,
    /// Whether a grouped write is syncing for all that wait.
    syncing: AtomicBool,
    hub: Arc<WatchHub>,
    /// How long each write takes, from its start until its commit is durable, for
    /// `/metrics` (a bind's share of the disk).
    write_duration: Histogram,
}

impl MetaStore {
    /// Opens (or creates) the store in `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = Database::builder()
            .set_cache_size(PAGE_CACHE_BYTES)
            .create(path)
            .map_err(|e| StoreError::Open(e.into()))?;
        Self::with_database(db)
    }

    /// A store in memory, for `dev` without a data directory and for tests.
    pub fn in_memory() -> Result<Self, StoreError> {
        let db = Database::builder()
            .set_cache_size(PAGE_CACHE_BYTES)
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(|e| StoreError::Open(e.into()))?;
        Self::with_database(db)
    }

    fn with_database(db: Database) -> Result<Self, StoreError> {
        let tx = db.begin_write().map_err(tx_err)?;
        tx.open_table(OBJECTS).map_err(tx_err)?;
        tx.open_table(INTENTS).map_err(tx_err)?;
        let rv = {
            let counters = tx.open_table(COUNTERS).map_err(tx_err)?;
            counters
                .get(RESOURCE_VERSION)
                .map_err(tx_err)?
                .map_or(0, |v| v.value())
        };
        tx.commit().map_err(tx_err)?;
        Ok(Self {
            db,
            writer: tokio::sync::Mutex::default(),
            durable: tokio::sync::watch::Sender::new(0),
            syncing: AtomicBool::new(false),
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
    /// The fsync is shared (ADR 23): `f` commits at once without syncing, so the next
    /// writer need not wait for the disk, and the first of the writers waiting syncs for
    /// all of them, on a blocking thread. Readers see the commit before it is durable: a
    /// crash in between loses it, and its writer was answered nothing.
    pub async fn transact<R, E>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Txn) -> Result<R, E>,
    ) -> Result<R, E>
    where
        E: From<StoreError>,
    {
        let started = std::time::Instant::now();
        let (out, commit) = {
            let mut writer = self.writer.lock().await;
            let (out, changes) = self.write(&mut writer, f)?;
            writer.pending.extend(changes);
            (out, writer.commits)
        };
        self.durable_through(commit).await?;
        self.write_duration.observe(started.elapsed().as_secs_f64());
        Ok(out)
    }

    /// Runs `f` in a write transaction and commits it without syncing; the changes it
    /// recorded are the caller's to publish once they are durable.
    fn write<R, E>(
        &self,
        writer: &mut Writer,
        f: impl FnOnce(&mut Txn) -> Result<R, E>,
    ) -> Result<(R, Vec<Change>), E>
    where
        E: From<StoreError>,
    {
        let mut tx = self.db.begin_write().map_err(tx_err)?;
        tx.set_durability(Durability::None).map_err(tx_err)?;
        let rv = {
            let counters = tx.open_table(COUNTERS).map_err(tx_err)?;
            counters
                .get(RESOURCE_VERSION)
                .map_err(tx_err)?
                .map_or(0, |v| v.value())
        };
        let mut txn = Txn {
            tx,
            rv,
            changes: Vec::new(),
        };
        let out = f(&mut txn)?;
        let Txn { tx, rv, changes } = txn;
        {
            let mut counters = tx.open_table(COUNTERS).map_err(tx_err)?;
            counters.insert(RESOURCE_VERSION, rv).map_err(tx_err)?;
        }
        tx.commit().map_err(tx_err)?;
        writer.commits += 1;
        Ok((out, changes))
    }

    /// Waits until commit number `commit` is durable, syncing for every writer waiting
    /// when no other does.
    async fn durable_through(self: &Arc<Self>, commit: u64) -> Result<(), StoreError> {
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
            let store = self.clone();
            let synced = match tokio::task::spawn_blocking(move || store.sync()).await {
                Ok(synced) => synced,
                Err(join) => Err(sync_err(std::io::Error::other(join.to_string()))),
            };
            if let Err(err) = synced {
                // Let the others try for themselves.
                self.syncing.store(false, Ordering::Release);
                self.durable.send_modify(|_| {});
                return Err(err);
            }
        }
    }

    /// Makes every commit so far durable with one empty durable commit, and publishes
    /// their changes in commit order.
    fn sync(&self) -> Result<(), StoreError> {
        let mut writer = self.writer.blocking_lock();
        if *self.durable.borrow() < writer.commits {
            let tx = self.db.begin_write().map_err(sync_err)?;
            tx.commit().map_err(sync_err)?;
        }
        // Before telling the waiters, so those this sync did not cover elect another.
        self.syncing.store(false, Ordering::Release);
        self.hub.publish(writer.pending.drain(..));
        self.durable.send_replace(writer.commits);
        Ok(())
    }
}

fn sync_err(err: impl Into<redb::Error>) -> StoreError {
    StoreError::Sync(err.into())
}

fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Decode {
        key: key.to_owned(),
        source,
    })
}

fn encode<T: Serialize>(key: &str, value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|source| StoreError::Encode {
        key: key.to_owned(),
        source,
    })
}

/// One write transaction of the store.
pub struct Txn {
    tx: WriteTransaction,
    rv: u64,
    changes: Vec<Change>,
}

impl Txn {
    /// Hands out the next resourceVersion.
    pub fn next_resource_version(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// The record stored under `key`, as this transaction sees it.
    pub fn get<T: DeserializeOwned>(&self, key: &Key) -> Result<Option<T>, StoreError> {
        let table = self.tx.open_table(OBJECTS).map_err(tx_err)?;
        let encoded = key.encode();
        let value = table.get(encoded.as_str()).map_err(tx_err)?;
        value.map(|v| decode(&encoded, v.value())).transpose()
    }

    /// Stores `record` under `key`.
    pub fn put<T: Serialize>(&mut self, key: &Key, record: &T) -> Result<(), StoreError> {
        let encoded = key.encode();
        let bytes = encode(&encoded, record)?;
        let mut table = self.tx.open_table(OBJECTS).map_err(tx_err)?;
        table
            .insert(encoded.as_str(), bytes.as_slice())
            .map_err(tx_err)?;
        Ok(())
    }

    /// Removes the record under `key`.
    pub fn delete(&mut self, key: &Key) -> Result<(), StoreError> {
        let mut table = self.tx.open_table(OBJECTS).map_err(tx_err)?;
        table.remove(key.encode().as_str()).map_err(tx_err)?;
        Ok(())
    }

    /// Drops the bind intents versions before ADR 0022 recorded, once recovery has
    /// released the leases they stood for.
    pub fn clear_intents(&mut self) -> Result<(), StoreError> {
        self.tx.delete_table(INTENTS).map_err(tx_err)?;
        Ok(())
    }

    /// Remembers the last battery event applied, so a restart skips its replay.
    pub fn set_last_battery_event_id(&mut self, id: u64) -> Result<(), StoreError> {
        let mut table = self.tx.open_table(COUNTERS).map_err(tx_err)?;
        table.insert(BATTERY_EVENT_ID, id).map_err(tx_err)?;
        Ok(())
    }

    /// Queues a change for watchers, published once the transaction commits.
    pub fn record_change(
        &mut self,
        key: &Key,
        change_type: ChangeType,
        resource_version: u64,
        object: WatchedObject,
    ) {
        self.changes.push(Change {
            resource_version,
            resource: key.resource,
            namespace: (!key.namespace.is_empty()).then(|| key.namespace.clone()),
            name: key.name.clone(),
            change_type,
            object,
            json_line: std::sync::OnceLock::new(),
        });
    }
}

#[cfg(test)]
mod tests;
