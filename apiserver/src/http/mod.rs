//! HTTP plumbing that knows nothing of pools: the non-resource endpoints (health,
//! version, metrics, discovery, OpenAPI), request info, authentication, authorization and
//! request logging as layers, and the fallback that keeps every error a `Status`.

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

/// A cache whose entries last `ttl` and that holds at most `capacity` of them, the least
/// used going first: no cache of answers may grow with the number of callers.
pub(crate) fn bounded_cache<K, V>(
    ttl: std::time::Duration,
    capacity: u64,
) -> moka::sync::Cache<K, V>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    moka::sync::Cache::builder()
        .max_capacity(capacity)
        .time_to_live(ttl)
        .build()
}

pub mod authn;
pub mod authz;
pub mod metrics;
mod nonresource;
pub mod recover;
pub mod request_info;

pub use nonresource::{NonResource, ServedOpenApi, router as nonresource_router};

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_bounded_cache_keeps_at_most_its_capacity_and_forgets_after_its_ttl() {
        let cache = super::bounded_cache::<u32, u32>(Duration::from_millis(50), 100);
        for n in 0..10_000 {
            cache.insert(n, n);
        }
        cache.run_pending_tasks();
        assert!(cache.entry_count() <= 100, "{}", cache.entry_count());
        cache.insert(1, 1);
        assert_eq!(cache.get(&1), Some(1));
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(cache.get(&1), None, "expired");
    }
}
