//! One module per resource, each a [`crate::api::Storage`] over battery and the metadata
//! store, plus what they share: a per-object write lock and the record bookkeeping.

pub mod follow;
pub mod hosts;
pub mod microvmclaims;
pub mod pools;

use std::sync::Arc;

use battery_api_machinery::status::ApiError;
use battery_types::ResourceInfo;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::meta_store::{Key, MetaStore, StoreError, Txn};
use crate::watch::ChangeType;

/// Serializes writes to one object, so a battery call and the record written after it
/// are never interleaved with another write to the same object (a store transaction
/// alone cannot span the battery call).
pub type KeyLocks = battery_locks::KeyLocks<Key>;

/// A store failure, answered as a 500 with the cause kept for the log.
pub fn store_error(error: StoreError) -> ApiError {
    ApiError::internal(error)
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        store_error(error)
    }
}

/// The optimistic-concurrency check of an update: the version the client changed must be
/// the one stored.
pub fn check_resource_version(
    info: &ResourceInfo,
    stored: &ObjectMeta,
    new: &ObjectMeta,
) -> Result<(), ApiError> {
    if stored.resource_version == new.resource_version {
        Ok(())
    } else {
        Err(ApiError::optimistic_lock(
            info,
            new.name.as_deref().unwrap_or_default(),
        ))
    }
}

/// Writes `object`'s record (made by `record`) with a new resourceVersion, or removes it
/// for a deletion, runs `also` in the same transaction, and tells watchers of the change
/// once it is durable (its fsync shared with the writes beside it, ADR 23).
pub async fn commit<K, R>(
    store: &Arc<MetaStore>,
    key: &Key,
    object: &mut K,
    change: ChangeType,
    record: impl FnOnce(&K) -> R,
    also: impl FnOnce(&mut Txn) -> Result<(), StoreError>,
) -> Result<(), ApiError>
where
    K: kube::Resource + serde::Serialize + Clone + Send + Sync + 'static,
    R: serde::Serialize,
{
    store
        .transact(write_object(key, object, change, record, also))
        .await
}

/// The transaction of [`commit`], for a caller that commits it another way (a bind's
/// claim, written ahead of its sync: [`MetaStore::transact_ahead`]).
pub fn write_object<'a, K, R>(
    key: &'a Key,
    object: &'a mut K,
    change: ChangeType,
    record: impl FnOnce(&K) -> R + 'a,
    also: impl FnOnce(&mut Txn) -> Result<(), StoreError> + 'a,
) -> impl FnOnce(&mut Txn) -> Result<(), ApiError> + 'a
where
    K: kube::Resource + Clone + Send + Sync + 'static,
    R: serde::Serialize,
{
    move |tx| {
        let rv = tx.next_resource_version();
        object.meta_mut().resource_version = Some(rv.to_string());
        match change {
            ChangeType::Deleted => tx.delete(key)?,
            ChangeType::Added | ChangeType::Modified => tx.put(key, &record(object))?,
        }
        also(tx)?;
        tx.record_change(key, change, rv, Arc::new(object.clone()));
        Ok(())
    }
}
