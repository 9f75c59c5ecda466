//! Who is asking, and the question "may they": the plain types of k8s.io/apiserver's
//! `pkg/authentication/user` ([`UserInfo`]) and `pkg/authorization/authorizer`
//! ([`Authorizer`], its [`Decision`]).
//!
//! They sit below `api/` and `resources/`, which carry the user in a request's context
//! and ask an authorizer again for what a request reaches beyond its own path (a claim's
//! ConfigMaps and Secrets). How a user is established and how a decision is made (the
//! authentication and authorization layers, the TokenReview and SubjectAccessReview
//! clients, `dev`'s policy) is `http/`'s.

use battery_api_machinery::request_info::RequestInfo;
use battery_api_machinery::status::ApiError;
use futures::future::BoxFuture;

/// Who is asking, as authentication established it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// A decision on one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Refused, with the authorizer's reason (may be empty).
    Deny(String),
}

/// Decides whether a user may do what a request asks.
pub trait Authorizer: Send + Sync {
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        request: &'a RequestInfo,
    ) -> BoxFuture<'a, Result<Decision, ApiError>>;
}
