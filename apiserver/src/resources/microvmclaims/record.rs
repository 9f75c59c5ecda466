//! What the metadata store keeps of a claim, its key, and battery's `request_id` for it.

use battery_types::{
    HasResourceInfo, MicroVMClaim, MicroVMClaimSpec, MicroVMClaimStatus, TokenSettings,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use serde::{Deserialize, Serialize};

use crate::battery::LeaseId;
use crate::meta_store::Key;

pub(super) const RESOURCE: &str = "microvmclaims";

/// What the metadata store keeps of a claim.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct ClaimRecord {
    pub(super) metadata: ObjectMeta,
    pub(super) spec: MicroVMClaimSpec,
    #[serde(default)]
    pub(super) status: MicroVMClaimStatus,
    /// battery's lease id, while the claim holds a lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) lease: Option<LeaseId>,
    /// The pool's lease lifetime when the claim was bound, for the `lease` subresource's
    /// `leaseDurationSeconds` even after the pool is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) lease_duration_seconds: Option<i32>,
    /// What its MicroVM uses, for quotas (recorded where quotas apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) usage: Option<Usage>,
    /// The ServiceAccount token its guest got at bind (ADR 43): kept so it is replaced
    /// after a restart, and its binding Secret deleted when the claim ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) token: Option<TokenSettings>,
}

/// What a claim's record keeps of its lease beside the status.
#[derive(Debug, Clone, Default)]
pub(super) struct LeaseRecord {
    pub(super) lease: Option<LeaseId>,
    pub(super) duration_seconds: Option<i32>,
    pub(super) usage: Option<Usage>,
    pub(super) token: Option<TokenSettings>,
}

impl ClaimRecord {
    /// Its namespace and Pool.
    pub(super) fn pool(&self) -> (&str, &str) {
        let namespace = self.metadata.namespace.as_deref().unwrap_or_default();
        (namespace, self.spec.pool_ref.name.as_str())
    }

    /// Its lease, as a read asks battery about it; `None` when it holds none.
    pub(super) fn leased(&self) -> Option<Leased<'_>> {
        self.lease.as_ref()?;
        let (namespace, pool) = self.pool();
        Some(Leased {
            uid: self.metadata.uid.as_deref().unwrap_or_default(),
            namespace,
            pool,
            expires: self.status.lease_expires_at.as_ref(),
        })
    }

    /// The record of `claim`, with `secrets` beside its status.
    pub(super) fn of(claim: &MicroVMClaim, secrets: LeaseRecord) -> Self {
        Self {
            metadata: claim.metadata.clone(),
            spec: claim.spec.clone(),
            status: claim.status.clone().unwrap_or_default(),
            lease: secrets.lease,
            lease_duration_seconds: secrets.duration_seconds,
            usage: secrets.usage,
            token: secrets.token,
        }
    }

    pub(super) fn lease_record(&self) -> LeaseRecord {
        LeaseRecord {
            lease: self.lease.clone(),
            duration_seconds: self.lease_duration_seconds,
            usage: self.usage,
            token: self.token.clone(),
        }
    }
}

pub(super) fn key(namespace: &str, name: &str) -> Key {
    Key::new(RESOURCE, Some(namespace), name)
}

/// Where the binds in flight are recorded (ADR 48): apart from the claims, so no read,
/// list or watch of claims sees them.
pub(super) const PENDING_RESOURCE: &str = "microvmclaimbinds";

/// A bind recorded while its `ClaimVM` is asked (ADR 48): the claim as it will be
/// recorded, less what battery answers. With battery's lease for its request id, a
/// restart records the claim Bound from it; without one, drops it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct PendingBind {
    /// The claim's record: its status holds only its limits, and no lease.
    pub(super) claim: ClaimRecord,
    /// The Pool's lease expiry threshold, for the lease's expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) threshold: Option<battery_types::Duration>,
    /// When `ClaimVM` was first asked.
    pub(super) asked: MicroTime,
}

pub(super) fn pending_key(namespace: &str, name: &str) -> Key {
    Key::new(PENDING_RESOURCE, Some(namespace), name)
}

pub(super) fn info() -> &'static battery_types::ResourceInfo {
    &MicroVMClaim::INFO
}

/// What every claim's `request_id` starts with: a lease with it that no claim's record
/// holds was left by a bind that never answered (see `recover`).
pub(super) const REQUEST_ID_PREFIX: &str = "microvmclaim/";

/// battery's `request_id` for a claim: stable across retries and restarts, unique per
/// claim, well under battery's 255 bytes.
pub(super) fn request_id(uid: &str) -> String {
    format!("{REQUEST_ID_PREFIX}{uid}")
}

/// A claim that holds a lease, as a read asks battery about it.
pub(super) struct Leased<'a> {
    pub(super) uid: &'a str,
    pub(super) namespace: &'a str,
    pub(super) pool: &'a str,
    /// The expiry its record holds.
    pub(super) expires: Option<&'a MicroTime>,
}

/// What one claim uses: itself, and its MicroVM's vCPUs and memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub vcpus: i64,
    pub memory_bytes: i64,
}

impl Usage {
    /// A MicroVM of `vcpu` vCPUs and `memory_in_mb` MiB.
    pub fn of_vm(vcpu: i32, memory_in_mb: i32) -> Self {
        Self {
            vcpus: vcpu.into(),
            memory_bytes: i64::from(memory_in_mb) << 20,
        }
    }
}

/// The claim a record holds, as the API shows it.
pub(super) fn object(record: ClaimRecord) -> MicroVMClaim {
    let mut claim = MicroVMClaim::new(
        record.metadata.name.as_deref().unwrap_or_default(),
        record.spec,
    );
    claim.metadata = record.metadata;
    claim.status = Some(record.status);
    claim
}
