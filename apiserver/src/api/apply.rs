//! Server-side apply (`reference/aggregated-apiserver.md` §5.6): an apply owns exactly
//! the fields it applied, removes the ones it applied before and no longer does, and
//! conflicts with another manager's differing value unless `force` is set. Ownership
//! itself is `managed_fields.rs`.

use std::collections::{BTreeMap, BTreeSet};

use axum::response::Response;
use battery_api_machinery::negotiate::{Format, Negotiated};
use battery_api_machinery::params::{PatchOptions, TableOptions};
use battery_api_machinery::status::ApiError;
use http::StatusCode;
use kube::Resource;
use serde_json::Value;

use super::RequestContext;
use super::handlers::{self, Manager, decode_object};
use super::managed_fields::{OPERATION_APPLY, Owners, Path, display, leaves, lookup, remove, set};
use super::respond;
use super::storage::Storage;

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
            let (object, _) = decode_object::<S>(applied, options.field_validation)?;
            let record_fields = |object: &mut S::Object| {
                let mut owners = Owners {
                    api_version: S::Object::api_version(&()).into_owned(),
                    entries: BTreeMap::new(),
                };
                owners.entries.insert(me, applied_paths);
                object.meta_mut().managed_fields = Some(owners.into_entries());
                Ok(())
            };
            let created =
                handlers::create_object(storage, ctx, object, record_fields, options.dry_run)
                    .await?;
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
