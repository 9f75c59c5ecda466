//! The Secrets and ConfigMaps a test creates through the stand-in, for claims' `env`
//! and `files` to name: created as kube-apiserver creates them, read back by the shared
//! get, list and watch.

use axum::body::Body;
use http::{Response, StatusCode};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::StatusDetails;
use serde_json::{Value, json};

use super::{Cluster, Collection, Stored, namespace_not_found, now, status, to_value};

impl Cluster {
    /// Creates a Secret or ConfigMap a test puts there, as kube-apiserver would: in an
    /// existing namespace, under a name not taken.
    pub(super) fn create(
        &self,
        collection: Collection,
        namespace: &str,
        mut object: Value,
    ) -> Response<Body> {
        if self.policy.current().namespace_phase(namespace).is_none() {
            return namespace_not_found(namespace);
        }
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if name.is_empty() {
            return status::failure(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                format!(
                    "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                    collection.kind()
                ),
            );
        }
        let mut state = self.state.lock().expect("state lock");
        let taken = state.created.iter().any(|o| {
            o.collection == collection
                && o.namespace() == namespace
                && o.object["metadata"]["name"] == name.as_str()
        });
        if taken {
            return status::failure_with(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", collection.plural()),
                Some(StatusDetails {
                    name: Some(name),
                    kind: Some(collection.plural().to_owned()),
                    ..StatusDetails::default()
                }),
            );
        }
        state.revision += 1;
        object["apiVersion"] = json!("v1");
        object["kind"] = json!(collection.kind());
        let metadata = &mut object["metadata"];
        metadata["namespace"] = json!(namespace);
        metadata["uid"] = json!(uuid::Uuid::new_v4().to_string());
        metadata["resourceVersion"] = json!(state.revision.to_string());
        metadata["creationTimestamp"] = to_value(&now());
        let stored = Stored {
            collection,
            created: state.revision,
            modified: state.revision,
            object: object.clone(),
        };
        state.created.push(stored.clone());
        let _ = self.changes.send(stored);
        status::json(StatusCode::CREATED, &object)
    }
}

/// A Secret as kube-apiserver keeps it: `stringData` merged into `data` (winning on a
/// clash), `type` Opaque unless given.
pub(super) fn stored_secret(mut secret: Secret) -> Secret {
    if let Some(strings) = secret.string_data.take() {
        let data = secret.data.get_or_insert_default();
        for (key, value) in strings {
            data.insert(key, k8s_openapi::ByteString(value.into_bytes()));
        }
    }
    secret.type_.get_or_insert_with(|| "Opaque".to_owned());
    secret
}
