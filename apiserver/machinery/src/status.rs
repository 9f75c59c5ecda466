//! `ApiError`: every failure this server answers with, written as a `metav1.Status`.
//!
//! Clients only treat an error body as a Kubernetes error when it decodes as `kind: Status`
//! with `status: Failure` (`client-go:rest/request.go`); anything else becomes a vague
//! "the server could not find the requested resource". So every rejection — from a handler,
//! an extractor, authentication or a fallback route — is an `ApiError`, and this module is the
//! only place that turns one into a response.
//!
//! The constructors mirror `apimachinery:pkg/api/errors/errors.go` (`NewNotFound`,
//! `NewInvalid`, ...) word for word, because kubectl prints these messages verbatim and users
//! search for them. The `Reason` fixes the HTTP code, so the two can never disagree.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use battery_types::ResourceInfo;
use battery_types::strconv::quote;
use battery_types::validation::FieldError;
use http::StatusCode;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER, X_CONTENT_TYPE_OPTIONS};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};

/// `metav1.StatusReason`: a machine-readable reason, each with exactly one HTTP code
/// (`apimachinery:pkg/apis/meta/v1/types.go`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// 400: the request is malformed (query parameters, body encoding).
    BadRequest,
    /// 401: no valid credentials.
    Unauthorized,
    /// 403: the authorizer said no.
    Forbidden,
    /// 404: the object does not exist.
    NotFound,
    /// 405: the verb is not served for this resource.
    MethodNotAllowed,
    /// 406: no representation in the Accept header can be produced.
    NotAcceptable,
    /// 409: create of a name that exists.
    AlreadyExists,
    /// 409: a precondition or resourceVersion did not match.
    Conflict,
    /// 410: the requested resourceVersion or continue token is too old.
    Expired,
    /// 410: the resource is gone for good.
    Gone,
    /// 413: the body is too large.
    RequestEntityTooLarge,
    /// 415: the body's Content-Type is not accepted.
    UnsupportedMediaType,
    /// 422: the object failed validation; `details.causes` lists the fields.
    Invalid,
    /// 429: try again after `Retry-After`.
    TooManyRequests,
    /// 500: a bug or an unexpected failure; the cause is logged, not sent.
    InternalError,
    /// 500: the operation could not complete in time, but may be retried.
    ServerTimeout,
    /// 503: a dependency (battery) is unavailable.
    ServiceUnavailable,
    /// 504: the request did not complete within its timeout.
    Timeout,
}

