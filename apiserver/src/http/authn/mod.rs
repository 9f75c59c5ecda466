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
//! key; the chain is verified here, per request, against the CAs trusted *now*
//! ([`trust`]), so a rotated CA takes effect without a restart (ADR 0008). Identity
//! headers are removed from every request, so nothing after this layer can read a
//! forged one.

mod front_proxy;
mod tokens;
mod trust;
mod x509;

pub use front_proxy::{FrontProxy, RequestHeaderNames};
pub use tokens::TokenReviewer;
pub use trust::{
    CONFIG_MAP_NAME, CONFIG_MAP_NAMESPACE, RequestHeaderConfig, RequestHeaderFlags, Trust,
    TrustConfig, TrustError, TrustKeeper, TrustSources,
};
pub use x509::{CaBundleError, Verifier, user_from_certificate, verifier};

use std::sync::{Arc, PoisonError, RwLock};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use battery_api_machinery::status::ApiError;
use http::HeaderMap;
use rustls::pki_types::CertificateDer;

use crate::api::UserInfo;
use crate::serve::PeerCertificates;

const AUTHENTICATED: &str = "system:authenticated";
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

impl Authentication {
    pub fn new(trust: Trust, tokens: Option<TokenReviewer>) -> Self {
        Self {
            trust: RwLock::new(Arc::new(trust)),
            tokens,
        }
    }

    /// From now on, verify against `trust`.
    pub fn set_trust(&self, trust: Trust) {
        *self.trust.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(trust);
    }

    fn trust(&self) -> Arc<Trust> {
        self.trust
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Who `headers` and `chain` say the request comes from. A 401 says only
    /// "Unauthorized", as Go's does: why is logged, not told to the caller.
    pub async fn authenticate(
        &self,
        chain: Option<&[CertificateDer<'static>]>,
        headers: &HeaderMap,
    ) -> Result<UserInfo, ApiError> {
        let chain = chain.unwrap_or_default();
        let trust = self.trust();
        let mut failures = Vec::new();
        if !chain.is_empty() {
            if let Some(front) = &trust.front_proxy {
                match front.authenticate(chain, headers) {
                    Ok(Some(user)) => return Ok(with_authenticated(user)),
                    Ok(None) => {}
                    Err(why) => failures.push(why),
                }
            }
            if let Some(client_ca) = &trust.client_ca {
                match x509::verify(client_ca, chain) {
                    Ok(()) => {
                        if let Some(user) = user_from_certificate(&chain[0]) {
                            return Ok(with_authenticated(user));
                        }
                    }
                    Err(why) => failures.push(format!("client certificate: {why}")),
                }
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

    /// Removes what vouched for the request (identity headers, the bearer token), as Go
    /// does, so that nothing behind this layer can read or pass on a credential.
    fn clear(&self, headers: &mut HeaderMap) {
        if let Some(front) = &self.trust().front_proxy {
            front.clear(headers);
        }
        headers.remove(http::header::AUTHORIZATION);
        tokens::clear_websocket_token(headers);
    }
}

/// Every authenticated user is in `system:authenticated` (`authenticated_group_adder.go`).
fn with_authenticated(mut user: UserInfo) -> UserInfo {
    if !user.groups.iter().any(|g| g == AUTHENTICATED) {
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
    let chain = request
        .extensions()
        .get::<PeerCertificates>()
        .map(|certs| certs.0.clone());
    let user = match request.extensions().get::<UserInfo>() {
        // Made inside this process (`dev` creating its Pool): no client can set an
        // extension, so it stands.
        Some(user) => Ok(user.clone()),
        None => {
            authentication
                .authenticate(chain.as_deref().map(Vec::as_slice), request.headers())
                .await
        }
    };
    authentication.clear(request.headers_mut());
    match user {
        Ok(user) => {
            request.extensions_mut().insert(user);
            next.run(request).await
        }
        Err(error) => error.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
