use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::*;

fn condition(status: ConditionStatus, reason: &str, at_secs: i64) -> Condition {
    Condition {
        type_: READY.to_owned(),
        status: status.to_string(),
        reason: reason.to_owned(),
        message: String::new(),
        observed_generation: Some(1),
        last_transition_time: Time(Timestamp::from_second(at_secs).unwrap()),
    }
}

#[test]
fn set_adds_then_keeps_the_transition_time_until_the_status_flips() {
    let mut conditions = Vec::new();
    assert!(set_status_condition(
        &mut conditions,
        condition(ConditionStatus::False, "BelowSize", 10)
    ));
    assert_eq!(conditions.len(), 1);

    // Same status, new reason: the transition time stays at the flip.
    assert!(set_status_condition(
        &mut conditions,
        condition(ConditionStatus::False, "NoEligibleHost", 20)
    ));
    assert_eq!(conditions[0].reason, "NoEligibleHost");
    assert_eq!(
        conditions[0].last_transition_time,
        condition(ConditionStatus::False, "", 10).last_transition_time
    );

    // Nothing new: nothing changes.
    assert!(!set_status_condition(
        &mut conditions,
        condition(ConditionStatus::False, "NoEligibleHost", 30)
    ));

    // The status flips: the transition time moves.
    assert!(set_status_condition(
        &mut conditions,
        condition(ConditionStatus::True, "AtSize", 40)
    ));
    assert_eq!(conditions.len(), 1);
    assert_eq!(conditions[0].status, "True");
    assert_eq!(
        conditions[0].last_transition_time,
        condition(ConditionStatus::True, "", 40).last_transition_time
    );
    assert!(is_status_condition_true(&conditions, READY));
    assert!(!is_status_condition_true(&conditions, EXHAUSTED));
    assert_eq!(find_status_condition(&conditions, EXHAUSTED), None);

    // Another generation observed is a change too.
    let mut newer = condition(ConditionStatus::True, "AtSize", 50);
    newer.observed_generation = Some(2);
    assert!(set_status_condition(&mut conditions, newer));
    assert_eq!(conditions[0].observed_generation, Some(2));
}

#[test]
fn reasons_are_valid_condition_reasons() {
    let reasons = PoolReadyReason::ALL
        .iter()
        .map(|reason| reason.as_str())
        .chain(
            PoolExhaustedReason::ALL
                .iter()
                .map(|reason| reason.as_str()),
        )
        .chain(ClaimBoundReason::ALL.iter().map(|reason| reason.as_str()))
        .chain(HostReadyReason::ALL.iter().map(|reason| reason.as_str()))
        .chain(HostDrainingReason::ALL.iter().map(|reason| reason.as_str()))
        .chain(
            ClaimHostReadyReason::ALL
                .iter()
                .map(|reason| reason.as_str()),
        );
    for reason in reasons {
        let mut condition = condition(ConditionStatus::True, reason, 0);
        condition.type_ = HOST_READY.to_owned();
        let errors = crate::validation::validate_conditions(
            &[condition],
            &crate::validation::FieldPath::new("status"),
        );
        assert_eq!(errors, vec![], "{reason}");
    }
    assert_eq!(HostReadyReason::KvmUnavailable.as_str(), "KVMUnavailable");
    assert_eq!(
        PoolReadyReason::DeletionBlocked.to_string(),
        "DeletionBlocked"
    );
    assert_eq!(ConditionStatus::from(false), ConditionStatus::False);
}
