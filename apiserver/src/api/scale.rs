//! `<plural>/<name>/scale`: an `autoscaling/v1` `Scale` view of an object's replica
//! count, as Go's `ScaleREST` serves `deployments/scale` and a custom resource's scale
//! (`apiextensions-apiserver:pkg/registry/customresource/etcd.go`). A read projects the
//! object; a write sets the replica count on the object as it is now and goes through
//! the object's own update (`handlers::replace`), so it changes the object exactly as
//! editing that field does: validation, generation, managedFields, dryRun, the storage.

use std::sync::Arc;

use axum::response::Response;
use battery_api_machinery::negotiate::{Negotiated, PatchType, Target};
use battery_api_machinery::params::{
    FieldValidation, IncludeObject, PatchOptions, QueryOptions, TableOptions,
};
use battery_api_machinery::status::ApiError;
use battery_api_machinery::table::{
    PartialObjectMetadata, RowObject, Table, TableColumnDefinition, TableRow,
};
use battery_types::validation::FieldError;
use http::{HeaderMap, StatusCode};
use k8s_openapi::api::autoscaling::v1::{Scale, ScaleSpec, ScaleStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde_json::Value;

use super::RequestContext;
use super::handlers::{Manager, info, patch_precondition, replace};
use super::respond::{self, Warnings};
use super::storage::Storage;
use super::subresource::{Subresource, decode, patched};

/// The patch types a scale takes: a Scale has no list to merge by key, so a strategic
/// merge patch (`kubectl patch`'s default) is a merge patch with directives. Server-side
/// apply would need field ownership mapped between the Scale and its object.
const PATCH_TYPES: &[PatchType] = &[
    PatchType::JsonPatch,
    PatchType::MergePatch,
    PatchType::StrategicMergePatch,
];
/// A write that loses a race with another is retried this often when its client pinned no
/// resourceVersion, as Go's `GuaranteedUpdate` does.
const PATCH_ATTEMPTS: usize = 5;

/// A storage whose objects have a replica count.
pub trait Scalable: Storage {
    /// The desired count (`spec.replicas`).
    fn spec_replicas(&self, object: &Self::Object) -> i32;
    /// `object` with the desired count set to `replicas`.
    fn set_spec_replicas(&self, object: &mut Self::Object, replicas: i32);
    /// The count observed now, comparable to the desired one (`status.replicas`).
    fn status_replicas(&self, object: &Self::Object) -> i32;
    /// The label selector, as a string, that HPA requires (`status.selector`).
    fn selector(&self, object: &Self::Object) -> String;
}

/// The `scale` subresource of storage `S`: a [`Subresource`] whose reads answer a Table
/// too, whose writes check the Scale's kind and identity, and whose patch is retried.
pub struct ScaleEndpoint<S>(pub Arc<S>);

impl<S: Scalable> Subresource for ScaleEndpoint<S> {
    type Object = Scale;

    /// A Scale is written with PUT and PATCH only, as a Deployment's.
    const POST_WRITES: bool = false;

    async fn get(&self, ctx: &RequestContext, name: &str) -> Result<Scale, ApiError> {
        Ok(scale_of(self.0.as_ref(), &self.0.get(ctx, name).await?))
    }

    async fn update(
        &self,
        ctx: &RequestContext,
        name: &str,
        scale: Scale,
        dry_run: bool,
        field_manager: &str,
    ) -> Result<Scale, ApiError> {
        write(self.0.as_ref(), ctx, name, &scale, dry_run, field_manager).await
    }

    fn decode(
        &self,
        ctx: &RequestContext,
        name: &str,
        value: Value,
        validation: FieldValidation,
    ) -> Result<(Scale, Warnings), ApiError> {
        let (scale, warnings) = decode_scale(value, validation)?;
        check_identity(ctx, name, &scale)?;
        Ok((scale, warnings))
    }

    fn respond_read(
        &self,
        scale: &Scale,
        negotiated: &Negotiated,
        query: &str,
        headers: &HeaderMap,
    ) -> Result<Response, ApiError> {
        let table = TableOptions::from_request(query, headers)?;
        respond_scale(negotiated, table.include_object, scale)
    }

    /// Get, patch the Scale, write; retried from a fresh read when another write came in
    /// between and the patch pinned no resourceVersion.
    async fn patch(
        &self,
        ctx: &RequestContext,
        name: &str,
        body: &[u8],
        query: &str,
        headers: &HeaderMap,
    ) -> Result<(Scale, Warnings), ApiError> {
        let options = PatchOptions::from_request_among(query, headers, PATCH_TYPES)?;
        let patch: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
        let manager = options.field_manager.as_deref().unwrap_or("unknown");
        let pinned = patch_precondition(options.patch_type, &patch).is_some();
        let mut attempt = 1;
        loop {
            let (mut scale, warnings) = patched(self, ctx, name, &options, &patch).await?;
            if !pinned {
                // The version read above is not the client's precondition: the write
                // applies to whatever is current, as an unpinned patch does.
                scale.metadata.resource_version = None;
            }
            match self
                .update(ctx, name, scale, options.dry_run, manager)
                .await
            {
                Err(e)
                    if e.code() == StatusCode::CONFLICT && !pinned && attempt < PATCH_ATTEMPTS =>
                {
                    attempt += 1;
                }
                written => return Ok((written?, warnings)),
            }
        }
    }
}

/// The Scale of `object`, with the metadata Go's `scaleFromCustomResource` copies.
fn scale_of<S: Scalable>(storage: &S, object: &S::Object) -> Scale {
    let meta = object.meta();
    Scale {
        metadata: ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            creation_timestamp: meta.creation_timestamp.clone(),
            ..ObjectMeta::default()
        },
        spec: Some(ScaleSpec {
            replicas: Some(storage.spec_replicas(object)),
        }),
        status: Some(ScaleStatus {
            replicas: storage.status_replicas(object),
            selector: Some(storage.selector(object)),
        }),
    }
}

