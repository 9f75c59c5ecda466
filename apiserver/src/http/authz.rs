//! Authorization, after authentication (`apiserver:pkg/endpoints/filters/authorization.go`):
//! health, version, discovery and OpenAPI are always allowed (the aggregator's
//! availability checks and every client's discovery need them); every other request —
//! each resource verb and `/metrics` — is put to the authorizer, which is the cluster's
//! SubjectAccessReview (`reference/aggregated-apiserver.md` §2.4) with short caches, or
//! `dev`'s local policy. A refusal is a 403 Status in Go's words.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use battery_api_machinery::request_info::{self, RequestInfo};
use battery_api_machinery::status::ApiError;
use futures::future::BoxFuture;
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::Api;
use moka::sync::Cache;

use crate::auth::{Authorizer, Decision, UserInfo};

/// How long a decision is kept, allowed or denied alike: Go's webhook authorizer caches
/// each kind for its own `--authorization-webhook-cache-*-ttl`; ours are equal.
const DECISION_TTL: Duration = Duration::from_secs(10);
/// A decision used when older than this is asked again in the background, so a user
/// who comes back within [`DECISION_TTL`] never waits for a review (a CI system that
/// claims every few seconds would otherwise pay one every ten), while no decision used is
/// older than the TTL.
const REFRESH_AFTER: Duration = Duration::from_secs(5);
/// Decisions kept at most, so that many distinct requests cannot grow memory without
/// bound; past it the least used go first.
const DECISION_CACHE_ENTRIES: u64 = 8192;

/// Paths any caller may read, as Go's `alwaysAllowPaths` plus discovery and OpenAPI
/// (RBAC's `system:discovery` and `system:public-info-viewer` grant them to everyone).
fn always_allowed(info: &RequestInfo) -> bool {
    if info.is_resource_request {
        return false;
    }
    let path = info.path.as_str();
    matches!(
        path,
        "/healthz" | "/livez" | "/readyz" | "/version" | "/api" | "/apis"
    ) || path.starts_with("/apis/")
        || path == "/openapi/v2"
        || path.starts_with("/openapi/v3")
}

/// `dev`'s policy: its one user may do everything; an exec agent (named for its Host by
/// [`agent_identity`](battery_types::agent_identity)) exactly its own Host's verbs; anyone
/// else nothing.
pub struct LocalPolicy {
    pub user: String,
}

impl Authorizer for LocalPolicy {
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        request: &'a RequestInfo,
    ) -> BoxFuture<'a, Result<Decision, ApiError>> {
        let decision = if user.name == self.user {
            Decision::Allow
        } else if let Some(host) =
            battery_types::agent_identity::agent_host(&user.name, &user.groups)
        {
            if agent_may(host, request) {
                Decision::Allow
            } else {
                Decision::Deny(format!(
                    "dev allows the agent of Host {host:?} only get, create, update and patch of \
                     that Host and its status, and create of its certificate"
                ))
            }
        } else {
            Decision::Deny(format!("dev allows only {}", self.user))
        };
        Box::pin(async move { Ok(decision) })
    }
}

/// What an agent may do in `dev`: what kubelet's Node authorizer allows a node of its
/// Node, for a Host. A create carries no name in its attributes (as in Kubernetes), so
/// the Host storage holds a create to the agent's own Host.
fn agent_may(host: &str, request: &RequestInfo) -> bool {
    if !request.is_resource_request
        || request.api_group != battery_types::GROUP
        || request.resource != "hosts"
    {
        return false;
    }
    let verb = request.verb.as_str();
    let named = request.name == host || (verb == "create" && request.name.is_empty());
    named
        && match request.subresource.as_str() {
            "" | "status" => matches!(verb, "get" | "create" | "update" | "patch"),
            "certificate" => verb == "create",
            _ => false,
        }
}

/// `serve` without a cluster to ask: whoever a CA or the front proxy vouches for may do
/// everything, anonymous nothing. Without a cluster there is no RBAC to consult, but an
/// unauthenticated caller must still get nothing.
pub struct AuthenticatedOnly;

