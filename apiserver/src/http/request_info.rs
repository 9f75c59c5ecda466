//! The layer that reads what a request asks for, once (`apiserver:pkg/endpoints/filters/
//! requestinfo.go` `WithRequestInfo`): metrics, authorization and dispatch take the
//! [`RequestInfo`] it leaves in the request's extensions instead of parsing again
//! (authorization and dispatch with the machinery's
//! [`request_info::of`](battery_api_machinery::request_info::of)).

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use battery_api_machinery::request_info::RequestInfo;

/// Parses the request's method and URL into its [`RequestInfo`]. A path that does not
/// parse (a malformed `%` escape) is answered 400 here, before anyone acts on it.
pub async fn parse(mut request: Request, next: Next) -> Response {
    match RequestInfo::parse(
        request.method(),
        request.uri().path(),
        request.uri().query(),
    ) {
        Ok(info) => {
            request.extensions_mut().insert(info);
            next.run(request).await
        }
        Err(error) => error.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::Body;
    use axum::extract::Request;
    use axum::routing::any;
    use battery_api_machinery::request_info::of;
    use http::StatusCode;
    use tower::ServiceExt;

    use super::*;

    /// A router whose one handler answers with the resource the layer read.
    fn app() -> Router {
        Router::new()
            .fallback(any(|request: Request| async move {
                match of(request.extensions()) {
                    Ok(info) => format!("{} {}", info.verb, info.resource).into_response(),
                    Err(error) => error.into_response(),
                }
            }))
            .layer(axum::middleware::from_fn(parse))
    }

    async fn send(uri: &str) -> (StatusCode, String) {
        let request = http::Request::delete(uri).body(Body::empty()).unwrap();
        let response = app().oneshot(request).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn the_layer_leaves_the_request_info_for_handlers_and_answers_a_bad_path_itself() {
        assert_eq!(
            send("/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/ns/pools/p").await,
            (StatusCode::OK, "delete pools".to_owned())
        );
        let (status, body) = send("/apis/battery.liquidmetal-x.dev/v1alpha1/pools/%zz").await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(body.contains("\"kind\":\"Status\""), "{body}");
    }

    #[tokio::test]
    async fn a_handler_the_layer_did_not_run_for_answers_500() {
        let response = Router::new()
            .fallback(any(|request: Request| async move {
                of(request.extensions()).map(|_| ()).into_response()
            }))
            .oneshot(http::Request::get("/healthz").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
