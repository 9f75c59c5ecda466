//! The generic verbs (`apiserver:pkg/endpoints/handlers/{get,create,update,patch,delete}.go`),
//! over any [`Storage`].

use std::collections::BTreeMap;

use axum::response::Response;
use battery_api_machinery::negotiate::{Format, Negotiated};
use battery_api_machinery::params::{
    CreateOptions, DeleteOptions, FieldValidation, ListOptions, PatchOptions, PropagationPolicy,
    TableOptions, UpdateOptions,
};
// Re-exported for the subresources' patch path.
pub(super) use battery_api_machinery::patch::{apply_patch, patch_precondition};
use battery_api_machinery::status::ApiError;
use battery_types::HasResourceInfo;
use battery_types::validation::FieldError;
use http::StatusCode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
use kube::Resource;
use serde_json::Value;

use super::RequestContext;
use super::managed_fields;
use super::respond::{self, Warnings};
use super::storage::{Deleted, Storage, StoredItem, list_key};
use crate::clock::server_now;

/// A patch or apply that loses an optimistic-concurrency race is retried this often,
/// as Go's `GuaranteedUpdate` does, when the client did not pin a resourceVersion.
const PATCH_ATTEMPTS: usize = 5;
/// `generateName` suffix length, as Go's `SimpleNameGenerator`.
const GENERATED_SUFFIX_LEN: usize = 5;

/// Finalizers the garbage collector drives (`apimachinery:pkg/apis/meta/v1/types.go`).
const FINALIZER_ORPHAN: &str = "orphan";
const FINALIZER_FOREGROUND: &str = "foregroundDeletion";

pub(super) fn info<S: Storage>() -> &'static battery_types::ResourceInfo {
    &<S::Object as HasResourceInfo>::INFO
}

pub async fn get<S: Storage>(
    storage: &S,
    ctx: &RequestContext,
    name: &str,
    negotiated: &Negotiated,
    table: TableOptions,
) -> Result<Response, ApiError> {
    let object = storage.get(ctx, name).await?;
    respond::object(storage, StatusCode::OK, negotiated, table, &object, &[])
}

/// Items that pass both selectors, in the storage's [`list_key`] order.
pub async fn select<S: Storage>(
    storage: &S,
    ctx: &RequestContext,
    options: &ListOptions,
) -> Result<(Vec<S::Object>, u64), ApiError> {
    check_selectable(storage, options)?;
    let (items, rv) = storage.list(ctx).await?;
    let items = items
        .into_iter()
        .filter(|o| matches(storage, o, options))
        .collect();
    Ok((items, rv))
}

fn check_selectable<S: Storage>(storage: &S, options: &ListOptions) -> Result<(), ApiError> {
    let mut supported = vec!["metadata.name", "metadata.namespace"];
    supported.extend_from_slice(storage.selectable_fields());
    options.field_selector.check_supported(&supported)
}

/// Whether `object` passes the label and field selectors of `options`.
pub fn matches<S: Storage>(storage: &S, object: &S::Object, options: &ListOptions) -> bool {
    let meta = object.meta();
    selected(
        options,
        meta.labels.as_ref(),
        meta.name.as_deref().unwrap_or_default(),
        meta.namespace.as_deref().unwrap_or_default(),
        || storage.field_values(object),
    )
}

