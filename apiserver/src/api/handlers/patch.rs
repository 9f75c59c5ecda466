//! patch (`apiserver:pkg/endpoints/handlers/patch.go`): JSON, merge and strategic
//! merge patches, retried on a lost race as Go's `GuaranteedUpdate`.

use axum::response::Response;
use battery_api_machinery::negotiate::Negotiated;
use battery_api_machinery::params::{PatchOptions, TableOptions};
use battery_api_machinery::patch::{apply_patch, patch_precondition};
use battery_api_machinery::status::ApiError;
use http::StatusCode;
use kube::Resource;
use serde_json::Value;

use super::shared::{Manager, decode_object, info};
use super::update::replace;
use crate::api::RequestContext;
use crate::api::respond;
use crate::api::storage::Storage;

/// A patch or apply that loses an optimistic-concurrency race is retried this often,
/// as Go's `GuaranteedUpdate` does, when the client did not pin a resourceVersion.
const PATCH_ATTEMPTS: usize = 5;

pub async fn patch<S: Storage>(
    storage: &S,
    ctx: &RequestContext,
    name: &str,
    body: &[u8],
    options: &PatchOptions,
    negotiated: &Negotiated,
) -> Result<Response, ApiError> {
    let manager = options
        .field_manager
        .clone()
        .unwrap_or_else(|| "unknown".into());
    let patch: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    let pinned = patch_precondition(options.patch_type, &patch);
    for attempt in 1..=PATCH_ATTEMPTS {
        let current = storage.get(ctx, name).await?;
        let mut document = serde_json::to_value(&current).map_err(ApiError::internal)?;
        apply_patch(options.patch_type, &mut document, &patch)?;
        let current_rv = current.meta().resource_version.clone();
        if pinned.is_some() && pinned != current_rv {
            // A resourceVersion in the patch is a precondition (the garbage collector
            // relies on it).
            return Err(ApiError::optimistic_lock(info::<S>(), name));
        }
        if let Some(meta) = document.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), current_rv.clone().into());
        }
        let (object, warnings) = decode_object::<S>(document, options.field_validation)?;
        match replace(
            storage,
            ctx,
            current,
            object,
            options.dry_run,
            Manager::Update(&manager),
        )
        .await
        {
            Ok(updated) => {
                return respond::object(
                    storage,
                    StatusCode::OK,
                    negotiated,
                    TableOptions::default(),
                    &updated,
                    &warnings,
                );
            }
            Err(e)
                if e.code() == StatusCode::CONFLICT
                    && pinned.is_none()
                    && attempt < PATCH_ATTEMPTS =>
            {
                continue;
            }
            Err(e) => return Err(e),
        }
    }
    Err(ApiError::optimistic_lock(info::<S>(), name))
}
