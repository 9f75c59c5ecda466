//! A request on its way to a resource's handlers: what dispatch learned of it (who asks,
//! the request info and its checked verb, the body read) handed to an endpoint or a
//! subresource.

use axum::body::Bytes;
use battery_api_machinery::request_info::RequestInfo;
use battery_types::Verb;
use http::request::Parts;

use super::RequestContext;

/// A request on its way to an endpoint.
pub struct Call {
    pub ctx: RequestContext,
    pub info: RequestInfo,
    /// The verb of `info`, checked against what the resource serves.
    pub verb: Verb,
    pub parts: Parts,
    pub body: Bytes,
    /// A watch's slot under the watch cap, held while it streams.
    pub watch_slot: Option<tokio::sync::OwnedSemaphorePermit>,
}
