//! `serviceAccountToken`: the claim's ServiceAccount inside its MicroVM, as a Pod has it (a
//! token from the cluster's TokenRequest API, the cluster's CA and the namespace, under
//! [`SERVICE_ACCOUNT_DIR`]). Set on a Pool for all its claims, or on a claim for itself;
//! the claim's fields win over its Pool's.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::validation::{FieldError, FieldPath};

/// Where a guest finds the token, `ca.crt` and `namespace`: where a Pod finds them.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// A token's lifetime when none is set: a projected token volume's default.
pub const DEFAULT_TOKEN_EXPIRATION_SECONDS: i64 = 3600;
/// The shortest lifetime a token may ask for, as Kubernetes checks a projected token's.
pub const MIN_TOKEN_EXPIRATION_SECONDS: i64 = 600;
/// The longest, as Kubernetes checks a projected token's (2^32 seconds).
pub const MAX_TOKEN_EXPIRATION_SECONDS: i64 = 1 << 32;

/// A token of the claim's ServiceAccount, in the guest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountToken {
    /// The audience the token is for. Unset, the cluster's own API audiences, so the
    /// guest's `kubectl` and client-go authenticate with it; set it for a cloud's OIDC
    /// federation (such as `sts.amazonaws.com`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// How long each token is valid, in seconds: at least 600, 3600 unless set. The
    /// token is replaced at 80% of its lifetime (or after 24 hours, whichever first), as
    /// the kubelet replaces a Pod's; kube-apiserver may shorten it
    /// (`--service-account-max-token-expiration`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 600, max = 4_294_967_296_i64))]
    pub expiration_seconds: Option<i64>,
}

/// What a claim's token is: its Pool's `serviceAccountToken` under its own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenSettings {
    /// `None`: the cluster's API audiences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// The lifetime asked for.
    pub expiration_seconds: i64,
}

impl ServiceAccountToken {
    /// Checks the fields with paths from `path`: an audience, when set, is not empty; the
    /// lifetime, when set, between 600 seconds and 2^32.
    pub fn validate(&self, path: &FieldPath) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if self.audience.as_deref().is_some_and(str::is_empty) {
            errors.push(FieldError::invalid(
                path.child("audience"),
                "",
                "must not be empty; leave it unset for the cluster's own audiences",
            ));
        }
        match self.expiration_seconds {
            Some(seconds) if seconds < MIN_TOKEN_EXPIRATION_SECONDS => {
                errors.push(FieldError::invalid(
                    path.child("expirationSeconds"),
                    seconds,
                    "may not specify a duration less than 10 minutes",
                ));
            }
            Some(seconds) if seconds > MAX_TOKEN_EXPIRATION_SECONDS => {
                errors.push(FieldError::invalid(
                    path.child("expirationSeconds"),
                    seconds,
                    "may not specify a duration larger than 2^32 seconds",
                ));
            }
            _ => {}
        }
        errors
    }

    /// The token a claim gets: `None` unless its Pool (`pool`) or the claim (`claim`)
    /// asks for one; each field the claim's, else the Pool's, else the default.
    pub fn resolve(pool: Option<&Self>, claim: Option<&Self>) -> Option<TokenSettings> {
        if pool.is_none() && claim.is_none() {
            return None;
        }
        let audience = claim
            .and_then(|t| t.audience.clone())
            .or_else(|| pool.and_then(|t| t.audience.clone()));
        let expiration_seconds = claim
            .and_then(|t| t.expiration_seconds)
            .or_else(|| pool.and_then(|t| t.expiration_seconds))
            .unwrap_or(DEFAULT_TOKEN_EXPIRATION_SECONDS);
        Some(TokenSettings {
            audience,
            expiration_seconds,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(audience: Option<&str>, seconds: Option<i64>) -> ServiceAccountToken {
        ServiceAccountToken {
            audience: audience.map(str::to_owned),
            expiration_seconds: seconds,
        }
    }

    #[test]
    fn the_claims_fields_win_over_its_pools_and_defaults_fill_the_rest() {
        assert_eq!(ServiceAccountToken::resolve(None, None), None);
        let pool = token(Some("vault"), Some(7200));
        assert_eq!(
            ServiceAccountToken::resolve(Some(&pool), None),
            Some(TokenSettings {
                audience: Some("vault".to_owned()),
                expiration_seconds: 7200
            })
        );
        let claim = token(None, Some(900));
        assert_eq!(
            ServiceAccountToken::resolve(Some(&pool), Some(&claim)),
            Some(TokenSettings {
                audience: Some("vault".to_owned()),
                expiration_seconds: 900
            })
        );
        assert_eq!(
            ServiceAccountToken::resolve(None, Some(&ServiceAccountToken::default())),
            Some(TokenSettings {
                audience: None,
                expiration_seconds: DEFAULT_TOKEN_EXPIRATION_SECONDS
            })
        );
    }

    #[test]
    fn a_lifetime_is_at_least_ten_minutes_and_an_audience_not_empty() {
        let path = FieldPath::new("spec").child("serviceAccountToken");
        let errors: Vec<String> = token(Some(""), Some(599))
            .validate(&path)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            errors,
            [
                "spec.serviceAccountToken.audience: Invalid value: \"\": must not be empty; \
                 leave it unset for the cluster's own audiences",
                "spec.serviceAccountToken.expirationSeconds: Invalid value: 599: may not \
                 specify a duration less than 10 minutes",
            ]
        );
        assert_eq!(
            token(None, Some(MAX_TOKEN_EXPIRATION_SECONDS + 1))
                .validate(&path)
                .len(),
            1
        );
        assert!(
            token(Some("sts.amazonaws.com"), Some(600))
                .validate(&path)
                .is_empty()
        );
        assert!(ServiceAccountToken::default().validate(&path).is_empty());
    }
}
