use std::io;

use axum::body::to_bytes;
use battery_types::{HasResourceInfo, Pool};
use serde_json::{Value, json};

use super::*;
use crate::request_info::RequestInfo;

const POOLS: &ResourceInfo = &Pool::INFO;

fn status_json(error: &ApiError) -> Value {
    serde_json::to_value(error.to_status()).unwrap()
}

#[test]
fn reasons_fix_codes() {
    let cases = [
        (Reason::BadRequest, 400),
        (Reason::Unauthorized, 401),
        (Reason::Forbidden, 403),
        (Reason::NotFound, 404),
        (Reason::MethodNotAllowed, 405),
        (Reason::NotAcceptable, 406),
        (Reason::AlreadyExists, 409),
        (Reason::Conflict, 409),
        (Reason::Expired, 410),
        (Reason::Gone, 410),
        (Reason::RequestEntityTooLarge, 413),
        (Reason::UnsupportedMediaType, 415),
        (Reason::Invalid, 422),
        (Reason::TooManyRequests, 429),
        (Reason::InternalError, 500),
        (Reason::ServerTimeout, 500),
        (Reason::ServiceUnavailable, 503),
        (Reason::Timeout, 504),
    ];
    for (reason, code) in cases {
        assert_eq!(reason.code().as_u16(), code, "{reason}");
        assert_eq!(
            ApiError::new(reason, "m").to_status().code,
            Some(i32::from(code))
        );
        assert_eq!(format!("{reason:?}"), reason.as_str());
    }
}

#[test]
fn not_found_status() {
    assert_eq!(
        status_json(&ApiError::not_found(POOLS, "x")),
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "pools.battery.liquidmetal-x.dev \"x\" not found",
            "reason": "NotFound",
            "details": {"name": "x", "group": "battery.liquidmetal-x.dev", "kind": "pools"},
            "code": 404,
        })
    );
}

#[test]
fn messages_in_go_words() {
    let cases = [
        (
            ApiError::already_exists(POOLS, "x"),
            "pools.battery.liquidmetal-x.dev \"x\" already exists",
        ),
        (
            ApiError::optimistic_lock(POOLS, "x"),
            "Operation cannot be fulfilled on pools.battery.liquidmetal-x.dev \"x\": the object has been modified; please apply your changes to the latest version and try again",
        ),
        (
            ApiError::conflict(
                POOLS,
                "x",
                "Precondition failed: UID in precondition: a, UID in object meta: b",
            ),
            "Operation cannot be fulfilled on pools.battery.liquidmetal-x.dev \"x\": Precondition failed: UID in precondition: a, UID in object meta: b",
        ),
        (
            ApiError::method_not_allowed(POOLS, "deletecollection"),
            "deletecollection is not supported on resources of kind \"pools.battery.liquidmetal-x.dev\"",
        ),
        (
            ApiError::not_acceptable(&["application/json", "application/yaml"]),
            "only the following media types are accepted: application/json, application/yaml",
        ),
        (
            ApiError::unsupported_media_type(&[
                "application/json-patch+json",
                "application/merge-patch+json",
            ]),
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json",
        ),
        (ApiError::unauthorized(""), "not authorized"),
        (ApiError::unauthorized("Unauthorized"), "Unauthorized"),
        (
            ApiError::timeout("request did not complete within the allotted timeout"),
            "Timeout: request did not complete within the allotted timeout",
        ),
        (
            ApiError::request_entity_too_large("limit is 3145728"),
            "Request entity too large: limit is 3145728",
        ),
        (
            ApiError::server_timeout(POOLS, "create", 2),
            "The create operation against pools.battery.liquidmetal-x.dev could not be completed at this time, please try again.",
        ),
        (
            ApiError::expired("too old resource version: 1 (5)"),
            "too old resource version: 1 (5)",
        ),
        // Names are quoted as Go's %q: control and invisible characters escaped.
        (
            ApiError::not_found(POOLS, "a\"b\\c\n\u{7}\u{1b}\u{202e}\u{1F600}é"),
            "pools.battery.liquidmetal-x.dev \"a\\\"b\\\\c\\n\\a\\x1b\\u202e\u{1F600}é\" not found",
        ),
    ];
    for (error, want) in cases {
        assert_eq!(error.message(), want);
    }
    assert_eq!(ApiError::expired("m").reason(), Reason::Expired);
    assert_eq!(ApiError::gone("m").reason(), Reason::Gone);
    let timeout = status_json(&ApiError::server_timeout(POOLS, "create", 2));
    assert_eq!(
        timeout["details"],
        json!({"name": "create", "group": "battery.liquidmetal-x.dev", "kind": "pools", "retryAfterSeconds": 2})
    );
}

