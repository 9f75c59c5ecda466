//! Admission the cluster decides: kube-apiserver runs none on requests it proxies to an
//! aggregated server, so a create asks whether its namespace may hold new objects
//! (Go's `NamespaceLifecycle` admission plugin). The cluster's adapter sits beside the
//! trait, so `cluster/` imports nothing above it.

use battery_api_machinery::status::ApiError;
use futures::future::BoxFuture;

/// Whether a namespace may hold new objects.
pub trait NamespaceLifecycle: Send + Sync {
    fn admit_create<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<(), ApiError>>;
}

impl NamespaceLifecycle for crate::cluster::Cluster {
    fn admit_create<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(crate::cluster::Cluster::admit_create(self, namespace))
    }
}
