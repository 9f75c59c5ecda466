//! Bearer tokens through the cluster's `TokenReview`, answers cached briefly as Go does.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use battery_api_machinery::status::ApiError;
use http::HeaderMap;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use sha2::Digest as _;

use crate::api::UserInfo;

/// Go caches TokenReview answers, both kinds, for this long (`CacheTTL`).
const TOKEN_TTL: Duration = Duration::from_secs(10);

/// When the cluster answered, and the user it named (none for an invalid token).
type CachedReview = (Instant, Option<UserInfo>);

/// Bearer tokens through the cluster's `TokenReview`.
pub struct TokenReviewer {
    client: kube::Client,
    /// By a digest of the token: the cache never holds a token itself.
    cache: Mutex<HashMap<[u8; 32], CachedReview>>,
}

impl TokenReviewer {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            cache: Mutex::default(),
        }
    }

    /// The user the token belongs to; `None` when the cluster says it is not valid (a
    /// deleted ServiceAccount's, an expired one).
    pub(super) async fn review(&self, token: &str) -> Result<Option<UserInfo>, ApiError> {
        let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        if let Some((at, user)) = self
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&digest)
            && at.elapsed() < TOKEN_TTL
        {
            return Ok(user.clone());
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let answered = api
            .create(&kube::api::PostParams::default(), &review)
            .await
            .map_err(ApiError::internal)?;
        let status = answered.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => Some(UserInfo {
                name: user.username.unwrap_or_default(),
                uid: user.uid.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default().into_iter().collect(),
            }),
            _ => None,
        };
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.retain(|_, (at, _)| at.elapsed() < TOKEN_TTL);
        cache.insert(digest, (Instant::now(), user.clone()));
        Ok(user)
    }
}

/// The token of an `Authorization: Bearer <token>` header.
pub(super) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}