impl Authorizer for AuthenticatedOnly {
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        _: &'a RequestInfo,
    ) -> BoxFuture<'a, Result<Decision, ApiError>> {
        let decision = if user.groups.iter().any(|g| g == super::authn::AUTHENTICATED) {
            Decision::Allow
        } else {
            Decision::Deny(
                "without a cluster to ask, only authenticated users are allowed".to_owned(),
            )
        };
        Box::pin(async move { Ok(decision) })
    }
}

/// The cluster's SubjectAccessReview, cached.
pub struct SubjectAccessReviewer {
    client: kube::Client,
    /// By the review's spec, which is exactly what decides.
    cache: Cache<String, Arc<Cached>>,
    refresh_after: Duration,
}

/// A decision, when kube-apiserver made it, and whether it is being asked again.
#[derive(Debug)]
struct Cached {
    decision: Decision,
    made: Instant,
    refreshing: AtomicBool,
}

impl SubjectAccessReviewer {
    pub fn new(client: kube::Client) -> Self {
        Self::with_timings(client, DECISION_TTL, REFRESH_AFTER)
    }

    fn with_timings(client: kube::Client, ttl: Duration, refresh_after: Duration) -> Self {
        Self {
            client,
            cache: crate::cache::bounded(ttl, DECISION_CACHE_ENTRIES),
            refresh_after,
        }
    }

    fn review(user: &UserInfo, request: &RequestInfo) -> SubjectAccessReview {
        let optional = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        let (resource_attributes, non_resource_attributes) = if request.is_resource_request {
            let attributes = ResourceAttributes {
                group: Some(request.api_group.clone()),
                version: optional(&request.api_version),
                resource: optional(&request.resource),
                subresource: optional(&request.subresource),
                namespace: optional(&request.namespace),
                name: optional(&request.name),
                verb: Some(request.verb.clone()),
                ..ResourceAttributes::default()
            };
            (Some(attributes), None)
        } else {
            let attributes = NonResourceAttributes {
                path: Some(request.path.clone()),
                verb: Some(request.verb.clone()),
            };
            (None, Some(attributes))
        };
        SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: optional(&user.uid),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                resource_attributes,
                non_resource_attributes,
            },
            ..SubjectAccessReview::default()
        }
    }
}

impl Authorizer for SubjectAccessReviewer {
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        request: &'a RequestInfo,
    ) -> BoxFuture<'a, Result<Decision, ApiError>> {
        Box::pin(async move {
            let review = Self::review(user, request);
            let key = serde_json::to_string(&review.spec).map_err(ApiError::internal)?;
            if let Some(cached) = self.cache.get(&key) {
                if cached.made.elapsed() >= self.refresh_after
                    && !cached.refreshing.swap(true, Ordering::AcqRel)
                {
                    let (client, cache) = (self.client.clone(), self.cache.clone());
                    let stale = cached.clone();
                    tokio::spawn(async move {
                        if let Err(err) = ask(client, &cache, key, &review).await {
                            // The decision expires as it would have; the next use asks.
                            stale.refreshing.store(false, Ordering::Release);
                            tracing::debug!(error = %err, "refreshing an authorization decision");
                        }
                    });
                }
                return Ok(cached.decision.clone());
            }
            // Go answers a failed review with 500, not 403: the user may well be allowed.
            ask(self.client.clone(), &self.cache, key, &review)
                .await
                .map_err(ApiError::internal)
        })
    }
}

/// Puts `review` to kube-apiserver and caches its decision under `key`.
async fn ask(
    client: kube::Client,
    cache: &Cache<String, Arc<Cached>>,
    key: String,
    review: &SubjectAccessReview,
) -> Result<Decision, super::ReviewError> {
    let api: Api<SubjectAccessReview> = Api::all(client);
    let answered = super::review(api, review, "SubjectAccessReview").await?;
    let status = answered.status.unwrap_or_default();
    let decision = if status.allowed {
        Decision::Allow
    } else {
        Decision::Deny(status.reason.unwrap_or_default())
    };
    let cached = Cached {
        decision: decision.clone(),
        made: Instant::now(),
        refreshing: AtomicBool::new(false),
    };
    cache.insert(key, Arc::new(cached));
    Ok(decision)
}

