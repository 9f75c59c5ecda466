//! Condition types and reasons of the three kinds, and apimachinery's condition helpers.
//!
//! The reasons are enums so that the apiserver cannot misspell one it writes; clients read
//! `Condition.reason` as the string it is and compare it with `as_str()`.

use std::fmt;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// Condition type of a Pool at size, and of a Host its exec agent reports usable.
pub const READY: &str = "Ready";
/// Condition type of a Pool with no MicroVM available to claim.
pub const EXHAUSTED: &str = "Exhausted";
/// Condition type of a claim that holds its MicroVM.
pub const BOUND: &str = "Bound";
/// Condition type of a claim whose MicroVM's Host reports itself ready.
pub const HOST_READY: &str = "HostReady";
/// Condition type of a Host being deleted that waits for its MicroVMs to go.
pub const DRAINING: &str = "Draining";

/// How often an exec agent reports its Host's readiness by default, as a heartbeat.
pub const HOST_REPORT_INTERVAL: Duration = Duration::from_secs(10);
/// A Host whose agent has not reported for this long (four default report intervals)
/// counts as not ready (`AgentNotReporting`): an agent that died cannot say so itself.
pub const HOST_REPORT_STALE_AFTER: Duration =
    Duration::from_secs(4 * HOST_REPORT_INTERVAL.as_secs());

/// Declares a reason enum: unit variants with their CamelCase wire text, `as_str`, `ALL`
/// and `Display`.
macro_rules! reasons {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$variant_meta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$variant_meta])* $variant, )+
        }

        impl $name {
            /// Every reason, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The reason as a condition carries it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( Self::$variant => $text, )+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

reasons! {
    /// Reasons of a Pool's `Ready` condition.
    pub enum PoolReadyReason {
        /// True: available, leased and provisioning MicroVMs add up to at least `size`.
        AtSize = "AtSize",
        /// False: they add up to less than `size`; battery is provisioning the rest.
        BelowSize = "BelowSize",
        /// False: `placement.nodeSelector` matches no Host, so nothing can be provisioned.
        NoEligibleHost = "NoEligibleHost",
        /// False: battery refused the Pool's spec; the message is battery's. Takes
        /// precedence over `NoEligibleHost`.
        Rejected = "Rejected",
        /// False: the Pool is being deleted and waits for its leased MicroVMs to be
        /// released or to expire; the message gives the count.
        DeletionBlocked = "DeletionBlocked",
        /// False: the Pool is being deleted and no MicroVM of it is leased: battery is
        /// still cancelling its MicroVMs that were booting, or deleting its MicroVMs.
        Deleting = "Deleting",
    }
}

reasons! {
    /// Reasons of a Pool's `Exhausted` condition.
    pub enum PoolExhaustedReason {
        /// True: no MicroVM is available, and `size` is above 0.
        NoneAvailable = "NoneAvailable",
        /// False: at least one MicroVM is available.
        Available = "Available",
        /// False: `size` is 0, so the Pool is empty by design.
        SizeZero = "SizeZero",
    }
}

reasons! {
    /// Reasons of a claim's `Bound` condition.
    pub enum ClaimBoundReason {
        /// True: the claim holds its MicroVM.
        Bound = "Bound",
        /// False: the lease ran out unrenewed and battery took the MicroVM back (phase
        /// `Expired`).
        LeaseExpired = "LeaseExpired",
        /// False: the claim went without activity for its idle timeout, and its MicroVM
        /// went back to battery (phase `Expired`).
        IdleTimeout = "IdleTimeout",
        /// False: the claim reached its maximum lifetime, however often it was renewed,
        /// and its MicroVM went back to battery (phase `Expired`).
        MaxLifetimeReached = "MaxLifetimeReached",
    }
}

reasons! {
    /// Reasons of a Host's `Ready` condition, as its exec agent reports them. A claim's
    /// `HostReady` condition carries its Host's reason.
    pub enum HostReadyReason {
        /// True: KVM, the thin pool, flintlockd and its exec API are all usable.
        Ready = "Ready",
        /// `/dev/kvm` is missing or unusable.
        KvmUnavailable = "KVMUnavailable",
        /// containerd's devmapper thin pool is missing.
        ThinPoolMissing = "ThinPoolMissing",
        /// flintlockd is not answering.
        FlintlockdNotReady = "FlintlockdNotReady",
        /// flintlockd answers but its exec API is disabled, so exec cannot reach MicroVMs.
        ExecDisabled = "ExecDisabled",
        /// The API server's, not the agent's: the agent's last report is older than
        /// [`HOST_REPORT_STALE_AFTER`], so the Host counts
        /// as not ready whatever it last said.
        AgentNotReporting = "AgentNotReporting",
    }
}

reasons! {
    /// Reasons of a deleted Host's `Draining` condition (always `True`: a Host that is not
    /// being deleted has none).
    pub enum HostDrainingReason {
        /// MicroVMs remain on the Host; the message gives how many and which claims hold
        /// them. Idle ones are claimed and released so that battery deletes them.
        MicroVmsRemain = "MicroVMsRemain",
        /// No MicroVM remains but battery refused to remove the Host; the message is
        /// battery's.
        RemovalRefused = "RemovalRefused",
    }
}

reasons! {
    /// Reasons of a claim's `HostReady` condition when there is no Host report to copy.
    pub enum ClaimHostReadyReason {
        /// False: the MicroVM's Host is not (or no longer) a registered Host.
        HostNotFound = "HostNotFound",
        /// False: the Host's exec agent has not reported its readiness yet.
        NoHostReport = "NoHostReport",
        /// False: the Host reports itself not ready without a usable reason.
        HostNotReady = "HostNotReady",
    }
}

/// `metav1.ConditionStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// Whether it holds cannot be told.
    Unknown,
}

impl ConditionStatus {
    /// The status as a condition carries it: `True`, `False` or `Unknown`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(holds: bool) -> Self {
        if holds { Self::True } else { Self::False }
    }
}

impl fmt::Display for ConditionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// apimachinery's `meta.FindStatusCondition`: the condition of type `type_`, if any.
pub fn find_status_condition<'a>(
    conditions: &'a [Condition],
    type_: &str,
) -> Option<&'a Condition> {
    conditions.iter().find(|condition| condition.type_ == type_)
}

/// apimachinery's `meta.IsStatusConditionTrue`: whether the condition of type `type_`
/// exists and is `True`.
pub fn is_status_condition_true(conditions: &[Condition], type_: &str) -> bool {
    find_status_condition(conditions, type_)
        .is_some_and(|condition| condition.status == ConditionStatus::True.as_str())
}

/// apimachinery's `meta.SetStatusCondition`: adds `new`, or updates the condition of its
/// type. `lastTransitionTime` changes only when the status does, so it keeps saying when
/// the condition last flipped however often it is rewritten. Returns whether anything
/// changed.
pub fn set_status_condition(conditions: &mut Vec<Condition>, new: Condition) -> bool {
    let Some(existing) = conditions
        .iter_mut()
        .find(|condition| condition.type_ == new.type_)
    else {
        conditions.push(new);
        return true;
    };
    let mut changed = false;
    if existing.status != new.status {
        existing.status = new.status;
        existing.last_transition_time = new.last_transition_time;
        changed = true;
    }
    if existing.reason != new.reason {
        existing.reason = new.reason;
        changed = true;
    }
    if existing.message != new.message {
        existing.message = new.message;
        changed = true;
    }
    if existing.observed_generation != new.observed_generation {
        existing.observed_generation = new.observed_generation;
        changed = true;
    }
    changed
}

#[cfg(test)]
mod tests;
