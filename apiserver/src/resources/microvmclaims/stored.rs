//! Lists served from the records' JSON as stored (ADR 25): each record is read for the
//! few fields a list needs, and its metadata, spec and status are copied into the
//! response as they are, so a list of thousands decodes and encodes no claim whole.

use std::borrow::Cow;
use std::collections::BTreeMap;

use battery_api_machinery::status::ApiError;
use battery_types::{ClaimPhase, HasResourceInfo, MicroVMClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::Resource;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::value::{RawValue, to_raw_value};

use super::read::{Ask, expire};
use super::record::{ClaimRecord, Leased, RESOURCE, object};
use super::storage::ClaimStorage;
use super::table::ClaimRow;
use crate::api::{ListPage, RequestContext, StoredItem};
use crate::meta_store::StoreError;

/// A record's parts, as stored.
#[derive(Deserialize)]
struct RecordParts<'a> {
    #[serde(borrow)]
    metadata: &'a RawValue,
    #[serde(borrow)]
    spec: &'a RawValue,
    #[serde(borrow)]
    status: &'a RawValue,
    #[serde(default)]
    lease: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaView<'a> {
    #[serde(borrow, default)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    namespace: Cow<'a, str>,
    #[serde(borrow, default)]
    uid: Cow<'a, str>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecView<'a> {
    #[serde(borrow)]
    pool_ref: NameView<'a>,
    #[serde(borrow, default)]
    service_account_name: Cow<'a, str>,
}

#[derive(Deserialize)]
struct NameView<'a> {
    #[serde(borrow, default)]
    name: Cow<'a, str>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StatusView<'a> {
    #[serde(default)]
    phase: Option<ClaimPhase>,
    #[serde(borrow, default)]
    host: Option<HostView<'a>>,
    #[serde(default)]
    lease_expires_at: Option<MicroTime>,
    #[serde(rename = "microVM", borrow, default)]
    micro_vm: Option<UidView<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct HostView<'a> {
    #[serde(borrow, default)]
    node_name: Cow<'a, str>,
}

#[derive(Deserialize)]
struct UidView<'a> {
    #[serde(borrow, default)]
    uid: Cow<'a, str>,
}

/// A claim as served, from its record's parts.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ObjectParts<'a> {
    api_version: &'a str,
    kind: &'a str,
    metadata: &'a RawValue,
    spec: &'a RawValue,
    status: &'a RawValue,
}

/// One record read for a list.
struct Viewed<'a> {
    parts: RecordParts<'a>,
    meta: MetaView<'a>,
    spec: SpecView<'a>,
    status: StatusView<'a>,
}

impl<'a> Viewed<'a> {
    fn read(key: &str, bytes: &'a [u8]) -> Result<Self, StoreError> {
        let decode_error = |source| StoreError::Decode {
            key: key.to_owned(),
            source,
        };
        let parts: RecordParts = serde_json::from_slice(bytes).map_err(decode_error)?;
        let meta: MetaView = serde_json::from_str(parts.metadata.get()).map_err(decode_error)?;
        let spec: SpecView = serde_json::from_str(parts.spec.get()).map_err(decode_error)?;
        let status: StatusView = serde_json::from_str(parts.status.get()).map_err(decode_error)?;
        Ok(Viewed {
            parts,
            meta,
            spec,
            status,
        })
    }

    /// Its lease, as a read asks battery about it; `None` when it holds none.
    fn leased(&self) -> Option<Leased<'_>> {
        self.parts.lease.as_ref()?;
        Some(Leased {
            uid: &self.meta.uid,
            namespace: &self.meta.namespace,
            pool: &self.spec.pool_ref.name,
            expires: self.status.lease_expires_at.as_ref(),
        })
    }

    fn row(&self) -> ClaimRow<'_> {
        ClaimRow {
            pool: &self.spec.pool_ref.name,
            phase: self.status.phase.as_ref(),
            node: self.status.host.as_ref().map(|h| h.node_name.as_ref()),
            expires: self.status.lease_expires_at.as_ref(),
            micro_vm: self.status.micro_vm.as_ref().map(|vm| vm.uid.as_ref()),
            holder: &self.spec.service_account_name,
        }
    }

    /// The item, its JSON copied from the record's.
    fn item(&self, storage: &ClaimStorage) -> Result<StoredItem, ApiError> {
        // Serialized, not formatted: serde_json copies the raw parts and knows the result
        // is JSON, where `RawValue::from_string` would parse it all again.
        let object = to_raw_value(&ObjectParts {
            api_version: &MicroVMClaim::api_version(&()),
            kind: MicroVMClaim::INFO.kind,
            metadata: self.parts.metadata,
            spec: self.parts.spec,
            status: self.parts.status,
        })
        .map_err(ApiError::internal)?;
        let row = self.row();
        Ok(StoredItem {
            namespace: self.meta.namespace.clone().into_owned(),
            name: self.meta.name.clone().into_owned(),
            object,
            metadata: self.parts.metadata.to_owned(),
            labels: self.meta.labels.clone(),
            created: self.meta.creation_timestamp.clone(),
            cells: row.cells(storage.time_left(&self.meta.uid)),
            fields: crate::api::Storage::selectable_fields(storage)
                .iter()
                .filter_map(|field| row.field(field).map(|value| (*field, value)))
                .collect(),
        })
    }
}

impl ClaimStorage {
    /// [`crate::api::Storage::list_page_stored`]: the page as [`ClaimStorage::as_read`]
    /// would read it, battery asked only about the claims whose records alone cannot tell.
    pub(super) async fn stored_page(
        &self,
        ctx: &RequestContext,
        after: Option<&str>,
        limit: usize,
    ) -> Result<ListPage<StoredItem>, ApiError> {
        let page = self
            .store
            .page_stored(RESOURCE, ctx.namespace.as_deref(), after, limit)?;
        let viewed = page
            .records
            .iter()
            .map(|(key, bytes)| Viewed::read(key, bytes))
            .collect::<Result<Vec<_>, _>>()?;
        let released = self
            .released(viewed.iter().filter_map(Viewed::leased), Ask::Unfollowed)
            .await?;
        let items = viewed
            .iter()
            .zip(&page.records)
            .map(|(viewed, (key, bytes))| {
                if released.contains(viewed.meta.uid.as_ref()) {
                    // Gone from battery: decoded whole, as its status changes.
                    let record: ClaimRecord =
                        serde_json::from_slice(bytes).map_err(|source| StoreError::Decode {
                            key: key.clone(),
                            source,
                        })?;
                    StoredItem::encode(self, &object(expire(record)))
                } else {
                    viewed.item(self)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ListPage {
            items,
            resource_version: page.resource_version,
            rest: page.rest,
        })
    }
}