#[test]
fn invalid_lists_causes() {
    let errors = [
        FieldError::invalid("spec.size", -1, "must be greater than or equal to 0"),
        FieldError::required("spec.template.kernel.image", ""),
        FieldError::not_supported(
            "spec.replenishment.type",
            "Sometimes",
            &["ImmediateOnLease", "Manual"],
        ),
        // A repeated message is printed once but still listed as a cause.
        FieldError::required("spec.template.kernel.image", ""),
    ];
    let error = ApiError::invalid(POOLS, "x", &errors);
    assert_eq!(error.code(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        error.message(),
        "Pool.battery.liquidmetal-x.dev \"x\" is invalid: [spec.size: Invalid value: -1: must be greater than or equal to 0, spec.template.kernel.image: Required value, spec.replenishment.type: Unsupported value: \"Sometimes\": supported values: \"ImmediateOnLease\", \"Manual\"]"
    );
    let status = status_json(&error);
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(status["details"]["kind"], "Pool");
    assert_eq!(status["details"]["name"], "x");
    assert_eq!(status["details"]["group"], "battery.liquidmetal-x.dev");
    assert_eq!(
        status["details"]["causes"][0],
        json!({"reason": "FieldValueInvalid", "message": "Invalid value: -1: must be greater than or equal to 0", "field": "spec.size"})
    );
    assert_eq!(
        status["details"]["causes"][1]["reason"],
        "FieldValueRequired"
    );
    assert_eq!(status["details"]["causes"].as_array().unwrap().len(), 4);

    let one = ApiError::invalid(POOLS, "x", &errors[..1]);
    assert_eq!(
        one.message(),
        "Pool.battery.liquidmetal-x.dev \"x\" is invalid: spec.size: Invalid value: -1: must be greater than or equal to 0"
    );
    assert_eq!(
        ApiError::invalid(POOLS, "x", &[]).message(),
        "Pool.battery.liquidmetal-x.dev \"x\" is invalid"
    );
    // Options errors name meta.k8s.io and an empty object name.
    let options = ApiError::invalid_kind(
        "meta.k8s.io",
        "CreateOptions",
        "",
        &[FieldError::forbidden("force", "no")],
    );
    assert_eq!(
        options.message(),
        "CreateOptions.meta.k8s.io \"\" is invalid: force: Forbidden: no"
    );
    assert_eq!(
        status_json(&options)["details"],
        json!({"group": "meta.k8s.io", "kind": "CreateOptions", "causes": [{"reason": "FieldValueForbidden", "message": "Forbidden: no", "field": "force"}]})
    );
}

#[test]
fn apply_conflict_lists_fields() {
    let cause = StatusCause {
        reason: Some("FieldManagerConflict".into()),
        message: Some("conflict with \"kubectl-edit\"".into()),
        field: Some(".spec.size".into()),
    };
    let error = ApiError::apply_conflict(
        vec![cause],
        "Apply failed with 1 conflict: conflict with \"kubectl-edit\": .spec.size",
    );
    assert_eq!(error.code(), StatusCode::CONFLICT);
    assert_eq!(
        status_json(&error)["details"],
        json!({"causes": [{"reason": "FieldManagerConflict", "message": "conflict with \"kubectl-edit\"", "field": ".spec.size"}]})
    );
}

fn request(
    verb: &str,
    path: &str,
    namespace: &str,
    resource: &str,
    subresource: &str,
    name: &str,
) -> RequestInfo {
    RequestInfo {
        is_resource_request: !resource.is_empty(),
        path: path.into(),
        verb: verb.into(),
        api_group: if resource.is_empty() {
            String::new()
        } else {
            "battery.liquidmetal-x.dev".into()
        },
        namespace: namespace.into(),
        resource: resource.into(),
        subresource: subresource.into(),
        name: name.into(),
        ..Default::default()
    }
}

#[test]
fn forbidden_sentences() {
    let cases = [
        (
            request("get", "", "default", "pools", "", "x"),
            "",
            "pools.battery.liquidmetal-x.dev \"x\" is forbidden: User \"alice\" cannot get resource \"pools\" in API group \"battery.liquidmetal-x.dev\" in the namespace \"default\"",
        ),
        (
            request("list", "", "", "hosts", "", ""),
            "no RBAC policy matched",
            "hosts.battery.liquidmetal-x.dev is forbidden: User \"alice\" cannot list resource \"hosts\" in API group \"battery.liquidmetal-x.dev\" at the cluster scope: no RBAC policy matched",
        ),
        (
            request("create", "", "ns", "microvmclaims", "exec", "c"),
            "",
            "microvmclaims.battery.liquidmetal-x.dev \"c\" is forbidden: User \"alice\" cannot create resource \"microvmclaims/exec\" in API group \"battery.liquidmetal-x.dev\" in the namespace \"ns\"",
        ),
        (
            request("get", "/metrics<script>", "", "", "", ""),
            "",
            "forbidden: User \"alice\" cannot get path \"/metrics&lt;script&gt;\"",
        ),
    ];
    for (info, reason, want) in cases {
        let error = ApiError::forbidden("alice", &info, reason);
        assert_eq!(error.reason(), Reason::Forbidden);
        assert_eq!(error.message(), want);
    }
    let details = status_json(&ApiError::forbidden(
        "alice",
        &request("get", "", "d", "pools", "status", "x"),
        "",
    ));
    assert_eq!(
        details["details"],
        json!({"name": "x", "group": "battery.liquidmetal-x.dev", "kind": "pools"})
    );
    let non_resource = status_json(&ApiError::forbidden(
        "alice",
        &request("get", "/x", "", "", "", ""),
        "",
    ));
    assert_eq!(non_resource["details"], json!({}));
}

#[tokio::test]
async fn into_response_writes_a_status() {
    let response = ApiError::not_found(POOLS, "x").into_response();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
    assert_eq!(response.headers()[X_CONTENT_TYPE_OPTIONS], "nosniff");
    assert!(response.headers().get(RETRY_AFTER).is_none());
    assert!(response.extensions().get::<ErrorSource>().is_none());
    let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body, status_json(&ApiError::not_found(POOLS, "x")));
}

