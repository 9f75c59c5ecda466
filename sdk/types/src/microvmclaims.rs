//! `MicroVMClaim`: one MicroVM of a Pool, bound to its Holder for as long as the lease is
//! renewed.
//!
//! battery's lease id is deliberately absent: it is a bearer secret for battery (whoever
//! holds it can renew or release the MicroVM), so it never leaves the apiserver.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

mod config;

pub use config::{
    ClaimEnvVar, ClaimFile, DEFAULT_CONFIG_MAP_FILE_MODE, DEFAULT_SECRET_FILE_MODE, EnvVarSource,
    KeySelector, MAX_ENV, MAX_FILES, SourceKind,
};

use crate::claim_limits::{ClaimLimits, validate_positive};
use crate::duration::Duration;
use crate::service_account_token::ServiceAccountToken;
use crate::string_enum::string_enum;
use crate::validation::{FieldError, FieldPath, messages, validate_dns_subdomain_name};
use crate::wire::{drop_null_from_enum, required_fields};

/// The desired state of a MicroVMClaim: which Pool to take a MicroVM from, who may use
/// it, and the MicroVM's own configuration. All are fixed once the claim exists.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "battery.liquidmetal-x.dev",
    version = "v1alpha1",
    kind = "MicroVMClaim",
    namespaced,
    status = "MicroVMClaimStatus",
    shortname = "mvc",
    category = "battery",
    derive = "PartialEq",
    doc = "A MicroVMClaim binds one MicroVM of a Pool to a Holder (a ServiceAccount) for as long as its lease is renewed. Creating it binds at once: the created object is already Bound. Deleting it releases the MicroVM."
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = required_fields(&["poolRef", "serviceAccountName"]))]
pub struct MicroVMClaimSpec {
    /// The Pool, in the claim's namespace, to take a MicroVM from. Immutable.
    #[serde(default)]
    pub pool_ref: PoolRef,
    /// The Holder: the ServiceAccount, in the claim's namespace, that alone may use the
    /// MicroVM (exec into it, renew its lease). Immutable.
    #[serde(default)]
    pub service_account_name: String,
    /// Environment variables given to every exec session in the MicroVM (a session's own
    /// `env` wins over one of the same name). Values from a Secret or ConfigMap are read
    /// at bind, as the creating user, and never stored. Immutable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub env: Vec<ClaimEnvVar>,
    /// Files written into the MicroVM at bind, before the claim is Bound, each the content
    /// of a Secret's or ConfigMap's key, read as the creating user. Immutable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["path"]))]
    pub files: Vec<ClaimFile>,
    /// How long the claim may go without an exec, a terminal, a port-forward or a file
    /// copy before it ends (phase `Expired`, reason `IdleTimeout`), as a duration such as
    /// `15m`; a session that stays open counts as activity for as long as it is open.
    /// Renewing the lease is not activity. Unset, the Pool's
    /// `claimLimits.idleTimeout.default` applies; it may not exceed the Pool's
    /// `claimLimits.idleTimeout.max`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<Duration>,
    /// How long after its bind the claim ends however often it is renewed (phase
    /// `Expired`, reason `MaxLifetimeReached`), as a duration such as `8h`. Unset, the
    /// Pool's `claimLimits.maxLifetime.default` applies; it may not exceed the Pool's
    /// `claimLimits.maxLifetime.max`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lifetime: Option<Duration>,
    /// A token of the Holder's ServiceAccount in the MicroVM, as its Pool's
    /// `serviceAccountToken` gives one; set here, the claim gets one even if its Pool
    /// gives none, and its fields win over the Pool's. The creating user must be allowed
    /// to `create` `serviceaccounts/token` for `serviceAccountName`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_token: Option<ServiceAccountToken>,
}

/// A reference to a Pool in the referring object's namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = required_fields(&["name"]))]
pub struct PoolRef {
    /// The Pool's name.
    #[serde(default)]
    pub name: String,
}

