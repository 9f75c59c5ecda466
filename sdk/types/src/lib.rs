//! The `battery.liquidmetal-x.dev/v1alpha1` kinds (Pool, MicroVMClaim, Host) and their
//! `ResourceInfo`, with no I/O.
//!
//! - **Kinds**: [`Pool`], [`MicroVMClaim`], [`MicroVMProcess`] (namespaced) and [`Host`]
//!   (cluster-scoped),
//!   derived with `kube::CustomResource`, so they work with `kube::Api` and their schema
//!   (`Pool::crd()`) carries a description for every field (`kubectl explain`).
//! - **Defaults** are applied while decoding, as Kubernetes applies them in its decoder:
//!   a missing `replenishment.type` decodes as `ImmediateOnLease`, a missing
//!   `lease.expiryThreshold` as `30s`, and so on; the `Default` impls hold the same values.
//!   Required fields whose zero value is invalid also decode when absent, so that
//!   validation, not the decoder, reports them (`422`, naming the field, as Kubernetes does).
//! - **Validation**: [`PoolSpec::validate`], [`MicroVMClaimSpec::validate`] and
//!   [`MicroVMClaimSpec::validate_update`] (immutable fields), [`HostSpec::validate`] and
//!   [`HostStatus::validate`] return [`validation::FieldError`]s worded as apimachinery's
//!   `field.Error`.
//! - **Resource table**: [`ResourceInfo`] for each kind ([`HasResourceInfo`]) and
//!   [`RESOURCES`], from which the apiserver derives routes, discovery, OpenAPI and authz.
//! - [`agent_identity`]: how an exec agent's user names its Host;
//!   [`HostCertificateRequest`] is what it posts to `hosts/<name>/certificate` for its
//!   serving certificate.
//! - [`channel`]: the exec and port-forward WebSocket channel protocol's framing, which the
//!   server, the SDK and the tests share.
//! - [`strconv::quote`] is Go's `strconv.Quote`, as Kubernetes' messages quote names and
//!   values.
//! - [`Duration`] is `metav1.Duration` (Go's `"1m30s"` format); [`conditions`] holds
//!   condition types, reasons and apimachinery's condition helpers.
//!
//! battery's lease id is a bearer secret for battery and appears in no type here.
//!
//! ```
//! use battery_types::{PoolSpec, ReplenishmentType};
//!
//! let spec: PoolSpec = serde_json::from_str(r#"{"size": -1}"#).unwrap();
//! assert_eq!(spec.replenishment.type_, ReplenishmentType::ImmediateOnLease);
//! let errors: Vec<String> = spec.validate().iter().map(ToString::to_string).collect();
//! assert_eq!(
//!     errors,
//!     [
//!         "spec.template: Required value",
//!         "spec.size: Invalid value: -1: must be greater than or equal to 0",
//!     ]
//! );
//! ```

#![deny(missing_docs)]

pub mod agent_identity;
mod api_group;
pub mod channel;
mod claim_limits;
pub mod conditions;
mod duration;
mod host_certificates;
mod hosts;
mod microvmclaims;
mod microvmprocesses;
mod pools;
mod resource_info;
mod service_account_token;
pub mod strconv;
mod string_enum;
mod template;
pub mod validation;
mod wire;

pub use api_group::{API_VERSION, GROUP, VERSION};
pub use claim_limits::{ClaimLimits, DurationLimit};
pub use duration::{Duration, DurationOutOfRange, ParseDurationError};
pub use host_certificates::{
    HostCertificateRequest, HostCertificateRequestSpec, HostCertificateRequestStatus,
};
pub use hosts::{Host, HostSpec, HostStatus, HostTls};
pub use microvmclaims::{
    ClaimEnvVar, ClaimFile, ClaimHost, ClaimPhase, ClaimedMicroVM, DEFAULT_CONFIG_MAP_FILE_MODE,
    DEFAULT_SECRET_FILE_MODE, EnvVarSource, KeySelector, MAX_ENV, MAX_FILES, MicroVMClaim,
    MicroVMClaimSpec, MicroVMClaimStatus, NetworkInterfaceStatus, PoolRef, SourceKind,
    service_account_username,
};
pub use microvmprocesses::{
    DEFAULT_PROCESS_GRACE_PERIOD_SECONDS, MAX_PROCESS_GRACE_PERIOD_SECONDS, MicroVMProcess,
    MicroVMProcessSpec, MicroVMProcessStatus, ProcessEnvVar, ProcessPhase,
};
pub use pools::{
    HookFailurePolicy, Hooks, LeaseSettings, POOL_UID_LABEL, Placement, Pool, PoolSpec, PoolStatus,
    Replenishment, ReplenishmentType,
};
pub use resource_info::{
    HasResourceInfo, RESOURCES, ResourceInfo, Scope, SubresourceInfo, Verb, resource_for_plural,
};
pub use service_account_token::{
    DEFAULT_TOKEN_EXPIRATION_SECONDS, MAX_TOKEN_EXPIRATION_SECONDS, MIN_TOKEN_EXPIRATION_SECONDS,
    SERVICE_ACCOUNT_DIR, ServiceAccountToken, TokenSettings,
};
pub use template::{
    Initrd, InterfaceType, Kernel, MicroVMTemplate, NetworkInterface, NetworkOverrides,
    StaticAddress, Volume,
};

#[cfg(test)]
mod tests;
