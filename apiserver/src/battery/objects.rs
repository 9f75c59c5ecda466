//! battery's answers as Kubernetes objects: the one place a Pool's status and conditions,
//! a claim's bound or expired status and a Host's status are made from what battery said,
//! beside the metadata the API server keeps (as `registry/<kind>/strategy.go` owns one
//! kind's conversion in k8s.io/apiserver). The storages keep records and compute no
//! status from battery's answers; the conditions they add are the Host storage's
//! `Draining`, which reports its own graceful deletion (`resources/hosts/leaving.rs`), and
//! its `Ready=False AgentNotReporting` over a stale agent report (`resources/hosts/
//! readiness.rs`). A claim's `HostReady` is made here from what the Host storage says of
//! its Host ([`HostReadiness`]).

use battery_types::conditions::{
    self, ClaimBoundReason, ClaimHostReadyReason, ConditionStatus, PoolExhaustedReason,
    PoolReadyReason,
};
use battery_types::{
    ClaimHost, ClaimLimits, ClaimPhase, ClaimedMicroVM, Host, MicroVMClaimStatus, Placement, Pool,
    PoolSpec, PoolStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, ObjectMeta, Time};

use super::{BatteryHost, BatteryPool, Lease, LeaseId};
use crate::clock::{in_seconds, server_now};

/// What the API server keeps of a Pool beside battery's view of it.
pub struct PoolMeta<'a> {
    pub metadata: ObjectMeta,
    pub placement: Option<Placement>,
    /// The limits on its claims' lives, which battery has no field for.
    pub claim_limits: Option<ClaimLimits>,
    /// Its claims' ServiceAccount token, which battery has no field for.
    pub service_account_token: Option<battery_types::ServiceAccountToken>,
    /// The conditions last recorded, so an unchanged one keeps its transition time.
    pub previous: &'a [Condition],
    /// battery's refusal of the Hosts the placement last resolved to, if it refused.
    pub rejected: Option<&'a str>,
}

/// The Pool: battery's spec and counts, our metadata and placement, and the conditions
/// both give.
pub fn pool(meta: PoolMeta<'_>, battery: BatteryPool) -> Pool {
    let mut spec = battery.spec;
    spec.placement = meta.placement;
    spec.claim_limits = meta.claim_limits;
    spec.service_account_token = meta.service_account_token;
    let mut status = battery.counts;
    status.conditions = pool_conditions(
        meta.previous,
        meta.rejected,
        &meta.metadata,
        &spec,
        &battery.hosts,
        &status,
    );
    let name = meta.metadata.name.clone().unwrap_or(battery.name);
    let mut object = Pool::new(&name, spec);
    object.metadata = meta.metadata;
    object.status = Some(status);
    object
}

fn condition(
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: String,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: status.as_str().to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time: server_now(),
    }
}

/// `Ready` and `Exhausted` from battery's counts (`reference/battery-operator.md` §1.1).
fn pool_conditions(
    previous: &[Condition],
    rejected: Option<&str>,
    metadata: &ObjectMeta,
    spec: &PoolSpec,
    hosts: &[String],
    counts: &PoolStatus,
) -> Vec<Condition> {
    let generation = metadata.generation;
    let size = spec.size.unwrap_or_default();
    let placed = counts.available + counts.leased + counts.provisioning;
    let (status, reason, message) = if metadata.deletion_timestamp.is_some() && counts.leased == 0 {
        (
            ConditionStatus::False,
            PoolReadyReason::Deleting,
            "battery is cancelling the Pool's MicroVMs that were booting and deleting its \
             MicroVMs"
                .to_owned(),
        )
    } else if metadata.deletion_timestamp.is_some() {
        (
            ConditionStatus::False,
            PoolReadyReason::DeletionBlocked,
            format!(
                "waiting for {} leased MicroVM(s) to be released or to expire",
                counts.leased
            ),
        )
    } else if let Some(message) = rejected {
        (
            ConditionStatus::False,
            PoolReadyReason::Rejected,
            format!("battery refused the Pool: {message}"),
        )
    } else if hosts.is_empty() {
        (
            ConditionStatus::False,
            PoolReadyReason::NoEligibleHost,
            "placement.nodeSelector matches no Host".to_owned(),
        )
    } else if placed >= size {
        (
            ConditionStatus::True,
            PoolReadyReason::AtSize,
            format!("{size} MicroVM(s) available, leased or provisioning"),
        )
    } else {
        (
            ConditionStatus::False,
            PoolReadyReason::BelowSize,
            format!("{placed} of {size} MicroVM(s) available, leased or provisioning"),
        )
    };
    let ready = condition(
        conditions::READY,
        status,
        reason.as_str(),
        message,
        generation,
    );
    let (status, reason, message) = if size == 0 {
        (
            ConditionStatus::False,
            PoolExhaustedReason::SizeZero,
            "the Pool has size 0".to_owned(),
        )
    } else if counts.available == 0 {
        (
            ConditionStatus::True,
            PoolExhaustedReason::NoneAvailable,
            "no MicroVM is available to claim".to_owned(),
        )
    } else {
        (
            ConditionStatus::False,
            PoolExhaustedReason::Available,
            format!("{} MicroVM(s) available", counts.available),
        )
    };
    let exhausted = condition(
        conditions::EXHAUSTED,
        status,
        reason.as_str(),
        message,
        generation,
    );
    let mut out = previous.to_vec();
    conditions::set_status_condition(&mut out, ready);
    conditions::set_status_condition(&mut out, exhausted);
    out
}

