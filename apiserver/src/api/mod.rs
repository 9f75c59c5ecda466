//! The generic REST layer, as k8s.io/apiserver's `pkg/endpoints/handlers` and
//! `pkg/registry/rest`: one [`Storage`] per resource does the resource's own work, and
//! the handlers here do everything every resource shares — decoding and field
//! validation, server-owned metadata, preconditions and optimistic concurrency, dryRun,
//! finalizers, patches, selectors, Table and metadata-only output, watch. Resource code
//! never writes HTTP.

mod apply;
mod call;
mod connect;
mod dispatch;
mod handlers;
mod limits;
mod managed_fields;
mod respond;
mod scale;
mod storage;
mod subresource;
mod watch_stream;

use std::sync::Arc;

use battery_api_machinery::status::ApiError;
use futures::future::BoxFuture;

use crate::http::authn::UserInfo;

pub use connect::Connect;
pub use dispatch::{Endpoint, ResourceEndpoint, resource_router};
pub use limits::{CreateRate, Limiter, Limits};
pub use scale::{Scalable, ScaleEndpoint};
pub use storage::{ApiObject, Deleted, ListPage, Storage, StoredItem, list_key};
pub use subresource::{Subresource, SubresourceEndpoint};

/// Admission the cluster decides: kube-apiserver runs none on requests it proxies to an
/// aggregated server, so a create asks whether its namespace may hold new objects.
pub trait NamespaceLifecycle: Send + Sync {
    fn admit_create<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<(), ApiError>>;
}

impl NamespaceLifecycle for crate::cluster::Cluster {
    fn admit_create<'a>(&'a self, namespace: &'a str) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(crate::cluster::Cluster::admit_create(self, namespace))
    }
}

/// What every storage call gets besides its arguments.
#[derive(Clone)]
pub struct RequestContext {
    pub user: UserInfo,
    /// The namespace of the request; `None` for cluster-scoped resources and for lists
    /// across all namespaces.
    pub namespace: Option<String>,
    /// `None` where there is no cluster (`dev`): every namespace is taken to exist.
    pub lifecycle: Option<Arc<dyn NamespaceLifecycle>>,
}

impl RequestContext {
    /// Refuses a create in a namespace that is missing or terminating.
    pub async fn admit_create(&self) -> Result<(), ApiError> {
        match (&self.lifecycle, &self.namespace) {
            (Some(lifecycle), Some(namespace)) => lifecycle.admit_create(namespace).await,
            _ => Ok(()),
        }
    }
}