string_enum! {
    /// Where a claim is in its life. A claim is created Bound; released claims are deleted,
    /// not kept.
    pub enum ClaimPhase {
        /// The claim holds a MicroVM and its lease is live.
        Bound = "Bound",
        /// The claim ended: its lease ran out unrenewed, or it reached its idle timeout or
        /// maximum lifetime, and battery took the MicroVM back. The `Bound` condition's
        /// reason says which. The claim is kept, so its Holder can see what happened,
        /// until it is deleted.
        Expired = "Expired",
    }
}

/// The observed state of a MicroVMClaim.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct MicroVMClaimStatus {
    /// `Bound` while the claim holds its MicroVM, `Expired` once the lease ran out.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(transform = drop_null_from_enum)]
    pub phase: Option<ClaimPhase>,
    /// The MicroVM the claim holds.
    #[serde(rename = "microVM", skip_serializing_if = "Option::is_none")]
    pub micro_vm: Option<ClaimedMicroVM>,
    /// The Host the MicroVM runs on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<ClaimHost>,
    /// When the claim was bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound_time: Option<Time>,
    /// When the lease runs out unless renewed, as battery reports it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_expires_at: Option<MicroTime>,
    /// When the lease was last renewed through the claim's `lease` subresource.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<MicroTime>,
    /// The host side of each of the MicroVM's network interfaces, by `deviceId`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["deviceId"]))]
    pub network_interfaces: Vec<NetworkInterfaceStatus>,
    /// The idle timeout that applies to the claim: its own, or its Pool's when it bound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<Duration>,
    /// The maximum lifetime that applies to the claim: its own, or its Pool's when it
    /// bound. The claim ends at `boundTime` plus this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_lifetime: Option<Duration>,
    /// The claim's conditions: `Bound` (the claim holds its MicroVM; false once it does
    /// not, with reason `LeaseExpired`, `IdleTimeout` or `MaxLifetimeReached`) and `HostReady` (the MicroVM's Host reports itself
    /// ready, with the Host's reason and message).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The MicroVM a claim holds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimedMicroVM {
    /// The MicroVM's uid in battery and flintlock.
    pub uid: String,
}

/// The Host a claimed MicroVM runs on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimHost {
    /// The name of the Host (the `hosts` object, and its Node).
    pub node_name: String,
    /// The `host:port` of the Host's exec agent, when it has registered one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_address: Option<String>,
}

/// The host side of a claimed MicroVM's network interface, as flintlock reports it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInterfaceStatus {
    /// The interface's `deviceId` in the Pool's template.
    pub device_id: String,
    /// The name of the device on the Host (the tap or macvtap device).
    #[serde(default)]
    pub host_device_name: String,
    /// The interface's index in the MicroVM.
    #[serde(default)]
    pub index: i32,
    /// The interface's MAC address.
    #[serde(default)]
    pub mac_address: String,
}

impl MicroVMClaimSpec {
    /// Checks the spec as a create must find it, with paths from `spec`: a Pool name and a
    /// ServiceAccount name, each a DNS subdomain as object names are; `env` and `files` as
    /// a Pod's `env` and volume items are checked; limits, when set, longer than zero.
    pub fn validate(&self) -> Vec<FieldError> {
        let path = FieldPath::new("spec");
        let mut errors =
            validate_dns_subdomain_name(&self.pool_ref.name, &path.child("poolRef").child("name"));
        errors.extend(validate_dns_subdomain_name(
            &self.service_account_name,
            &path.child("serviceAccountName"),
        ));
        errors.extend(config::validate_env(&self.env, &path.child("env")));
        errors.extend(config::validate_files(&self.files, &path.child("files")));
        errors.extend(validate_positive(
            self.idle_timeout,
            &path.child("idleTimeout"),
        ));
        errors.extend(validate_positive(
            self.max_lifetime,
            &path.child("maxLifetime"),
        ));
        if let Some(token) = &self.service_account_token {
            errors.extend(token.validate(&path.child("serviceAccountToken")));
        }
        errors
    }

