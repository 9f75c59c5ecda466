//! What a connect subresource that opens a WebSocket session shares (a claim's `exec`
//! and `portforward`, a process's `attach`): its options are read from the query first,
//! refusing before anything else, then the WebSocket handshake is answered with the
//! session opened.

use std::sync::Arc;

use axum::response::Response;
use battery_api_machinery::status::ApiError;
use battery_types::channel::Protocol;
use futures::future::BoxFuture;
use http::request::Parts;

use crate::api::connect::websocket::{self, Session};
use crate::api::{Connect, RequestContext};

/// A connect subresource that serves WebSocket sessions.
pub(in crate::resources::microvmclaims) trait SessionSubresource:
    Send + Sync + 'static
{
    /// What its query asks for.
    type Options: Send + 'static;

    /// What serves the client once the WebSocket is up.
    type Session: Session;

    /// The channel protocols it speaks, best first: by default remotecommand's, as
    /// exec and attach do.
    const PROTOCOLS: &'static [Protocol] = &Protocol::ALL;

    /// The options of `query`, or why they are refused.
    fn options(query: &str) -> Result<Self::Options, ApiError>;

    /// The session of `options` on the object `name`, if it may open.
    fn open(
        &self,
        ctx: &RequestContext,
        name: &str,
        options: Self::Options,
        protocol: Protocol,
    ) -> impl Future<Output = Result<Self::Session, ApiError>> + Send;
}

impl<T: SessionSubresource> Connect for Arc<T> {
    fn connect(
        &self,
        ctx: RequestContext,
        name: String,
        parts: Parts,
    ) -> BoxFuture<'static, Result<Response, ApiError>> {
        let subresource = self.clone();
        Box::pin(async move {
            let options = T::options(parts.uri.query().unwrap_or_default())?;
            websocket::accept(parts, T::PROTOCOLS, |protocol| async move {
                subresource.open(&ctx, &name, options, protocol).await
            })
            .await
        })
    }
}