impl Reason {
    /// The HTTP code Go's `errors.go` constructors give this reason.
    pub fn code(self) -> StatusCode {
        match self {
            Reason::BadRequest => StatusCode::BAD_REQUEST,
            Reason::Unauthorized => StatusCode::UNAUTHORIZED,
            Reason::Forbidden => StatusCode::FORBIDDEN,
            Reason::NotFound => StatusCode::NOT_FOUND,
            Reason::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Reason::NotAcceptable => StatusCode::NOT_ACCEPTABLE,
            Reason::AlreadyExists | Reason::Conflict => StatusCode::CONFLICT,
            Reason::Expired | Reason::Gone => StatusCode::GONE,
            Reason::RequestEntityTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Reason::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Reason::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
            Reason::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
            Reason::InternalError | Reason::ServerTimeout => StatusCode::INTERNAL_SERVER_ERROR,
            Reason::ServiceUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Reason::Timeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The `reason` string on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BadRequest => "BadRequest",
            Reason::Unauthorized => "Unauthorized",
            Reason::Forbidden => "Forbidden",
            Reason::NotFound => "NotFound",
            Reason::MethodNotAllowed => "MethodNotAllowed",
            Reason::NotAcceptable => "NotAcceptable",
            Reason::AlreadyExists => "AlreadyExists",
            Reason::Conflict => "Conflict",
            Reason::Expired => "Expired",
            Reason::Gone => "Gone",
            Reason::RequestEntityTooLarge => "RequestEntityTooLarge",
            Reason::UnsupportedMediaType => "UnsupportedMediaType",
            Reason::Invalid => "Invalid",
            Reason::TooManyRequests => "TooManyRequests",
            Reason::InternalError => "InternalError",
            Reason::ServerTimeout => "ServerTimeout",
            Reason::ServiceUnavailable => "ServiceUnavailable",
            Reason::Timeout => "Timeout",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The internal cause of an error, handed to the logging layer in a response extension.
///
/// It never reaches the body: battery's errors can name hosts, paths and lease state that a
/// caller has no business seeing.
#[derive(Clone, Debug)]
pub struct ErrorSource(pub Arc<dyn StdError + Send + Sync>);

/// A failed API request, answered as a `Status` with `status: Failure`.
///
/// Boxed, because it is the error of nearly every `Result` on the request path and a
/// `StatusDetails` is large.
#[derive(Clone, Debug)]
pub struct ApiError(Box<Inner>);

#[derive(Clone, Debug)]
struct Inner {
    reason: Reason,
    /// A reason more specific than `reason`'s, with the same code (Kubernetes reasons are
    /// open strings; clients fall back to the code for ones they do not know).
    specific_reason: Option<&'static str>,
    message: String,
    details: Option<StatusDetails>,
    source: Option<Arc<dyn StdError + Send + Sync>>,
}

impl ApiError {
    /// An error with a reason and a message and no details; the named constructors below
    /// are preferred wherever one fits, because they carry Go's exact wording.
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        ApiError(Box::new(Inner {
            reason,
            specific_reason: None,
            message: message.into(),
            details: None,
            source: None,
        }))
    }

    pub(crate) fn with_details(reason: Reason, message: String, details: StatusDetails) -> Self {
        ApiError(Box::new(Inner {
            reason,
            specific_reason: None,
            message,
            details: Some(details),
            source: None,
        }))
    }

    /// `NewNotFound`: `pools.battery.liquidmetal-x.dev "x" not found`.
    pub fn not_found(info: &ResourceInfo, name: &str) -> Self {
        let resource = group_resource(info.group, info.plural);
        Self::with_details(
            Reason::NotFound,
            format!("{resource} {} not found", quote(name)),
            resource_details(info.group, info.plural, name),
        )
    }

    /// `NewAlreadyExists`: `pools.battery.liquidmetal-x.dev "x" already exists`.
    pub fn already_exists(info: &ResourceInfo, name: &str) -> Self {
        let resource = group_resource(info.group, info.plural);
        Self::with_details(
            Reason::AlreadyExists,
            format!("{resource} {} already exists", quote(name)),
            resource_details(info.group, info.plural, name),
        )
    }

    /// `NewConflict`: `Operation cannot be fulfilled on pools.battery.liquidmetal-x.dev "x":
    /// <why>`. For a stale resourceVersion, `why` is Go's `OptimisticLockErrorMsg`, see
    /// [`ApiError::optimistic_lock`].
    pub fn conflict(info: &ResourceInfo, name: &str, why: impl fmt::Display) -> Self {
        let resource = group_resource(info.group, info.plural);
        Self::with_details(
            Reason::Conflict,
            format!(
                "Operation cannot be fulfilled on {resource} {}: {why}",
                quote(name)
            ),
            resource_details(info.group, info.plural, name),
        )
    }

    /// The conflict for a stale `resourceVersion` on update, with Go's
    /// `storage.OptimisticLockErrorMsg` (`apiserver:pkg/storage/errors.go`).
    pub fn optimistic_lock(info: &ResourceInfo, name: &str) -> Self {
        Self::conflict(
            info,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// `NewApplyConflict`: a server-side apply that would take fields another manager owns,
    /// with one `FieldManagerConflict` cause per field.
    pub fn apply_conflict(causes: Vec<StatusCause>, message: impl Into<String>) -> Self {
        let details = StatusDetails {
            causes: Some(causes),
            ..StatusDetails::default()
        };
        Self::with_details(Reason::Conflict, message.into(), details)
    }

    /// `NewInvalid` for one of our kinds: `Pool.battery.liquidmetal-x.dev "x" is invalid:
    /// spec.size: Invalid value: -1: must be greater than or equal to 0`.
    pub fn invalid(info: &ResourceInfo, name: &str, errors: &[FieldError]) -> Self {
        Self::invalid_kind(info.group, info.kind, name, errors)
    }

    /// `NewInvalid` for any group and kind, e.g. `meta.k8s.io`/`ListOptions` for bad query
    /// options or `coordination.k8s.io`/`Lease` for the lease subresource. `details.kind` is
    /// the Kind (not the resource), which kubectl prints as `The Pool "x" is invalid:`.
    pub fn invalid_kind(group: &str, kind: &str, name: &str, errors: &[FieldError]) -> Self {
        let causes = errors
            .iter()
            .map(|e| StatusCause {
                reason: Some(e.kind.cause_type().to_owned()),
                message: Some(e.body()),
                field: Some(e.field.clone()),
            })
            .collect();
        let qualified = group_resource(group, kind);
        // `field.ErrorList.ToAggregate` drops repeated messages, then prints one error bare
        // and several as `[a, b]` (`apimachinery:pkg/util/errors/errors.go`).
        let mut messages: Vec<String> = Vec::with_capacity(errors.len());
        for e in errors {
            let message = e.to_string();
            if !messages.contains(&message) {
                messages.push(message);
            }
        }
        let message = match messages.as_slice() {
            [] => format!("{qualified} {} is invalid", quote(name)),
            [one] => format!("{qualified} {} is invalid: {one}", quote(name)),
            many => format!(
                "{qualified} {} is invalid: [{}]",
                quote(name),
                many.join(", ")
            ),
        };
        let mut details = resource_details(group, kind, name);
        details.causes = Some(causes);
        Self::with_details(Reason::Invalid, message, details)
    }

    /// `NewBadRequest`: the message as given.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(Reason::BadRequest, message)
    }

    /// `NewUnauthorized`; kubectl prints `error: You must be logged in to the server (<message>)`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        let message = message.into();
        if message.is_empty() {
            Self::new(Reason::Unauthorized, "not authorized")
        } else {
            Self::new(Reason::Unauthorized, message)
        }
    }

    /// `NewForbidden` for a rule of the resource's own, beyond RBAC:
    /// `microvmclaims.battery.liquidmetal-x.dev "c" is forbidden: <why>`.
    pub fn forbidden_object(info: &ResourceInfo, name: &str, why: impl fmt::Display) -> Self {
        let resource = group_resource(info.group, info.plural);
        Self::with_details(
            Reason::Forbidden,
            format!("{resource} {} is forbidden: {why}", quote(name)),
            resource_details(info.group, info.plural, name),
        )
    }

    /// NamespaceLifecycle's refusal of a create in a namespace that does not exist:
    /// `NewNotFound` on `namespaces`.
    pub fn namespace_not_found(namespace: &str) -> Self {
        Self::with_details(
            Reason::NotFound,
            format!("namespaces {} not found", quote(namespace)),
            resource_details("", "namespaces", namespace),
        )
    }

    /// NamespaceLifecycle's refusal of a create in a namespace being deleted
    /// (`apiserver:pkg/admission/plugin/namespace/lifecycle/admission.go`).
    pub fn namespace_terminating(namespace: &str) -> Self {
        Self::with_details(
            Reason::Forbidden,
            format!(
                "unable to create new content in namespace {namespace} because it is being terminated"
            ),
            resource_details("", "namespaces", namespace),
        )
    }

    /// Go's generic 404 for a path nothing serves (`NewGenericServerResponse` with
    /// `StatusReasonNotFound`), naming the path when there is one.
    pub fn no_route(path: Option<&str>) -> Self {
        let message = "the server could not find the requested resource";
        match path {
            Some(path) => Self::new(Reason::NotFound, format!("{message} ({path})")),
            None => Self::new(Reason::NotFound, message),
        }
    }

    /// Go's generic 405 for a method a path does not serve.
    pub fn no_method() -> Self {
        Self::new(
            Reason::MethodNotAllowed,
            "the server does not allow this method on the requested resource",
        )
    }

    /// `NewMethodNotSupported`: `deletecollection is not supported on resources of kind
    /// "hosts.battery.liquidmetal-x.dev"`.
    pub fn method_not_allowed(info: &ResourceInfo, action: &str) -> Self {
        let resource = group_resource(info.group, info.plural);
        Self::with_details(
            Reason::MethodNotAllowed,
            format!(
                "{action} is not supported on resources of kind {}",
                quote(&resource)
            ),
            resource_details(info.group, info.plural, ""),
        )
    }

    /// `negotiation.NewNotAcceptableError`: `only the following media types are accepted:
    /// application/json, application/yaml`.
    pub fn not_acceptable(accepted: &[&str]) -> Self {
        Self::new(
            Reason::NotAcceptable,
            format!(
                "only the following media types are accepted: {}",
                accepted.join(", ")
            ),
        )
    }

    /// `negotiation.NewUnsupportedMediaTypeError`: `the body of the request was in an unknown
    /// format - accepted media types include: application/json-patch+json, ...`.
    pub fn unsupported_media_type(accepted: &[&str]) -> Self {
        Self::new(
            Reason::UnsupportedMediaType,
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    /// `NewResourceExpired` (410, reason Expired): what a too-old resourceVersion or continue
    /// token gets, and what makes a reflector relist.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(Reason::Expired, message)
    }

    /// `NewGone` (410, reason Gone).
    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(Reason::Gone, message)
    }

    /// `NewRequestEntityTooLargeError`: `Request entity too large: <message>`.
    pub fn request_entity_too_large(message: impl fmt::Display) -> Self {
        Self::new(
            Reason::RequestEntityTooLarge,
            format!("Request entity too large: {message}"),
        )
    }

    /// `NewTooManyRequests`: the message as given, with `Retry-After`.
    pub fn too_many_requests(message: impl Into<String>, retry_after_seconds: u32) -> Self {
        Self::new(Reason::TooManyRequests, message).with_retry_after(retry_after_seconds)
    }

    /// `NewServiceUnavailable`: the message as given; add [`ApiError::with_retry_after`]
    /// when the dependency said when to come back.
    pub fn service_unavailable(message: impl Into<String>) -> Self {
        Self::new(Reason::ServiceUnavailable, message)
    }

    /// `NewTimeoutError` (504): `Timeout: <message>`.
    pub fn timeout(message: impl fmt::Display) -> Self {
        Self::new(Reason::Timeout, format!("Timeout: {message}"))
    }

    /// `NewServerTimeout` (500, reason ServerTimeout): `The create operation against
    /// pools.battery.liquidmetal-x.dev could not be completed at this time, please try again.`
    pub fn server_timeout(info: &ResourceInfo, operation: &str, retry_after_seconds: u32) -> Self {
        let resource = group_resource(info.group, info.plural);
        Self::with_details(
            Reason::ServerTimeout,
            format!(
                "The {operation} operation against {resource} could not be completed at this time, please try again."
            ),
            resource_details(info.group, info.plural, operation),
        )
        .with_retry_after(retry_after_seconds)
    }

    /// An unexpected failure. Unlike Go's `NewInternalError`, the cause is not echoed into
    /// the message or `details.causes`: it goes to the log through [`ErrorSource`] only.
    pub fn internal(source: impl StdError + Send + Sync + 'static) -> Self {
        Self::new(
            Reason::InternalError,
            "Internal error occurred: the server failed to complete the request; the cause is in its log",
        )
        .with_source(source)
    }

    /// Answers with `reason` in place of the generic one, e.g. `PoolDeleting` for a
    /// Conflict; the code stays the generic reason's.
    pub fn with_specific_reason(mut self, reason: &'static str) -> Self {
        self.0.specific_reason = Some(reason);
        self
    }

    /// Attaches the internal cause for the logging layer; it is never sent to the client.
    pub fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Self {
        self.0.source = Some(Arc::new(source));
        self
    }

    /// Sets `details.retryAfterSeconds` and so the `Retry-After` header; 0 means no advice,
    /// as in Go, which only sends the header for a positive value.
    pub fn with_retry_after(mut self, seconds: u32) -> Self {
        let details = self.0.details.get_or_insert_with(StatusDetails::default);
        details.retry_after_seconds =
            (seconds > 0).then(|| i32::try_from(seconds).unwrap_or(i32::MAX));
        self
    }

    /// The reason, which fixes the HTTP code.
    pub fn reason(&self) -> Reason {
        self.0.reason
    }

    /// The HTTP status code.
    pub fn code(&self) -> StatusCode {
        self.0.reason.code()
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// `details` (name, group, kind, causes, retryAfterSeconds), when there are any.
    pub fn details(&self) -> Option<&StatusDetails> {
        self.0.details.as_ref()
    }

    /// The seconds to advertise in `Retry-After`, if any.
    pub fn retry_after_seconds(&self) -> Option<u32> {
        self.0
            .details
            .as_ref()
            .and_then(|d| d.retry_after_seconds)
            .and_then(|s| u32::try_from(s).ok())
            .filter(|s| *s > 0)
    }

    /// The `Status` object, as sent in a response body or a watch `ERROR` event.
    pub fn to_status(&self) -> Status {
        Status {
            code: Some(i32::from(self.code().as_u16())),
            details: self.0.details.clone(),
            message: Some(self.0.message.clone()),
            metadata: Default::default(),
            reason: Some(
                self.0
                    .specific_reason
                    .unwrap_or(self.0.reason.as_str())
                    .to_owned(),
            ),
            status: Some("Failure".to_owned()),
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl StdError for ApiError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0
            .source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        // A Status is strings and integers, so encoding cannot fail; should it ever, a
        // fixed Status still keeps the client on the error path rather than a bare 500.
        let body = serde_json::to_vec(&self.to_status()).unwrap_or_else(|_| {
            br#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"failed to encode the error","reason":"InternalError","code":500}"#.to_vec()
        });
        let mut response = (self.code(), body).into_response();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        // As Go's RespondWithError: the message can echo request input.
        headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
        if let Some(seconds) = self.retry_after_seconds() {
            headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        }
        if let Some(source) = self.0.source {
            response.extensions_mut().insert(ErrorSource(source));
        }
        response
    }
}

/// `schema.GroupResource.String()` (and `GroupKind.String()`): `resource.group`, or just
/// `resource` for the core group.
pub fn group_resource(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

pub(crate) fn resource_details(group: &str, kind: &str, name: &str) -> StatusDetails {
    // Go's StatusDetails fields are `omitempty`: empty strings stay off the wire.
    let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    StatusDetails {
        group: non_empty(group),
        kind: non_empty(kind),
        name: non_empty(name),
        ..StatusDetails::default()
    }
}

#[cfg(test)]
mod tests;