    /// The idle timeout and maximum lifetime the claim gets on a Pool with `pool`'s
    /// limits: its own, else the Pool's default (or maximum); refused, naming the claim's
    /// field, when it asks for more than the Pool's maximum.
    pub fn limits_on(
        &self,
        pool: Option<&ClaimLimits>,
    ) -> Result<(Option<Duration>, Option<Duration>), Vec<FieldError>> {
        let path = FieldPath::new("spec");
        let pool = pool.cloned().unwrap_or_default();
        let idle = pool.idle_timeout.resolve(
            self.idle_timeout,
            &path.child("idleTimeout"),
            "spec.claimLimits.idleTimeout.max",
        );
        let lifetime = pool.max_lifetime.resolve(
            self.max_lifetime,
            &path.child("maxLifetime"),
            "spec.claimLimits.maxLifetime.max",
        );
        match (idle, lifetime) {
            (Ok(idle), Ok(lifetime)) => Ok((idle, lifetime)),
            (idle, lifetime) => Err(idle.err().into_iter().chain(lifetime.err()).collect()),
        }
    }

    /// Whether binding reads a Secret or a ConfigMap.
    pub fn has_references(&self) -> bool {
        self.env.iter().any(|e| e.value_from.is_some()) || !self.files.is_empty()
    }

    /// Checks an update from `old` to `new`: `new` as `validate` does, and that neither the
    /// Pool, the Holder, the env, the files the limits nor the token changed. Changing the Holder would hand a
    /// live MicroVM to someone else; changing the Pool would not move the MicroVM; the env
    /// and files were resolved, authorized and written at bind.
    pub fn validate_update(old: &Self, new: &Self) -> Vec<FieldError> {
        let path = FieldPath::new("spec");
        let mut errors = new.validate();
        if new.pool_ref != old.pool_ref {
            errors.push(FieldError::invalid(
                path.child("poolRef"),
                json!({ "name": new.pool_ref.name }),
                messages::IMMUTABLE,
            ));
        }
        if new.service_account_name != old.service_account_name {
            errors.push(FieldError::invalid(
                path.child("serviceAccountName"),
                new.service_account_name.as_str(),
                messages::IMMUTABLE,
            ));
        }
        if new.env != old.env {
            errors.push(FieldError::invalid(
                path.child("env"),
                serde_json::to_value(&new.env).unwrap_or_default(),
                messages::IMMUTABLE,
            ));
        }
        for (name, old, new) in [
            ("idleTimeout", old.idle_timeout, new.idle_timeout),
            ("maxLifetime", old.max_lifetime, new.max_lifetime),
        ] {
            if new != old {
                errors.push(FieldError::invalid(
                    path.child(name),
                    new.map_or(serde_json::Value::Null, |d| d.to_string().into()),
                    messages::IMMUTABLE,
                ));
            }
        }
        if new.files != old.files {
            errors.push(FieldError::invalid(
                path.child("files"),
                serde_json::to_value(&new.files).unwrap_or_default(),
                messages::IMMUTABLE,
            ));
        }
        if new.service_account_token != old.service_account_token {
            errors.push(FieldError::invalid(
                path.child("serviceAccountToken"),
                serde_json::to_value(&new.service_account_token).unwrap_or_default(),
                messages::IMMUTABLE,
            ));
        }
        errors
    }
}

impl MicroVMClaim {
    /// The username the Holder authenticates as,
    /// `system:serviceaccount:<namespace>:<serviceAccountName>`: the only user the exec and
    /// lease subresources serve. `None` while the claim has no namespace.
    pub fn holder_username(&self) -> Option<String> {
        let namespace = self.metadata.namespace.as_deref()?;
        Some(service_account_username(
            namespace,
            &self.spec.service_account_name,
        ))
    }
}

/// The username a ServiceAccount's tokens authenticate as, as Kubernetes' `MakeUsername`
/// forms it: `system:serviceaccount:<namespace>:<name>`.
pub fn service_account_username(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

#[cfg(test)]
mod tests;

/// kube-rs offers `Api::exec` on resources marked `Execute`: a claim's `exec`
/// subresource speaks the same protocol as `pods/exec`.
#[cfg(feature = "exec")]
impl kube::api::Execute for MicroVMClaim {}
