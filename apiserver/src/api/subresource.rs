//! Subresources with their own object (`status` writes, `lease`), each a small storage
//! like Go's `StatusREST`: get, update, and patch as get-patch-update. Connect
//! subresources (exec) are `connect`'s.

use std::sync::Arc;

use axum::response::Response;
use battery_api_machinery::negotiate::{Negotiated, PatchType, body_format};
use battery_api_machinery::params::{FieldValidation, PatchOptions, QueryOptions, UpdateOptions};
use battery_api_machinery::status::ApiError;
use battery_types::Verb;
use futures::future::BoxFuture;
use http::StatusCode;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::RequestContext;
use super::call::Call;
use super::handlers::{apply_patch, unknown_fields};
use super::respond;

/// One subresource's storage.
pub trait Subresource: Send + Sync + 'static {
    /// What the subresource reads and writes.
    type Object: Serialize + DeserializeOwned + Clone + Send + Sync + 'static;

    /// The subresource of the object `name`.
    fn get(
        &self,
        ctx: &RequestContext,
        name: &str,
    ) -> impl Future<Output = Result<Self::Object, ApiError>> + Send;

    /// Writes `new` (the client's full object) over `current`; `dry_run` checks without
    /// changing anything.
    fn update(
        &self,
        ctx: &RequestContext,
        name: &str,
        new: Self::Object,
        dry_run: bool,
    ) -> impl Future<Output = Result<Self::Object, ApiError>> + Send;
}

/// The object-safe face of a [`Subresource`], for the dispatcher.
pub trait SubresourceEndpoint: Send + Sync + 'static {
    fn handle(&self, call: Call) -> BoxFuture<'static, Result<Response, ApiError>>;
}

impl<T: Subresource> SubresourceEndpoint for Arc<T> {
    fn handle(&self, call: Call) -> BoxFuture<'static, Result<Response, ApiError>> {
        let storage = self.clone();
        Box::pin(async move { serve(storage.as_ref(), call).await })
    }
}

/// Decodes a subresource's body, applying `fieldValidation` to its unknown fields.
pub(super) fn decode<T: DeserializeOwned>(
    value: Value,
    validation: FieldValidation,
) -> Result<(T, Vec<String>), ApiError> {
    let mut unknown = Vec::new();
    let object: T = serde_ignored::deserialize(&value, |path| unknown.push(path.to_string()))
        .map_err(|e| ApiError::bad_request(format!("error decoding the request body: {e}")))?;
    // apiVersion and kind are part of every Kubernetes object, named or not by its type.
    unknown.retain(|f| f != "apiVersion" && f != "kind");
    Ok((object, unknown_fields(&unknown, validation)?))
}

async fn serve<T: Subresource>(storage: &T, call: Call) -> Result<Response, ApiError> {
    let Call {
        ctx,
        info,
        verb,
        parts,
        body,
        ..
    } = call;
    let query = parts.uri.query().unwrap_or_default();
    let headers = &parts.headers;
    let negotiated = Negotiated::for_resource(headers, Some(query))?;
    let name = info.name.as_str();
    let (object, warnings) = match verb {
        Verb::Get => (storage.get(&ctx, name).await?, Vec::new()),
        // A subresource that accepts POST treats it as a write of the whole object.
        Verb::Update | Verb::Create => {
            let options = UpdateOptions::from_request(query, headers)?;
            let value: Value = body_format(headers)?.decode(&body)?;
            let (new, warnings) = decode(value, options.field_validation)?;
            (
                storage.update(&ctx, name, new, options.dry_run).await?,
                warnings,
            )
        }
        Verb::Patch => {
            let options = PatchOptions::from_request(query, headers)?;
            if options.patch_type == PatchType::Apply {
                return Err(ApiError::unsupported_media_type(&[
                    PatchType::JsonPatch.content_type(),
                    PatchType::MergePatch.content_type(),
                ]));
            }
            let patch: Value = serde_json::from_slice(&body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            let current = storage.get(&ctx, name).await?;
            let mut document = serde_json::to_value(&current).map_err(ApiError::internal)?;
            apply_patch(options.patch_type, &mut document, &patch)?;
            let (new, warnings) = decode(document, options.field_validation)?;
            (
                storage.update(&ctx, name, new, options.dry_run).await?,
                warnings,
            )
        }
        other => {
            return Err(ApiError::subresource_method_not_allowed(
                &info,
                other.as_str(),
            ));
        }
    };
    respond::encoded(StatusCode::OK, &negotiated, &object, &warnings)
}
