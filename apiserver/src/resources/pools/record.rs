//! What the metadata store keeps of a Pool, its key, and what is on its way to battery.

use battery_api_machinery::status::ApiError;
use battery_types::{ClaimLimits, HasResourceInfo, Placement, Pool, PoolSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use serde::{Deserialize, Serialize};

use crate::battery::BatteryError;
use crate::meta_store::Key;

pub(super) const RESOURCE: &str = "pools";

/// What the metadata store keeps of a Pool.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct PoolRecord {
    pub(super) metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) placement: Option<Placement>,
    /// The limits on its claims' lives (`spec.claimLimits`), which battery has no field for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) claim_limits: Option<ClaimLimits>,
    /// Its claims' ServiceAccount token (`spec.serviceAccountToken`), which battery has no
    /// field for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) service_account_token: Option<battery_types::ServiceAccountToken>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) conditions: Vec<Condition>,
    /// battery's refusal of the spec the Pool's Hosts last resolved to, if it refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) rejected: Option<String>,
    /// A spec written through the API that battery has not yet been told (`respec`):
    /// what the Pool shows as its spec meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) pending: Option<Pending>,
}

/// A Pool's spec on its way to battery, and the generation that wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Pending {
    pub(super) spec: PoolSpec,
    pub(super) generation: i64,
}

/// What a Pool's record holds beside the object it is written from.
#[derive(Debug, Default)]
pub(super) struct Kept {
    pub(super) rejected: Option<String>,
    pub(super) pending: Option<Pending>,
}

/// A spec to tell battery, as UpdatePool takes it.
pub(super) struct Respec {
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) spec: PoolSpec,
    pub(super) hosts: Vec<String>,
}

impl PoolRecord {
    /// The record of a Pool battery has and we never recorded.
    pub(super) fn adopted(namespace: &str, name: &str) -> Self {
        Self {
            metadata: adopted_metadata(namespace, name),
            ..Self::default()
        }
    }
}

/// The error a client sees for a battery failure its waiters share.
pub(super) fn shared_error(err: &BatteryError, name: &str) -> ApiError {
    err.clone().into_api_error(info(), name)
}

pub(super) fn key(namespace: &str, name: &str) -> Key {
    Key::new(RESOURCE, Some(namespace), name)
}

pub(super) fn info() -> &'static battery_types::ResourceInfo {
    &Pool::INFO
}

/// Metadata for a Pool battery has but we never recorded (created with `poolmgrctl`,
/// or by a create that crashed before its record was written): a uid derived from its
/// identity, so it is stable across reads, and resourceVersion 0 until it is written.
pub(super) fn adopted_metadata(namespace: &str, name: &str) -> ObjectMeta {
    let uid = uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("{RESOURCE}/{namespace}/{name}").as_bytes(),
    );
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        uid: Some(uid.to_string()),
        resource_version: Some("0".to_owned()),
        generation: Some(1),
        ..ObjectMeta::default()
    }
}
