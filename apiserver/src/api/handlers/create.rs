//! create (`apiserver:pkg/endpoints/handlers/create.go`), and what every create does
//! once (`rest.BeforeCreate`), apply's too.

use axum::response::Response;
use battery_api_machinery::negotiate::Negotiated;
use battery_api_machinery::params::{CreateOptions, TableOptions};
use battery_api_machinery::status::ApiError;
use battery_types::validation::FieldError;
use http::StatusCode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

use super::shared::{Write, check_namespace, decode_body, decode_object, info, invalid};
use crate::api::RequestContext;
use crate::api::managed_fields;
use crate::api::respond;
use crate::api::storage::Storage;
use crate::clock::server_now;

/// `generateName` suffix length, as Go's `SimpleNameGenerator`.
const GENERATED_SUFFIX_LEN: usize = 5;

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
fn prepare_create_metadata(meta: &mut ObjectMeta) -> Result<(), FieldError> {
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

/// What every create does once its object is decoded (`rest.BeforeCreate`, then the
/// storage): the namespace from the URL, the server-owned metadata, who owns which field
/// (`record_fields`), validation, namespace lifecycle, and `dryRun`.
pub(in crate::api) async fn create_object<S: Storage>(
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
    ctx.trace.name(&name);
    record_fields(&mut object)?;
    invalid::<S>(&name, storage.validate(&object))?;
    ctx.admit_create().await?;
    ctx.trace.step("validated and admitted");
    if dry_run {
        return Ok(object);
    }
    let created = storage.create(ctx, object).await?;
    ctx.trace.step("stored");
    Ok(created)
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
    ctx.trace.step("decoded");
    let manager = options
        .field_manager
        .clone()
        .unwrap_or_else(|| "unknown".into());
    let record_fields =
        |object: &mut S::Object| managed_fields::record_update(object, None, &manager);
    let created = create_object(storage, ctx, object, record_fields, options.dry_run).await?;
    let response = respond::object(
        storage,
        StatusCode::CREATED,
        negotiated,
        TableOptions::default(),
        &created,
        &warnings,
    );
    ctx.trace.step("encoded");
    response
}
