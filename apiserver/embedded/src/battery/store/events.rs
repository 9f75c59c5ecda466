//! The events outbox (§4.6): one global increasing id across all pools, never pruned.

use battery_proto::poolmgr::v1alpha1::{Event, EventType};
use prost::Message;
use redb::ReadableTable;
use tokio::sync::watch;

use super::db::{EVENTS, Result, Store, decode};
use crate::battery::model::PoolKey;
use crate::battery::time;

impl Store {
    /// Appends an event with the next id (ids start at 1, like SQLite AUTOINCREMENT) and
    /// wakes subscribers. `payload_json` is always empty, as in battery.
    pub(crate) fn append_event(
        &self,
        pool: &PoolKey,
        vm_uid: &str,
        kind: EventType,
    ) -> Result<Event> {
        let event = self.write(|txn| {
            let mut events = txn.open_table(EVENTS)?;
            let id = events.last()?.map_or(1, |(id, _)| id.value() + 1);
            let event = Event {
                id: i64::try_from(id).unwrap_or(i64::MAX),
                pool_name: pool.name.clone(),
                vm_uid: vm_uid.to_owned(),
                r#type: kind as i32,
                created_at: Some(time::now()),
                payload_json: String::new(),
                pool_namespace: pool.namespace.clone(),
            };
            events.insert(id, event.encode_to_vec().as_slice())?;
            Ok(event)
        })?;
        // Only after the commit, so a woken subscriber finds the row.
        self.last_event.send_if_modified(|last| {
            let newer = event.id > *last;
            if newer {
                *last = event.id;
            }
            newer
        });
        Ok(event)
    }

    /// Up to `limit` events with id > `after`, in id order, optionally of one pool only
    /// (exact name and namespace).
    pub(crate) fn events_after(
        &self,
        after: i64,
        pool: Option<&PoolKey>,
        limit: usize,
    ) -> Result<Vec<Event>> {
        self.read(|txn| {
            let events = txn.open_table(EVENTS)?;
            let start = u64::try_from(after).unwrap_or(0).saturating_add(1);
            let mut batch = Vec::new();
            for entry in events.range(start..)? {
                let (_, value) = entry?;
                let event: Event = decode("event", value.value())?;
                if pool.is_none_or(|key| {
                    event.pool_name == key.name && event.pool_namespace == key.namespace
                }) {
                    batch.push(event);
                    if batch.len() == limit {
                        break;
                    }
                }
            }
            Ok(batch)
        })
    }

    /// A receiver of the newest event id, changed after each append commits.
    pub(crate) fn watch_events(&self) -> watch::Receiver<i64> {
        self.last_event.subscribe()
    }
}
