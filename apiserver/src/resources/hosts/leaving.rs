//! What a Host being deleted keeps in its record, and the `Draining` condition it shows.

use battery_api_machinery::status::ApiError;
use battery_types::conditions::{self, ConditionStatus, HostDrainingReason};
use battery_types::{ClaimPhase, MicroVMClaimStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use serde::{Deserialize, Serialize};

use crate::clock::server_now;
use crate::meta_store::MetaStore;

/// Claims named in the `Draining` message; the rest are counted, so the condition stays
/// small however many claims a Host holds.
const CLAIMS_NAMED: usize = 10;

/// A Pool by battery's identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct PoolName {
    pub namespace: String,
    pub name: String,
}

/// What a Host being deleted keeps in its record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Leaving {
    /// The Pools placing MicroVMs on the Host when its deletion was accepted: the only
    /// ones that can have MicroVMs there, so the only ones its idle MicroVMs are retired
    /// from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolName>,
    /// battery's refusal of the last RemoveHost, once no MicroVM remained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

impl Leaving {
    /// The `Draining` condition of the Host with `vm_count` MicroVMs left, `claims` of
    /// them held by claims. It changes only when those do, so reads compare equal.
    pub fn condition(&self, metadata: &ObjectMeta, vm_count: i32, claims: &[String]) -> Condition {
        let (reason, message) = match &self.refused {
            Some(refusal) if vm_count == 0 => (
                HostDrainingReason::RemovalRefused,
                format!("battery refused to remove the Host: {refusal}"),
            ),
            _ => (
                HostDrainingReason::MicroVmsRemain,
                remain_message(vm_count, claims, !self.pools.is_empty()),
            ),
        };
        Condition {
            type_: conditions::DRAINING.to_owned(),
            status: ConditionStatus::True.as_str().to_owned(),
            reason: reason.as_str().to_owned(),
            message,
            observed_generation: metadata.generation,
            last_transition_time: metadata
                .deletion_timestamp
                .clone()
                .unwrap_or_else(server_now),
        }
    }
}

fn remain_message(vm_count: i32, claims: &[String], retiring: bool) -> String {
    let mut message = format!("{vm_count} MicroVM(s) remain on the Host");
    if retiring {
        message.push_str("; idle ones are being retired");
    }
    if claims.is_empty() {
        if !retiring {
            message.push_str(
                "; no claim holds one: they are quarantined, deleting, or leased outside this API",
            );
        }
        return message;
    }
    message.push_str("; held by claims ");
    message.push_str(&claims[..claims.len().min(CLAIMS_NAMED)].join(", "));
    if claims.len() > CLAIMS_NAMED {
        message.push_str(&format!(" and {} more", claims.len() - CLAIMS_NAMED));
    }
    message
}

/// What this module reads of a claim's record: who it is and where its MicroVM runs.
#[derive(Deserialize)]
struct ClaimOnHost {
    metadata: ObjectMeta,
    #[serde(default)]
    status: MicroVMClaimStatus,
}

/// The Bound claims (`namespace/name`) whose MicroVM runs on the Host `host`.
pub(super) fn claims_on(store: &MetaStore, host: &str) -> Result<Vec<String>, ApiError> {
    let (claims, _) = store.list::<ClaimOnHost>("microvmclaims", None)?;
    Ok(claims
        .into_iter()
        .filter(|c| {
            c.status.phase == Some(ClaimPhase::Bound)
                && c.status.host.as_ref().is_some_and(|h| h.node_name == host)
        })
        .map(|c| {
            format!(
                "{}/{}",
                c.metadata.namespace.unwrap_or_default(),
                c.metadata.name.unwrap_or_default()
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draining_message_names_a_bounded_number_of_claims() {
        let claims: Vec<String> = (0..12).map(|i| format!("ns/c{i}")).collect();
        let message = remain_message(12, &claims, false);
        assert!(message.starts_with("12 MicroVM(s) remain on the Host; held by claims ns/c0, "));
        assert!(message.ends_with("ns/c9 and 2 more"), "{message}");
        assert_eq!(
            remain_message(2, &[], true),
            "2 MicroVM(s) remain on the Host; idle ones are being retired"
        );
        assert!(remain_message(1, &[], false).ends_with("leased outside this API"));
    }

    #[test]
    fn a_refusal_shows_only_once_no_microvm_remains() {
        let leaving = Leaving {
            pools: Vec::new(),
            refused: Some("named by pools [a/b]".to_owned()),
        };
        let metadata = ObjectMeta {
            deletion_timestamp: Some(server_now()),
            ..ObjectMeta::default()
        };
        let refused = leaving.condition(&metadata, 0, &[]);
        assert_eq!(refused.reason, "RemovalRefused");
        assert!(refused.message.ends_with("named by pools [a/b]"));
        assert_eq!(
            refused.last_transition_time,
            metadata.deletion_timestamp.clone().unwrap()
        );
        let remaining = leaving.condition(&metadata, 1, &["ns/c".to_owned()]);
        assert_eq!(remaining.reason, "MicroVMsRemain");
        assert_eq!(remaining.status, "True");
        assert_eq!(remaining.type_, "Draining");
    }
}
