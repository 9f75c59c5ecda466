//! `Host`: a machine running flintlockd that battery places MicroVMs on.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::validation::{FieldError, FieldPath, messages, validate_conditions, validate_host_port};
use crate::wire::{is_false, required_fields};

/// The desired state of a Host: how battery reaches its flintlockd, and whether new
/// MicroVMs may be placed on it. A Host's labels (in its metadata) are what Pools'
/// `placement.nodeSelector` match.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "battery.liquidmetal-x.dev",
    version = "v1alpha1",
    kind = "Host",
    status = "HostStatus",
    shortname = "bhost",
    category = "battery",
    derive = "PartialEq",
    doc = "A Host is a machine running flintlockd on which battery places the MicroVMs of Pools. Its exec agent registers it and reports its readiness through the status subresource."
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = required_fields(&["address", "tls"]))]
pub struct HostSpec {
    /// The `host:port` of the Host's flintlockd gRPC API, as battery dials it.
    #[serde(default)]
    pub address: String,
    /// Whether the Host is cordoned: battery places no new MicroVMs on it. MicroVMs already
    /// there keep running.
    #[serde(default, skip_serializing_if = "is_false")]
    pub unschedulable: bool,
    /// How battery secures its connection to flintlockd: either `insecure`, or a `caFile`
    /// (with an optional client `certFile` and `keyFile`).
    #[serde(default)]
    pub tls: HostTls,
    /// The `host:port` of the Host's exec agent, which relays exec sessions into the
    /// Host's MicroVMs. Set by the agent when it registers the Host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_address: Option<String>,
}

/// How battery secures its connection to a Host's flintlockd. The files are paths on the
/// machine battery runs on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct HostTls {
    /// Connect without TLS. Only for development: flintlockd's API then has no
    /// authentication. May not be combined with any file.
    #[serde(skip_serializing_if = "is_false")]
    pub insecure: bool,
    /// The CA bundle that signed flintlockd's serving certificate. Required unless
    /// `insecure` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// battery's client certificate, for flintlockd configured to require one. Set
    /// together with `keyFile`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<String>,
    /// The private key of `certFile`. Set together with `certFile`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<String>,
}

/// The observed state of a Host: battery's view of it, and its exec agent's report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct HostStatus {
    /// The version of flintlockd battery found on the Host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flintlock_version: Option<String>,
    /// MicroVMs battery has on the Host, of every Pool and in every phase, including
    /// placements in progress.
    pub vm_count: i32,
    /// Why the Host was cordoned, as battery recorded it; set only while it is cordoned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cordoned_reason: Option<String>,
    /// The Host's conditions. `Ready` is the exec agent's report: true when KVM, the
    /// thin pool, flintlockd and its exec API are all usable, otherwise false with a reason
    /// such as `KVMUnavailable`, `ThinPoolMissing`, `FlintlockdNotReady` or `ExecDisabled`.
    /// A report older than 40 seconds (four of the agent's 10-second heartbeats) is
    /// replaced by `Ready=False` with reason `AgentNotReporting`. While `Ready` is false
    /// battery places no new MicroVMs on the Host (it is cordoned, `cordonedReason`
    /// says why, and `spec.unschedulable` keeps the admin's own choice); a Host with no
    /// report at all is placed on as before.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

impl HostSpec {
    /// Checks the spec as a create or an update must find it, with paths from `spec`: the
    /// rules battery's `AddHost`/`UpdateHost` apply, so that battery never refuses a Host
    /// this accepted. A Host has no immutable fields, so an update is checked the same way.
    pub fn validate(&self) -> Vec<FieldError> {
        let path = FieldPath::new("spec");
        let mut errors = Vec::new();
        if self.address.is_empty() {
            errors.push(FieldError::required(path.child("address"), ""));
        } else {
            errors.extend(validate_host_port(&self.address, &path.child("address")));
        }
        if let Some(agent_address) = &self.agent_address {
            errors.extend(validate_host_port(
                agent_address,
                &path.child("agentAddress"),
            ));
        }
        errors.extend(self.tls.validate(&path.child("tls")));
        errors
    }
}

impl HostTls {
    fn validate(&self, path: &FieldPath) -> Vec<FieldError> {
        let files = [
            ("caFile", &self.ca_file),
            ("certFile", &self.cert_file),
            ("keyFile", &self.key_file),
        ];
        let mut errors = Vec::new();
        // An empty path is as good as none to battery, so treat it as unset.
        let set = |file: &Option<String>| file.as_deref().is_some_and(|file| !file.is_empty());
        if self.insecure {
            for (name, file) in files {
                if set(file) {
                    errors.push(FieldError::forbidden(
                        path.child(name),
                        "may not be set when insecure is true",
                    ));
                }
            }
            return errors;
        }
        if !set(&self.ca_file) {
            errors.push(FieldError::required(
                path.child("caFile"),
                "required unless insecure is true",
            ));
        }
        match (set(&self.cert_file), set(&self.key_file)) {
            (true, false) => errors.push(FieldError::required(
                path.child("keyFile"),
                "required when certFile is set",
            )),
            (false, true) => errors.push(FieldError::required(
                path.child("certFile"),
                "required when keyFile is set",
            )),
            _ => {}
        }
        errors
    }
}

impl HostStatus {
    /// Checks a status written through the `status` subresource (the exec agent's report),
    /// with paths from `status`.
    pub fn validate(&self) -> Vec<FieldError> {
        let path = FieldPath::new("status");
        let mut errors = validate_conditions(&self.conditions, &path.child("conditions"));
        if self.vm_count < 0 {
            errors.push(FieldError::invalid(
                path.child("vmCount"),
                self.vm_count,
                messages::NON_NEGATIVE,
            ));
        }
        errors
    }
}

#[cfg(test)]
mod tests;
