//! update (`apiserver:pkg/endpoints/handlers/update.go`), and the replace that update,
//! patch, apply and scale share (`rest.BeforeUpdate`).

use axum::response::Response;
use battery_api_machinery::negotiate::Negotiated;
use battery_api_machinery::params::{TableOptions, UpdateOptions};
use battery_api_machinery::status::ApiError;
use battery_types::validation::FieldError;
use http::StatusCode;
use kube::Resource;
use serde_json::Value;

use super::shared::{
    Manager, Write, check_namespace, decode_body, decode_object, info, invalid, precondition_failed,
};
use crate::api::RequestContext;
use crate::api::managed_fields;
use crate::api::respond;
use crate::api::storage::{Deleted, Storage};

pub async fn update<S: Storage>(
    storage: &S,
    ctx: &RequestContext,
    name: &str,
    write: Write<'_>,
    options: &UpdateOptions,
    negotiated: &Negotiated,
) -> Result<Response, ApiError> {
    let value = decode_body(write.format, write.body)?;
    let (mut object, warnings) = decode_object::<S>(value, options.field_validation)?;
    check_namespace(ctx, object.meta_mut())?;
    let body_name = object.meta().name.clone().unwrap_or_default();
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    if object
        .meta()
        .resource_version
        .as_deref()
        .unwrap_or_default()
        .is_empty()
    {
        // Custom resources refuse unconditional updates (`AllowUnconditionalUpdate`).
        return Err(ApiError::invalid(
            info::<S>(),
            name,
            &[FieldError::invalid(
                "metadata.resourceVersion",
                Value::from("0x0"),
                "must be specified for an update",
            )],
        ));
    }
    let current = storage.get(ctx, name).await?;
    let manager = options
        .field_manager
        .clone()
        .unwrap_or_else(|| "unknown".into());
    let updated = replace(
        storage,
        ctx,
        current,
        object,
        options.dry_run,
        Manager::Update(&manager),
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

/// The shared second half of update and patch (`rest.BeforeUpdate`, then the storage):
/// `new` carries the resourceVersion the client based its change on.
pub(in crate::api) async fn replace<S: Storage>(
    storage: &S,
    ctx: &RequestContext,
    current: S::Object,
    mut new: S::Object,
    dry_run: bool,
    manager: Manager<'_>,
) -> Result<S::Object, ApiError> {
    let info = info::<S>();
    let name = current.meta().name.clone().unwrap_or_default();
    let old = current.meta();
    if new.meta().resource_version != old.resource_version {
        return Err(ApiError::optimistic_lock(info, &name));
    }
    if let Some(uid) = &new.meta().uid
        && !uid.is_empty()
        && Some(uid) != old.uid.as_ref()
    {
        return Err(precondition_failed(
            info,
            &name,
            "UID",
            uid,
            old.uid.as_deref(),
        ));
    }
    let being_deleted = old.deletion_timestamp.is_some();
    let old_finalizers = old.finalizers.clone().unwrap_or_default();
    let new_finalizers = new.meta().finalizers.clone().unwrap_or_default();
    if being_deleted
        && let Some(added) = new_finalizers.iter().find(|f| !old_finalizers.contains(f))
    {
        return Err(ApiError::invalid(
            info,
            &name,
            &[FieldError::forbidden(
                "metadata.finalizers",
                format!(
                    "no new finalizers can be added if the object is being deleted, found new finalizers [\"{added}\"]"
                ),
            )],
        ));
    }
    let spec_changed = spec_of(&current)? != spec_of(&new)?;
    {
        let meta = new.meta_mut();
        meta.uid = old.uid.clone();
        meta.creation_timestamp = old.creation_timestamp.clone();
        meta.deletion_timestamp = old.deletion_timestamp.clone();
        meta.deletion_grace_period_seconds = old.deletion_grace_period_seconds;
        meta.generation = Some(old.generation.unwrap_or(1) + i64::from(spec_changed));
    }
    if let Manager::Update(manager) = manager {
        new.meta_mut().managed_fields = old.managed_fields.clone();
        managed_fields::record_update(&mut new, Some(&current), manager)?;
    }
    let mut errors = storage.validate(&new);
    errors.extend(storage.validate_update(&current, &new));
    invalid::<S>(&name, errors)?;
    if dry_run {
        return Ok(new);
    }
    let finalized = being_deleted && new_finalizers.is_empty();
    let updated = storage.update(ctx, current, new).await?;
    ctx.trace.step("stored");
    if finalized {
        // The last finalizer is gone: the deletion asked for earlier completes now.
        return Ok(match storage.delete(ctx, updated).await? {
            Deleted::Gone(object) | Deleted::Pending(object) => object,
        });
    }
    Ok(updated)
}

/// The `spec` of an object, to tell whether `generation` moves.
fn spec_of<T: serde::Serialize>(object: &T) -> Result<Value, ApiError> {
    let value = serde_json::to_value(object).map_err(ApiError::internal)?;
    Ok(value.get("spec").cloned().unwrap_or(Value::Null))
}
