//! Authentication, in the order of Kubernetes' delegating authenticator
//! (`apiserver:pkg/authentication/authenticatorfactory/delegating.go`):
//!
//! 1. **front-proxy**: the request's identity headers (`X-Remote-User`, `X-Remote-Group`,
//!    `X-Remote-Extra-*`, and uid headers when configured) count only when the TLS client
//!    certificate chains to the requestheader CA and its CN is an allowed name
//!    (`…/request/x509/x509.go` `Verifier`, `…/headerrequest/requestheader.go`);
//! 2. **client certificate** signed by the client CA: CN is the user, O the groups;
//! 3. **bearer token**, through the cluster's TokenReview, answers cached briefly;
//! 4. otherwise `system:anonymous`.
//!
//! The TLS layer accepts a certificate from either CA; which one a chain verifies against
//! is decided here. Identity headers are removed from every request, so nothing after
//! this layer can read a forged one.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use battery_api_machinery::status::ApiError;
use http::HeaderMap;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::api::UserInfo;
use crate::serve::PeerCertificates;

const AUTHENTICATED: &str = "system:authenticated";
const ANONYMOUS: &str = "system:anonymous";
const UNAUTHENTICATED: &str = "system:unauthenticated";

/// Verifies a client certificate chain against one CA bundle.
pub type Verifier = Arc<dyn ClientCertVerifier>;

/// Front-proxy (request-header) authentication, as the aggregator uses it.
pub struct FrontProxy {
    /// Verifies against the requestheader CA.
    pub verifier: Verifier,
    /// CNs the front-proxy certificate may have; empty allows any.
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub uid_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_prefixes: Vec<String>,
}

/// What the server trusts to say who a request comes from.
#[derive(Default)]
pub struct Authentication {
    pub front_proxy: Option<FrontProxy>,
    /// Verifies direct client certificates against the client CA.
    pub client_ca: Option<Verifier>,
    /// Reviews bearer tokens, when there is a cluster to ask.
    pub tokens: Option<TokenReviewer>,
}

/// Go caches TokenReview answers, both kinds, for this long (`CacheTTL`).
const TOKEN_TTL: std::time::Duration = std::time::Duration::from_secs(10);

/// When the cluster answered, and the user it named (none for an invalid token).
type CachedReview = (std::time::Instant, Option<UserInfo>);

/// Bearer tokens through the cluster's `TokenReview`.
pub struct TokenReviewer {
    client: kube::Client,
    /// By a digest of the token: the cache never holds a token itself.
    cache: std::sync::Mutex<std::collections::HashMap<[u8; 32], CachedReview>>,
}

impl TokenReviewer {
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            cache: std::sync::Mutex::default(),
        }
    }

    /// The user the token belongs to; `None` when the cluster says it is not valid (a
    /// deleted ServiceAccount's, an expired one).
    async fn review(&self, token: &str) -> Result<Option<UserInfo>, ApiError> {
        use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
        use sha2::Digest;
        let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        {
            let cache = self
                .cache
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some((at, user)) = cache.get(&digest)
                && at.elapsed() < TOKEN_TTL
            {
                return Ok(user.clone());
            }
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
        let mut cache = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        cache.retain(|_, (at, _)| at.elapsed() < TOKEN_TTL);
        cache.insert(digest, (std::time::Instant::now(), user.clone()));
        Ok(user)
    }
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

fn verifies(verifier: &Verifier, chain: &[CertificateDer<'static>]) -> bool {
    let Some((leaf, intermediates)) = chain.split_first() else {
        return false;
    };
    verifier
        .verify_client_cert(leaf, intermediates, UnixTime::now())
        .is_ok()
}

fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?;
    Some(cn.to_owned())
}

/// The user a verified client certificate names, or `None` if it names none.
pub fn user_from_certificate(der: &[u8]) -> Option<UserInfo> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())?
        .to_owned();
    if name.is_empty() {
        return None;
    }
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    Some(UserInfo {
        name,
        groups,
        ..UserInfo::default()
    })
}

fn values<'a>(headers: &'a HeaderMap, names: &'a [String]) -> impl Iterator<Item = String> + 'a {
    names.iter().flat_map(move |name| {
        headers
            .get_all(name.as_str())
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_owned)
    })
}

