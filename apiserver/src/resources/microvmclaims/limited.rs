//! The Bound claims under a limit on their life (an idle timeout, a maximum lifetime),
//! and when each reaches it: what the enforcer (`limits.rs`) and the Table's time-left
//! column read.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use battery_types::ClaimPhase;
use battery_types::conditions::ClaimBoundReason;
use k8s_openapi::jiff::Timestamp;

use super::activity::Use;
use super::record::ClaimRecord;

/// A Bound claim under a limit.
#[derive(Clone, Debug)]
pub(super) struct Limited {
    pub(super) namespace: String,
    pub(super) name: String,
    pub(super) idle_timeout: Option<Duration>,
    /// When its maximum lifetime runs out.
    pub(super) ends_at: Option<Timestamp>,
    pub(super) bound: Timestamp,
}

/// The Bound claims under a limit, by uid.
#[derive(Default)]
pub(super) struct LimitedClaims(Mutex<HashMap<String, Limited>>);

impl LimitedClaims {
    pub(super) fn claims(&self) -> std::sync::MutexGuard<'_, HashMap<String, Limited>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn forget(&self, uid: &str) {
        self.claims().remove(uid);
    }

    pub(super) fn get(&self, uid: &str) -> Option<Limited> {
        self.claims().get(uid).cloned()
    }
}

impl Limited {
    /// The limits of a claim that holds its lease, if any applies.
    pub(super) fn of(record: &ClaimRecord) -> Option<(String, Self)> {
        record.lease.as_ref()?;
        let status = &record.status;
        if status.phase != Some(ClaimPhase::Bound) {
            return None;
        }
        let idle_timeout = status.idle_timeout.and_then(|d| d.to_std());
        let lifetime = status.max_lifetime.and_then(|d| d.to_std());
        if idle_timeout.is_none() && lifetime.is_none() {
            return None;
        }
        let bound = status.bound_time.as_ref()?.0;
        let limited = Self {
            namespace: record.metadata.namespace.clone().unwrap_or_default(),
            name: record.metadata.name.clone().unwrap_or_default(),
            idle_timeout,
            ends_at: lifetime.and_then(|l| bound.checked_add(l).ok()),
            bound,
        };
        Some((record.metadata.uid.clone()?, limited))
    }

    /// The limit the claim has reached at `now`, if any: its lifetime first, which holds
    /// whatever its use.
    pub(super) fn reached(&self, used: Use, now: Timestamp) -> Option<ClaimBoundReason> {
        if self.ends_at.is_some_and(|end| now >= end) {
            return Some(ClaimBoundReason::MaxLifetimeReached);
        }
        let idle = self.idle_timeout?;
        let since = match used {
            Use::Busy => return None,
            Use::IdleSince(since) => since,
            Use::Unknown => self.bound,
        };
        since
            .checked_add(idle)
            .is_ok_and(|end| now >= end)
            .then_some(ClaimBoundReason::IdleTimeout)
    }

    /// How long until the claim reaches a limit, as of `now`; none while only an idle
    /// timeout applies and the claim is in use.
    pub(super) fn time_left(&self, used: Use, now: Timestamp) -> Option<Duration> {
        let idle_end = match used {
            Use::Busy => None,
            Use::IdleSince(since) => self.idle_timeout.and_then(|i| since.checked_add(i).ok()),
            Use::Unknown => self
                .idle_timeout
                .and_then(|i| self.bound.checked_add(i).ok()),
        };
        let end = [idle_end, self.ends_at].into_iter().flatten().min()?;
        Some(end.duration_since(now).try_into().unwrap_or(Duration::ZERO))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(idle: Option<u64>, lifetime: Option<u64>, bound: Timestamp) -> Limited {
        Limited {
            namespace: "default".to_owned(),
            name: "c".to_owned(),
            idle_timeout: idle.map(Duration::from_secs),
            ends_at: lifetime.map(|l| bound + Duration::from_secs(l)),
            bound,
        }
    }

    #[test]
    fn the_lifetime_ends_a_busy_claim_and_the_idle_timeout_only_an_unused_one() {
        let bound = Timestamp::now();
        let at = |secs: u64| bound + Duration::from_secs(secs);
        let claim = limited(Some(5), Some(60), bound);
        assert_eq!(claim.reached(Use::Unknown, at(4)), None);
        assert_eq!(
            claim.reached(Use::Unknown, at(5)),
            Some(ClaimBoundReason::IdleTimeout)
        );
        assert_eq!(claim.reached(Use::IdleSince(at(10)), at(14)), None);
        assert_eq!(claim.reached(Use::Busy, at(59)), None, "in use");
        assert_eq!(
            claim.reached(Use::Busy, at(60)),
            Some(ClaimBoundReason::MaxLifetimeReached)
        );
        assert_eq!(
            claim.time_left(Use::IdleSince(at(10)), at(12)),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            claim.time_left(Use::Busy, at(12)),
            Some(Duration::from_secs(48))
        );
        let idle_only = limited(Some(5), None, bound);
        assert_eq!(idle_only.time_left(Use::Busy, at(12)), None);
        assert_eq!(
            idle_only.time_left(Use::Unknown, at(12)),
            Some(Duration::ZERO)
        );
    }
}
