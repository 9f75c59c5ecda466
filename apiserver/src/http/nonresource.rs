//! Paths that are not resources: health, version, metrics, discovery and OpenAPI.
//! Discovery and OpenAPI are built once at start and answer even when battery is down,
//! so the APIService stays Available and the cluster's discovery never breaks. The v2
//! document alone may change later, when its Kubernetes definitions are taken from the
//! cluster's ([`ServedOpenApi`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use battery_api_machinery::discovery::Discovery;
use battery_api_machinery::negotiate;
use battery_api_machinery::openapi::OpenApi;
use battery_api_machinery::status::ApiError;
use futures::future::BoxFuture;
use serde::Deserialize;
use tokio::sync::watch;

use crate::metrics::Metrics;

/// How long `/openapi/v2` waits for the cluster's definitions before it answers with
/// ours: the aggregator downloads it once a minute, and a first answer with ours would
/// leave renamed definitions in the cluster's document until the next.
const OPENAPI_SETTLE_WAIT: Duration = Duration::from_secs(3);

/// The OpenAPI documents served now.
#[derive(Clone)]
pub struct ServedOpenApi {
    pub documents: Arc<OpenApi>,
    /// Whether the v2 document's Kubernetes definitions are final: taken from the
    /// cluster, or there is no cluster, or asking it failed (ours then, until it answers).
    pub settled: bool,
}

/// What the non-resource paths serve.
pub struct NonResource {
    pub discovery: Discovery,
    pub openapi: watch::Receiver<ServedOpenApi>,
    /// Whether battery answers, or why not: asked by `/readyz`, a function so that this
    /// module knows no battery client.
    pub battery_serving: Box<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>,
    pub metrics: Arc<Metrics>,
    /// Set once the start-up work is done: battery's Hosts and Pools adopted and the
    /// leases binds left without a claim released.
    pub started: Arc<AtomicBool>,
}

pub fn router(state: Arc<NonResource>, group: &str, version: &str) -> Router {
    Router::new()
        .route("/healthz", get(ok))
        .route("/livez", get(ok))
        .route("/readyz", get(readyz))
        .route("/version", get(version_info))
        .route("/metrics", get(metrics))
        .route("/api", get(api))
        .route("/apis", get(apis))
        .route(&format!("/apis/{group}"), get(group_doc))
        .route(&format!("/apis/{group}/{version}"), get(resource_list))
        .route("/openapi/v2", get(openapi_v2))
        .route("/openapi/v3", get(openapi_v3_root))
        .route(
            &format!("/openapi/v3/apis/{group}/{version}"),
            get(openapi_v3),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn ok() -> &'static str {
    "ok"
}

/// Ready only when battery answers (without it no resource can be served) and the
/// start-up work is done, as kube-apiserver's post-start hooks hold its `/readyz`; each
/// failing check is a `[-]` line, as Go's.
async fn readyz(State(state): State<Arc<NonResource>>) -> Response {
    let mut failed = String::new();
    if let Err(reason) = (state.battery_serving)().await {
        failed.push_str(&format!("[-]battery failed: {reason}\n"));
    }
    if !state.started.load(Ordering::Acquire) {
        failed.push_str(
            "[-]poststarthook/adopt-and-recover failed: battery's Hosts and Pools not yet \
             adopted, or the leases binds left not yet released\n",
        );
    }
    if failed.is_empty() {
        "ok".into_response()
    } else {
        failed.push_str("readyz check failed\n");
        (StatusCode::INTERNAL_SERVER_ERROR, failed).into_response()
    }
}

async fn version_info() -> Response {
    let version = env!("CARGO_PKG_VERSION");
    let mut parts = version.split('.');
    let info = k8s_openapi::apimachinery::pkg::version::Info {
        major: parts.next().unwrap_or_default().to_owned(),
        minor: parts.next().unwrap_or_default().to_owned(),
        git_version: format!("v{version}"),
        git_commit: option_env!("BATTERY_APISERVER_GIT_COMMIT")
            .unwrap_or("unknown")
            .to_owned(),
        git_tree_state: "unknown".to_owned(),
        build_date: "unknown".to_owned(),
        go_version: String::new(),
        compiler: "rustc".to_owned(),
        platform: format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
        ..Default::default()
    };
    axum::Json(info).into_response()
}

async fn metrics(State(state): State<Arc<NonResource>>) -> Response {
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        state.metrics.render(),
    )
        .into_response()
}

async fn api(State(state): State<Arc<NonResource>>, headers: HeaderMap) -> Response {
    match negotiate::Discovery::negotiate(&headers) {
        Ok(_) => state.discovery.api_versions(),
        Err(e) => e.into_response(),
    }
}

/// `/apis`: aggregated discovery when asked for, the legacy list otherwise, 406 when
/// neither is acceptable (aggregators of 1.27/1.28 fall back only on 406).
async fn apis(State(state): State<Arc<NonResource>>, headers: HeaderMap) -> Response {
    match negotiate::Discovery::negotiate(&headers) {
        Ok(negotiate::Discovery::Aggregated(version, _)) => {
            state.discovery.aggregated(version, &headers)
        }
        Ok(negotiate::Discovery::Legacy(_)) => state.discovery.group_list(),
        Err(e) => e.into_response(),
    }
}

async fn group_doc(State(state): State<Arc<NonResource>>) -> Response {
    state.discovery.group()
}

async fn resource_list(State(state): State<Arc<NonResource>>) -> Response {
    state.discovery.resource_list()
}

async fn openapi_v2(State(state): State<Arc<NonResource>>, headers: HeaderMap) -> Response {
    let mut served = state.openapi.clone();
    // Past the wait (or with the sender gone) ours are served: never an error.
    let _ = tokio::time::timeout(OPENAPI_SETTLE_WAIT, served.wait_for(|s| s.settled)).await;
    let documents = served.borrow().documents.clone();
    documents.v2(&headers)
}

async fn openapi_v3_root(State(state): State<Arc<NonResource>>, headers: HeaderMap) -> Response {
    let documents = state.openapi.borrow().documents.clone();
    documents.v3_root(&headers)
}

#[derive(Deserialize)]
struct HashQuery {
    hash: Option<String>,
}

async fn openapi_v3(
    State(state): State<Arc<NonResource>>,
    Query(query): Query<HashQuery>,
    headers: HeaderMap,
) -> Response {
    let documents = state.openapi.borrow().documents.clone();
    documents.v3_group_version(query.hash.as_deref(), &headers)
}

async fn not_found() -> ApiError {
    ApiError::no_route(None)
}

async fn method_not_allowed() -> ApiError {
    ApiError::no_method()
}
