//! Connect subresources (`exec`, `portforward`), as Go's `rest.Connecter`: no object is
//! read or written; the resource gets the request's head, its pending upgrade included,
//! and answers with a response of its own (a `101 Switching Protocols`, or a refusal).
//!
//! A resource that streams over a WebSocket decides only whether the connection may open
//! and with what session; [`websocket`] does the rest (the handshake, the upgrade, kube's
//! channel framing and the task that serves the session), as k8s.io/apiserver's
//! `wsstream` package does for `pods/exec` and `pods/portforward`.

pub mod websocket;

use std::sync::Arc;

use axum::response::Response;
use battery_api_machinery::status::ApiError;
use futures::future::BoxFuture;
use http::request::Parts;

use super::RequestContext;
use super::call::Call;
use super::subresource::SubresourceEndpoint;

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
