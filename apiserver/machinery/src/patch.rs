//! Merge patches (RFC 7386) and JSON patches (RFC 6902) applied to an object's JSON, as
//! Go's `apiserver:pkg/endpoints/handlers/patch.go` applies them before it decodes and
//! validates the result. Server-side apply is not a patch of this kind: it merges by
//! field ownership, in the server.

use serde_json::Value;

use crate::negotiate::PatchType;
use crate::status::{ApiError, Reason};

/// Go caps JSON patches at this many operations (`patch.go` `maxJSONPatchOperations`).
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// Applies `patch` to `document`: 400 for a patch that is not of its type's shape, 413
/// for too many JSON patch operations, 422 for an operation that cannot apply (a failed
/// `test`, a missing path).
pub fn apply_patch(kind: PatchType, document: &mut Value, patch: &Value) -> Result<(), ApiError> {
    match kind {
        PatchType::MergePatch => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("a merge patch must be a JSON object"));
            }
            json_patch::merge(document, patch);
            Ok(())
        }
        PatchType::JsonPatch => {
            let operations: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            if operations.0.len() > MAX_JSON_PATCH_OPERATIONS {
                return Err(ApiError::request_entity_too_large(format!(
                    "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
                    operations.0.len()
                )));
            }
            // `json_patch::patch` undoes a failed patch in place, and panics where the undo
            // itself fails (a `copy` to a path, then a `move` from it to a missing parent):
            // patch a copy instead, kept only when every operation applied.
            let mut patched = document.clone();
            json_patch::patch_unsafe(&mut patched, &operations).map_err(|e| {
                ApiError::new(
                    Reason::Invalid,
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?;
            *document = patched;
            Ok(())
        }
        // The server hands apply patches to server-side apply before any document is
        // patched.
        PatchType::Apply => Err(ApiError::internal(std::io::Error::other(
            "an apply patch reached the JSON patch path",
        ))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Found by the `patches` fuzz target: json-patch's own undo panicked on it.
    #[test]
    fn a_failed_json_patch_leaves_the_document_as_it_was() {
        let original = json!({"metadata": {"name": "p"}, "spec": {"template": {"vcpu": 1}}});
        let patch = json!([
            {"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}},
            {"op": "copy", "from": "/spec/template", "path": "/spec/x"},
            {"op": "move", "from": "/spec/x", "path": "/missing/y"},
        ]);
        let mut document = original.clone();
        let error = apply_patch(PatchType::JsonPatch, &mut document, &patch).unwrap_err();
        assert_eq!(error.reason(), Reason::Invalid);
        assert_eq!(document, original);
    }

    #[test]
    fn a_json_patch_applies_every_operation() {
        let mut document = json!({"spec": {"size": 1}});
        let patch = json!([
            {"op": "test", "path": "/spec/size", "value": 1},
            {"op": "replace", "path": "/spec/size", "value": 2},
        ]);
        apply_patch(PatchType::JsonPatch, &mut document, &patch).unwrap();
        assert_eq!(document, json!({"spec": {"size": 2}}));
    }
}
