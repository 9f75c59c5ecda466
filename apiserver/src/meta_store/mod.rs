//! The metadata store (DESIGN §3): what battery cannot hold — Kubernetes object metadata,
//! the few spec fields battery has no place for — plus the one
//! resourceVersion counter and the last battery event id seen. An embedded, transactional,
//! crash-safe redb database on the same volume as battery's, keyed by battery's identity
//! of each object (`<resource>/<namespace>/<name>`).
//!
//! Every write goes through [`MetaStore::transact`]: one redb write transaction, one
//! resourceVersion per changed object, and the watch changes published under the same
//! lock that orders commits, so watchers see them in resourceVersion order.

use std::ops::Bound;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::watch::{Change, ChangeType, WatchHub, WatchedObject};

const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
/// Where versions before ADR 0022 recorded a bind before its `ClaimVM`; only dropped now.
const INTENTS: TableDefinition<&str, &[u8]> = TableDefinition::new("intents");
const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
const RESOURCE_VERSION: &str = "resourceVersion";
const BATTERY_EVENT_ID: &str = "batteryEventId";

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

/// The store, with the watch hub its commits feed.
pub struct MetaStore {
    db: Database,
    /// Orders commit-then-publish so watch changes leave in resourceVersion order.
    writer: Mutex<()>,
    hub: Arc<WatchHub>,
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
            writer: Mutex::new(()),
            hub: Arc::new(WatchHub::new(WATCH_WINDOW, rv)),
        })
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
                records.push(decode(k.value(), v.value())?);
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

    /// Runs `f` in one write transaction, commits it durably, then publishes the
    /// changes it recorded to watchers. Nothing is committed or published if `f` fails.
    pub fn transact<R, E>(&self, f: impl FnOnce(&mut Txn) -> Result<R, E>) -> Result<R, E>
    where
        E: From<StoreError>,
    {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let tx = self.db.begin_write().map_err(tx_err)?;
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
        self.hub.publish(changes);
        Ok(out)
    }
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
