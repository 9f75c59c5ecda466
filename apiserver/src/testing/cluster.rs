//! A stand-in for the cluster's kube-apiserver, for router-level tests of what the server
//! asks of it.

use std::sync::Arc;

use axum::Router;
use http::StatusCode;
use serde_json::{Value, json};

use crate::dev::pki::DEV_USER;

/// A stand-in for the kube-apiserver of the cluster served, answering only what the
/// server asks of it: namespaces (`default` active, `dying` terminating, others missing),
/// ResourceQuotas (none), Event creation (recorded; a repeated name is a 409, as in Kubernetes) and
/// SubjectAccessReviews from a written policy (each review recorded too).
pub async fn fake_kube_apiserver() -> (kube::Client, Arc<std::sync::Mutex<Vec<Value>>>) {
    use axum::extract::{Path, State};
    use axum::routing::{get, post};
    type Events = Arc<std::sync::Mutex<Vec<Value>>>;
    async fn namespace(Path(name): Path<String>) -> (StatusCode, axum::Json<Value>) {
        let phase = match name.as_str() {
            "default" => "Active",
            "dying" => "Terminating",
            _ => {
                let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                    "code": 404, "message": format!("namespaces \"{name}\" not found")});
                return (StatusCode::NOT_FOUND, axum::Json(status));
            }
        };
        let ns = json!({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": name}, "status": {"phase": phase}});
        (StatusCode::OK, axum::Json(ns))
    }
    async fn event(
        State(events): State<Events>,
        axum::Json(event): axum::Json<Value>,
    ) -> (StatusCode, axum::Json<Value>) {
        let mut events = events.lock().unwrap();
        if events
            .iter()
            .any(|e| e["metadata"]["name"] == event["metadata"]["name"])
        {
            let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "AlreadyExists", "code": 409});
            return (StatusCode::CONFLICT, axum::Json(status));
        }
        events.push(event.clone());
        (StatusCode::CREATED, axum::Json(event))
    }
    /// The policy: the dev ServiceAccount may do everything, `viewer` may read pools.
    async fn review(
        State(events): State<Events>,
        axum::Json(mut review): axum::Json<Value>,
    ) -> axum::Json<Value> {
        events
            .lock()
            .unwrap()
            .push(json!({"review": review["spec"].clone()}));
        let spec = &review["spec"];
        let user = spec["user"].as_str().unwrap_or_default();
        let verb = spec["resourceAttributes"]["verb"]
            .as_str()
            .unwrap_or_default();
        let allowed = user == DEV_USER
            || (user == "viewer"
                && matches!(verb, "get" | "list" | "watch")
                && spec["resourceAttributes"]["resource"] == "pools");
        review["status"] = json!({"allowed": allowed, "reason": if allowed { "" } else { "no RBAC policy matched" }});
        axum::Json(review)
    }
    /// Tokens: `sa-token` is the dev ServiceAccount's, `bob-token` bob's; any other (a
    /// deleted ServiceAccount's) is not authenticated.
    async fn token_review(
        axum::Json(mut review): axum::Json<Value>,
    ) -> Result<axum::Json<Value>, StatusCode> {
        if review["spec"]["token"] == "breaks-the-webhook" {
            return Err(StatusCode::INTERNAL_SERVER_ERROR);
        }
        let user = match review["spec"]["token"].as_str() {
            Some("sa-token") => Some(DEV_USER),
            Some("bob-token") => Some("bob"),
            _ => None,
        };
        review["status"] = match user {
            Some(name) => {
                json!({"authenticated": true, "user": {"username": name, "groups": ["system:serviceaccounts"]}})
            }
            None => json!({"authenticated": false, "error": "token has been invalidated"}),
        };
        Ok(axum::Json(review))
    }
    /// No namespace has a ResourceQuota, so claims bind unlimited.
    async fn no_quotas() -> axum::Json<Value> {
        axum::Json(
            json!({"kind": "ResourceQuotaList", "apiVersion": "v1", "metadata": {}, "items": []}),
        )
    }
    let events: Events = Arc::default();
    let app = Router::new()
        .route(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            post(token_review),
        )
        .route("/api/v1/namespaces/{name}", get(namespace))
        .route("/api/v1/namespaces/{ns}/events", post(event))
        .route("/api/v1/namespaces/{ns}/resourcequotas", get(no_quotas))
        .route(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            post(review),
        )
        .with_state(events.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    (client, events)
}
