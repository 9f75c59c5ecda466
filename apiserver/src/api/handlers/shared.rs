//! What the verbs share: decoding a body into the kind, the namespace check,
//! preconditions.

use battery_api_machinery::negotiate::Format;
use battery_api_machinery::params::FieldValidation;
use battery_api_machinery::status::ApiError;
use battery_types::HasResourceInfo;
use battery_types::validation::FieldError;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde_json::Value;

use crate::api::RequestContext;
use crate::api::respond::Warnings;
use crate::api::storage::Storage;

pub(in crate::api) fn info<S: Storage>() -> &'static battery_types::ResourceInfo {
    &<S::Object as HasResourceInfo>::INFO
}

/// Decodes a body into the kind, checking `apiVersion`/`kind` and applying
/// `fieldValidation` to unknown fields (`strict decoding error: unknown field "spec.x"`).
pub(in crate::api) fn decode_object<S: Storage>(
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
pub(in crate::api) fn unknown_fields(
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

pub(in crate::api) fn decode_body(format: Format, body: &[u8]) -> Result<Value, ApiError> {
    format.decode(body)
}

pub(in crate::api) fn invalid<S: Storage>(
    name: &str,
    errors: Vec<FieldError>,
) -> Result<(), ApiError> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(info::<S>(), name, &errors))
    }
}

/// The namespace in the body must be the URL's (Go: 400 "the namespace of the provided
/// object does not match the namespace sent on the request").
pub(in crate::api) fn check_namespace(
    ctx: &RequestContext,
    meta: &mut ObjectMeta,
) -> Result<(), ApiError> {
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

/// Who changed an object, for `managedFields`.
#[derive(Clone, Copy)]
pub(in crate::api) enum Manager<'a> {
    /// An update by this field manager: its fields are recorded here.
    Update(&'a str),
    /// A server-side apply, whose `managedFields` the caller already computed.
    Applied,
}

pub struct Write<'a> {
    pub body: &'a [u8],
    pub format: Format,
}

/// A failed uid or resourceVersion precondition, in Go's words (`apiserver:pkg/
/// storage/etcd3/store.go` `checkPreconditions`).
pub(in crate::api) fn precondition_failed(
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
