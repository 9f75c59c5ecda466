//! Merge patches (RFC 7386), JSON patches (RFC 6902) and strategic merge patches of kinds
//! with no list to merge by key, applied to an object's JSON, as Go's
//! `apiserver:pkg/endpoints/handlers/patch.go` applies them before it decodes and
//! validates the result. Server-side apply is not a patch of this kind: it merges by
//! field ownership, in the server.

use serde_json::{Map, Value};

use crate::negotiate::PatchType;
use crate::status::{ApiError, Reason};

/// Go caps JSON patches at this many operations (`patch.go` `maxJSONPatchOperations`).
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// The resourceVersion `patch` itself sets: a precondition the write must meet, where a
/// patch without one applies to whatever version is current (and is retried on a
/// conflict), as Go's patch handler does. Not the version of the object it is applied to.
pub fn patch_precondition(kind: PatchType, patch: &Value) -> Option<String> {
    let value = match kind {
        PatchType::JsonPatch => patch
            .as_array()?
            .iter()
            .rev()
            .find(|op| {
                op["path"] == "/metadata/resourceVersion"
                    && matches!(op["op"].as_str(), Some("add" | "replace"))
            })
            .map(|op| &op["value"]),
        _ => patch.pointer("/metadata/resourceVersion"),
    };
    value.and_then(Value::as_str).map(str::to_owned)
}

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
        PatchType::StrategicMergePatch => {
            let (Value::Object(original), Value::Object(patch)) = (&*document, patch) else {
                return Err(ApiError::bad_request(
                    "a strategic merge patch must be a JSON object",
                ));
            };
            *document =
                Value::Object(strategic_merge(original.clone(), patch)?.unwrap_or_default());
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

/// The `$patch` directive: what to do with the map it sits in.
const PATCH_DIRECTIVE: &str = "$patch";
/// The `$retainKeys` directive: the keys of the map to keep, the rest cleared.
const RETAIN_KEYS_DIRECTIVE: &str = "$retainKeys";

/// `strategicpatch.mergeMap` (`apimachinery:pkg/util/strategicpatch/patch.go`) for a kind
/// whose lists are all atomic, so that a list is replaced like any other value: a merge
/// patch that also honours the map directives `$patch` (`replace`, `delete`, `merge`) and
/// `$retainKeys`. `None` when the patch deletes the map. List directives
/// (`$setElementOrder/…`, `$deleteFromPrimitiveList/…`) name a list merged by key, which
/// such a kind has not: they are refused.
fn strategic_merge(
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
) -> Result<Option<Map<String, Value>>, ApiError> {
    let mut patch = patch.clone();
    match patch.remove(PATCH_DIRECTIVE) {
        None => {}
        Some(Value::String(directive)) => match directive.as_str() {
            "delete" => return Ok(None),
            "replace" => original.clear(),
            "merge" => {}
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown patch type: {other} in map"
                )));
            }
        },
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown patch type: {other} in map"
            )));
        }
    }
    if let Some(retain) = patch.remove(RETAIN_KEYS_DIRECTIVE) {
        let keys: Vec<String> = serde_json::from_value(retain).map_err(|_| {
            ApiError::bad_request("the $retainKeys directive must be a list of strings")
        })?;
        if let Some(stray) = patch.keys().find(|key| !keys.contains(key)) {
            return Err(ApiError::bad_request(format!(
                "the patch has {stray:?}, which its $retainKeys directive does not list"
            )));
        }
        original.retain(|key, _| keys.contains(key));
    }
    if let Some(directive) = patch.keys().find(|key| key.starts_with('$')) {
        return Err(ApiError::bad_request(format!(
            "unknown patch directive {directive:?}: the object has no list to merge by key"
        )));
    }
    for (key, value) in patch {
        match value {
            Value::Null => {
                original.remove(&key);
            }
            Value::Object(nested) => {
                let current = match original.remove(&key) {
                    Some(Value::Object(current)) => current,
                    _ => Map::new(),
                };
                if let Some(merged) = strategic_merge(current, &nested)? {
                    original.insert(key, Value::Object(merged));
                }
            }
            value => {
                original.insert(key, value);
            }
        }
    }
    Ok(Some(original))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Found by the `patches` fuzz target: json-patch's own undo panicked on it.
    #[test]
    fn only_a_resource_version_the_patch_sets_is_a_precondition() {
        let merge = json!({"metadata": {"resourceVersion": "7"}, "spec": {"size": 2}});
        assert_eq!(
            patch_precondition(PatchType::MergePatch, &merge).as_deref(),
            Some("7")
        );
        let unpinned = json!({"spec": {"size": 2}});
        for kind in [PatchType::MergePatch, PatchType::StrategicMergePatch] {
            assert_eq!(patch_precondition(kind, &unpinned), None);
        }
        let json_patch = json!([
            {"op": "replace", "path": "/spec/size", "value": 2},
            {"op": "replace", "path": "/metadata/resourceVersion", "value": "9"},
        ]);
        assert_eq!(
            patch_precondition(PatchType::JsonPatch, &json_patch).as_deref(),
            Some("9")
        );
        let tested = json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "9"}]);
        assert_eq!(patch_precondition(PatchType::JsonPatch, &tested), None);
    }

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

    fn strategic(document: Value, patch: Value) -> Result<Value, ApiError> {
        let mut document = document;
        apply_patch(PatchType::StrategicMergePatch, &mut document, &patch)?;
        Ok(document)
    }

    #[test]
    fn a_strategic_merge_patch_merges_maps_and_replaces_the_rest() {
        let scale = json!({
            "metadata": {"name": "dev", "labels": {"a": "1", "b": "2"}},
            "spec": {"replicas": 2},
            "status": {"replicas": 2, "selector": "x=y"},
        });
        // What `kubectl patch --subresource=scale` sends by default.
        let patched = strategic(scale.clone(), json!({"spec": {"replicas": 5}})).unwrap();
        assert_eq!(patched["spec"], json!({"replicas": 5}));
        assert_eq!(patched["status"], scale["status"]);
        // null deletes; a map into a missing key is written without its nulls.
        let patched = strategic(
            scale.clone(),
            json!({"metadata": {"labels": {"a": null}, "annotations": {"k": "v", "gone": null}}}),
        )
        .unwrap();
        assert_eq!(
            patched["metadata"],
            json!({"name": "dev", "labels": {"b": "2"}, "annotations": {"k": "v"}})
        );
    }

    #[test]
    fn strategic_merge_directives_replace_delete_and_retain() {
        let document =
            json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"replicas": 2}});
        let replaced = strategic(
            document.clone(),
            json!({"metadata": {"labels": {"$patch": "replace", "c": "3"}}}),
        )
        .unwrap();
        assert_eq!(replaced["metadata"]["labels"], json!({"c": "3"}));
        let deleted = strategic(
            document.clone(),
            json!({"metadata": {"labels": {"$patch": "delete"}}}),
        )
        .unwrap();
        assert_eq!(deleted["metadata"], json!({}));
        let retained = strategic(
            document.clone(),
            json!({"metadata": {"labels": {"$retainKeys": ["b", "c"], "c": "3"}}}),
        )
        .unwrap();
        assert_eq!(retained["metadata"]["labels"], json!({"b": "2", "c": "3"}));
        assert_eq!(
            strategic(
                document.clone(),
                json!({"$patch": "merge", "spec": {"replicas": 3}})
            )
            .unwrap()["spec"],
            json!({"replicas": 3})
        );
    }

    #[test]
    fn a_bad_strategic_merge_patch_is_a_bad_request() {
        let document = json!({"spec": {"replicas": 2}});
        for patch in [
            json!([{"op": "add", "path": "/spec", "value": {}}]),
            json!({"spec": {"$patch": "sideways"}}),
            json!({"spec": {"$retainKeys": "replicas"}}),
            json!({"spec": {"$retainKeys": ["other"], "replicas": 1}}),
            json!({"$setElementOrder/spec": []}),
        ] {
            let error = strategic(document.clone(), patch.clone()).unwrap_err();
            assert_eq!(error.reason(), Reason::BadRequest, "{patch}");
        }
    }
}
