//! Kubernetes API-server HTTP machinery that knows nothing of pools: Status errors,
//! request info, query options, selectors, content negotiation, Table, discovery and
//! OpenAPI. The resources it serves are described to it by `battery_types::ResourceInfo`.

pub mod discovery;
mod etag;
pub mod negotiate;
pub mod openapi;
pub mod params;
pub mod patch;
// Below `params` and `negotiate`, which both read queries as Go does.
mod query;
pub mod request_info;
pub mod selectors;
pub mod status;
pub mod table;
pub mod watch;
