//! Connect subresources (`exec`, `portforward`), as Go's `rest.Connecter`: no object is
//! read or written; the resource gets the request's head, its pending upgrade included,
//! and answers with a response of its own (a `101 Switching Protocols`, or a refusal).
//!
//! A resource that streams over a WebSocket is a [`SessionSubresource`]: it reads its
//! options from the query, refusing before anything else, and decides only whether the
//! connection may open and with what session; [`websocket`] does the rest (the handshake,
//! the upgrade, kube's channel framing and the task that serves the session), as
//! k8s.io/apiserver's `wsstream` package does for `pods/exec` and `pods/portforward`.

pub mod websocket;

use std::sync::Arc;

use axum::response::Response;
use battery_api_machinery::status::ApiError;
use battery_types::channel::Protocol;
use futures::future::BoxFuture;
use http::request::Parts;

use super::RequestContext;
use super::call::Call;
use super::subresource::SubresourceEndpoint;
use websocket::Session;

/// A connect subresource of one resource.
pub trait Connect: Send + Sync + 'static {
    /// Connects to the object `name`. `parts` is the request's head; the upgrade of its
    /// connection is in its extensions.
    fn connect(
        &self,
        ctx: RequestContext,
        name: String,
        parts: Parts,
    ) -> BoxFuture<'static, Result<Response, ApiError>>;
}

/// A [`Connect`] as the dispatcher calls subresources.
pub(super) struct ConnectEndpoint(pub Arc<dyn Connect>);

impl SubresourceEndpoint for ConnectEndpoint {
    fn handle(&self, call: Call) -> BoxFuture<'static, Result<Response, ApiError>> {
        self.0.connect(call.ctx, call.info.name, call.parts)
    }
}

/// A connect subresource that serves WebSocket sessions.
pub trait SessionSubresource: Send + Sync + 'static {
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
