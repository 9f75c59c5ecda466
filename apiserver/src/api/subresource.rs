//! Subresources with their own object (`status` writes, `lease`, `scale`), each a small
//! storage like Go's `StatusREST`: get, update, and patch as get-patch-update. One whose
//! object differs (`scale`'s Table, kind check and retried patch) overrides the step
//! that differs. Connect subresources (exec) are `connect`'s.

use std::sync::Arc;

use axum::response::Response;
use battery_api_machinery::negotiate::{Negotiated, PatchType, body_format};
use battery_api_machinery::params::{FieldValidation, PatchOptions, QueryOptions, UpdateOptions};
use battery_api_machinery::status::ApiError;
use battery_types::Verb;
use futures::future::BoxFuture;
use http::{HeaderMap, StatusCode};
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

    /// Whether a POST writes the whole object, as a PUT does.
    const POST_WRITES: bool = true;

    /// The subresource of the object `name`.
    fn get(
        &self,
        ctx: &RequestContext,
        name: &str,
    ) -> impl Future<Output = Result<Self::Object, ApiError>> + Send;

    /// Writes `new` (the client's full object) over `current`; `dry_run` checks without
    /// changing anything; `field_manager` names the writer, for those that record it.
    fn update(
        &self,
        ctx: &RequestContext,
        name: &str,
        new: Self::Object,
        dry_run: bool,
        field_manager: &str,
    ) -> impl Future<Output = Result<Self::Object, ApiError>> + Send;

    /// Decodes a written body, or a patched one, for the object `name`.
    fn decode(
        &self,
        _ctx: &RequestContext,
        _name: &str,
        value: Value,
        validation: FieldValidation,
    ) -> Result<(Self::Object, Vec<String>), ApiError> {
        decode(value, validation)
    }

    /// The answer to a read of `object`.
    fn respond_read(
        &self,
        object: &Self::Object,
        negotiated: &Negotiated,
        _query: &str,
        _headers: &HeaderMap,
    ) -> Result<Response, ApiError> {
        respond::encoded(StatusCode::OK, negotiated, object, &[])
    }

    /// A patch, as get-patch-update: the patched object and the warnings of its decoding.
    fn patch(
        &self,
        ctx: &RequestContext,
        name: &str,
        body: &[u8],
        query: &str,
        headers: &HeaderMap,
    ) -> impl Future<Output = Result<(Self::Object, Vec<String>), ApiError>> + Send {
        async move {
            let options = PatchOptions::from_request(query, headers)?;
            if options.patch_type == PatchType::Apply {
                return Err(ApiError::unsupported_media_type(&[
                    PatchType::JsonPatch.content_type(),
                    PatchType::MergePatch.content_type(),
                ]));
            }
            let patch: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            let (new, warnings) = patched(self, ctx, name, &options, &patch).await?;
            let manager = options.field_manager.as_deref().unwrap_or("unknown");
            let written = self.update(ctx, name, new, options.dry_run, manager);
            Ok((written.await?, warnings))
        }
    }
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

/// The object `name` as it is now with `patch` applied, decoded, and the warnings of its
/// decoding: the read and the patch every subresource's patch starts with.
pub(super) async fn patched<T: Subresource + ?Sized>(
    storage: &T,
    ctx: &RequestContext,
    name: &str,
    options: &PatchOptions,
    patch: &Value,
) -> Result<(T::Object, Vec<String>), ApiError> {
    let current = storage.get(ctx, name).await?;
    let mut document = serde_json::to_value(&current).map_err(ApiError::internal)?;
    apply_patch(options.patch_type, &mut document, patch)?;
    storage.decode(ctx, name, document, options.field_validation)
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
        Verb::Get => {
            let object = storage.get(&ctx, name).await?;
            return storage.respond_read(&object, &negotiated, query, headers);
        }
        // A subresource that accepts POST treats it as a write of the whole object.
        Verb::Update | Verb::Create if verb == Verb::Update || T::POST_WRITES => {
            let options = UpdateOptions::from_request(query, headers)?;
            let value: Value = body_format(headers)?.decode(&body)?;
            let (new, warnings) = storage.decode(&ctx, name, value, options.field_validation)?;
            let manager = options.field_manager.as_deref().unwrap_or("unknown");
            let written = storage.update(&ctx, name, new, options.dry_run, manager);
            (written.await?, warnings)
        }
        Verb::Patch => storage.patch(&ctx, name, &body, query, headers).await?,
        other => {
            return Err(ApiError::subresource_method_not_allowed(
                &info,
                other.as_str(),
            ));
        }
    };
    respond::encoded(StatusCode::OK, &negotiated, &object, &warnings)
}
