//! `resourcequotas` of the core group, as kube-apiserver serves what battery-apiserver and
//! the tests use of them: list in a namespace, get, create (the tests make quotas), and
//! the `status` subresource (get, `PUT`, `PATCH` as a JSON merge patch). There is no quota
//! controller: only what battery-apiserver writes appears in a status. Their
//! resourceVersions come from a counter of their own, not the other objects'.

use std::collections::BTreeMap;
use std::sync::Mutex;

use axum::body::Body;
use http::{HeaderMap, Method, Response, StatusCode, header};
use k8s_openapi::api::core::v1::{ResourceQuota, ResourceQuotaStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, StatusDetails};
use serde_json::{Value, json};

use super::status;

struct State {
    revision: u64,
    /// By namespace and name: lists come out in the order kube-apiserver gives them.
    items: BTreeMap<(String, String), ResourceQuota>,
}

pub struct Quotas {
    state: Mutex<State>,
}

impl Default for Quotas {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                revision: 1,
                items: BTreeMap::new(),
            }),
        }
    }
}

impl Quotas {
    /// Answers `/api/v1/namespaces/<namespace>/resourcequotas<rest>`; `exists` says whether
    /// the namespace does.
    pub async fn handle(
        &self,
        namespace: &str,
        exists: bool,
        rest: &[&str],
        method: &Method,
        headers: &HeaderMap,
        body: Body,
    ) -> Response<Body> {
        match (rest, method) {
            ([], &Method::GET) => self.list(namespace),
            ([], &Method::POST) => match super::cluster::read::<ResourceQuota>(body).await {
                Ok(quota) if exists => self.create(namespace, quota),
                Ok(_) => super::cluster::namespace_not_found(namespace),
                Err(response) => response,
            },
            ([name] | [name, "status"], &Method::GET) => match self.get(namespace, name) {
                Some(quota) => status::json(StatusCode::OK, &quota),
                None => not_found(name),
            },
            ([name, "status"], &Method::PUT) => {
                match super::cluster::read::<ResourceQuota>(body).await {
                    Ok(quota) => self.put_status(namespace, name, quota),
                    Err(response) => response,
                }
            }
            ([name, "status"], &Method::PATCH) => {
                let content_type = headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default();
                // For the maps of a quota's status, a strategic merge patch is a merge patch.
                if !matches!(
                    content_type,
                    "application/merge-patch+json" | "application/strategic-merge-patch+json"
                ) {
                    return status::failure(
                        StatusCode::UNSUPPORTED_MEDIA_TYPE,
                        "UnsupportedMediaType",
                        format!(
                            "the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json; got {content_type:?}"
                        ),
                    );
                }
                match super::cluster::read::<Value>(body).await {
                    Ok(patch) => self.patch_status(namespace, name, &patch),
                    Err(response) => response,
                }
            }
            ([] | [_] | [_, "status"], _) => status::method_not_allowed(method),
            _ => status::no_such_path(),
        }
    }

    fn list(&self, namespace: &str) -> Response<Body> {
        let state = self.state.lock().expect("quota lock");
        let items: Vec<&ResourceQuota> = state
            .items
            .iter()
            .filter(|((ns, _), _)| ns == namespace)
            .map(|(_, quota)| quota)
            .collect();
        status::json(
            StatusCode::OK,
            &json!({
                "apiVersion": "v1",
                "kind": "ResourceQuotaList",
                "metadata": ListMeta { resource_version: Some(state.revision.to_string()), ..ListMeta::default() },
                "items": items,
            }),
        )
    }

    fn get(&self, namespace: &str, name: &str) -> Option<ResourceQuota> {
        let state = self.state.lock().expect("quota lock");
        state
            .items
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// As kube-apiserver's strategy does, a new quota's status starts empty.
    fn create(&self, namespace: &str, mut quota: ResourceQuota) -> Response<Body> {
        let Some(name) = quota.metadata.name.clone().filter(|n| !n.is_empty()) else {
            return status::failure(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                "ResourceQuota \"\" is invalid: metadata.name: Required value: name or generateName is required",
            );
        };
        let mut state = self.state.lock().expect("quota lock");
        let key = (namespace.to_owned(), name.clone());
        if state.items.contains_key(&key) {
            return status::failure_with(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("resourcequotas \"{name}\" already exists"),
                details(&name),
            );
        }
        state.revision += 1;
        let metadata = &mut quota.metadata;
        metadata.namespace = Some(namespace.to_owned());
        metadata.uid = Some(uuid::Uuid::new_v4().to_string());
        metadata.resource_version = Some(state.revision.to_string());
        metadata.creation_timestamp = Some(super::cluster::now());
        quota.status = None;
        state.items.insert(key, quota.clone());
        status::json(StatusCode::CREATED, &quota)
    }

    /// A status write: only `status` changes, after the resourceVersion precondition.
    fn put_status(&self, namespace: &str, name: &str, new: ResourceQuota) -> Response<Body> {
        self.write_status(namespace, name, |quota| {
            if let Some(wanted) = new.metadata.resource_version.as_deref()
                && quota.metadata.resource_version.as_deref() != Some(wanted)
            {
                return Err(Box::new(status::failure_with(
                    StatusCode::CONFLICT,
                    "Conflict",
                    format!("Operation cannot be fulfilled on resourcequotas \"{name}\": the object has been modified; please apply your changes to the latest version and try again"),
                    details(name),
                )));
            }
            Ok(new.status)
        })
    }

    /// A merge patch of the whole object, of which the status subresource keeps only
    /// `status`.
    fn patch_status(&self, namespace: &str, name: &str, patch: &Value) -> Response<Body> {
        self.write_status(namespace, name, |quota| {
            let mut object = serde_json::to_value(quota).expect("quotas serialize");
            json_patch::merge(&mut object, patch);
            serde_json::from_value::<ResourceQuota>(object)
                .map(|patched| patched.status)
                .map_err(|e| {
                    Box::new(status::bad_request(format!(
                        "the patched object is not a ResourceQuota: {e}"
                    )))
                })
        })
    }

    /// Replaces the quota's status with what `change` makes of the quota, as one step.
    fn write_status(
        &self,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&ResourceQuota) -> Result<Option<ResourceQuotaStatus>, Box<Response<Body>>>,
    ) -> Response<Body> {
        let mut state = self.state.lock().expect("quota lock");
        let revision = state.revision + 1;
        let Some(quota) = state
            .items
            .get_mut(&(namespace.to_owned(), name.to_owned()))
        else {
            return not_found(name);
        };
        match change(quota) {
            Ok(new) => quota.status = new,
            Err(response) => return *response,
        }
        quota.metadata.resource_version = Some(revision.to_string());
        let quota = quota.clone();
        state.revision = revision;
        status::json(StatusCode::OK, &quota)
    }
}

fn not_found(name: &str) -> Response<Body> {
    status::failure_with(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("resourcequotas \"{name}\" not found"),
        details(name),
    )
}

fn details(name: &str) -> Option<StatusDetails> {
    Some(StatusDetails {
        name: Some(name.to_owned()),
        kind: Some("resourcequotas".to_owned()),
        ..StatusDetails::default()
    })
}