#[tokio::test]
async fn retry_after_header() {
    let response = ApiError::too_many_requests("slow down", 7).into_response();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()[RETRY_AFTER], "7");
    let body: Value =
        serde_json::from_slice(&to_bytes(response.into_body(), usize::MAX).await.unwrap()).unwrap();
    assert_eq!(body["details"], json!({"retryAfterSeconds": 7}));

    let unavailable = ApiError::service_unavailable("battery is unavailable")
        .with_retry_after(3)
        .into_response();
    assert_eq!(unavailable.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(unavailable.headers()[RETRY_AFTER], "3");
    // Zero means no advice, and no header, as in Go.
    let none = ApiError::too_many_requests("slow down", 0);
    assert_eq!(none.retry_after_seconds(), None);
    assert!(none.into_response().headers().get(RETRY_AFTER).is_none());
}

#[tokio::test]
async fn internal_cause_stays_out_of_the_body() {
    let secret = io::Error::other("lease 7f3a-secret expired on host h1");
    let error = ApiError::internal(secret);
    assert_eq!(
        error.source().map(|s| s.to_string()).as_deref(),
        Some("lease 7f3a-secret expired on host h1")
    );
    let response = error.into_response();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let source = response
        .extensions()
        .get::<ErrorSource>()
        .expect("source for the logging layer");
    assert!(source.0.to_string().contains("7f3a-secret"));
    let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(!text.contains("secret"), "{text}");
    let body: Value = serde_json::from_slice(text.as_bytes()).unwrap();
    assert_eq!(body["reason"], "InternalError");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("Internal error occurred: ")
    );

    // Any error can carry a source without showing it.
    let unavailable = ApiError::service_unavailable("battery is unavailable")
        .with_source(io::Error::other("dial 10.0.0.1:9090"));
    let response = unavailable.into_response();
    assert!(response.extensions().get::<ErrorSource>().is_some());
    let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
    assert!(!String::from_utf8_lossy(&body).contains("10.0.0.1"));
}
