//! delete and deletecollection (`apiserver:pkg/endpoints/handlers/delete.go`), with
//! preconditions, finalizers and propagation.

use axum::response::Response;
use battery_api_machinery::negotiate::Negotiated;
use battery_api_machinery::params::{DeleteOptions, ListOptions, PropagationPolicy, TableOptions};
use battery_api_machinery::status::ApiError;
use http::StatusCode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::Resource;

use super::list::select;
use super::shared::{info, precondition_failed};
use crate::api::RequestContext;
use crate::api::respond;
use crate::api::storage::{Deleted, Storage};
use crate::clock::server_now;

/// Finalizers the garbage collector drives (`apimachinery:pkg/apis/meta/v1/types.go`).
const FINALIZER_ORPHAN: &str = "orphan";
const FINALIZER_FOREGROUND: &str = "foregroundDeletion";

pub async fn delete<S: Storage>(
    storage: &S,
    ctx: &RequestContext,
    name: &str,
    options: &DeleteOptions,
    negotiated: &Negotiated,
) -> Result<Response, ApiError> {
    let current = storage.get(ctx, name).await?;
    let (status, object) = delete_object(storage, ctx, current, options).await?;
    respond::object(
        storage,
        status,
        negotiated,
        TableOptions::default(),
        &object,
        &[],
    )
}

/// Deletes one object, honouring preconditions, finalizers and propagation
/// (`apiserver:pkg/registry/generic/registry/store.go` `Delete`).
async fn delete_object<S: Storage>(
    storage: &S,
    ctx: &RequestContext,
    current: S::Object,
    options: &DeleteOptions,
) -> Result<(StatusCode, S::Object), ApiError> {
    let info = info::<S>();
    let meta = current.meta().clone();
    let name = meta.name.clone().unwrap_or_default();
    if let Some(pre) = &options.preconditions {
        if let Some(uid) = &pre.uid
            && Some(uid) != meta.uid.as_ref()
        {
            return Err(precondition_failed(
                info,
                &name,
                "UID",
                uid,
                meta.uid.as_deref(),
            ));
        }
        if let Some(rv) = &pre.resource_version
            && Some(rv) != meta.resource_version.as_ref()
        {
            return Err(precondition_failed(
                info,
                &name,
                "ResourceVersion",
                rv,
                meta.resource_version.as_deref(),
            ));
        }
    }
    if meta.deletion_timestamp.is_some() {
        // Already being deleted: nothing more to do until its finalizers go.
        return Ok((StatusCode::OK, current));
    }
    let mut finalizers = meta.finalizers.clone().unwrap_or_default();
    let gc_finalizer = match options.propagation_policy {
        Some(PropagationPolicy::Foreground) => Some(FINALIZER_FOREGROUND),
        Some(PropagationPolicy::Orphan) => Some(FINALIZER_ORPHAN),
        _ if options.orphan_dependents == Some(true) => Some(FINALIZER_ORPHAN),
        _ => None,
    };
    if let Some(f) = gc_finalizer
        && !finalizers.iter().any(|x| x == f)
    {
        finalizers.push(f.to_owned());
    }
    if !finalizers.is_empty() {
        let mut marked = current.clone();
        let m = marked.meta_mut();
        m.finalizers = Some(finalizers);
        m.deletion_timestamp = Some(server_now());
        m.deletion_grace_period_seconds = Some(0);
        if options.dry_run {
            return Ok((StatusCode::OK, marked));
        }
        let marked = storage.update(ctx, current, marked).await?;
        return Ok((StatusCode::OK, marked));
    }
    if options.dry_run {
        return Ok((StatusCode::OK, current));
    }
    let deleted = storage.delete(ctx, current).await?;
    ctx.trace.step("deleted from storage");
    match deleted {
        Deleted::Gone(object) => Ok((StatusCode::OK, object)),
        // Go answers 202 only for the legacy `orphanDependents=false`.
        Deleted::Pending(object) if options.orphan_dependents == Some(false) => {
            Ok((StatusCode::ACCEPTED, object))
        }
        Deleted::Pending(object) => Ok((StatusCode::OK, object)),
    }
}

pub async fn delete_collection<S: Storage>(
    storage: &S,
    ctx: &RequestContext,
    list_options: &ListOptions,
    options: &DeleteOptions,
    negotiated: &Negotiated,
) -> Result<Response, ApiError> {
    let (items, rv) = select(storage, ctx, list_options).await?;
    let mut deleted = Vec::with_capacity(items.len());
    for item in items {
        match delete_object(storage, ctx, item, options).await {
            Ok((_, object)) => deleted.push(object),
            // Gone meanwhile: what deletecollection wanted.
            Err(e) if e.code() == StatusCode::NOT_FOUND => {}
            Err(e) => return Err(e),
        }
    }
    let metadata = ListMeta {
        resource_version: Some(rv.to_string()),
        ..ListMeta::default()
    };
    respond::list(
        storage,
        negotiated,
        TableOptions::default(),
        &deleted,
        metadata,
    )
}
