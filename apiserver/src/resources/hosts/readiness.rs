//! The agent's readiness report as the API server holds it: when the last report came
//! (a report older than [`HOST_REPORT_STALE_AFTER`] counts as `Ready=False
//! AgentNotReporting`, derived on read and never stored), and the cordon the API server
//! puts on a Host in battery while it is not ready, so that new placements skip it. The
//! effective cordon is the admin's `spec.unschedulable` or not ready; the admin's choice
//! is kept in the record while ours is on, and restored when the Host is ready again.

use battery_types::conditions::{self, ConditionStatus, HOST_REPORT_STALE_AFTER, HostReadyReason};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::record::{HostRecord, Reporting};
use crate::battery::objects::HostReadiness;

/// The Host's `Ready` as it counts now: the agent's report, or `False AgentNotReporting`
/// once the report is stale. `None` when the agent never reported.
pub(super) fn effective_ready(
    conditions: &[Condition],
    reporting: &Reporting,
    now: Timestamp,
) -> Option<Condition> {
    let ready = conditions::find_status_condition(conditions, conditions::READY)?;
    let stale = reporting.reported_at.as_ref().is_some_and(|at| {
        now.duration_since(at.0).unsigned_abs() > HOST_REPORT_STALE_AFTER && now > at.0
    });
    if !stale {
        return Some(ready.clone());
    }
    let at = reporting.reported_at.as_ref().map(|t| t.0).unwrap_or(now);
    Some(Condition {
        type_: conditions::READY.to_owned(),
        status: ConditionStatus::False.as_str().to_owned(),
        reason: HostReadyReason::AgentNotReporting.as_str().to_owned(),
        message: format!(
            "no report from the Host's exec agent since {at} (over {}s); it last said {}: {}",
            HOST_REPORT_STALE_AFTER.as_secs(),
            ready.reason,
            ready.message
        ),
        observed_generation: ready.observed_generation,
        last_transition_time: if ready.status == ConditionStatus::False.as_str() {
            ready.last_transition_time.clone()
        } else {
            Time(now)
        },
    })
}

/// The readiness of a Host's record for its claims.
pub(super) fn of_record(record: Option<&HostRecord>, now: Timestamp) -> HostReadiness {
    match record {
        None => HostReadiness::NotFound,
        Some(record) => match effective_ready(&record.conditions, &record.reporting, now) {
            None => HostReadiness::NoReport,
            Some(ready) => HostReadiness::Reported(ready),
        },
    }
}

/// Whether a Host's readiness should keep new placements off it: a report that is not
/// True (a stale one included). A Host with no report is placed on, as battery alone
/// would.
pub(super) fn not_ready(readiness: &HostReadiness) -> Option<String> {
    match readiness {
        HostReadiness::Reported(ready) if ready.status != ConditionStatus::True.as_str() => Some(
            format!("the Host is not ready: {}: {}", ready.reason, ready.message),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(status: &str, reason: &str) -> Condition {
        Condition {
            type_: conditions::READY.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: "m".to_owned(),
            observed_generation: None,
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }
    }

    fn reported(seconds_ago: i64, now: Timestamp) -> Reporting {
        Reporting {
            reported_at: Some(Time(
                now - k8s_openapi::jiff::SignedDuration::from_secs(seconds_ago),
            )),
            ..Reporting::default()
        }
    }

    #[test]
    fn a_report_older_than_four_intervals_counts_as_not_ready() {
        let now = Timestamp::now();
        let conditions = [ready("True", "Ready")];
        let fresh = effective_ready(&conditions, &reported(39, now), now).unwrap();
        assert_eq!(
            (fresh.status.as_str(), fresh.reason.as_str()),
            ("True", "Ready")
        );
        let stale = effective_ready(&conditions, &reported(41, now), now).unwrap();
        assert_eq!(
            (stale.status.as_str(), stale.reason.as_str()),
            ("False", "AgentNotReporting")
        );
        assert!(
            stale.message.contains("it last said Ready: m"),
            "{}",
            stale.message
        );
        assert_eq!(stale.last_transition_time, Time(now));
        assert!(not_ready(&HostReadiness::Reported(stale)).is_some());
        assert!(not_ready(&HostReadiness::Reported(fresh)).is_none());
    }

    #[test]
    fn no_report_is_no_report_and_is_not_cordoned() {
        let now = Timestamp::now();
        assert!(effective_ready(&[], &Reporting::default(), now).is_none());
        assert_eq!(of_record(None, now), HostReadiness::NotFound);
        assert!(not_ready(&HostReadiness::NoReport).is_none());
        assert!(not_ready(&HostReadiness::NotFound).is_none());
    }
}
