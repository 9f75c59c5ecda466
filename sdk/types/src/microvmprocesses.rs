//! `MicroVMProcess`: a command running in the background in a Bound claim's MicroVM,
//! after the client that started it left (ADR 44). It lives in the process table of its
//! Host's exec agent, not in any store: its status is what the agent follows.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::string_enum::string_enum;
use crate::validation::{FieldError, FieldPath, messages, validate_dns_subdomain_name};
use crate::wire::{drop_null_from_enum, required_fields};

/// The grace period between SIGTERM and SIGKILL when none is given.
pub const DEFAULT_PROCESS_GRACE_PERIOD_SECONDS: i64 = 30;
/// The longest grace period a process may ask for.
pub const MAX_PROCESS_GRACE_PERIOD_SECONDS: i64 = 3600;

/// What runs, where, and how it stops: all fixed once the process exists.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "battery.liquidmetal-x.dev",
    version = "v1alpha1",
    kind = "MicroVMProcess",
    namespaced,
    status = "MicroVMProcessStatus",
    shortname = "mvp",
    category = "battery",
    derive = "PartialEq",
    doc = "A MicroVMProcess is a command running in the background in a Bound MicroVMClaim's MicroVM: it runs on after its client leaves, its output is kept (the latest 1 MiB) for `attach`, and its end stays readable until it is deleted or its claim ends. Only the claim's Holder may create, attach to, stop or delete one. Deleting it stops it: SIGTERM, then SIGKILL after its grace period."
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = required_fields(&["claimName", "command"]))]
pub struct MicroVMProcessSpec {
    /// The Bound MicroVMClaim, in the process's namespace, whose MicroVM runs it.
    #[serde(default)]
    pub claim_name: String,
    /// argv: the program, then its arguments, run as given (never through a shell), as
    /// an exec runs it.
    #[serde(default)]
    pub command: Vec<String>,
    /// Environment variables, over the claim's own `env`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub env: Vec<ProcessEnvVar>,
    /// The working directory in the guest; unset, the guest's default.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub working_dir: String,
    /// Keep the process's stdin open, for `attach` to write to; otherwise it reads end
    /// of file at once.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdin: bool,
    /// Seconds from SIGTERM to SIGKILL when it is stopped or deleted: 0 to 3600, 30 when
    /// unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
}

/// An environment variable of a process.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = required_fields(&["name"]))]
pub struct ProcessEnvVar {
    /// Its name.
    #[serde(default)]
    pub name: String,
    /// Its value.
    #[serde(default)]
    pub value: String,
}

string_enum! {
    /// Where a process is in its life.
    pub enum ProcessPhase {
        /// It runs.
        Running = "Running",
        /// It exited with code 0.
        Succeeded = "Succeeded",
        /// It exited with another code or by a signal, or could not be run or followed.
        Failed = "Failed",
        /// It was running when its Host's exec agent restarted, which ended it:
        /// `message` says so. Its exit code is not known.
        Lost = "Lost",
    }
}

/// What the Host's exec agent knows of the process.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct MicroVMProcessStatus {
    /// `Running`, then `Succeeded`, `Failed` or `Lost`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(transform = drop_null_from_enum)]
    pub phase: Option<ProcessPhase>,
    /// The exit code, once it exited: 128+n when signal n ended it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal a stop sent that ended it: `SIGTERM`, or `SIGKILL` after its grace
    /// period.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// Why it failed or was lost, for a person.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The Host whose exec agent runs it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// When it started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_time: Option<Time>,
}

impl MicroVMProcessSpec {
    /// The rules of a process's spec, as `field.Error`s under `spec`.
    pub fn validate(&self) -> Vec<FieldError> {
        let path = FieldPath::new("spec");
        let mut errors = validate_dns_subdomain_name(&self.claim_name, &path.child("claimName"));
        let command = path.child("command");
        match self.command.first() {
            None => errors.push(FieldError::required(&command, "")),
            Some(program) if program.is_empty() => {
                errors.push(FieldError::required(command.index(0), "the program"));
            }
            Some(_) => {}
        }
        for (index, arg) in self.command.iter().enumerate() {
            if arg.contains('\0') {
                errors.push(FieldError::invalid(
                    command.index(index),
                    arg.as_str(),
                    "must not contain NUL",
                ));
            }
        }
        let env = path.child("env");
        for (index, var) in self.env.iter().enumerate() {
            let name = env.index(index).child("name");
            if var.name.is_empty() {
                errors.push(FieldError::required(&name, ""));
            } else if var.name.contains(['=', '\0']) {
                errors.push(FieldError::invalid(
                    &name,
                    var.name.as_str(),
                    "must not contain '=' or NUL",
                ));
            } else if self.env[..index]
                .iter()
                .any(|earlier| earlier.name == var.name)
            {
                errors.push(FieldError::duplicate(&name, var.name.as_str()));
            }
            if var.value.contains('\0') {
                errors.push(FieldError::invalid(
                    env.index(index).child("value"),
                    var.value.as_str(),
                    "must not contain NUL",
                ));
            }
        }
        if let Some(seconds) = self.termination_grace_period_seconds
            && !(0..=MAX_PROCESS_GRACE_PERIOD_SECONDS).contains(&seconds)
        {
            errors.push(FieldError::invalid(
                path.child("terminationGracePeriodSeconds"),
                seconds,
                format!("must be between 0 and {MAX_PROCESS_GRACE_PERIOD_SECONDS}"),
            ));
        }
        errors
    }

    /// Checks an update from `old` to `new`: `new` as `validate` does, and that it is
    /// `old`: what runs, and where, is fixed once it started.
    pub fn validate_update(old: &Self, new: &Self) -> Vec<FieldError> {
        let mut errors = new.validate();
        if new != old {
            errors.push(FieldError::invalid(
                "spec",
                serde_json::to_value(new).unwrap_or_default(),
                messages::IMMUTABLE,
            ));
        }
        errors
    }

    /// Its grace period in seconds, the default when unset.
    pub fn grace_period_seconds(&self) -> i64 {
        self.termination_grace_period_seconds
            .unwrap_or(DEFAULT_PROCESS_GRACE_PERIOD_SECONDS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_needs_a_claim_and_a_program_and_well_formed_env() {
        let spec = MicroVMProcessSpec {
            claim_name: "Not_A_Name".into(),
            command: vec![String::new()],
            env: vec![
                ProcessEnvVar {
                    name: "A".into(),
                    value: "1".into(),
                },
                ProcessEnvVar {
                    name: "A".into(),
                    value: "2".into(),
                },
                ProcessEnvVar {
                    name: "B=C".into(),
                    value: String::new(),
                },
            ],
            termination_grace_period_seconds: Some(-1),
            ..MicroVMProcessSpec::default()
        };
        let fields: Vec<String> = spec.validate().iter().map(|e| e.field.clone()).collect();
        assert_eq!(
            fields,
            [
                "spec.claimName",
                "spec.command[0]",
                "spec.env[1].name",
                "spec.env[2].name",
                "spec.terminationGracePeriodSeconds",
            ]
        );
        let good = MicroVMProcessSpec {
            claim_name: "c1".into(),
            command: vec!["sleep".into(), "1".into()],
            ..MicroVMProcessSpec::default()
        };
        assert!(good.validate().is_empty());
        assert_eq!(
            good.grace_period_seconds(),
            DEFAULT_PROCESS_GRACE_PERIOD_SECONDS
        );
    }
}
