//! Responses in Kubernetes' shape: objects as JSON, errors as `Status`.

use axum::body::Body;
use http::{HeaderValue, Response, StatusCode, header};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusDetails};
use serde::Serialize;

/// `object` as `application/json` with `code`.
pub fn json(code: StatusCode, object: &impl Serialize) -> Response<Body> {
    let body = serde_json::to_vec(object).expect("API objects serialize");
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// A failure `Status` with `reason` and `message`.
pub fn failure(code: StatusCode, reason: &str, message: impl Into<String>) -> Response<Body> {
    failure_with(code, reason, message, None)
}

/// A failure `Status` with details (the kind and name it is about).
pub fn failure_with(
    code: StatusCode,
    reason: &str,
    message: impl Into<String>,
    details: Option<StatusDetails>,
) -> Response<Body> {
    let status = Status {
        status: Some("Failure".to_owned()),
        code: Some(code.as_u16().into()),
        reason: Some(reason.to_owned()),
        message: Some(message.into()),
        details,
        ..Status::default()
    };
    json(code, &status)
}

pub fn not_found(message: impl Into<String>) -> Response<Body> {
    failure(StatusCode::NOT_FOUND, "NotFound", message)
}

/// kube-apiserver's answer to a path nothing serves.
pub fn no_such_path() -> Response<Body> {
    not_found("the server could not find the requested resource")
}

pub fn bad_request(message: impl Into<String>) -> Response<Body> {
    failure(StatusCode::BAD_REQUEST, "BadRequest", message)
}

pub fn method_not_allowed(method: &http::Method) -> Response<Body> {
    failure(
        StatusCode::METHOD_NOT_ALLOWED,
        "MethodNotAllowed",
        format!("the server does not allow this method on the requested resource ({method})"),
    )
}

pub fn unauthorized() -> Response<Body> {
    failure(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
}

pub fn service_unavailable(message: impl Into<String>) -> Response<Body> {
    failure(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        message,
    )
}
