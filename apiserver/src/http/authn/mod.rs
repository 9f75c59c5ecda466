//! Authentication, in the order of Kubernetes' delegating authenticator
//! (`apiserver:pkg/authentication/authenticatorfactory/delegating.go`):
//!
//! 1. **front-proxy** ([`front_proxy`]): the request's identity headers (`X-Remote-User`,
//!    `X-Remote-Group`, `X-Remote-Extra-*`, and uid headers when configured) count only
//!    when the TLS client certificate chains to the requestheader CA and its CN is an
//!    allowed name;
//! 2. **client certificate** signed by the client CA ([`x509`]): CN is the user, O the
//!    groups;
//! 3. **bearer token** (`Authorization`, or a WebSocket's token sub-protocol), through the
//!    cluster's TokenReview ([`tokens`]), cached briefly;
//! 4. otherwise `system:anonymous`.
//!
//! They combine as Go's union does: the first that names a user wins, and when none does
//! but one failed (a certificate of an unknown CA or expired, a front proxy of a CN not
//! allowed, a token the cluster refuses) the answer is 401, never anonymous.
//!
//! The TLS layer asks for a client certificate and checks only that the client holds its
//! key; the chain is verified here against the CAs trusted *now* ([`trust`]), so a
//! rotated CA takes effect without a restart (ADR 0008), once per connection and trust
//! until a certificate of it expires ([`peer`], ADR 0028). Identity headers are removed
//! from every request, so nothing after this layer can read a forged one.

mod front_proxy;
mod peer;
mod tokens;
mod trust;
mod x509;

pub use front_proxy::{FrontProxy, RequestHeaderNames};
pub use peer::PeerCertificates;
pub use tokens::{TokenReviewer, bearer, clear_websocket_token};
pub use trust::{
    CONFIG_MAP_NAME, CONFIG_MAP_NAMESPACE, RequestHeaderConfig, RequestHeaderFlags, Trust,
    TrustConfig, TrustError, TrustHolder, TrustKeeper, TrustSources,
};
pub use x509::{CaBundleError, Verifier, user_from_certificate, verifier};

use std::sync::{Arc, PoisonError, RwLock};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use battery_api_machinery::status::ApiError;
use http::HeaderMap;
use rustls::pki_types::UnixTime;

use crate::auth::UserInfo;

/// The group of every authenticated user.
pub const AUTHENTICATED: &str = "system:authenticated";
const ANONYMOUS: &str = "system:anonymous";
const UNAUTHENTICATED: &str = "system:unauthenticated";

/// What the server trusts to say who a request comes from.
#[derive(Default)]
pub struct Authentication {
    /// Swapped whole when a CA or the header names change.
    trust: RwLock<Arc<Trust>>,
    /// Reviews bearer tokens, when there is a cluster to ask.
    tokens: Option<TokenReviewer>,
}

impl TrustHolder for Authentication {
    fn set_trust(&self, trust: Trust) {
        *self.trust.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(trust);
    }
}

impl Authentication {
    pub fn new(trust: Trust, tokens: Option<TokenReviewer>) -> Self {
        Self {
            trust: RwLock::new(Arc::new(trust)),
            tokens,
        }
    }

