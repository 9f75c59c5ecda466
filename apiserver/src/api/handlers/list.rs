//! list, and the selectors and continue tokens a list and a watch share
//! (`apiserver:pkg/endpoints/handlers/get.go` `ListResource`).

use std::collections::BTreeMap;

use axum::response::Response;
use battery_api_machinery::negotiate::{Format, Negotiated};
use battery_api_machinery::params::{ListOptions, TableOptions};
use battery_api_machinery::status::ApiError;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use kube::Resource;
use serde_json::Value;

use crate::api::RequestContext;
use crate::api::respond;
use crate::api::storage::{Storage, StoredItem, list_key};

/// Items that pass both selectors, in the storage's [`list_key`] order.
pub async fn select<S: Storage>(
    storage: &S,
    ctx: &RequestContext,
    options: &ListOptions,
) -> Result<(Vec<S::Object>, u64), ApiError> {
    check_selectable(storage, options)?;
    let (items, rv) = storage.list(ctx).await?;
    ctx.trace.step("listed from storage");
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
        ctx.trace.step("listed from storage");
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
    ctx.trace.step("listed from storage");
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
