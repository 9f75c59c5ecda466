//! `Pool`: a warm pool of MicroVMs that battery keeps ready to be claimed.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::claim_limits::ClaimLimits;
use crate::duration::Duration;
use crate::service_account_token::ServiceAccountToken;
use crate::string_enum::string_enum;
use crate::template::MicroVMTemplate;
use crate::validation::{FieldError, FieldPath, messages, validate_labels};
use crate::wire::required_fields;

/// The desired state of a Pool: what its MicroVMs look like, how many battery keeps, where
/// they run, and how claims on them are leased.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "battery.liquidmetal-x.dev",
    version = "v1alpha1",
    kind = "Pool",
    namespaced,
    status = "PoolStatus",
    shortname = "bpool",
    category = "battery",
    derive = "PartialEq",
    doc = "A Pool is a warm pool of identical flintlock MicroVMs that battery keeps provisioned on the Hosts the Pool selects, ready for MicroVMClaims to bind."
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = required_fields(&["template"]))]
pub struct PoolSpec {
    /// The MicroVM every member of the Pool is created from.
    #[serde(default)]
    pub template: MicroVMTemplate,
    /// How many MicroVMs battery keeps in the Pool; at least 0. How leased MicroVMs count
    /// towards it depends on `replenishment.type`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(required, range(min = 0))]
    pub size: Option<i32>,
    /// Which Hosts the Pool's MicroVMs may run on. Unset selects every Host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    /// When battery provisions MicroVMs to bring the Pool back to size.
    #[serde(default)]
    pub replenishment: Replenishment,
    /// Commands run inside the Pool's MicroVMs, and what happens when one fails.
    #[serde(default)]
    pub hooks: Hooks,
    /// How claims on the Pool are leased: how often their Holder renews, and how long a
    /// lease lasts unrenewed.
    #[serde(default)]
    pub lease: LeaseSettings,
    /// How long the Pool's claims may live: an idle timeout and a maximum lifetime, each
    /// a default for claims that set none and a maximum no claim may exceed. Kept by the
    /// API server (battery has no such limit), and applied to claims as they bind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_limits: Option<ClaimLimits>,
    /// A token of each claim's ServiceAccount (`serviceAccountName`) in its MicroVM, as a
    /// Pod has one: the token, the cluster's CA and the namespace under
    /// `/var/run/secrets/kubernetes.io/serviceaccount`, the token replaced before it
    /// expires and invalid soon after the claim ends. Unset, only claims that ask for
    /// one get one. Needs a cluster (not `battery-apiserver dev`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_token: Option<ServiceAccountToken>,
}

/// Which Hosts a Pool's MicroVMs may run on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Labels a Host must carry (in its metadata) for the Pool's MicroVMs to run on it.
    /// Empty selects every Host. The selection is re-evaluated whenever a Host is added,
    /// changed or removed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
}

string_enum! {
    /// When battery provisions MicroVMs to bring a Pool back to size.
    #[derive(Default)]
    pub enum ReplenishmentType {
        /// Keep `size` MicroVMs available: every claim provisions a replacement at once, so
        /// leased MicroVMs come on top of `size` (the default).
        #[default]
        ImmediateOnLease = "ImmediateOnLease",
        /// When fewer than `minSize` MicroVMs are available, provision up to `size` in all.
        MinSizeThreshold = "MinSizeThreshold",
        /// Keep `size` MicroVMs in all, leased ones included: a replacement is provisioned
        /// when a MicroVM is deleted.
        ReplaceOnDelete = "ReplaceOnDelete",
    }
}

/// When battery provisions MicroVMs to bring a Pool back to size.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct Replenishment {
    /// The strategy: `ImmediateOnLease` (the default) keeps `size` MicroVMs available and
    /// replaces each one as it is claimed; `MinSizeThreshold` provisions up to `size` once
    /// fewer than `minSize` are available; `ReplaceOnDelete` keeps `size` in all and replaces
    /// each one when it is deleted.
    #[serde(rename = "type")]
    pub type_: ReplenishmentType,
    /// The number of available MicroVMs below which a `MinSizeThreshold` Pool provisions
    /// more; at least 1. Required for `MinSizeThreshold`, unused otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub min_size: Option<i32>,
}

