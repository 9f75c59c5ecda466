//! From a request to the verb of one resource: parse the request info, find the
//! resource, check the verb is one it serves, read the body, and call the generic
//! handler with the resource's storage (`apiserver:pkg/endpoints/installer.go` derives
//! the same routes from each storage's capabilities; ours come from `ResourceInfo`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use battery_api_machinery::negotiate::{Negotiated, PatchType, body_format};
use battery_api_machinery::params::{
    CreateOptions, DeleteOptions, ListOptions, PatchOptions, QueryOptions, TableOptions,
    UpdateOptions,
};
use battery_api_machinery::request_info::{self, RequestInfo};
use battery_api_machinery::status::ApiError;
use battery_types::{HasResourceInfo, ResourceInfo, Scope, Verb};
use futures::future::BoxFuture;
use http::HeaderMap;
use http::request::Parts;

use super::apply;
use super::call::Call;
use super::connect::{Connect, ConnectEndpoint};
use super::context::RequestContext;
use super::handlers::{self, Write};
use super::limits::{self, Limiter, Limits};
use super::namespace_lifecycle::NamespaceLifecycle;
use super::storage::Storage;
use super::subresource::SubresourceEndpoint;
use super::watch_stream;
use crate::meta_store::MetaStore;

/// Go's limit on request bodies (`apiserver:pkg/server/config.go` `MaxRequestBodyBytes`).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// One served resource, with its storage behind an object-safe face.
pub trait Endpoint: Send + Sync + 'static {
    fn info(&self) -> &'static ResourceInfo;
    fn handle(&self, call: Call) -> BoxFuture<'static, Result<Response, ApiError>>;
}

/// The generic handlers over storage `S`.
pub struct ResourceEndpoint<S: Storage> {
    storage: Arc<S>,
    store: Arc<MetaStore>,
    subresources: HashMap<&'static str, Arc<dyn SubresourceEndpoint>>,
}

impl<S: Storage> ResourceEndpoint<S> {
    pub fn new(storage: Arc<S>, store: Arc<MetaStore>) -> Self {
        Self {
            storage,
            store,
            subresources: HashMap::new(),
        }
    }

    /// Serves the subresource `name` with `endpoint`.
    pub fn with_subresource(
        mut self,
        name: &'static str,
        endpoint: Arc<dyn SubresourceEndpoint>,
    ) -> Self {
        self.subresources.insert(name, endpoint);
        self
    }

    /// Serves the connect subresource `name` (`exec`) with `connect`.
    pub fn with_connect(self, name: &'static str, connect: Arc<dyn Connect>) -> Self {
        self.with_subresource(name, Arc::new(ConnectEndpoint(connect)))
    }
}

fn query(parts: &Parts) -> &str {
    parts.uri.query().unwrap_or_default()
}

impl<S: Storage> Endpoint for ResourceEndpoint<S> {
    fn info(&self) -> &'static ResourceInfo {
        &<S::Object as HasResourceInfo>::INFO
    }

    fn handle(&self, call: Call) -> BoxFuture<'static, Result<Response, ApiError>> {
        if let Some(subresource) = self.subresources.get(call.info.subresource.as_str()) {
            return subresource.handle(call);
        }
        Box::pin(serve(self.storage.clone(), self.store.clone(), call))
    }
}

/// Serves a call on the main resource, or a read of its status: one short function per
/// verb reads the verb's options and calls its handler.
async fn serve<S: Storage>(
    storage: Arc<S>,
    store: Arc<MetaStore>,
    call: Call,
) -> Result<Response, ApiError> {
    let Call {
        ctx,
        info,
        verb,
        parts,
        body,
        watch_slot,
    } = call;
    let on = On {
        storage: storage.as_ref(),
        ctx: &ctx,
        name: &info.name,
        headers: &parts.headers,
        query: query(&parts),
        body: &body,
    };
    match (verb, info.subresource.as_str()) {
        (Verb::Get, "") => get(on).await,
        (Verb::List, "") => list(on).await,
        (Verb::Watch, "") => {
            let (name, q) = (&info.name, query(&parts));
            watch(storage, store, watch_slot, ctx, name, &parts.headers, q).await
        }
        (Verb::Create, "") => create(on).await,
        (Verb::Update, "") => update(on).await,
        (Verb::Patch, "") => patch(on).await,
        (Verb::Delete, "") => delete(on).await,
        (Verb::DeleteCollection, "") => delete_collection(on).await,
        // The status subresource reads the whole object, as Go's status storage.
        (Verb::Get, "status") => {
            let negotiated = on.negotiated()?;
            handlers::get(
                on.storage,
                on.ctx,
                on.name,
                &negotiated,
                TableOptions::default(),
            )
            .await
        }
        (verb, other) => {
            let resource = &<S::Object as HasResourceInfo>::INFO;
            Err(ApiError::method_not_allowed(
                resource,
                &format!("{} on {}/{other}", verb.as_str(), resource.plural),
            ))
        }
    }
}

