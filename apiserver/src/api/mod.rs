//! The generic REST layer, as k8s.io/apiserver's `pkg/endpoints/handlers` and
//! `pkg/registry/rest`: one [`Storage`] per resource does the resource's own work, and
//! the handlers here do everything every resource shares — decoding and field
//! validation, server-owned metadata, preconditions and optimistic concurrency, dryRun,
//! finalizers, patches, selectors, Table and metadata-only output, watch. Resource code
//! never writes HTTP.

mod apply;
mod dispatch;
mod handlers;
mod respond;
mod storage;
mod subresource;
mod watch_stream;

use std::collections::BTreeMap;

pub use dispatch::{Endpoint, ResourceEndpoint, resource_router};
pub use storage::{ApiObject, Deleted, Storage, server_now};
pub use subresource::{Subresource, SubresourceEndpoint};

/// Who is asking, as authentication established it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What every storage call gets besides its arguments.
#[derive(Debug, Clone)]
pub struct RequestContext {
    pub user: UserInfo,
    /// The namespace of the request; `None` for cluster-scoped resources and for lists
    /// across all namespaces.
    pub namespace: Option<String>,
}
