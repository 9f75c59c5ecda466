//! A write transaction of the metadata store, the tables it writes, and the replay of
//! the log's records into them at open.

use redb::{ReadableTable, TableDefinition, WriteTransaction};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::log::{Op, Record};
use crate::watch::{Change, ChangeType, WatchedObject};

pub(super) const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
/// Where versions before ADR 0022 recorded a bind before its `ClaimVM`; only dropped now.
pub(super) const INTENTS: TableDefinition<&str, &[u8]> = TableDefinition::new("intents");
pub(super) const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
pub(super) const RESOURCE_VERSION: &str = "resourceVersion";
pub(super) const BATTERY_EVENT_ID: &str = "batteryEventId";
/// The sequence number of the last log record redb holds: at open, the records after it
/// are replayed. A store from before the log has none (0), and replays nothing.
pub(super) const LOG_SEQUENCE: &str = "logSequence";

/// A failure of the store itself (disk, corruption, encoding): always a server error.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("opening the metadata store")]
    Open(#[source] redb::Error),
    #[error("metadata store transaction")]
    Transaction(#[source] redb::Error),
    #[error("making the metadata store's commits durable")]
    Sync(#[source] redb::Error),
    #[error("the metadata store stopped before a commit was durable")]
    Stopped,
    #[error("the metadata store's log")]
    Log(#[source] std::io::Error),
    #[error("the metadata store's log skips from record {after} to {next}: records are missing")]
    LogGap { after: u64, next: u64 },
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

pub(super) fn tx_err(err: impl Into<redb::Error>) -> StoreError {
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

    pub(super) fn encode(&self) -> String {
        format!("{}/{}/{}", self.resource, self.namespace, self.name)
    }

    /// The key prefix of a resource, or of a resource in one namespace.
    pub(super) fn prefix(resource: &str, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) => format!("{resource}/{ns}/"),
            None => format!("{resource}/"),
        }
    }
}

/// Applies the log's `records` that redb lacks to `tx`, in order, and returns the
/// resourceVersion after them.
pub(super) fn replay(tx: &WriteTransaction, records: Vec<Record>) -> Result<u64, StoreError> {
    let mut counters = tx.open_table(COUNTERS).map_err(tx_err)?;
    let mut rv = counters
        .get(RESOURCE_VERSION)
        .map_err(tx_err)?
        .map_or(0, |v| v.value());
    let mut seq = counters
        .get(LOG_SEQUENCE)
        .map_err(tx_err)?
        .map_or(0, |v| v.value());
    let mut objects = tx.open_table(OBJECTS).map_err(tx_err)?;
    let checkpointed = seq;
    // Records up to the checkpoint's were in redb before the log started again.
    for record in records.into_iter().filter(|r| r.seq > checkpointed) {
        if record.seq != seq + 1 {
            return Err(StoreError::LogGap {
                after: seq,
                next: record.seq,
            });
        }
        for op in record.ops {
            match op {
                Op::Put { key, value } => {
                    objects
                        .insert(key.as_str(), value.as_slice())
                        .map_err(tx_err)?;
                }
                Op::Delete { key } => {
                    objects.remove(key.as_str()).map_err(tx_err)?;
                }
                Op::BatteryEventId(id) => {
                    counters.insert(BATTERY_EVENT_ID, id).map_err(tx_err)?;
                }
                Op::ClearIntents => {
                    tx.delete_table(INTENTS).map_err(tx_err)?;
                }
            }
        }
        (rv, seq) = (record.resource_version, record.seq);
    }
    counters.insert(RESOURCE_VERSION, rv).map_err(tx_err)?;
    counters.insert(LOG_SEQUENCE, seq).map_err(tx_err)?;
    Ok(rv)
}

pub(super) fn sync_err(err: impl Into<redb::Error>) -> StoreError {
    StoreError::Sync(err.into())
}

pub(super) fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, StoreError> {
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
    pub(super) tx: WriteTransaction,
    pub(super) rv: u64,
    pub(super) changes: Vec<Change>,
    /// What it changed, for its record in the log.
    pub(super) ops: Vec<Op>,
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
        self.ops.push(Op::Put {
            key: encoded,
            value: bytes,
        });
        Ok(())
    }

    /// Removes the record under `key`.
    pub fn delete(&mut self, key: &Key) -> Result<(), StoreError> {
        let encoded = key.encode();
        let mut table = self.tx.open_table(OBJECTS).map_err(tx_err)?;
        table.remove(encoded.as_str()).map_err(tx_err)?;
        self.ops.push(Op::Delete { key: encoded });
        Ok(())
    }

    /// Drops the bind intents versions before ADR 0022 recorded, once recovery has
    /// released the leases they stood for.
    pub fn clear_intents(&mut self) -> Result<(), StoreError> {
        self.tx.delete_table(INTENTS).map_err(tx_err)?;
        self.ops.push(Op::ClearIntents);
        Ok(())
    }

    /// Remembers the last battery event applied, so a restart skips its replay.
    pub fn set_last_battery_event_id(&mut self, id: u64) -> Result<(), StoreError> {
        let mut table = self.tx.open_table(COUNTERS).map_err(tx_err)?;
        table.insert(BATTERY_EVENT_ID, id).map_err(tx_err)?;
        self.ops.push(Op::BatteryEventId(id));
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