/// What a verb reads of its call.
struct On<'a, S> {
    storage: &'a S,
    ctx: &'a RequestContext,
    name: &'a str,
    headers: &'a HeaderMap,
    query: &'a str,
    body: &'a [u8],
}

impl<S> On<'_, S> {
    fn negotiated(&self) -> Result<Negotiated, ApiError> {
        Negotiated::for_resource(self.headers, Some(self.query))
    }

    fn write(&self) -> Result<Write<'_>, ApiError> {
        Ok(Write {
            body: self.body,
            format: body_format(self.headers)?,
        })
    }
}

async fn get<S: Storage>(on: On<'_, S>) -> Result<Response, ApiError> {
    let negotiated = on.negotiated()?;
    let table = TableOptions::from_request(on.query, on.headers)?;
    handlers::get(on.storage, on.ctx, on.name, &negotiated, table).await
}

async fn list<S: Storage>(on: On<'_, S>) -> Result<Response, ApiError> {
    let negotiated = on.negotiated()?;
    let table = TableOptions::from_request(on.query, on.headers)?;
    let options = ListOptions::from_request(on.query, on.headers)?;
    options.forbid_send_initial_events()?;
    handlers::list(on.storage, on.ctx, &options, &negotiated, table).await
}

async fn watch<S: Storage>(
    storage: Arc<S>,
    store: Arc<MetaStore>,
    watch_slot: Option<tokio::sync::OwnedSemaphorePermit>,
    ctx: RequestContext,
    name: &str,
    headers: &HeaderMap,
    query: &str,
) -> Result<Response, ApiError> {
    let negotiated = Negotiated::for_watch(headers)?;
    let table = TableOptions::from_request(query, headers)?;
    let mut options = ListOptions::from_request(query, headers)?;
    if !name.is_empty() {
        // `/watch/namespaces/ns/pools/x` watches one object.
        options.field_selector = battery_api_machinery::selectors::FieldSelector::parse(&format!(
            "metadata.name={name}"
        ))?;
    }
    watch_stream::watch(
        storage,
        store,
        watch_slot,
        ctx,
        options,
        negotiated,
        table.include_object,
    )
    .await
}

async fn create<S: Storage>(on: On<'_, S>) -> Result<Response, ApiError> {
    let negotiated = on.negotiated()?;
    let options = CreateOptions::from_request(on.query, on.headers)?;
    handlers::create(on.storage, on.ctx, on.write()?, &options, &negotiated).await
}

async fn update<S: Storage>(on: On<'_, S>) -> Result<Response, ApiError> {
    let negotiated = on.negotiated()?;
    let options = UpdateOptions::from_request(on.query, on.headers)?;
    let write = on.write()?;
    handlers::update(on.storage, on.ctx, on.name, write, &options, &negotiated).await
}

async fn patch<S: Storage>(on: On<'_, S>) -> Result<Response, ApiError> {
    let negotiated = on.negotiated()?;
    let options = PatchOptions::from_request(on.query, on.headers)?;
    if options.patch_type == PatchType::Apply {
        let manager = options.field_manager.as_deref().unwrap_or("unknown");
        let (storage, ctx, name, body) = (on.storage, on.ctx, on.name, on.body);
        return apply::apply(storage, ctx, name, body, &options, &negotiated, manager).await;
    }
    handlers::patch(on.storage, on.ctx, on.name, on.body, &options, &negotiated).await
}

async fn delete<S: Storage>(on: On<'_, S>) -> Result<Response, ApiError> {
    let negotiated = on.negotiated()?;
    let options = DeleteOptions::from_request(on.query, on.headers, on.body)?;
    handlers::delete(on.storage, on.ctx, on.name, &options, &negotiated).await
}

async fn delete_collection<S: Storage>(on: On<'_, S>) -> Result<Response, ApiError> {
    let negotiated = on.negotiated()?;
    let list = ListOptions::from_request(on.query, on.headers)?;
    let options = DeleteOptions::from_request(on.query, on.headers, on.body)?;
    handlers::delete_collection(on.storage, on.ctx, &list, &options, &negotiated).await
}

struct Resources {
    endpoints: HashMap<&'static str, Arc<dyn Endpoint>>,
    lifecycle: Option<Arc<dyn NamespaceLifecycle>>,
    limiter: Limiter,
}