/// `url.PathUnescape` of an extra key; an undecodable key is kept as it came.
fn unescape(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = key.get(i + 1..i + 3)
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| key.to_owned())
}

impl FrontProxy {
    /// The user the identity headers name, if the first username header has a value.
    fn user(&self, headers: &HeaderMap) -> Option<UserInfo> {
        let name = values(headers, &self.username_headers).find(|v| !v.is_empty())?;
        let uid = values(headers, &self.uid_headers)
            .find(|v| !v.is_empty())
            .unwrap_or_default();
        // Every value of every group header: the aggregator sends one line per group.
        let groups = values(headers, &self.group_headers).collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (header, value) in headers {
            let lower = header.as_str();
            for prefix in &self.extra_prefixes {
                let prefix = prefix.to_ascii_lowercase();
                if let Some(key) = lower.strip_prefix(prefix.as_str())
                    && let Ok(value) = value.to_str()
                {
                    extra
                        .entry(unescape(key))
                        .or_default()
                        .push(value.to_owned());
                }
            }
        }
        Some(UserInfo {
            name,
            uid,
            groups,
            extra,
        })
    }

    /// Removes every identity header (`ClearAuthenticationHeaders`).
    fn clear(&self, headers: &mut HeaderMap) {
        for name in self
            .username_headers
            .iter()
            .chain(&self.uid_headers)
            .chain(&self.group_headers)
        {
            headers.remove(name.as_str());
        }
        let prefixes: Vec<String> = self
            .extra_prefixes
            .iter()
            .map(|p| p.to_ascii_lowercase())
            .collect();
        let extra: Vec<http::HeaderName> = headers
            .keys()
            .filter(|k| prefixes.iter().any(|p| k.as_str().starts_with(p.as_str())))
            .cloned()
            .collect();
        for name in extra {
            headers.remove(name);
        }
    }
}

impl Authentication {
    /// Who `headers` and `chain` say the request comes from; an error for a front-proxy
    /// certificate whose CN is not allowed (Go answers that with 401).
    pub async fn authenticate(
        &self,
        chain: Option<&[CertificateDer<'static>]>,
        headers: &HeaderMap,
    ) -> Result<UserInfo, ApiError> {
        let chain = chain.unwrap_or_default();
        if let Some(front) = &self.front_proxy
            && verifies(&front.verifier, chain)
        {
            let cn = chain
                .first()
                .and_then(|leaf| common_name(leaf))
                .unwrap_or_default();
            if !front.allowed_names.is_empty() && !front.allowed_names.contains(&cn) {
                return Err(ApiError::unauthorized(format!(
                    "x509: subject with cn={cn} is not in the allowed list"
                )));
            }
            if let Some(user) = front.user(headers) {
                return Ok(with_authenticated(user));
            }
        }
        if let Some(client_ca) = &self.client_ca
            && verifies(client_ca, chain)
            && let Some(user) = chain.first().and_then(|leaf| user_from_certificate(leaf))
        {
            return Ok(with_authenticated(user));
        }
        if let Some(tokens) = &self.tokens
            && let Some(token) = bearer(headers)
        {
            return match tokens.review(token).await? {
                Some(user) => Ok(with_authenticated(user)),
                // Go answers a token the cluster refuses with 401.
                None => Err(ApiError::unauthorized("invalid bearer token")),
            };
        }
        Ok(UserInfo {
            name: ANONYMOUS.to_owned(),
            groups: vec![UNAUTHENTICATED.to_owned()],
            ..UserInfo::default()
        })
    }

    fn clear(&self, headers: &mut HeaderMap) {
        if let Some(front) = &self.front_proxy {
            front.clear(headers);
        }
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
    fn extra_keys_are_lowercased_and_unescaped() {
        assert_eq!(
            unescape("authentication.kubernetes.io%2fcredential-id"),
            "authentication.kubernetes.io/credential-id"
        );
        assert_eq!(unescape("bad%zzkey"), "bad%zzkey");
        assert_eq!(unescape("trailing%2"), "trailing%2");
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