/// Whether an object with these labels, name, namespace and values of the storage's
/// selectable fields (`fields`, asked only when there is a field selector) passes the
/// selectors of `options`.
fn selected(
    options: &ListOptions,
    labels: Option<&BTreeMap<String, String>>,
    name: &str,
    namespace: &str,
    fields: impl FnOnce() -> Vec<(&'static str, String)>,
) -> bool {
    static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
    if !options.label_selector.matches(labels.unwrap_or(&NO_LABELS)) {
        return false;
    }
    if options.field_selector.is_empty() {
        return true;
    }
    let fields = fields();
    options.field_selector.matches(|field| match field {
        "metadata.name" => Some(name),
        "metadata.namespace" => Some(namespace),
        other => fields
            .iter()
            .find(|(f, _)| *f == other)
            .map(|(_, value)| value.as_str()),
    })
}

/// A list, or with `limit` one page of it: the storage reads the page after the
/// continue token's key and no more, then the selectors filter it, so a page may hold
/// fewer than `limit` items and still have a continue token, as kube-apiserver's may.
/// In compact JSON, a storage that keeps its objects as JSON serves them as stored.
pub async fn list<S: Storage>(
    storage: &S,
    ctx: &RequestContext,
    options: &ListOptions,
    negotiated: &Negotiated,
    table: TableOptions,
) -> Result<Response, ApiError> {
    check_selectable(storage, options)?;
    let after = options
        .continue_token
        .as_deref()
        .map(decode_continue)
        .transpose()?;
    let limit = options.limit.map_or(usize::MAX, |l| {
        usize::try_from(l.get()).unwrap_or(usize::MAX)
    });
    let compact_json = negotiated.format == Format::Json && !negotiated.pretty;
    if compact_json
        && let Some(page) = storage
            .list_page_stored(ctx, after.as_deref(), limit)
            .await?
    {
        let last = page.items.last().map(StoredItem::list_key);
        let metadata = list_meta(options, page.resource_version, page.rest, last);
        let items: Vec<_> = page
            .items
            .into_iter()
            .filter(|item| {
                selected(
                    options,
                    Some(&item.labels),
                    &item.name,
                    &item.namespace,
                    || item.fields.clone(),
                )
            })
            .collect();
        return respond::stored_list(storage, negotiated, table, &items, metadata);
    }
    let page = storage.list_page(ctx, after.as_deref(), limit).await?;
    let last = page.items.last().map(list_key);
    let metadata = list_meta(options, page.resource_version, page.rest, last);
    let items: Vec<_> = page
        .items
        .into_iter()
        .filter(|o| matches(storage, o, options))
        .collect();
    respond::list(storage, negotiated, table, &items, metadata)
}

/// A page's `ListMeta`: its resourceVersion, and while `rest` objects follow it, the
/// continue token after `last` (the page's last [`list_key`]) and how many follow.
fn list_meta(
    options: &ListOptions,
    resource_version: u64,
    rest: usize,
    last: Option<String>,
) -> ListMeta {
    let continue_token = last.filter(|_| rest > 0).map(|last| encode_continue(&last));
    // Counted only without selectors, as kube-apiserver does: what follows is not
    // filtered, so with selectors the count would overstate.
    let selected = !options.label_selector.is_empty() || !options.field_selector.is_empty();
    let remaining = (continue_token.is_some() && !selected)
        .then(|| i64::try_from(rest).ok())
        .flatten();
    ListMeta {
        resource_version: Some(resource_version.to_string()),
        continue_: continue_token,
        remaining_item_count: remaining,
        ..ListMeta::default()
    }
}

/// A continue token names the [`list_key`] of the last item served, so a page resumes
/// after it whatever changed meanwhile (our lists are always current, so the token never
/// expires).
fn encode_continue(key: &str) -> String {
    use base64::Engine;
    let json = serde_json::json!({"v": 2, "after": key});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json.to_string())
}

fn decode_continue(token: &str) -> Result<String, ApiError> {
    use base64::Engine;
    let invalid = || ApiError::bad_request("continue key is not valid");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| invalid())?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|_| invalid())?;
    match (value.get("v").and_then(Value::as_u64), value.get("after")) {
        (Some(2), Some(Value::String(after))) => Ok(after.clone()),
        _ => Err(invalid()),
    }
}