/// The layer. Runs after request info and authentication, which put the [`RequestInfo`]
/// and the [`UserInfo`] in the extensions.
pub async fn authorize(
    State(authorizer): State<Arc<dyn Authorizer>>,
    request: Request,
    next: Next,
) -> Response {
    let info = match request_info::of(request.extensions()) {
        Ok(info) => info,
        Err(error) => return error.into_response(),
    };
    if always_allowed(info) {
        return next.run(request).await;
    }
    let Some(user) = request.extensions().get::<UserInfo>() else {
        return ApiError::internal(std::io::Error::other(
            "authorization ran before authentication",
        ))
        .into_response();
    };
    let attributes = info.for_authorization();
    let decision = authorizer.authorize(user, &attributes).await;
    match decision {
        Ok(Decision::Allow) => {
            crate::trace::Trace::of(request.extensions()).step("authorized");
            next.run(request).await
        }
        Ok(Decision::Deny(reason)) => {
            ApiError::forbidden(&user.name, &attributes, &reason).into_response()
        }
        Err(error) => error.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Method;

    fn info(method: Method, path: &str) -> RequestInfo {
        RequestInfo::parse(&method, path, None).unwrap()
    }

    #[tokio::test]
    async fn without_a_cluster_authenticated_users_may_and_anonymous_may_not() {
        let request = info(
            Method::GET,
            "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/pools",
        );
        let user = |name: &str, group: &str| UserInfo {
            name: name.to_owned(),
            groups: vec![group.to_owned()],
            ..UserInfo::default()
        };
        let alice = user("alice", super::super::authn::AUTHENTICATED);
        let anonymous = user("system:anonymous", "system:unauthenticated");
        assert!(matches!(
            AuthenticatedOnly.authorize(&alice, &request).await,
            Ok(Decision::Allow)
        ));
        assert!(matches!(
            AuthenticatedOnly.authorize(&anonymous, &request).await,
            Ok(Decision::Deny(_))
        ));
    }

    #[test]
    fn health_discovery_and_openapi_are_always_allowed_and_resources_and_metrics_are_not() {
        for path in [
            "/healthz",
            "/readyz",
            "/livez",
            "/version",
            "/api",
            "/apis",
            "/apis/battery.liquidmetal-x.dev",
            "/apis/battery.liquidmetal-x.dev/v1alpha1",
            "/openapi/v2",
            "/openapi/v3",
            "/openapi/v3/apis/battery.liquidmetal-x.dev/v1alpha1",
        ] {
            assert!(always_allowed(&info(Method::GET, path)), "{path}");
        }
        for path in [
            "/metrics",
            "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/pools",
        ] {
            assert!(!always_allowed(&info(Method::GET, path)), "{path}");
        }
    }

    #[test]
    fn a_review_carries_the_kubernetes_verb_and_the_subresource() {
        let user = UserInfo {
            name: "alice".into(),
            groups: vec!["devs".into()],
            ..UserInfo::default()
        };
        let request = info(
            Method::PATCH,
            "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/ns/microvmclaims/c/lease",
        );
        let review = SubjectAccessReviewer::review(&user, &request);
        let attributes = review.spec.resource_attributes.unwrap();
        assert_eq!(
            (
                attributes.verb.as_deref(),
                attributes.resource.as_deref(),
                attributes.subresource.as_deref(),
                attributes.name.as_deref(),
                attributes.namespace.as_deref()
            ),
            (
                Some("patch"),
                Some("microvmclaims"),
                Some("lease"),
                Some("c"),
                Some("ns")
            )
        );
        let metrics = SubjectAccessReviewer::review(&user, &info(Method::GET, "/metrics"));
        assert_eq!(
            metrics
                .spec
                .non_resource_attributes
                .unwrap()
                .path
                .as_deref(),
            Some("/metrics")
        );
    }

    #[tokio::test]
    async fn dev_lets_an_agent_do_its_own_hosts_verbs_and_nothing_else() {
        use battery_types::agent_identity::{AGENT_GROUP, agent_username};
        let policy = LocalPolicy {
            user: "dev".to_owned(),
        };
        let agent = UserInfo {
            name: agent_username("host-0"),
            groups: vec![AGENT_GROUP.to_owned()],
            ..UserInfo::default()
        };
        let hosts = "/apis/battery.liquidmetal-x.dev/v1alpha1/hosts";
        let allowed = [
            (Method::GET, format!("{hosts}/host-0")),
            (Method::POST, hosts.to_owned()),
            (Method::PUT, format!("{hosts}/host-0")),
            (Method::PATCH, format!("{hosts}/host-0")),
            (Method::GET, format!("{hosts}/host-0/status")),
            (Method::PUT, format!("{hosts}/host-0/status")),
            (Method::PATCH, format!("{hosts}/host-0/status")),
            (Method::POST, format!("{hosts}/host-0/certificate")),
        ];
        for (method, path) in allowed {
            let decision = policy.authorize(&agent, &info(method.clone(), &path)).await;
            assert_eq!(decision.unwrap(), Decision::Allow, "{method} {path}");
        }
        let denied = [
            (Method::PATCH, format!("{hosts}/host-1")),
            (Method::PATCH, format!("{hosts}/host-1/status")),
            (Method::DELETE, format!("{hosts}/host-0")),
            (Method::GET, hosts.to_owned()),
            (Method::GET, format!("{hosts}/host-0/certificate")),
            (
                Method::GET,
                "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/pools".to_owned(),
            ),
        ];
        for (method, path) in denied {
            let decision = policy.authorize(&agent, &info(method.clone(), &path)).await;
            assert!(
                matches!(decision, Ok(Decision::Deny(ref why)) if why.contains("\"host-0\"")),
                "{method} {path}: {decision:?}"
            );
        }
        // The name alone, without the agents' group, is nobody.
        let impostor = UserInfo {
            name: agent_username("host-0"),
            ..UserInfo::default()
        };
        let decision = policy
            .authorize(&impostor, &info(Method::GET, &format!("{hosts}/host-0")))
            .await;
        assert!(matches!(decision, Ok(Decision::Deny(_))));
    }

    /// A cluster whose SubjectAccessReviews answer `allowed` as the flag says, counted.
    fn reviewing_cluster(
        allowed: Arc<AtomicBool>,
        reviews: Arc<std::sync::atomic::AtomicUsize>,
    ) -> kube::Client {
        let service = tower::service_fn(move |_request: http::Request<kube::client::Body>| {
            reviews.fetch_add(1, Ordering::SeqCst);
            let body = serde_json::json!({
                "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {}, "status": {"allowed": allowed.load(Ordering::SeqCst)}
            });
            let response = http::Response::builder()
                .status(201)
                .header("content-type", "application/json")
                .body(body.to_string())
                .unwrap();
            async move { Ok::<_, std::convert::Infallible>(response) }
        });
        kube::Client::new(service, "default")
    }

    #[tokio::test]
    async fn a_decision_used_past_its_half_life_is_asked_again_in_the_background() {
        let allowed = Arc::new(AtomicBool::new(true));
        let reviews = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let client = reviewing_cluster(allowed.clone(), reviews.clone());
        let refresh_after = Duration::from_millis(50);
        let reviewer =
            SubjectAccessReviewer::with_timings(client, Duration::from_secs(600), refresh_after);
        let user = UserInfo {
            name: "alice".to_owned(),
            ..UserInfo::default()
        };
        let pools = info(
            Method::GET,
            "/apis/battery.liquidmetal-x.dev/v1alpha1/pools",
        );
        let request = pools.for_authorization();
        let decide = || reviewer.authorize(&user, &request);
        assert_eq!(decide().await.unwrap(), Decision::Allow);
        assert_eq!(decide().await.unwrap(), Decision::Allow);
        assert_eq!(
            reviews.load(Ordering::SeqCst),
            1,
            "a fresh decision is reused"
        );

        allowed.store(false, Ordering::SeqCst);
        tokio::time::sleep(refresh_after).await;
        assert_eq!(
            decide().await.unwrap(),
            Decision::Allow,
            "within its lifetime the cached decision answers at once"
        );
        // The refresh runs on its own task; wait for its answer to be cached.
        tokio::time::timeout(Duration::from_secs(30), async {
            while decide().await.unwrap() == Decision::Allow {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the refreshed decision replaces the cached one");
        assert_eq!(
            reviews.load(Ordering::SeqCst),
            2,
            "one refresh, not one a use"
        );
    }
}
