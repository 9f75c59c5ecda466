//! The generic REST layer, as k8s.io/apiserver's `pkg/endpoints/handlers` and
//! `pkg/registry/rest`: one [`Storage`] per resource does the resource's own work, and
//! the handlers here do everything every resource shares — decoding and field
//! validation, server-owned metadata, preconditions and optimistic concurrency, dryRun,
//! finalizers, patches, selectors, Table and metadata-only output, watch. Resource code
//! never writes HTTP.

mod apply;
mod call;
pub mod connect;
mod context;
mod dispatch;
mod handlers;
mod limits;
mod managed_fields;
mod namespace_lifecycle;
mod respond;
mod scale;
mod storage;
mod subresource;
mod watch_stream;

pub use connect::{Connect, SessionSubresource};
pub use context::RequestContext;
pub use dispatch::{Endpoint, ResourceEndpoint, resource_router};
pub use limits::{CreateRate, Limiter, Limits};
pub use namespace_lifecycle::NamespaceLifecycle;
pub use scale::{Scalable, ScaleEndpoint};
pub use storage::{ApiObject, Deleted, ListPage, Storage, StoredItem, list_key};
pub use subresource::{Subresource, SubresourceEndpoint};