    fn trust(&self) -> Arc<Trust> {
        self.trust
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Who `headers` and `peer`'s chain say the request comes from; then removes from
    /// `headers` what vouched for it, judged by the same trust. A 401 says only
    /// "Unauthorized", as Go's does: why is logged, not told to the caller.
    pub async fn authenticate(
        &self,
        peer: Option<&PeerCertificates>,
        headers: &mut HeaderMap,
    ) -> Result<UserInfo, ApiError> {
        let trust = self.trust();
        let user = self.identify(&trust, peer, headers).await;
        clear(&trust, headers);
        user
    }

    async fn identify(
        &self,
        trust: &Arc<Trust>,
        peer: Option<&PeerCertificates>,
        headers: &HeaderMap,
    ) -> Result<UserInfo, ApiError> {
        let mut failures = Vec::new();
        if let Some(verdict) = peer.map(|peer| peer.verdict(trust, UnixTime::now())) {
            if let (Some(front), Some(vouched)) = (&trust.front_proxy, &verdict.front_proxy) {
                match vouched {
                    Ok(()) => {
                        if let Some(user) = front.user(headers) {
                            return Ok(with_authenticated(user));
                        }
                    }
                    Err(why) => failures.push(why.clone()),
                }
            }
            match &verdict.client {
                Some(Ok(Some(user))) => return Ok(with_authenticated(user.clone())),
                Some(Err(why)) => failures.push(why.clone()),
                Some(Ok(None)) | None => {}
            }
        }
        if let Some(tokens) = &self.tokens {
            match tokens::bearer(headers) {
                // Go answers a review that failed, too, with 401.
                Ok(Some(token)) => match tokens.review(&token).await {
                    Ok(Some(user)) => return Ok(with_authenticated(user)),
                    Ok(None) => failures.push("the cluster refused the bearer token".to_owned()),
                    Err(error) => failures.push(error.to_string()),
                },
                Ok(None) => {}
                Err(why) => failures.push(why),
            }
        }
        if !failures.is_empty() {
            tracing::info!(why = %failures.join("; "), "unable to authenticate the request");
            return Err(ApiError::unauthorized("Unauthorized"));
        }
        Ok(UserInfo {
            name: ANONYMOUS.to_owned(),
            groups: vec![UNAUTHENTICATED.to_owned()],
            ..UserInfo::default()
        })
    }
}

/// Removes what vouched for the request (identity headers, the bearer token), as Go
/// does, so that nothing behind this layer can read or pass on a credential.
fn clear(trust: &Trust, headers: &mut HeaderMap) {
    front_proxy::clear(trust.front_proxy.as_ref().map(|f| &f.names), headers);
    headers.remove(http::header::AUTHORIZATION);
    tokens::clear_websocket_token(headers);
}

/// Whether an authenticated user of that name and groups joins `system:authenticated`
/// (`authenticated_group_adder.go`): all do but anonymous, and a user already in either
/// of the two groups, as a front proxy may forward an anonymous request: that one must
/// not gain what authenticated users have.
pub fn joins_authenticated_group(name: &str, groups: &[String]) -> bool {
    name != ANONYMOUS
        && !groups
            .iter()
            .any(|g| g == AUTHENTICATED || g == UNAUTHENTICATED)
}

fn with_authenticated(mut user: UserInfo) -> UserInfo {
    if joins_authenticated_group(&user.name, &user.groups) {
        user.groups.push(AUTHENTICATED.to_owned());
    }
    user
}

/// The layer: puts the request's [`UserInfo`] in its extensions and strips identity
/// headers.
pub async fn authenticate(
    State(authentication): State<Arc<Authentication>>,
    mut request: Request,
    next: Next,
) -> Response {
    let peer = request.extensions().get::<PeerCertificates>().cloned();
    let user = match request.extensions().get::<UserInfo>() {
        // Made inside this process (`dev` creating its Pool): no client can set an
        // extension, so it stands.
        Some(user) => {
            let user = user.clone();
            clear(&authentication.trust(), request.headers_mut());
            Ok(user)
        }
        None => {
            authentication
                .authenticate(peer.as_ref(), request.headers_mut())
                .await
        }
    };
    match user {
        Ok(user) => {
            crate::trace::Trace::of(request.extensions()).step("authenticated");
            request.extensions_mut().insert(user);
            next.run(request).await
        }
        Err(error) => error.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    /// A verifier of a CA made once for these tests.
    fn test_verifier() -> Verifier {
        static CA: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::default();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params.self_signed(&key).unwrap().pem()
        });
        x509::verifier(CA.as_bytes(), "a test CA").unwrap()
    }

