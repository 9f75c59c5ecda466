//! `managedFields` and server-side apply, reduced from structured-merge-diff to what our
//! kinds need: every list is atomic (none of our lists is a map list), a field set is the
//! set of leaf paths under `spec` and `metadata.labels`/`metadata.annotations`, and
//! ownership moves as in Kubernetes — an update takes the fields it changed from their
//! previous owners; an apply owns exactly the fields it applied, removes the ones it
//! applied before and no longer does, and conflicts with another manager's differing
//! value unless `force` is set (`reference/aggregated-apiserver.md` §5.6).

use std::collections::{BTreeMap, BTreeSet};

use axum::response::Response;
use battery_api_machinery::negotiate::{Format, Negotiated};
use battery_api_machinery::params::{PatchOptions, TableOptions};
use battery_api_machinery::status::ApiError;
use http::StatusCode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kube::Resource;
use serde_json::{Map, Value};

use super::RequestContext;
use super::handlers::{self, Manager, check_namespace, decode_object, info, invalid};
use super::respond;
use super::storage::{ApiObject, Storage, server_now};

type Path = Vec<String>;

const OPERATION_APPLY: &str = "Apply";
const OPERATION_UPDATE: &str = "Update";

/// The leaf paths of the parts of an object managers own.
fn leaves(object: &Value) -> BTreeSet<Path> {
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

fn lookup<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(value, |v, k| v.get(k))
}

fn set(value: &mut Value, path: &[String], leaf: Value) {
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

fn remove(value: &mut Value, path: &[String]) {
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

fn display(path: &[String]) -> String {
    format!(".{}", path.join("."))
}

/// Ownership of the fields of one object, by (manager, operation).
struct Owners {
    api_version: String,
    entries: BTreeMap<(String, String), BTreeSet<Path>>,
}

impl Owners {
    fn of<T: ApiObject>(object: &T) -> Self {
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
    fn release(&mut self, paths: &BTreeSet<Path>, keep: &(String, String)) {
        for (owner, fields) in &mut self.entries {
            if owner != keep {
                fields.retain(|p| !paths.contains(p));
            }
        }
    }

    fn into_entries(self) -> Vec<ManagedFieldsEntry> {
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
pub fn record_update<T: ApiObject>(
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

/// A server-side apply (`PATCH` with `application/apply-patch+yaml`): creates the object
/// if it does not exist, else merges the applied configuration into it.
pub async fn apply<S: Storage>(
    storage: &S,
    ctx: &RequestContext,
    name: &str,
    body: &[u8],
    options: &PatchOptions,
    negotiated: &Negotiated,
    manager: &str,
) -> Result<Response, ApiError> {
    // YAML is a superset of JSON, so this reads what kubectl sends either way.
    let applied: Value = Format::Yaml.decode(body)?;
    let applied_name = applied
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if applied_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({applied_name}) does not match the name on the URL ({name})"
        )));
    }
    // Decoding checks the kind and applies fieldValidation to the applied fields.
    let (_, warnings) = decode_object::<S>(applied.clone(), options.field_validation)?;
    let applied_paths = leaves(&applied);
    let me = (manager.to_owned(), OPERATION_APPLY.to_owned());

    let current = match storage.get(ctx, name).await {
        Ok(current) => current,
        Err(e) if e.code() == StatusCode::NOT_FOUND => {
            let (mut object, _) = decode_object::<S>(applied, options.field_validation)?;
            let meta = object.meta_mut();
            check_namespace(ctx, meta)?;
            if let Err(error) = handlers::prepare_create_metadata(meta) {
                return Err(ApiError::invalid(info::<S>(), name, &[error]));
            }
            let mut owners = Owners {
                api_version: S::Object::api_version(&()).into_owned(),
                entries: BTreeMap::new(),
            };
            owners.entries.insert(me, applied_paths);
            object.meta_mut().managed_fields = Some(owners.into_entries());
            invalid::<S>(name, storage.validate(&object))?;
            ctx.admit_create().await?;
            let created = if options.dry_run {
                object
            } else {
                storage.create(ctx, object).await?
            };
            return respond::object(
                storage,
                StatusCode::CREATED,
                negotiated,
                TableOptions::default(),
                &created,
                &warnings,
            );
        }
        Err(e) => return Err(e),
    };

    let current_value = serde_json::to_value(&current).map_err(ApiError::internal)?;
    let mut owners = Owners::of(&current);
    let conflicts: Vec<(String, Path)> = owners
        .entries
        .iter()
        .filter(|(owner, _)| **owner != me)
        .flat_map(|((manager, _), fields)| {
            applied_paths
                .iter()
                .filter(|p| fields.contains(*p))
                .filter(|p| lookup(&current_value, p) != lookup(&applied, p))
                .map(move |p| (manager.clone(), p.clone()))
        })
        .collect();
    if !conflicts.is_empty() && !options.force {
        return Err(conflict_error(&conflicts));
    }

    let mut merged = current_value.clone();
    let previously_applied = owners.entries.get(&me).cloned().unwrap_or_default();
    for path in previously_applied.difference(&applied_paths) {
        let owned_by_others = owners
            .entries
            .iter()
            .any(|(owner, fields)| *owner != me && fields.contains(path));
        if !owned_by_others {
            remove(&mut merged, path);
        }
    }
    for path in &applied_paths {
        if let Some(value) = lookup(&applied, path) {
            set(&mut merged, path, value.clone());
        }
    }
    if options.force {
        let taken: BTreeSet<Path> = conflicts.into_iter().map(|(_, p)| p).collect();
        owners.release(&taken, &me);
    }
    owners.entries.insert(me, applied_paths);
    if let Some(meta) = merged.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert(
            "managedFields".into(),
            serde_json::to_value(owners.into_entries()).map_err(ApiError::internal)?,
        );
    }
    let (object, _) = decode_object::<S>(merged, options.field_validation)?;
    let updated = handlers::replace(
        storage,
        ctx,
        current,
        object,
        options.dry_run,
        Manager::Applied,
    )
    .await?;
    respond::object(
        storage,
        StatusCode::OK,
        negotiated,
        TableOptions::default(),
        &updated,
        &warnings,
    )
}

/// `Apply failed with N conflicts: conflict with "m": .spec.size`, with one
/// `FieldManagerConflict` cause per field, which kubectl turns into its `--force-conflicts`
/// advice.
fn conflict_error(conflicts: &[(String, Path)]) -> ApiError {
    let lines: Vec<String> = conflicts
        .iter()
        .map(|(manager, path)| format!("conflict with \"{manager}\": {}", display(path)))
        .collect();
    let noun = if conflicts.len() == 1 {
        "conflict"
    } else {
        "conflicts"
    };
    let message = format!(
        "Apply failed with {} {noun}: {}",
        conflicts.len(),
        lines.join("\n")
    );
    let causes = conflicts
        .iter()
        .zip(&lines)
        .map(
            |((_, path), line)| k8s_openapi::apimachinery::pkg::apis::meta::v1::StatusCause {
                field: Some(display(path)),
                message: Some(line.clone()),
                reason: Some("FieldManagerConflict".to_owned()),
            },
        )
        .collect();
    ApiError::apply_conflict(causes, message)
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

    #[test]
    fn conflicts_name_manager_and_field() {
        let err = conflict_error(&[("kubectl-create".into(), vec!["spec".into(), "size".into()])]);
        assert_eq!(err.code(), StatusCode::CONFLICT);
        assert_eq!(
            err.message(),
            "Apply failed with 1 conflict: conflict with \"kubectl-create\": .spec.size"
        );
    }
}
