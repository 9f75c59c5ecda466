//! How long a claim may live: its idle timeout and its maximum lifetime, set on a Pool as
//! defaults (and maximums) for its claims and on a claim to override them. Pools and
//! claims both use these, so they sit below both.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::Duration;
use crate::validation::{FieldError, FieldPath, messages};

/// Limits on how long a Pool's claims live. Each applies to claims bound after it is set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct ClaimLimits {
    /// How long a claim may go without activity (an exec, a terminal, a port-forward, a
    /// file copy) before it ends: `default` for a claim that sets no `spec.idleTimeout`,
    /// `max` the longest a claim may set.
    #[serde(skip_serializing_if = "DurationLimit::is_unset")]
    pub idle_timeout: DurationLimit,
    /// How long after its bind a claim ends, however often it is renewed: `default` for a
    /// claim that sets no `spec.maxLifetime`, `max` the longest a claim may set.
    #[serde(skip_serializing_if = "DurationLimit::is_unset")]
    pub max_lifetime: DurationLimit,
}

/// A Pool's default and maximum for one of its claims' limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct DurationLimit {
    /// What a claim that sets none gets, as a duration such as `30m`. Unset, a claim that
    /// sets none gets `max`, or no limit if that is unset too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<Duration>,
    /// The longest a claim may set: a claim asking for more is refused. At least `default`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<Duration>,
}

impl DurationLimit {
    /// Whether neither a default nor a maximum is set.
    pub fn is_unset(&self) -> bool {
        self.default.is_none() && self.max.is_none()
    }

    /// The limit a claim asking for `asked` gets: its own, else the default, else the
    /// maximum (so a Pool with a maximum has no claim without a limit), else none. A claim
    /// asking for more than the maximum is refused with `field` (the claim's field) named;
    /// `pool_field` names the Pool's maximum in the message.
    pub fn resolve(
        &self,
        asked: Option<Duration>,
        field: &FieldPath,
        pool_field: &str,
    ) -> Result<Option<Duration>, FieldError> {
        match (asked, self.max) {
            (Some(asked), Some(max)) if asked > max => Err(FieldError::invalid(
                field,
                asked.to_string(),
                format!("must be no more than {max}, the maximum its Pool sets ({pool_field})"),
            )),
            (Some(asked), _) => Ok(Some(asked)),
            (None, max) => Ok(self.default.or(max)),
        }
    }

    fn validate(&self, path: &FieldPath) -> Vec<FieldError> {
        let mut errors = Vec::new();
        for (name, value) in [("default", self.default), ("max", self.max)] {
            errors.extend(validate_positive(value, &path.child(name)));
        }
        if let (Some(default), Some(max)) = (self.default, self.max)
            && errors.is_empty()
            && default > max
        {
            errors.push(FieldError::invalid(
                path.child("default"),
                default.to_string(),
                format!("must be no more than max ({max})"),
            ));
        }
        errors
    }
}

impl ClaimLimits {
    /// Checks the limits with paths from `path` (the Pool's `spec.claimLimits`): every
    /// duration positive, no default above its maximum.
    pub fn validate(&self, path: &FieldPath) -> Vec<FieldError> {
        let mut errors = self.idle_timeout.validate(&path.child("idleTimeout"));
        errors.extend(self.max_lifetime.validate(&path.child("maxLifetime")));
        errors
    }
}

/// A limit a claim sets must be longer than zero, when it is set.
pub(crate) fn validate_positive(value: Option<Duration>, path: &FieldPath) -> Option<FieldError> {
    value
        .filter(|value| !value.is_positive())
        .map(|value| FieldError::invalid(path, value.to_string(), messages::POSITIVE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(secs: u32) -> Option<Duration> {
        Some(Duration::from_secs(secs))
    }

    #[test]
    fn a_claim_gets_its_own_limit_else_the_default_else_the_maximum() {
        let path = FieldPath::new("spec").child("maxLifetime");
        let pool = "spec.claimLimits.maxLifetime.max";
        let both = DurationLimit {
            default: secs(60),
            max: secs(600),
        };
        assert_eq!(both.resolve(secs(30), &path, pool), Ok(secs(30)));
        assert_eq!(both.resolve(secs(600), &path, pool), Ok(secs(600)));
        assert_eq!(both.resolve(None, &path, pool), Ok(secs(60)));
        let max_only = DurationLimit {
            default: None,
            max: secs(600),
        };
        assert_eq!(max_only.resolve(None, &path, pool), Ok(secs(600)));
        let none = DurationLimit::default();
        assert_eq!(none.resolve(None, &path, pool), Ok(None));
        assert_eq!(none.resolve(secs(5), &path, pool), Ok(secs(5)));
        assert_eq!(
            both.resolve(secs(601), &path, pool)
                .unwrap_err()
                .to_string(),
            "spec.maxLifetime: Invalid value: \"10m1s\": must be no more than 10m0s, the \
             maximum its Pool sets (spec.claimLimits.maxLifetime.max)"
        );
    }

    #[test]
    fn limits_are_positive_and_no_default_exceeds_its_maximum() {
        let path = FieldPath::new("spec").child("claimLimits");
        let limits = ClaimLimits {
            idle_timeout: DurationLimit {
                default: secs(0),
                max: None,
            },
            max_lifetime: DurationLimit {
                default: secs(120),
                max: secs(60),
            },
        };
        let errors: Vec<String> = limits
            .validate(&path)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            errors,
            [
                "spec.claimLimits.idleTimeout.default: Invalid value: \"0s\": must be greater than zero",
                "spec.claimLimits.maxLifetime.default: Invalid value: \"2m0s\": must be no more \
                 than max (1m0s)",
            ]
        );
        assert!(ClaimLimits::default().validate(&path).is_empty());
    }
}
