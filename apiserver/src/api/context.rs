//! The request context every storage call gets besides its arguments: who asks, in which
//! namespace, the namespace admission a create must pass, and the request's trace. Built
//! once per request by dispatch from what the layers left in the request's extensions, as
//! Go's handlers read `request.UserFrom` and `request.NamespaceValue` from the request's
//! context.

use std::sync::Arc;

use battery_api_machinery::request_info::RequestInfo;
use battery_api_machinery::status::ApiError;

use super::namespace_lifecycle::NamespaceLifecycle;
use crate::auth::UserInfo;
use crate::trace::Trace;

/// What every storage call gets besides its arguments.
#[derive(Clone)]
pub struct RequestContext {
    pub user: UserInfo,
    /// The namespace of the request; `None` for cluster-scoped resources and for lists
    /// across all namespaces.
    pub namespace: Option<String>,
    /// `None` where there is no cluster (`dev`): every namespace is taken to exist.
    pub lifecycle: Option<Arc<dyn NamespaceLifecycle>>,
    /// Where the handler and the storage record the steps a slow request is logged with.
    pub trace: Trace,
}

impl RequestContext {
    /// The context of a request that passed authentication: its user from `extensions`,
    /// its namespace from `info`.
    pub(super) fn of(
        extensions: &http::Extensions,
        info: &RequestInfo,
        lifecycle: Option<Arc<dyn NamespaceLifecycle>>,
    ) -> Result<Self, ApiError> {
        Ok(Self {
            user: user(extensions)?,
            namespace: (!info.namespace.is_empty()).then(|| info.namespace.clone()),
            lifecycle,
            trace: Trace::of(extensions),
        })
    }

    /// Refuses a create in a namespace that is missing or terminating.
    pub async fn admit_create(&self) -> Result<(), ApiError> {
        match (&self.lifecycle, &self.namespace) {
            (Some(lifecycle), Some(namespace)) => lifecycle.admit_create(namespace).await,
            _ => Ok(()),
        }
    }
}

/// Who authentication said is asking; a 500 if it did not run, which is a bug in how the
/// stack was built (anonymous callers are named by authentication too).
fn user(extensions: &http::Extensions) -> Result<UserInfo, ApiError> {
    extensions.get::<UserInfo>().cloned().ok_or_else(|| {
        ApiError::internal(std::io::Error::other(
            "the request reached a handler without passing authentication",
        ))
    })
}
