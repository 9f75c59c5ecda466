//! The store's database: its tables, the [`Store`] handle with its one-transaction read
//! and write, and the row codec; below the files that add each table's operations.

use std::path::PathBuf;
use std::sync::{PoisonError, RwLock};

use battery_locks::blocking;
use prost::Message;

use redb::{
    Database, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};
use tokio::sync::watch;

/// (namespace, name) -> `PoolSpec`.
pub(super) const POOLS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("pools");
/// VM uid -> `VmRecord`.
pub(super) const VMS: TableDefinition<&str, &[u8]> = TableDefinition::new("vms");
/// lease_id -> `LeaseRecord`.
pub(super) const LEASES: TableDefinition<&str, &[u8]> = TableDefinition::new("leases");
/// request_id -> lease_id: the unique index; leases without a request_id have no entry,
/// like battery's partial index where NULLs never conflict.
pub(super) const LEASE_REQUEST_IDS: TableDefinition<&str, &str> =
    TableDefinition::new("lease_request_ids");
/// event id -> `Event`.
pub(super) const EVENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("events");
/// host name -> `Host`.
pub(super) const HOSTS: TableDefinition<&str, &[u8]> = TableDefinition::new("hosts");
/// reservation id -> (host, pool namespace, pool name).
pub(super) const PLACEMENTS: TableDefinition<u64, (&str, &str, &str)> =
    TableDefinition::new("placements");
/// Store metadata: the schema version.
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

pub(super) const SCHEMA_VERSION_KEY: &str = "schema_version";
/// 2 added the `pool_vms` index, built at open from a version 1 store's VM rows.
pub(super) const SCHEMA_VERSION: u64 = 2;

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

pub(super) type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The store, plus a watch of the newest event id so Subscribe streams wake on commits.
pub(crate) struct Store {
    /// `None` once closed: a call still in flight after shutdown (a tonic connection task
    /// outlives the server) must not keep the file locked for the next open.
    db: RwLock<Option<Database>>,
    pub(super) last_event: watch::Sender<i64>,
}

impl Store {
    /// The handle on an opened database whose tables all exist.
    pub(super) fn new(db: Database) -> Result<Self> {
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

    pub(super) fn read<T>(&self, body: impl FnOnce(&ReadTransaction) -> Result<T>) -> Result<T> {
        let db = self.db.read().unwrap_or_else(PoisonError::into_inner);
        let txn = db.as_ref().ok_or(StoreError::Closed)?.begin_read()?;
        body(&txn)
    }

    /// Runs `body` in one write transaction, committed when it returns Ok. Operations check
    /// their preconditions before changing anything, so an Ok carrying a refusal commits no
    /// change.
    ///
    /// Waiting for the one writer and for the commit's sync blocks this thread, so the
    /// runtime's other tasks are handed on meanwhile, as Go's scheduler does for poolmgrd's
    /// goroutine in a system call: a commit under way holds up no other call.
    pub(super) fn write<T>(&self, body: impl FnOnce(&WriteTransaction) -> Result<T>) -> Result<T> {
        blocking(|| {
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
        })
    }
}

pub(super) fn decode<M: Message + Default>(what: &'static str, bytes: &[u8]) -> Result<M> {
    M::decode(bytes).map_err(|source| StoreError::Decode { what, source })
}

/// Decodes every row of a table whose values are encoded messages, in key order.
pub(super) fn decode_all<K, M>(
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

pub(super) fn get_decoded<'k, K, M>(
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