/// Decodes a body into the kind, checking `apiVersion`/`kind` and applying
/// `fieldValidation` to unknown fields (`strict decoding error: unknown field "spec.x"`).
pub(super) fn decode_object<S: Storage>(
    value: Value,
    validation: FieldValidation,
) -> Result<(S::Object, Warnings), ApiError> {
    let mut value = check_type::<S>(value)?;
    // The kinds' serde ignores apiVersion and kind (checked above) on the way in; they
    // are not unknown fields.
    if let Some(map) = value.as_object_mut() {
        map.remove("apiVersion");
        map.remove("kind");
    }
    let mut unknown = Vec::new();
    let object: S::Object = serde_ignored::deserialize(&value, |path| {
        unknown.push(path.to_string());
    })
    .map_err(|e| {
        ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: {e}",
            info::<S>().kind,
            info::<S>().version,
            info::<S>().kind
        ))
    })?;
    Ok((object, unknown_fields(&unknown, validation)?))
}

/// `fieldValidation` applied to the unknown fields a decode found: `Strict` refuses them
/// (`strict decoding error: unknown field "spec.x"`), `Warn` returns them as warnings,
/// `Ignore` drops them.
pub(super) fn unknown_fields(
    unknown: &[String],
    validation: FieldValidation,
) -> Result<Warnings, ApiError> {
    let messages: Vec<String> = unknown
        .iter()
        .map(|field| format!("unknown field \"{field}\""))
        .collect();
    match validation {
        FieldValidation::Strict if !messages.is_empty() => Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            messages.join(", ")
        ))),
        FieldValidation::Warn => Ok(messages),
        _ => Ok(Vec::new()),
    }
}

/// The body's `apiVersion` and `kind` must name this resource's kind; absent ones are
/// filled in.
fn check_type<S: Storage>(mut value: Value) -> Result<Value, ApiError> {
    let info = info::<S>();
    let api_version = S::Object::api_version(&()).into_owned();
    let Some(map) = value.as_object_mut() else {
        return Err(ApiError::bad_request(format!(
            "the body of the request is not a {} object",
            info.kind
        )));
    };
    let given_version = map.get("apiVersion").and_then(Value::as_str);
    let given_kind = map.get("kind").and_then(Value::as_str);
    if let Some(kind) = given_kind
        && kind != info.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the body ({kind}) does not match the kind of the URL ({})",
            info.kind
        )));
    }
    if let Some(version) = given_version
        && version != api_version
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({version}) does not match the expected API version ({api_version})"
        )));
    }
    map.insert("apiVersion".into(), Value::String(api_version));
    map.insert("kind".into(), Value::String(info.kind.to_owned()));
    Ok(value)
}

fn decode_body(format: Format, body: &[u8]) -> Result<Value, ApiError> {
    format.decode(body)
}

pub(super) fn invalid<S: Storage>(name: &str, errors: Vec<FieldError>) -> Result<(), ApiError> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(info::<S>(), name, &errors))
    }
}

/// The namespace in the body must be the URL's (Go: 400 "the namespace of the provided
/// object does not match the namespace sent on the request").
pub(super) fn check_namespace(ctx: &RequestContext, meta: &mut ObjectMeta) -> Result<(), ApiError> {
    match (&ctx.namespace, &meta.namespace) {
        (Some(url), Some(body)) if !body.is_empty() && url != body => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        (Some(url), _) => {
            meta.namespace = Some(url.clone());
            Ok(())
        }
        (None, _) => {
            meta.namespace = None;
            Ok(())
        }
    }
}

fn generated_name(prefix: &str) -> String {
    // Go's alphabet without vowels and confusable characters.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let random = uuid::Uuid::new_v4();
    let suffix: String = random
        .as_bytes()
        .iter()
        .take(GENERATED_SUFFIX_LEN)
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect();
    format!("{prefix}{suffix}")
}

