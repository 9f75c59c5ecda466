//! HTTP plumbing that knows nothing of pools: the non-resource endpoints (health,
//! version, metrics, discovery, OpenAPI), authentication and request logging as layers,
//! and the fallback that keeps every error a `Status`.

pub mod authn;
pub mod authz;
pub mod metrics;
mod nonresource;
pub mod recover;

pub use nonresource::{NonResource, router as nonresource_router};