    /// Header names a request controls that authentication reads or must remove, and a
    /// few it must leave alone.
    fn header_name() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("x-remote-user".to_owned()),
            Just("x-remote-group".to_owned()),
            Just("x-remote-uid".to_owned()),
            "x-remote-extra-[a-z0-9%.-]{0,12}",
            Just("x-proxy-user".to_owned()),
            "x-proxy-extra-[a-z0-9%.-]{0,12}",
            Just("authorization".to_owned()),
            Just("sec-websocket-protocol".to_owned()),
            Just("connection".to_owned()),
            Just("upgrade".to_owned()),
            Just("accept".to_owned()),
        ]
    }

    fn header_value() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..40),
            "(Bearer |bearer |Basic )?[ -~]{0,30}".prop_map(String::into_bytes),
            (
                "(v5.channel.k8s.io, )?base64url.bearer.authorization.k8s.io.[A-Za-z0-9_=-]{0,20}",
                proptest::collection::vec(any::<u8>(), 0..3),
            )
                .prop_map(|(protocols, tail)| [protocols.into_bytes(), tail].concat()),
            Just(b"Upgrade".to_vec()),
            Just(b"websocket".to_vec()),
        ]
    }

    proptest! {
        /// Whatever identity and credential headers a request carries, reading them never
        /// panics, and none is left for what comes after authentication.
        #[test]
        fn credential_headers_never_panic_and_never_get_through(
            pairs in proptest::collection::vec((header_name(), header_value()), 0..12),
        ) {
            let mut headers = HeaderMap::new();
            for (name, value) in &pairs {
                if let (Ok(name), Ok(value)) = (
                    http::HeaderName::from_bytes(name.as_bytes()),
                    http::HeaderValue::from_bytes(value),
                ) {
                    headers.append(name, value);
                }
            }
            let names = RequestHeaderNames {
                allowed_names: Vec::new(),
                username_headers: vec!["X-Proxy-User".to_owned(), "X-Remote-User".to_owned()],
                uid_headers: vec!["X-Remote-Uid".to_owned()],
                group_headers: vec!["X-Remote-Group".to_owned()],
                extra_prefixes: vec!["X-Proxy-Extra-".to_owned()],
            };
            let front = FrontProxy { verifier: test_verifier(), names };
            let _ = front.user(&headers);
            let _ = tokens::bearer(&headers);
            let trust = Trust { client_ca: None, front_proxy: Some(front) };
            clear(&trust, &mut headers);
            for (name, value) in &headers {
                let name = name.as_str();
                prop_assert!(!name.starts_with("x-remote-") && !name.starts_with("x-proxy-"), "{name} got through");
                prop_assert!(name != "authorization");
                let value = String::from_utf8_lossy(value.as_bytes());
                prop_assert!(!value.contains("base64url.bearer.authorization.k8s.io."), "{value}");
            }
        }
    }

    #[test]
    fn anonymous_forwarded_by_a_front_proxy_does_not_become_authenticated() {
        let anonymous = UserInfo {
            name: ANONYMOUS.to_owned(),
            groups: vec![UNAUTHENTICATED.to_owned()],
            ..UserInfo::default()
        };
        assert_eq!(
            with_authenticated(anonymous.clone()).groups,
            [UNAUTHENTICATED]
        );
        let unauthenticated_group = UserInfo {
            name: "someone".to_owned(),
            ..anonymous
        };
        assert_eq!(
            with_authenticated(unauthenticated_group).groups,
            [UNAUTHENTICATED]
        );
    }

    #[test]
    fn the_dev_certificate_names_the_dev_service_account_and_its_groups() {
        let dir = tempfile::tempdir().unwrap();
        let pki = crate::dev::pki::write_dev_pki(dir.path()).unwrap();
        let pem = std::fs::read(&pki.client_cert).unwrap();
        let der = x509_parser::pem::parse_x509_pem(&pem).unwrap().1.contents;
        let user = with_authenticated(user_from_certificate(&der).unwrap());
        assert_eq!(user.name, crate::dev::pki::DEV_USER);
        assert_eq!(
            user.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:default",
                "system:authenticated"
            ]
        );
    }
}
