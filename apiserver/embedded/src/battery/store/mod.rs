//! battery's store (§5) on redb: the tables `pools`, `vms`, `leases` (with a global unique
//! request_id index), `events` (one global increasing id, never pruned), `hosts` and
//! `placements`. Rows are the API's own protobuf messages (`VmRecord` is battery's VM row),
//! encoded with prost.
//!
//! Every operation is one short synchronous redb transaction that never spans an await;
//! redb serializes writers, so, as with battery's single SQLite connection, commit order is
//! event-id order. Each multi-row change (a VM with its lease, the DeletePool tombstone, a
//! finished deletion) commits in one transaction.

mod events;
mod hosts;
mod leases;
mod pool_vms;
mod pools;
mod vms;

use std::path::{Path, PathBuf};
use std::sync::{PoisonError, RwLock};

use prost::Message;

use redb::backends::InMemoryBackend;
use redb::{
    Database, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};
use tokio::sync::watch;

pub(crate) use hosts::HostRemoval;
pub(crate) use leases::{Heartbeat, LeaseCommit};
pub(crate) use pools::Tombstone;
pub(crate) use vms::{Placement, Transition};

/// (namespace, name) -> `PoolSpec`.
const POOLS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("pools");
/// VM uid -> `VmRecord`.
const VMS: TableDefinition<&str, &[u8]> = TableDefinition::new("vms");
/// lease_id -> `LeaseRecord`.
const LEASES: TableDefinition<&str, &[u8]> = TableDefinition::new("leases");
/// request_id -> lease_id: the unique index; leases without a request_id have no entry,
/// like battery's partial index where NULLs never conflict.
const LEASE_REQUEST_IDS: TableDefinition<&str, &str> = TableDefinition::new("lease_request_ids");
/// event id -> `Event`.
const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
/// host name -> `Host`.
const HOSTS: TableDefinition<&str, &[u8]> = TableDefinition::new("hosts");
/// reservation id -> (host, pool namespace, pool name).
const PLACEMENTS: TableDefinition<u64, (&str, &str, &str)> = TableDefinition::new("placements");
/// Store metadata: the schema version.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

const SCHEMA_VERSION_KEY: &str = "schema_version";
/// 2 added the `pool_vms` index, built at open from a version 1 store's VM rows.
const SCHEMA_VERSION: u64 = 2;
/// The store's file name inside `BatteryConfig::data_dir`.
const FILE_NAME: &str = "battery.redb";

/// A store failure. battery maps these to INTERNAL.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store: {0}")]
    Db(#[from] redb::Error),
    #[error("store: decoding a stored {what}: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: prost::DecodeError,
    },
    #[error("store: schema version {found} is newer than this binary's {SCHEMA_VERSION}")]
    TooNew { found: u64 },
    #[error("store: closed, the battery is shutting down")]
    Closed,
    #[error("store: creating data dir {path}: {source}", path = .path.display())]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

macro_rules! from_redb {
    ($($ty:ty),*) => {$(
        impl From<$ty> for StoreError {
            fn from(err: $ty) -> Self {
                Self::Db(err.into())
            }
        }
    )*};
}
from_redb!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The store, plus a watch of the newest event id so Subscribe streams wake on commits.
pub(crate) struct Store {
    /// `None` once closed: a call still in flight after shutdown (a tonic connection task
    /// outlives the server) must not keep the file locked for the next open.
    db: RwLock<Option<Database>>,
    last_event: watch::Sender<i64>,
}

impl Store {
    /// Opens the store in `data_dir` (created if needed), or in memory when `None`.
    pub(crate) fn open(data_dir: Option<&Path>) -> Result<Self> {
        let db = match data_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| StoreError::DataDir {
                    path: dir.to_path_buf(),
                    source,
                })?;
                Database::create(dir.join(FILE_NAME))?
            }
            None => Database::builder().create_with_backend(InMemoryBackend::new())?,
        };
        let txn = db.begin_write()?;
        {
            let mut meta = txn.open_table(META)?;
            let found = meta.get(SCHEMA_VERSION_KEY)?.map(|v| v.value());
            match found {
                Some(found) if found > SCHEMA_VERSION => return Err(StoreError::TooNew { found }),
                Some(SCHEMA_VERSION) => {}
                Some(_) => {
                    pool_vms::rebuild(&txn)?;
                    meta.insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION)?;
                }
                None => {
                    meta.insert(SCHEMA_VERSION_KEY, SCHEMA_VERSION)?;
                }
            }
            // Create every table so read transactions can open them.
            txn.open_table(POOLS)?;
            txn.open_table(VMS)?;
            txn.open_table(pool_vms::POOL_VMS)?;
            txn.open_table(LEASES)?;
            txn.open_table(LEASE_REQUEST_IDS)?;
            txn.open_table(EVENTS)?;
            txn.open_table(HOSTS)?;
            txn.open_table(PLACEMENTS)?;
        }
        txn.commit()?;
        let last_event = {
            let read = db.begin_read()?;
            let events = read.open_table(EVENTS)?;
            let last = events.last()?.map_or(0, |(id, _)| id.value());
            i64::try_from(last).unwrap_or(i64::MAX)
        };
        Ok(Self {
            db: RwLock::new(Some(db)),
            last_event: watch::Sender::new(last_event),
        })
    }

    /// Closes the database, releasing its file, once the transactions in flight end.
    pub(crate) fn close(&self) {
        self.db
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
    }

    fn read<T>(&self, body: impl FnOnce(&ReadTransaction) -> Result<T>) -> Result<T> {
        let db = self.db.read().unwrap_or_else(PoisonError::into_inner);
        let txn = db.as_ref().ok_or(StoreError::Closed)?.begin_read()?;
        body(&txn)
    }

    /// Runs `body` in one write transaction, committed when it returns Ok. Operations check
    /// their preconditions before changing anything, so an Ok carrying a refusal commits no
    /// change.
    fn write<T>(&self, body: impl FnOnce(&WriteTransaction) -> Result<T>) -> Result<T> {
        let db = self.db.read().unwrap_or_else(PoisonError::into_inner);
        let txn = db.as_ref().ok_or(StoreError::Closed)?.begin_write()?;
        match body(&txn) {
            Ok(value) => {
                txn.commit()?;
                Ok(value)
            }
            Err(err) => {
                txn.abort()?;
                Err(err)
            }
        }
    }
}

fn decode<M: Message + Default>(what: &'static str, bytes: &[u8]) -> Result<M> {
    M::decode(bytes).map_err(|source| StoreError::Decode { what, source })
}

/// Decodes every row of a table whose values are encoded messages, in key order.
fn decode_all<K, M>(
    table: &impl ReadableTable<K, &'static [u8]>,
    what: &'static str,
) -> Result<Vec<M>>
where
    K: redb::Key + 'static,
    M: Message + Default,
{
    let mut rows = Vec::new();
    for entry in table.iter()? {
        let (_, value) = entry?;
        rows.push(decode(what, value.value())?);
    }
    Ok(rows)
}

fn get_decoded<'k, K, M>(
    table: &impl ReadableTable<K, &'static [u8]>,
    key: impl std::borrow::Borrow<K::SelfType<'k>>,
    what: &'static str,
) -> Result<Option<M>>
where
    K: redb::Key + 'static,
    M: Message + Default,
{
    table
        .get(key)?
        .map(|value| decode(what, value.value()))
        .transpose()
}

#[cfg(test)]
mod tests;