string_enum! {
    /// What battery does with a MicroVM whose create or pre-lease hook failed.
    #[derive(Default)]
    pub enum HookFailurePolicy {
        /// Delete the MicroVM; replenishment replaces it (the default).
        #[default]
        DeleteAndReplace = "DeleteAndReplace",
        /// Keep the MicroVM, out of service, for inspection; it counts as quarantined.
        Quarantine = "Quarantine",
    }
}

/// Commands run inside a Pool's MicroVMs, and what happens when one fails.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct Hooks {
    /// Shell commands run once in each new MicroVM after it boots and its guest agent is
    /// up, before it becomes available.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub create: Vec<String>,
    /// Shell commands run in a MicroVM each time it is claimed, just before the claim is
    /// bound; a failure fails the claim.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub pre_lease: Vec<String>,
    /// What happens to a MicroVM whose hook failed: `DeleteAndReplace` (the default) or
    /// `Quarantine`.
    pub failure_policy: HookFailurePolicy,
}

/// How claims on a Pool are leased.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct LeaseSettings {
    /// How often a claim's Holder should renew its lease, as a duration such as `10s`
    /// (the default). Must be shorter than `expiryThreshold`.
    pub heartbeat_interval: Duration,
    /// How long a lease lasts after the claim or its last renewal, as a duration such as
    /// `30s` (the default). battery deletes the MicroVM of a lease left to expire.
    pub expiry_threshold: Duration,
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_secs(10),
            expiry_threshold: Duration::from_secs(30),
        }
    }
}

/// The observed state of a Pool, read from battery whenever the Pool is read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct PoolStatus {
    /// MicroVMs ready to be claimed.
    pub available: i32,
    /// MicroVMs bound to a claim, or running their pre-lease hooks for one.
    pub leased: i32,
    /// MicroVMs being created or running their create hooks.
    pub provisioning: i32,
    /// MicroVMs kept out of service after a hook failed (hook failure policy `Quarantine`).
    pub quarantined: i32,
    /// The Pool's conditions: `Ready` (the Pool is at size) and `Exhausted` (no MicroVM is
    /// available to claim).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The label key of a Pool's `scale` selector (`status.selector`): `<key>=<the Pool's
/// uid>`, as a Job's selector names its `controller-uid`. No Pod carries it (ADR 0019).
pub const POOL_UID_LABEL: &str = "battery.liquidmetal-x.dev/pool-uid";

impl Pool {
    /// How many of the Pool's MicroVMs count towards `spec.size` under its replenishment
    /// type, as battery's reconciler counts them: the `status.replicas` of its `scale`
    /// subresource, which HPA compares with `spec.replicas`. Leased MicroVMs come on top
    /// of `size` for `ImmediateOnLease`, and quarantined ones never count.
    pub fn replicas(&self) -> i32 {
        let status = self.status.clone().unwrap_or_default();
        let ready = status.available.saturating_add(status.provisioning);
        match self.spec.replenishment.type_ {
            ReplenishmentType::ImmediateOnLease => ready,
            _ => ready.saturating_add(status.leased),
        }
    }

    /// The label selector of its `scale` subresource, in the query-string form
    /// `status.selector` takes: the Pool's uid under [`POOL_UID_LABEL`], so that it is a
    /// valid label value whatever the name, and no two Pools share it.
    pub fn scale_selector(&self) -> String {
        format!(
            "{POOL_UID_LABEL}={}",
            self.metadata.uid.as_deref().unwrap_or_default()
        )
    }
}