/// The router of `/apis/<group>/<version>/...` for `endpoints`.
pub fn resource_router(
    endpoints: Vec<Arc<dyn Endpoint>>,
    lifecycle: Option<Arc<dyn NamespaceLifecycle>>,
    limits: Limits,
) -> Router {
    let mut by_plural = HashMap::new();
    let mut prefixes = Vec::new();
    for endpoint in endpoints {
        let info = endpoint.info();
        let prefix = format!("/apis/{}/{}", info.group, info.version);
        if !prefixes.contains(&prefix) {
            prefixes.push(prefix);
        }
        by_plural.insert(info.plural, endpoint);
    }
    let state = Arc::new(Resources {
        endpoints: by_plural,
        lifecycle,
        limiter: Limiter::new(limits),
    });
    let mut router = Router::new();
    for prefix in prefixes {
        router = router.route(&format!("{prefix}/{{*rest}}"), any(dispatch));
    }
    router.with_state(state)
}

async fn dispatch(State(resources): State<Arc<Resources>>, request: Request) -> Response {
    match route(&resources, request).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn route(resources: &Resources, request: Request) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let info = request_info::of(&parts.extensions)?.clone();
    let asked = info.resource_verb();
    let endpoint = resources
        .endpoints
        .get(info.resource.as_str())
        .ok_or_else(|| not_found(&info))?;
    let resource = endpoint.info();
    check_scope(resource, &info, asked)?;
    let verb = check_verb(resource, &info, asked, &parts.method)?;
    let body = axum::body::to_bytes(Body::new(body), MAX_BODY_BYTES)
        .await
        .map_err(|_| {
            ApiError::request_entity_too_large(format!(
                "the request body is larger than {MAX_BODY_BYTES} bytes"
            ))
        })?;
    let ctx = RequestContext::of(&parts.extensions, &info, resources.lifecycle.clone())?;
    ctx.trace.step("body read");
    if !info.name.is_empty() {
        ctx.trace.name(&info.name);
    }
    let limiter = &resources.limiter;
    let watch_slot = match verb {
        Verb::Watch => Some(limiter.admit_watch()?),
        Verb::Create if info.subresource.is_empty() => {
            limiter.admit_create(&ctx.user.name)?;
            None
        }
        _ => None,
    };
    let long_running = watch_slot.is_some();
    let timeout = limiter.request_timeout();
    let call = endpoint.handle(Call {
        ctx,
        info,
        verb,
        parts,
        body,
        watch_slot,
    });
    if long_running {
        // The watch's own timeoutSeconds ends it.
        return call.await;
    }
    // A bind outlives its request, so giving up here leaves nothing half done.
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| Err(limits::timed_out()))
}

/// Go's answer for a path no resource serves: a 404 Status with the generic message.
fn not_found(info: &RequestInfo) -> ApiError {
    ApiError::no_route(Some(&info.path))
}

fn check_scope(
    resource: &ResourceInfo,
    info: &RequestInfo,
    verb: Option<Verb>,
) -> Result<(), ApiError> {
    let collection_verb = matches!(
        verb,
        Some(Verb::List | Verb::Watch | Verb::DeleteCollection)
    );
    match resource.scope {
        Scope::Cluster if !info.namespace.is_empty() => Err(not_found(info)),
        // A single namespaced object is always addressed within its namespace.
        Scope::Namespaced if info.namespace.is_empty() && !collection_verb => Err(not_found(info)),
        _ => Ok(()),
    }
}

/// The verb must be one the resource (or its subresource) serves: 405 otherwise.
fn check_verb(
    resource: &ResourceInfo,
    info: &RequestInfo,
    verb: Option<Verb>,
    method: &http::Method,
) -> Result<Verb, ApiError> {
    let Some(verb) = verb else {
        return Err(ApiError::method_not_allowed(resource, &info.verb));
    };
    // The `/watch/` prefix makes any method a watch in request info; Go serves only GET
    // there, so another method is refused rather than opening a watch.
    if verb == Verb::Watch && method != http::Method::GET {
        return Err(ApiError::method_not_allowed(
            resource,
            &format!("{method} on a watch"),
        ));
    }
    let verbs: &[Verb] = if info.subresource.is_empty() {
        resource.verbs
    } else {
        match resource
            .subresources
            .iter()
            .find(|s| s.name == info.subresource)
        {
            Some(sub) => sub.verbs,
            None => return Err(not_found(info)),
        }
    };
    // `list` and `watch` of a collection are served when the resource lists them.
    if verbs.contains(&verb) {
        Ok(verb)
    } else {
        Err(ApiError::method_not_allowed(resource, &info.verb))
    }
}
