//! What the metadata store keeps of a Host, and its key.

use battery_types::{HasResourceInfo, Host, HostSpec, HostStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use serde::{Deserialize, Serialize};

use super::leaving::Leaving;
use crate::battery::BatteryHost;
use crate::meta_store::Key;

pub(super) const RESOURCE: &str = "hosts";
/// battery's cordon reason for a Host its admin marked unschedulable.
pub(super) const ADMIN_CORDON_REASON: &str = "spec.unschedulable is true";

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct HostRecord {
    pub(super) metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) agent_address: Option<String>,
    /// The agent's report; `Draining` is ours and derived on read, never kept here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) conditions: Vec<Condition>,
    /// battery's view of the Host when the record was last written: what `sync` compares
    /// battery's answers with, so another client's change gets a resourceVersion even
    /// across a restart of this server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) observed: Option<Observed>,
    /// Set from the moment the Host's deletion is accepted until battery removed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) leaving: Option<Leaving>,
    /// When the agent last reported, and the cordon the API server keeps while the Host
    /// is not ready (`readiness.rs`).
    #[serde(default)]
    pub(super) reporting: Reporting,
}

/// battery's part of a Host: its spec without `agentAddress`, its status without
/// conditions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Observed {
    pub(super) spec: HostSpec,
    pub(super) status: HostStatus,
}

impl Observed {
    pub(super) fn of(host: &BatteryHost) -> Self {
        Self {
            spec: host.spec.clone(),
            status: host.status.clone(),
        }
    }

    pub(super) fn of_object(host: &Host) -> Self {
        let mut spec = host.spec.clone();
        spec.agent_address = None;
        let mut status = host.status.clone().unwrap_or_default();
        status.conditions = Vec::new();
        Self { spec, status }
    }
}

pub(super) fn key(name: &str) -> Key {
    Key::new(RESOURCE, None, name)
}

pub(super) fn info() -> &'static battery_types::ResourceInfo {
    &Host::INFO
}

/// What the record keeps of the agent's reporting beside its conditions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Reporting {
    /// When the agent last wrote `hosts/<name>/status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) reported_at: Option<Time>,
    /// Whether the API server has the Host cordoned in battery because it is not ready.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) cordoned_not_ready: bool,
    /// The admin's `spec.unschedulable` while [`Self::cordoned_not_ready`] is on: battery's
    /// cordon then says nothing of it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) admin_unschedulable: bool,
}

pub(super) fn adopted_metadata(name: &str) -> ObjectMeta {
    let uid = uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        format!("{RESOURCE}//{name}").as_bytes(),
    );
    ObjectMeta {
        name: Some(name.to_owned()),
        uid: Some(uid.to_string()),
        resource_version: Some("0".to_owned()),
        generation: Some(1),
        ..ObjectMeta::default()
    }
}
