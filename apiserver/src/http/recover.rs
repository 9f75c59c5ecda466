//! A panic while a handler makes its response becomes a 500 `Status`, logged with the
//! request, instead of a dropped connection: Go's `WithPanicRecovery`. (A panic while a
//! body streams, a watch's, still ends that one connection: its head is already sent.)
//! No panic should be reachable from a request (the fuzz targets look for them); this
//! keeps one that is from costing more than that request.

use std::panic::AssertUnwindSafe;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use battery_api_machinery::status::ApiError;
use futures::FutureExt as _;

/// What a handler panicked with.
#[derive(Debug, thiserror::Error)]
#[error("a handler panicked: {0}")]
struct Panicked(String);

pub async fn recover_panics(request: Request, next: Next) -> Response {
    match AssertUnwindSafe(next.run(request)).catch_unwind().await {
        Ok(response) => response,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            ApiError::internal(Panicked(message)).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::routing::get;
    use tower::ServiceExt as _;

    async fn boom() -> &'static str {
        panic!("boom")
    }

    #[tokio::test]
    async fn a_panicking_handler_answers_a_500_status() {
        let app = Router::new()
            .route("/boom", get(boom))
            .layer(axum::middleware::from_fn(recover_panics));
        let response = app
            .oneshot(
                http::Request::get("/boom")
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .unwrap();
        let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status["reason"], "InternalError");
        assert!(
            !status["message"].as_str().unwrap().contains("boom"),
            "{status}"
        );
    }
}
