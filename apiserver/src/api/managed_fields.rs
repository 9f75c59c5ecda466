//! `managedFields`, reduced from structured-merge-diff to what our kinds need (the apply
//! handler in `apply.rs` builds on it): every list is atomic (none of our lists is a map list), a field set is the
//! set of leaf paths under `spec` and `metadata.labels`/`metadata.annotations`, and
//! ownership moves as in Kubernetes — an update takes the fields it changed from their
//! previous owners; an apply owns exactly the fields it applied, removes the ones it
//! applied before and no longer does, and conflicts with another manager's differing
//! value unless `force` is set (`reference/aggregated-apiserver.md` §5.6).

use std::collections::{BTreeMap, BTreeSet};

use battery_api_machinery::status::ApiError;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use serde_json::{Map, Value};

use super::storage::ApiObject;
use crate::clock::server_now;

/// A field's path from the object's root.
pub(super) type Path = Vec<String>;

pub(super) const OPERATION_APPLY: &str = "Apply";
const OPERATION_UPDATE: &str = "Update";

/// The leaf paths of the parts of an object managers own.
pub(super) fn leaves(object: &Value) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    if let Some(spec) = object.get("spec") {
        collect(spec, &mut vec!["spec".to_owned()], &mut out);
    }
    for part in ["labels", "annotations"] {
        if let Some(map) = object.pointer(&format!("/metadata/{part}")) {
            collect(
                map,
                &mut vec!["metadata".to_owned(), part.to_owned()],
                &mut out,
            );
        }
    }
    out
}

fn collect(value: &Value, path: &mut Path, out: &mut BTreeSet<Path>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                path.push(k.clone());
                collect(v, path, out);
                path.pop();
            }
        }
        // Scalars, atomic lists and empty maps are leaves.
        _ => {
            out.insert(path.clone());
        }
    }
}

pub(super) fn lookup<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, k| v.get(k))
}

pub(super) fn set(value: &mut Value, path: &[String], leaf: Value) {
    let Some((key, rest)) = path.split_first() else {
        *value = leaf;
        return;
    };
    // A leaf on the way becomes a parent.
    if !value.is_object() {
        *value = Value::Object(Map::new());
    }
    if let Value::Object(map) = value {
        set(map.entry(key.clone()).or_insert(Value::Null), rest, leaf);
    }
}

pub(super) fn remove(value: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = value;
    for key in parents {
        match node.get_mut(key) {
            Some(next) => node = next,
            None => return,
        }
    }
    if let Some(map) = node.as_object_mut() {
        map.remove(last);
    }
}

/// `fieldsV1`: `{"f:spec": {"f:size": {}}}`.
fn to_fields_v1(paths: &BTreeSet<Path>) -> FieldsV1 {
    let mut root = Value::Object(Map::new());
    for path in paths {
        let keyed: Path = path.iter().map(|k| format!("f:{k}")).collect();
        set(&mut root, &keyed, Value::Object(Map::new()));
    }
    FieldsV1(root)
}

fn from_fields_v1(fields: Option<&FieldsV1>) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    if let Some(FieldsV1(value)) = fields {
        collect(value, &mut Vec::new(), &mut out);
    }
    out.into_iter()
        .map(|p| {
            p.into_iter()
                .map(|k| k.strip_prefix("f:").map(str::to_owned).unwrap_or(k))
                .collect()
        })
        .collect()
}

pub(super) fn display(path: &[String]) -> String {
    format!(".{}", path.join("."))
}

/// Ownership of the fields of one object, by (manager, operation).
pub(super) struct Owners {
    pub(super) api_version: String,
    pub(super) entries: BTreeMap<(String, String), BTreeSet<Path>>,
}

impl Owners {
    pub(super) fn of<T: ApiObject>(object: &T) -> Self {
        let entries = object
            .meta()
            .managed_fields
            .iter()
            .flatten()
            .map(|e| {
                (
                    (
                        e.manager.clone().unwrap_or_default(),
                        e.operation.clone().unwrap_or_default(),
                    ),
                    from_fields_v1(e.fields_v1.as_ref()),
                )
            })
            .collect();
        Self {
            api_version: T::api_version(&()).into_owned(),
            entries,
        }
    }

    /// Takes `paths` away from everyone but `keep`.
    pub(super) fn release(&mut self, paths: &BTreeSet<Path>, keep: &(String, String)) {
        for (owner, fields) in &mut self.entries {
            if owner != keep {
                fields.retain(|p| !paths.contains(p));
            }
        }
    }

    pub(super) fn into_entries(self) -> Vec<ManagedFieldsEntry> {
        let time = server_now();
        self.entries
            .into_iter()
            .filter(|(_, fields)| !fields.is_empty())
            .map(|((manager, operation), fields)| ManagedFieldsEntry {
                api_version: Some(self.api_version.clone()),
                fields_type: Some("FieldsV1".to_owned()),
                fields_v1: Some(to_fields_v1(&fields)),
                manager: Some(manager),
                operation: Some(operation),
                time: Some(time.clone()),
                subresource: None,
            })
            .collect()
    }
}

/// Records an update by `manager`: it owns the fields it changed from `old` (all of
/// them on create), and their previous owners lose them.
pub(super) fn record_update<T: ApiObject>(
    new: &mut T,
    old: Option<&T>,
    manager: &str,
) -> Result<(), ApiError> {
    let new_value = serde_json::to_value(&*new).map_err(ApiError::internal)?;
    let old_value = old
        .map(serde_json::to_value)
        .transpose()
        .map_err(ApiError::internal)?;
    let changed: BTreeSet<Path> = leaves(&new_value)
        .into_iter()
        .filter(|p| {
            old_value
                .as_ref()
                .is_none_or(|o| lookup(o, p) != lookup(&new_value, p))
        })
        .collect();
    let mut owners = Owners::of(new);
    let me = (manager.to_owned(), OPERATION_UPDATE.to_owned());
    owners.release(&changed, &me);
    owners.entries.entry(me).or_default().extend(changed);
    new.meta_mut().managed_fields = Some(owners.into_entries());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_v1_round_trips_leaf_paths() {
        let object = json!({"spec": {"size": 2, "template": {"vcpu": 1, "interfaces": [{"deviceId": "eth0"}]}},
                            "metadata": {"labels": {"team": "ci"}, "name": "x"}});
        let paths = leaves(&object);
        let names: Vec<String> = paths.iter().map(|p| display(p)).collect();
        assert_eq!(
            names,
            [
                ".metadata.labels.team",
                ".spec.size",
                ".spec.template.interfaces",
                ".spec.template.vcpu"
            ]
        );
        let v1 = to_fields_v1(&paths);
        assert_eq!(v1.0["f:spec"]["f:template"]["f:vcpu"], json!({}));
        assert_eq!(from_fields_v1(Some(&v1)), paths);
    }

    #[test]
    fn set_and_remove_leave_the_rest_alone() {
        let mut doc = json!({"spec": {"a": 1, "b": {"c": 2}}});
        set(&mut doc, &["spec".into(), "b".into(), "d".into()], json!(3));
        remove(&mut doc, &["spec".into(), "a".into()]);
        assert_eq!(doc, json!({"spec": {"b": {"c": 2, "d": 3}}}));
    }
}
