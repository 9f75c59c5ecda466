//! The contract between the generic handlers and one resource's storage, like
//! `apiserver:pkg/registry/rest/rest.go`, reduced to what our three resources need.

use std::collections::BTreeMap;

use battery_api_machinery::status::ApiError;
use battery_api_machinery::table::TableColumnDefinition;
use battery_types::HasResourceInfo;
use battery_types::validation::FieldError;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::{RawValue, to_raw_value};

use super::RequestContext;

/// A kind the generic handlers can serve.
pub trait ApiObject:
    kube::Resource<DynamicType = ()>
    + HasResourceInfo
    + Serialize
    + DeserializeOwned
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<T> ApiObject for T where
    T: kube::Resource<DynamicType = ()>
        + HasResourceInfo
        + Serialize
        + DeserializeOwned
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// What a delete did.
#[derive(Debug)]
pub enum Deleted<T> {
    /// The object is gone; this was its last state.
    Gone(T),
    /// The object stays, marked for deletion, until something outside this request
    /// finishes (a Pool whose MicroVMs are still leased).
    Pending(T),
}

/// A page of a list.
pub struct ListPage<T> {
    pub items: Vec<T>,
    /// The resourceVersion the page is consistent with.
    pub resource_version: u64,
    /// How many objects follow the page.
    pub rest: usize,
}

/// An object of a list as its storage keeps it, with what a list needs of it, so the
/// list copies the object's JSON instead of decoding and encoding it (ADR 25).
pub struct StoredItem {
    pub namespace: String,
    pub name: String,
    /// The object as served, in compact JSON.
    pub object: Box<RawValue>,
    /// Its metadata, in compact JSON.
    pub metadata: Box<RawValue>,
    pub labels: BTreeMap<String, String>,
    pub created: Option<Time>,
    /// The cells of [`Storage::table_columns`].
    pub cells: Vec<serde_json::Value>,
    /// The values of [`Storage::selectable_fields`].
    pub fields: Vec<(&'static str, String)>,
}

impl StoredItem {
    /// The item of an object the storage had to decode (and perhaps change) after all.
    pub fn encode<S: Storage>(storage: &S, object: &S::Object) -> Result<Self, ApiError> {
        let meta = kube::Resource::meta(object);
        Ok(StoredItem {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            object: to_raw_value(object).map_err(ApiError::internal)?,
            metadata: to_raw_value(meta).map_err(ApiError::internal)?,
            labels: meta.labels.clone().unwrap_or_default(),
            created: meta.creation_timestamp.clone(),
            cells: storage.table_cells(object),
            fields: storage.field_values(object),
        })
    }

    /// Its [`list_key`].
    pub fn list_key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Where an object sorts in a list, and what a continue token resumes after:
/// `namespace/name`, ordered as bytes, as kube-apiserver orders its etcd keys (an order
/// that differs from (namespace, name) when one namespace's name is a prefix of another's).
pub fn list_key<T: kube::Resource>(object: &T) -> String {
    let meta = object.meta();
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// One resource's storage. Methods are called only after the handlers have decoded,
/// defaulted, validated and authorized the request, and never for `dryRun`.
pub trait Storage: Send + Sync + 'static {
    /// The kind stored.
    type Object: ApiObject;

    /// Table columns after `Name` and before `Age`.
    fn table_columns(&self) -> Vec<TableColumnDefinition>;

    /// The cells of those columns for `object`.
    fn table_cells(&self, object: &Self::Object) -> Vec<serde_json::Value>;

    /// Field selector labels beyond `metadata.name` and `metadata.namespace`.
    fn selectable_fields(&self) -> &'static [&'static str] {
        &[]
    }

    /// The value of a field from [`Storage::selectable_fields`].
    fn field_value(&self, _object: &Self::Object, _field: &str) -> Option<String> {
        None
    }

    /// The values of [`Storage::selectable_fields`] that `object` has.
    fn field_values(&self, object: &Self::Object) -> Vec<(&'static str, String)> {
        self.selectable_fields()
            .iter()
            .filter_map(|f| self.field_value(object, f).map(|v| (*f, v)))
            .collect()
    }

    /// Rules of the kind itself (defaults were applied while decoding).
    fn validate(&self, object: &Self::Object) -> Vec<FieldError>;

    /// Rules about changing `old` into `new` (immutable fields).
    fn validate_update(&self, _old: &Self::Object, _new: &Self::Object) -> Vec<FieldError> {
        Vec::new()
    }

    /// The object `name` in `ctx.namespace`.
    fn get(
        &self,
        ctx: &RequestContext,
        name: &str,
    ) -> impl Future<Output = Result<Self::Object, ApiError>> + Send;

    /// Every object (in `ctx.namespace`, when set) and the resourceVersion the list is
    /// consistent with.
    fn list(
        &self,
        ctx: &RequestContext,
    ) -> impl Future<Output = Result<(Vec<Self::Object>, u64), ApiError>> + Send;

    /// A page of the list: the objects after the one whose [`list_key`] is `after`, at
    /// most `limit` of them, and how many follow. This default lists everything and cuts;
    /// a storage whose list costs per object reads only the page.
    fn list_page(
        &self,
        ctx: &RequestContext,
        after: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = Result<ListPage<Self::Object>, ApiError>> + Send {
        async move {
            let (items, resource_version) = self.list(ctx).await?;
            let start = after.map_or(0, |after| {
                items.partition_point(|o| list_key(o).as_str() <= after)
            });
            let mut items: Vec<_> = items.into_iter().skip(start).collect();
            let rest = items.len().saturating_sub(limit);
            items.truncate(limit);
            Ok(ListPage {
                items,
                resource_version,
                rest,
            })
        }
    }

    /// A page as [`Storage::list_page`] reads it, as stored JSON, for a storage whose
    /// objects cost more to decode and encode than to copy; `None` (this default) where
    /// the storage has no such form, and the list decodes.
    fn list_page_stored(
        &self,
        _ctx: &RequestContext,
        _after: Option<&str>,
        _limit: usize,
    ) -> impl Future<Output = Result<Option<ListPage<StoredItem>>, ApiError>> + Send {
        async { Ok(None) }
    }

    /// Creates `object`, whose server-owned metadata (uid, creationTimestamp, generation,
    /// managedFields) the handler set; the storage sets resourceVersion and status.
    fn create(
        &self,
        ctx: &RequestContext,
        object: Self::Object,
    ) -> impl Future<Output = Result<Self::Object, ApiError>> + Send;

    /// Replaces `old` with `new`. `new.metadata.resourceVersion` is the version the client
    /// changed: the storage refuses with a Conflict if the object moved on since.
    fn update(
        &self,
        ctx: &RequestContext,
        old: Self::Object,
        new: Self::Object,
    ) -> impl Future<Output = Result<Self::Object, ApiError>> + Send;

    /// Removes `object`, which has no finalizers left.
    fn delete(
        &self,
        ctx: &RequestContext,
        object: Self::Object,
    ) -> impl Future<Output = Result<Deleted<Self::Object>, ApiError>> + Send;
}
