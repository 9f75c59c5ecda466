//! HTTP plumbing that knows nothing of pools: TLS serving ([`serve`]), the non-resource
//! endpoints (health, version, metrics, discovery, OpenAPI), request info, authentication
//! and authorization as layers, and the fallback that keeps every error a `Status`.

/// How long the cluster gets to answer a TokenReview or SubjectAccessReview: Go's
/// webhook default, well inside a request's deadline.
const WEBHOOK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A review the cluster did not answer.
#[derive(Debug, thiserror::Error)]
enum ReviewError {
    #[error("the cluster did not answer the {0} within {WEBHOOK_TIMEOUT:?}")]
    Timeout(&'static str),
    #[error("the {0} failed: {1}")]
    Failed(&'static str, #[source] kube::Error),
}

/// Asks the cluster to create `review`, within [`WEBHOOK_TIMEOUT`].
async fn review<K>(api: kube::Api<K>, review: &K, kind: &'static str) -> Result<K, ReviewError>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    tokio::time::timeout(
        WEBHOOK_TIMEOUT,
        api.create(&kube::api::PostParams::default(), review),
    )
    .await
    .map_err(|_| ReviewError::Timeout(kind))?
    .map_err(|error| ReviewError::Failed(kind, error))
}

pub mod authn;
pub mod authz;
mod nonresource;
pub mod recover;
pub mod request_info;
pub mod serve;

pub use nonresource::{NonResource, ServedOpenApi, router as nonresource_router};