/// Server-owned metadata of a new object (`rest.BeforeCreate`).
pub(super) fn prepare_create_metadata(meta: &mut ObjectMeta) -> Result<(), FieldError> {
    if meta.name.as_deref().unwrap_or_default().is_empty() {
        match meta.generate_name.as_deref() {
            Some(prefix) if !prefix.is_empty() => meta.name = Some(generated_name(prefix)),
            _ => {
                return Err(FieldError::required(
                    "metadata.name",
                    "name or generateName is required",
                ));
            }
        }
    }
    meta.uid = Some(uuid::Uuid::new_v4().to_string());
    meta.creation_timestamp = Some(server_now());
    meta.generation = Some(1);
    meta.resource_version = None;
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.self_link = None;
    Ok(())
}

/// Who changed an object, for `managedFields`.
#[derive(Clone, Copy)]
pub(super) enum Manager<'a> {
    /// An update by this field manager: its fields are recorded here.
    Update(&'a str),
    /// A server-side apply, whose `managedFields` the caller already computed.
    Applied,
}

/// What every create does once its object is decoded (`rest.BeforeCreate`, then the
/// storage): the namespace from the URL, the server-owned metadata, who owns which field
/// (`record_fields`), validation, namespace lifecycle, and `dryRun`.
pub(super) async fn create_object<S: Storage>(
    storage: &S,
    ctx: &RequestContext,
    mut object: S::Object,
    record_fields: impl FnOnce(&mut S::Object) -> Result<(), ApiError>,
    dry_run: bool,
) -> Result<S::Object, ApiError> {
    let meta = object.meta_mut();
    check_namespace(ctx, meta)?;
    let name = meta.name.clone().unwrap_or_default();
    if let Err(error) = prepare_create_metadata(meta) {
        return Err(ApiError::invalid(info::<S>(), &name, &[error]));
    }
    let name = meta.name.clone().unwrap_or_default();
    record_fields(&mut object)?;
    invalid::<S>(&name, storage.validate(&object))?;
    ctx.admit_create().await?;
    if dry_run {
        Ok(object)
    } else {
        storage.create(ctx, object).await
    }
}

pub struct Write<'a> {
    pub body: &'a [u8],
    pub format: Format,
}

pub async fn create<S: Storage>(
    storage: &S,
    ctx: &RequestContext,
    write: Write<'_>,
    options: &CreateOptions,
    negotiated: &Negotiated,
) -> Result<Response, ApiError> {
    let value = decode_body(write.format, write.body)?;
    let (object, warnings) = decode_object::<S>(value, options.field_validation)?;
    let manager = options
        .field_manager
        .clone()
        .unwrap_or_else(|| "unknown".into());
    let record_fields =
        |object: &mut S::Object| managed_fields::record_update(object, None, &manager);
    let created = create_object(storage, ctx, object, record_fields, options.dry_run).await?;
    respond::object(
        storage,
        StatusCode::CREATED,
        negotiated,
        TableOptions::default(),
        &created,
        &warnings,
    )
}

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
pub(super) async fn replace<S: Storage>(
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
    if finalized {
        // The last finalizer is gone: the deletion asked for earlier completes now.
        return Ok(match storage.delete(ctx, updated).await? {
            Deleted::Gone(object) | Deleted::Pending(object) => object,
        });
    }
    Ok(updated)
}

/// A failed uid or resourceVersion precondition, in Go's words (`apiserver:pkg/
/// storage/etcd3/store.go` `checkPreconditions`).
fn precondition_failed(
    info: &battery_types::ResourceInfo,
    name: &str,
    field: &str,
    wanted: &str,
    actual: Option<&str>,
) -> ApiError {
    ApiError::conflict(
        info,
        name,
        format!(
            "Precondition failed: {field} in precondition: {wanted}, {field} in object meta: {}",
            actual.unwrap_or_default()
        ),
    )
}

/// The `spec` of an object, to tell whether `generation` moves.
fn spec_of<T: serde::Serialize>(object: &T) -> Result<Value, ApiError> {
    let value = serde_json::to_value(object).map_err(ApiError::internal)?;
    Ok(value.get("spec").cloned().unwrap_or(Value::Null))
}

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
    match storage.delete(ctx, current).await? {
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