impl PoolSpec {
    /// Checks the spec as a create or an update must find it, with paths from `spec`. A
    /// Pool has no immutable fields, so an update is checked the same way.
    pub fn validate(&self) -> Vec<FieldError> {
        let path = FieldPath::new("spec");
        let mut errors = self.template.validate(&path.child("template"));
        match self.size {
            None => errors.push(FieldError::required(path.child("size"), "")),
            Some(size) if size < 0 => {
                errors.push(FieldError::invalid(
                    path.child("size"),
                    size,
                    messages::NON_NEGATIVE,
                ));
            }
            Some(_) => {}
        }
        if let Some(placement) = &self.placement {
            errors.extend(validate_labels(
                &placement.node_selector,
                &path.child("placement").child("nodeSelector"),
            ));
        }
        errors.extend(self.replenishment.validate(&path.child("replenishment")));
        if !self.hooks.failure_policy.is_known() {
            errors.push(FieldError::not_supported(
                path.child("hooks").child("failurePolicy"),
                self.hooks.failure_policy.as_str(),
                HookFailurePolicy::VALUES,
            ));
        }
        errors.extend(self.lease.validate(&path.child("lease")));
        if let Some(limits) = &self.claim_limits {
            errors.extend(limits.validate(&path.child("claimLimits")));
        }
        if let Some(token) = &self.service_account_token {
            errors.extend(token.validate(&path.child("serviceAccountToken")));
        }
        errors.extend(self.validate_per_vm_network(&path.child("template").child("interfaces")));
        errors
    }

    /// battery refuses a template that fixes a guest MAC or a static address when the Pool
    /// can hold more than one MicroVM, since every MicroVM would get the same one. It can
    /// when its size is above 1, when every claim provisions a replacement
    /// (`ImmediateOnLease`), or when failed MicroVMs are kept (`Quarantine`).
    fn validate_per_vm_network(&self, path: &FieldPath) -> Vec<FieldError> {
        const DETAIL: &str = "may not be set while the Pool can hold more than one MicroVM (size above 1, replenishment type ImmediateOnLease, or hook failure policy Quarantine): every MicroVM would get the same one";
        let holds_several = self.size.is_some_and(|size| size > 1)
            || self.replenishment.type_ == ReplenishmentType::ImmediateOnLease
            || self.hooks.failure_policy == HookFailurePolicy::Quarantine;
        if !holds_several {
            return Vec::new();
        }
        let mut errors = Vec::new();
        for (i, interface) in self.template.interfaces.iter().enumerate() {
            if interface.guest_mac.is_some() {
                errors.push(FieldError::forbidden(
                    path.index(i).child("guestMac"),
                    DETAIL,
                ));
            }
            if interface.address.is_some() {
                errors.push(FieldError::forbidden(
                    path.index(i).child("address"),
                    DETAIL,
                ));
            }
        }
        errors
    }
}

impl Replenishment {
    fn validate(&self, path: &FieldPath) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if !self.type_.is_known() {
            errors.push(FieldError::not_supported(
                path.child("type"),
                self.type_.as_str(),
                ReplenishmentType::VALUES,
            ));
        }
        match self.min_size {
            Some(min_size) if min_size < 1 => {
                errors.push(FieldError::invalid(
                    path.child("minSize"),
                    min_size,
                    messages::at_least(1),
                ));
            }
            None if self.type_ == ReplenishmentType::MinSizeThreshold => {
                errors.push(FieldError::required(
                    path.child("minSize"),
                    "required when type is MinSizeThreshold",
                ));
            }
            _ => {}
        }
        errors
    }
}

impl LeaseSettings {
    fn validate(&self, path: &FieldPath) -> Vec<FieldError> {
        let mut errors = Vec::new();
        for (name, duration) in [
            ("heartbeatInterval", self.heartbeat_interval),
            ("expiryThreshold", self.expiry_threshold),
        ] {
            if !duration.is_positive() {
                errors.push(FieldError::invalid(
                    path.child(name),
                    duration.to_string(),
                    messages::POSITIVE,
                ));
            }
        }
        // A Holder renewing no more often than the lease lasts loses its claim between two
        // renewals; battery would accept the spec (it never reads the interval), so say so.
        if errors.is_empty() && self.heartbeat_interval >= self.expiry_threshold {
            errors.push(FieldError::invalid(
                path.child("heartbeatInterval"),
                self.heartbeat_interval.to_string(),
                format!(
                    "must be less than expiryThreshold ({})",
                    self.expiry_threshold
                ),
            ));
        }
        errors
    }
}

#[cfg(test)]
mod tests;