/// A Scale as negotiated: itself, its metadata, or the Table kube-apiserver prints for
/// `deployments/scale` (`kubernetes:pkg/printers/internalversion/printers.go` `printScale`:
/// desired and available replicas), which `kubectl get --subresource=scale` shows.
fn respond_scale(
    negotiated: &Negotiated,
    include: IncludeObject,
    scale: &Scale,
) -> Result<Response, ApiError> {
    match negotiated.target {
        Target::Object => respond::encoded(StatusCode::OK, negotiated, scale, &[]),
        Target::Table(version) => {
            let mut table = Table::new(version);
            table.column_definitions = vec![
                TableColumnDefinition::name(),
                TableColumnDefinition::new(
                    "Desired",
                    "integer",
                    "The desired number of instances (spec.replicas).",
                    0,
                ),
                TableColumnDefinition::new(
                    "Available",
                    "integer",
                    "The number of instances observed (status.replicas).",
                    0,
                ),
            ];
            let object = RowObject::new(include, version, &scale.metadata, scale);
            table.rows.push(TableRow {
                cells: vec![
                    scale.metadata.name.clone().unwrap_or_default().into(),
                    scale.spec.as_ref().and_then(|s| s.replicas).into(),
                    scale.status.as_ref().map(|s| s.replicas).into(),
                ],
                object,
            });
            respond::encoded(StatusCode::OK, negotiated, &table, &[])
        }
        Target::PartialObjectMetadata(version) => respond::encoded(
            StatusCode::OK,
            negotiated,
            &PartialObjectMetadata::new(version, scale.metadata.clone()),
            &[],
        ),
        Target::PartialObjectMetadataList(_) => Err(ApiError::not_acceptable(&[
            "application/json",
            "application/yaml",
        ])),
    }
}

/// Decodes a Scale body: its `apiVersion` and `kind`, where given, must be
/// `autoscaling/v1` `Scale`.
fn decode_scale(value: Value, validation: FieldValidation) -> Result<(Scale, Warnings), ApiError> {
    let expected = Scale::api_version(&());
    if let Some(kind) = value.get("kind").and_then(Value::as_str)
        && kind != Scale::kind(&())
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the body ({kind}) does not match the kind of the URL (Scale)"
        )));
    }
    if let Some(version) = value.get("apiVersion").and_then(Value::as_str)
        && version != expected
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({version}) does not match the expected API version ({expected})"
        )));
    }
    decode(value, validation)
}

/// The name and namespace in the body must be the URL's (Go's `checkName`).
fn check_identity(ctx: &RequestContext, name: &str, scale: &Scale) -> Result<(), ApiError> {
    let body_name = scale.metadata.name.as_deref().unwrap_or_default();
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    match (&ctx.namespace, scale.metadata.namespace.as_deref()) {
        (Some(url), Some(body)) if !body.is_empty() && url != body => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => Ok(()),
    }
}

/// Writes `scale.spec.replicas` to the object `name` as it is now. A resourceVersion in
/// the Scale is a precondition, as for Deployments; without one the write applies to
/// whatever is current, read again if another write came in between.
async fn write<S: Scalable>(
    storage: &S,
    ctx: &RequestContext,
    name: &str,
    scale: &Scale,
    dry_run: bool,
    manager: &str,
) -> Result<Scale, ApiError> {
    let replicas = scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
    if replicas < 0 {
        // `autoscaling/validation.ValidateScale`.
        return Err(ApiError::invalid_kind(
            "autoscaling",
            "Scale",
            name,
            &[FieldError::invalid(
                "spec.replicas",
                replicas,
                "must be greater than or equal to 0",
            )],
        ));
    }
    let precondition = scale
        .metadata
        .resource_version
        .as_deref()
        .filter(|rv| !rv.is_empty());
    let mut attempt = 1;
    loop {
        let current = storage.get(ctx, name).await?;
        let meta = current.meta();
        if precondition.is_some_and(|rv| Some(rv) != meta.resource_version.as_deref()) {
            return Err(ApiError::optimistic_lock(info::<S>(), name));
        }
        if meta.deletion_timestamp.is_some() {
            // Its storage is winding it down (a Pool drains at size 0): a new count would
            // fight that.
            return Err(ApiError::conflict(
                info::<S>(),
                name,
                format!("the {} is being deleted", info::<S>().singular),
            ));
        }
        let mut scaled = current.clone();
        storage.set_spec_replicas(&mut scaled, replicas);
        match replace(
            storage,
            ctx,
            current,
            scaled,
            dry_run,
            Manager::Update(manager),
        )
        .await
        {
            Err(e)
                if e.code() == StatusCode::CONFLICT
                    && precondition.is_none()
                    && attempt < PATCH_ATTEMPTS =>
            {
                attempt += 1;
            }
            written => return Ok(scale_of(storage, &written?)),
        }
    }
}