fn bound_condition(
    status: ConditionStatus,
    reason: ClaimBoundReason,
    message: &str,
    generation: Option<i64>,
    since: Time,
) -> Condition {
    Condition {
        type_: conditions::BOUND.to_owned(),
        status: status.as_str().to_owned(),
        reason: reason.as_str().to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time: since,
    }
}

/// What the API server knows of a Host's readiness, for its claims' `HostReady`.
#[derive(Debug, Clone, PartialEq)]
pub enum HostReadiness {
    /// No such Host is registered.
    NotFound,
    /// The Host's agent has not reported yet.
    NoReport,
    /// The Host's `Ready` condition, stale reports already counted as not ready.
    Reported(Condition),
}

/// The longest condition message Kubernetes accepts.
const MAX_CONDITION_MESSAGE: usize = 32768;

/// A Bound claim's `HostReady`: its Host's `Ready` (status, reason and message) or, with
/// no report to copy, False with why.
pub fn claim_host_ready(readiness: &HostReadiness, generation: Option<i64>) -> Condition {
    let (status, reason, message) = match readiness {
        HostReadiness::NotFound => (
            ConditionStatus::False.as_str().to_owned(),
            ClaimHostReadyReason::HostNotFound.as_str().to_owned(),
            "the MicroVM's Host is not a registered Host".to_owned(),
        ),
        HostReadiness::NoReport => (
            ConditionStatus::False.as_str().to_owned(),
            ClaimHostReadyReason::NoHostReport.as_str().to_owned(),
            "the Host's exec agent has not reported its readiness".to_owned(),
        ),
        HostReadiness::Reported(ready) if ready.status == ConditionStatus::True.as_str() => (
            ready.status.clone(),
            ready.reason.clone(),
            ready.message.clone(),
        ),
        HostReadiness::Reported(ready) => {
            // Anything but True is not ready; a report without a reason gets ours.
            let reason = if ready.reason.is_empty() {
                ClaimHostReadyReason::HostNotReady.as_str().to_owned()
            } else {
                ready.reason.clone()
            };
            (
                ConditionStatus::False.as_str().to_owned(),
                reason,
                ready.message.clone(),
            )
        }
    };
    let mut message = message;
    if message.len() > MAX_CONDITION_MESSAGE {
        let mut end = MAX_CONDITION_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    Condition {
        type_: conditions::HOST_READY.to_owned(),
        status,
        reason,
        message,
        observed_generation: generation,
        last_transition_time: server_now(),
    }
}

/// A claim's status once battery leased it a MicroVM, and the lease id the claim keeps
/// (never shown). `agent_address` and `readiness` are the Host's agent's, which battery
/// does not know.
pub fn bound_status(
    lease: Lease,
    agent_address: Option<String>,
    readiness: &HostReadiness,
    generation: Option<i64>,
) -> (MicroVMClaimStatus, LeaseId) {
    let bound = lease.claimed_at.unwrap_or_else(server_now);
    let status = MicroVMClaimStatus {
        phase: Some(ClaimPhase::Bound),
        micro_vm: Some(ClaimedMicroVM { uid: lease.vm_uid }),
        host: Some(ClaimHost {
            node_name: lease.host_name,
            agent_address,
        }),
        renew_time: Some(MicroTime(bound.0)),
        bound_time: Some(bound),
        lease_expires_at: lease.expires_at,
        network_interfaces: lease.network_interfaces,
        // The limits are the bind's to fill in: they come from the claim and its Pool.
        idle_timeout: None,
        max_lifetime: None,
        conditions: vec![
            bound_condition(
                ConditionStatus::True,
                ClaimBoundReason::Bound,
                "battery leased a MicroVM to the claim",
                generation,
                server_now(),
            ),
            claim_host_ready(readiness, generation),
        ],
    };
    (status, lease.id)
}

/// Brings a Bound claim's `HostReady` in line with `readiness`; answers whether it
/// changed. `lastTransitionTime` moves only when the status does.
pub fn refresh_host_ready(
    status: &mut MicroVMClaimStatus,
    readiness: &HostReadiness,
    generation: Option<i64>,
) -> bool {
    conditions::set_status_condition(
        &mut status.conditions,
        claim_host_ready(readiness, generation),
    )
}

/// A claim's status once battery no longer has its lease: phase Expired, `Bound=False`,
/// and no `HostReady` (set only while Bound). The change is dated when the lease ran out
/// if that has passed, so every read that finds the lease gone before the claim is
/// recorded Expired answers the same time as the record then does; a lease battery ended
/// early is dated by the read that finds it gone.
pub fn expire(status: &mut MicroVMClaimStatus, generation: Option<i64>) {
    let now = server_now();
    let since = status
        .lease_expires_at
        .as_ref()
        .map(|expiry| in_seconds(expiry.0))
        .filter(|ran_out| *ran_out < now)
        .unwrap_or(now);
    end_since(
        status,
        generation,
        ClaimBoundReason::LeaseExpired,
        "the lease expired unrenewed and battery deleted the MicroVM".to_owned(),
        since,
    );
}

/// A claim's status once it has ended for `reason` (its lease expired, or a limit on its
/// life ended it) and its MicroVM went back to battery: Expired, `Bound` false.
pub fn end(
    status: &mut MicroVMClaimStatus,
    generation: Option<i64>,
    reason: ClaimBoundReason,
    message: String,
) {
    end_since(status, generation, reason, message, server_now());
}

/// [`end`], the change dated `since`.
fn end_since(
    status: &mut MicroVMClaimStatus,
    generation: Option<i64>,
    reason: ClaimBoundReason,
    message: String,
    since: Time,
) {
    status.phase = Some(ClaimPhase::Expired);
    status
        .conditions
        .retain(|c| c.type_ != conditions::HOST_READY);
    conditions::set_status_condition(
        &mut status.conditions,
        bound_condition(ConditionStatus::False, reason, &message, generation, since),
    );
}

/// What the API server keeps of a Host beside battery's view of it.
pub struct HostMeta {
    pub metadata: ObjectMeta,
    pub agent_address: Option<String>,
    /// The agent's readiness report.
    pub conditions: Vec<Condition>,
}

/// The Host: battery's address, TLS, cordon, version and MicroVM count, our metadata,
/// the agent's address and its report.
pub fn host(meta: HostMeta, battery: BatteryHost) -> Host {
    let mut spec = battery.spec;
    spec.agent_address = meta.agent_address;
    let mut status = battery.status;
    status.conditions = meta.conditions;
    let mut object = Host::new(&battery.name, spec);
    object.metadata = meta.metadata;
    object.status = Some(status);
    object
}

#[cfg(test)]
mod tests {
    use battery_types::conditions::BOUND;
    use k8s_openapi::jiff::{SignedDuration, Timestamp};

    use super::*;

    fn bound_until(expiry: Timestamp) -> MicroVMClaimStatus {
        MicroVMClaimStatus {
            phase: Some(ClaimPhase::Bound),
            lease_expires_at: Some(MicroTime(expiry)),
            conditions: vec![bound_condition(
                ConditionStatus::True,
                ClaimBoundReason::Bound,
                "leased",
                Some(1),
                in_seconds(expiry - SignedDuration::from_secs(60)),
            )],
            ..Default::default()
        }
    }

    fn expired_since(mut status: MicroVMClaimStatus) -> Time {
        expire(&mut status, Some(1));
        assert_eq!(status.phase, Some(ClaimPhase::Expired));
        let bound = status.conditions.iter().find(|c| c.type_ == BOUND).unwrap();
        assert_eq!(bound.status, "False");
        bound.last_transition_time.clone()
    }

    #[test]
    fn a_lease_that_ran_out_is_expired_since_it_ran_out_on_every_read() {
        let ran_out: Timestamp = "2026-01-02T03:04:05.678Z".parse().unwrap();
        let since = expired_since(bound_until(ran_out));
        assert_eq!(since, Time("2026-01-02T03:04:05Z".parse().unwrap()));
        assert_eq!(expired_since(bound_until(ran_out)), since);
    }

    #[test]
    fn a_lease_battery_ended_early_is_expired_since_the_read() {
        let before = server_now();
        let since = expired_since(bound_until(
            Timestamp::now() + SignedDuration::from_hours(1),
        ));
        assert!(before <= since && since <= server_now(), "{since:?}");
    }
}
