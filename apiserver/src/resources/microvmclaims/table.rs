//! A claim's Table row and selectable fields.

use std::time::Duration;

use battery_api_machinery::table::{TableColumnDefinition, human_duration};
use battery_types::{ClaimPhase, MicroVMClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use serde_json::Value;

/// The columns of a claim's Table row.
pub(super) fn columns() -> Vec<TableColumnDefinition> {
    vec![
        TableColumnDefinition::new("Pool", "string", "The Pool the MicroVM comes from.", 0),
        TableColumnDefinition::new(
            "Phase",
            "string",
            "Bound, or Expired once the lease ran out.",
            0,
        ),
        TableColumnDefinition::new("Node", "string", "The Host the MicroVM runs on.", 0),
        // A string, not a date: kubectl shows a date column as an age, and a future
        // time has none (battery-operator #161).
        TableColumnDefinition::new(
            "Expires",
            "string",
            "When the lease expires unless renewed.",
            0,
        ),
        // The time left, age-like ("4m59s"), as a string for the same reason: a date in
        // the future has no age. One word, as kubectl's own columns mostly are.
        TableColumnDefinition::new(
            "TTL",
            "string",
            "The time left until the claim reaches its idle timeout or maximum lifetime, \
             whichever comes first; <none> where neither applies, or while only an idle \
             timeout does and the claim is in use.",
            0,
        ),
        TableColumnDefinition::new("MicroVM", "string", "The MicroVM's uid.", 1),
        TableColumnDefinition::new(
            "Holder",
            "string",
            "The ServiceAccount that may use the MicroVM.",
            1,
        ),
    ]
}

/// What a claim's Table row and selectable fields show.
pub(super) struct ClaimRow<'a> {
    pub(super) pool: &'a str,
    pub(super) phase: Option<&'a ClaimPhase>,
    pub(super) node: Option<&'a str>,
    pub(super) expires: Option<&'a MicroTime>,
    pub(super) micro_vm: Option<&'a str>,
    pub(super) holder: &'a str,
}

impl<'a> ClaimRow<'a> {
    pub(super) fn of(claim: &'a MicroVMClaim) -> Self {
        let status = claim.status.as_ref();
        ClaimRow {
            pool: &claim.spec.pool_ref.name,
            phase: status.and_then(|s| s.phase.as_ref()),
            node: status
                .and_then(|s| s.host.as_ref())
                .map(|h| h.node_name.as_str()),
            expires: status.and_then(|s| s.lease_expires_at.as_ref()),
            micro_vm: status
                .and_then(|s| s.micro_vm.as_ref())
                .map(|vm| vm.uid.as_str()),
            holder: &claim.spec.service_account_name,
        }
    }

    /// The cells of [`columns`], with `time_left` until the claim reaches a limit.
    pub(super) fn cells(&self, time_left: Option<Duration>) -> Vec<Value> {
        let text = |value: Option<&str>| Value::String(value.unwrap_or_default().to_owned());
        vec![
            self.pool.into(),
            self.phase().into(),
            text(self.node),
            self.expires
                .map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
                .unwrap_or_default()
                .into(),
            // kubectl's word for a value that is not there, so every row has each column.
            time_left
                .map_or_else(|| "<none>".to_owned(), human_duration)
                .into(),
            text(self.micro_vm),
            self.holder.into(),
        ]
    }

    /// The value of one of [`ClaimStorage::selectable_fields`].
    pub(super) fn field(&self, field: &str) -> Option<String> {
        match field {
            "spec.poolRef.name" => Some(self.pool.to_owned()),
            "status.phase" => Some(self.phase().to_owned()),
            _ => None,
        }
    }

    pub(super) fn phase(&self) -> &'a str {
        self.phase.map(ClaimPhase::as_str).unwrap_or_default()
    }
}
