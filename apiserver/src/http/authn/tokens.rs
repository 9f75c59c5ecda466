//! Bearer tokens through the cluster's `TokenReview`, answers cached briefly as Go does.

use std::time::Duration;

use http::HeaderMap;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use moka::sync::Cache;
use sha2::Digest as _;

use crate::auth::UserInfo;
use crate::http::ReviewError;

/// Go caches TokenReview answers, both kinds, for this long (`CacheTTL`).
const TOKEN_TTL: Duration = Duration::from_secs(10);
/// Answers kept at most, so that a flood of made-up tokens cannot grow memory without
/// bound; past it the least used go first.
const TOKEN_CACHE_ENTRIES: u64 = 4096;

/// Bearer tokens through the cluster's `TokenReview`.
pub struct TokenReviewer {
    client: kube::Client,
    /// The user the cluster named (none for an invalid token), by a digest of the token:
    /// the cache never holds a token itself.
    cache: Cache<[u8; 32], Option<UserInfo>>,
}

impl TokenReviewer {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            cache: crate::cache::bounded(TOKEN_TTL, TOKEN_CACHE_ENTRIES),
        }
    }

    /// The user the token belongs to; `None` when the cluster says it is not valid (a
    /// deleted ServiceAccount's, an expired one). A failed review is not cached.
    pub(super) async fn review(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
        let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        if let Some(user) = self.cache.get(&digest) {
            return Ok(user);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                ..TokenReviewSpec::default()
            },
            ..TokenReview::default()
        };
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let answered = super::super::review(api, &review, "TokenReview").await?;
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
        self.cache.insert(digest, user.clone());
        Ok(user)
    }
}

/// The WebSocket sub-protocol that carries a bearer token, base64url-encoded without
/// padding: a browser cannot set `Authorization` on a WebSocket
/// (`apiserver:pkg/authentication/request/websocket/protocol.go`).
const WEBSOCKET_TOKEN_PREFIX: &str = "base64url.bearer.authorization.k8s.io.";

/// The request's bearer token: from `Authorization: Bearer <token>`, or, on a WebSocket
/// upgrade, from the token sub-protocol. `Err` for a sub-protocol token that does not
/// decode or comes twice, which Go refuses too.
pub fn bearer(headers: &HeaderMap) -> Result<Option<String>, String> {
    let header = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, token)| scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty())
        .map(|(_, token)| token.trim().to_owned());
    if header.is_some() {
        return Ok(header);
    }
    if !is_websocket_upgrade(headers) {
        return Ok(None);
    }
    let mut tokens =
        websocket_protocols(headers).filter_map(|p| p.strip_prefix(WEBSOCKET_TOKEN_PREFIX));
    let Some(encoded) = tokens.next() else {
        return Ok(None);
    };
    if tokens.next().is_some() {
        return Err("more than one bearer token sub-protocol".to_owned());
    }
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(encoded)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .filter(|token| !token.is_empty())
        .map(Some)
        .ok_or_else(|| "a bearer token sub-protocol that is not base64url".to_owned())
}

/// Removes the token sub-protocol, so that no handler (and no upstream) sees the token.
pub fn clear_websocket_token(headers: &mut HeaderMap) {
    // By bytes: a value that is not UTF-8 is no protocol list, but must not carry a token on.
    let prefix = WEBSOCKET_TOKEN_PREFIX.as_bytes();
    let carries_token = headers
        .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .any(|v| v.as_bytes().windows(prefix.len()).any(|w| w == prefix));
    if !carries_token {
        return;
    }
    let kept: Vec<String> = websocket_protocols(headers)
        .filter(|p| !p.starts_with(WEBSOCKET_TOKEN_PREFIX))
        .map(str::to_owned)
        .collect();
    headers.remove(http::header::SEC_WEBSOCKET_PROTOCOL);
    if let Ok(value) = http::HeaderValue::from_str(&kept.join(", "))
        && !kept.is_empty()
    {
        headers.insert(http::header::SEC_WEBSOCKET_PROTOCOL, value);
    }
}

fn websocket_protocols(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
}

fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    let has = |name, wanted: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|v| v.trim().eq_ignore_ascii_case(wanted))
    };
    has(http::header::CONNECTION, "upgrade") && has(http::header::UPGRADE, "websocket")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (http::HeaderName::from_static(k), v.parse().unwrap()))
            .collect()
    }

    const UPGRADE: [(&str, &str); 2] = [("connection", "Upgrade"), ("upgrade", "websocket")];

    #[test]
    fn a_websocket_carries_its_token_in_a_sub_protocol_that_is_then_removed() {
        // base64url("t0k") without padding.
        let protocols = "v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.dDBr";
        let mut h = headers(&[
            UPGRADE[0],
            UPGRADE[1],
            ("sec-websocket-protocol", protocols),
        ]);
        assert_eq!(bearer(&h), Ok(Some("t0k".to_owned())));
        clear_websocket_token(&mut h);
        assert_eq!(h["sec-websocket-protocol"], "v5.channel.k8s.io");
    }

    #[test]
    fn the_sub_protocol_counts_only_on_an_upgrade_and_only_once() {
        let token = (
            "sec-websocket-protocol",
            "base64url.bearer.authorization.k8s.io.dDBr",
        );
        assert_eq!(bearer(&headers(&[token])), Ok(None));
        let twice = headers(&[UPGRADE[0], UPGRADE[1], token, token]);
        assert!(bearer(&twice).is_err());
        let garbage = (
            "sec-websocket-protocol",
            "base64url.bearer.authorization.k8s.io.@@",
        );
        assert!(bearer(&headers(&[UPGRADE[0], UPGRADE[1], garbage])).is_err());
    }

    #[test]
    fn the_authorization_header_comes_first() {
        let h = headers(&[("authorization", "Bearer  abc ")]);
        assert_eq!(bearer(&h), Ok(Some("abc".to_owned())));
        assert_eq!(
            bearer(&headers(&[("authorization", "Basic abc")])),
            Ok(None)
        );
    }
}
