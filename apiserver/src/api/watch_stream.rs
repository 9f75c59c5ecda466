//! `?watch=true`: newline-delimited JSON events, live from the store's watch hub
//! (`apiserver:pkg/endpoints/handlers/watch.go`, `pkg/storage/cacher`).
//!
//! resourceVersion semantics (`reference/aggregated-apiserver.md` §7): unset or `"0"`
//! sends the current objects as ADDED first; a specific version sends only what came
//! after it, or `410 Expired` when it is older than the window; `sendInitialEvents=true`
//! (WatchList, what informers of 1.35+ use) sends the current objects and then a bookmark
//! annotated `k8s.io/initial-events-end`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use battery_api_machinery::negotiate::{Negotiated, Target};
use battery_api_machinery::params::{IncludeObject, ListOptions, ResourceVersionMatch};
use battery_api_machinery::status::ApiError;
use battery_api_machinery::table::PartialObjectMetadata;
use battery_api_machinery::watch::{Bookmark, EventType, WatchEvent};
use battery_types::HasResourceInfo;
use battery_types::validation::FieldError;
use http::{HeaderValue, StatusCode, header};
use kube::Resource;
use serde_json::Value;
use tokio::sync::mpsc;

use super::RequestContext;
use super::handlers::{matches, select};
use super::respond;
use super::storage::Storage;
use crate::meta_store::MetaStore;
use crate::watch::{Change, ChangeType, Subscription};

/// How often a watch that allows bookmarks gets one, so a client can resume close to
/// where it was even when nothing it watches changes.
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(30);
/// Without `timeoutSeconds`, a watch ends cleanly after Go's `MinRequestTimeout` (30
/// minutes) and the client re-watches.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Events buffered for a slow client before it holds up nothing but itself.
const CLIENT_BUFFER: usize = 256;

/// `validateWatchOptions` (`apimachinery:pkg/apis/meta/internalversion/validation`).
fn validate(options: &ListOptions) -> Result<(), ApiError> {
    let mut errors = Vec::new();
    match (options.send_initial_events, options.resource_version_match) {
        (Some(_), Some(ResourceVersionMatch::NotOlderThan)) | (None, None) => {}
        (Some(_), _) => errors.push(FieldError::forbidden(
            "resourceVersionMatch",
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        )),
        (None, Some(_)) => errors.push(FieldError::forbidden(
            "resourceVersionMatch",
            "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        )),
    }
    if options.send_initial_events == Some(true) && !options.allow_watch_bookmarks {
        errors.push(FieldError::forbidden(
            "allowWatchBookmarks",
            "allowWatchBookmarks must be set to true when sendInitialEvents is true",
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid_kind(
            "meta.k8s.io",
            "ListOptions",
            "",
            &errors,
        ))
    }
}

fn parse_rv(rv: &str) -> Result<u64, ApiError> {
    rv.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv:?}")))
}

/// Where the stream starts.
struct Start<T> {
    /// Objects to send as ADDED first.
    initial: Vec<T>,
    /// Whether to end the initial objects with the initial-events-end bookmark.
    end_bookmark: bool,
    /// Changes after this version are streamed.
    after: u64,
}

pub async fn watch<S: Storage>(
    storage: Arc<S>,
    store: Arc<MetaStore>,
    slot: Option<tokio::sync::OwnedSemaphorePermit>,
    ctx: RequestContext,
    options: ListOptions,
    negotiated: Negotiated,
    include: IncludeObject,
) -> Result<Response, ApiError> {
    validate(&options)?;
    let requested = options
        .resource_version
        .as_deref()
        .filter(|rv| *rv != "0")
        .map(parse_rv)
        .transpose()?;
    let hub = store.hub().clone();
    let now = store.resource_version().map_err(ApiError::internal)?;
    let wants_initial = match options.send_initial_events {
        Some(send) => send,
        None => requested.is_none(),
    };
    // Subscribe before listing, so nothing committed in between is lost; what the list
    // already shows is skipped by resourceVersion below.
    let subscription = hub
        .subscribe(if wants_initial {
            now
        } else {
            requested.unwrap_or(now)
        })
        .map_err(|too_old| ApiError::expired(too_old.to_string()))?;
    let start = if wants_initial {
        let (initial, list_rv) = select(storage.as_ref(), &ctx, &options).await?;
        Start {
            initial,
            end_bookmark: options.send_initial_events == Some(true),
            after: list_rv,
        }
    } else {
        Start {
            initial: Vec::new(),
            end_bookmark: false,
            after: requested.unwrap_or(now),
        }
    };
    let timeout = options.timeout.unwrap_or(DEFAULT_TIMEOUT);
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(CLIENT_BUFFER);
    let stream = Stream {
        storage,
        ctx,
        options,
        negotiated,
        include,
        tx,
        sent_headers: false,
        _slot: slot,
    };
    tokio::spawn(stream.run(start, subscription, timeout));
    let mut response = Response::new(Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    ));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

struct Stream<S: Storage> {
    storage: Arc<S>,
    ctx: RequestContext,
    options: ListOptions,
    negotiated: Negotiated,
    include: IncludeObject,
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
    sent_headers: bool,
    /// The watch's slot under the watch cap, released when the stream ends.
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl<S: Storage> Stream<S> {
    async fn run(mut self, start: Start<S::Object>, subscription: Subscription, timeout: Duration) {
        let Subscription {
            backlog,
            mut receiver,
        } = subscription;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut last_rv = start.after;
        for object in &start.initial {
            if !self.send_object(EventType::Added, object).await {
                return;
            }
        }
        if start.end_bookmark && !self.send_bookmark(last_rv, true).await {
            return;
        }
        for change in backlog {
            if change.resource_version > last_rv {
                last_rv = change.resource_version;
                if !self.send_change(&change).await {
                    return;
                }
            }
        }
        let mut bookmarks = tokio::time::interval(BOOKMARK_INTERVAL);
        bookmarks.tick().await;
        loop {
            tokio::select! {
                () = &mut deadline => return,
                () = self.tx.closed() => return,
                _ = bookmarks.tick(), if self.options.allow_watch_bookmarks => {
                    if !self.send_bookmark(last_rv, false).await {
                        return;
                    }
                }
                received = receiver.recv() => match received {
                    Ok(change) if change.resource_version > last_rv => {
                        last_rv = change.resource_version;
                        if !self.send_change(&change).await {
                            return;
                        }
                    }
                    Ok(_) => {}
                    // Fell behind the hub (or the server is stopping): end the stream;
                    // the client re-watches from its last resourceVersion.
                    Err(_) => return,
                },
            }
        }
    }

    async fn send_change(&mut self, change: &Change) -> bool {
        let info = &<S::Object as HasResourceInfo>::INFO;
        if change.resource != info.plural {
            return true;
        }
        if let Some(ns) = &self.ctx.namespace
            && change.namespace.as_ref() != Some(ns)
        {
            return true;
        }
        let Some(object) = change.object.downcast_ref::<S::Object>() else {
            tracing::error!(resource = info.plural, name = %change.name, "a watch change holds another kind of object");
            return true;
        };
        if !matches(self.storage.as_ref(), object, &self.options) {
            return true;
        }
        let event_type = match change.change_type {
            ChangeType::Added => EventType::Added,
            ChangeType::Modified => EventType::Modified,
            ChangeType::Deleted => EventType::Deleted,
        };
        if self.negotiated.target != Target::Object {
            return self.send_object(event_type, object).await;
        }
        let line = change.json_line.get_or_init(|| {
            WatchEvent::new(event_type, object)
                .to_json_line()
                .map(Bytes::from)
                .map_err(|err| err.to_string())
        });
        match line {
            Ok(line) => self.tx.send(Ok(line.clone())).await.is_ok(),
            Err(err) => {
                tracing::error!(error = %err, "encoding a watch event");
                false
            }
        }
    }

    async fn send_object(&mut self, event_type: EventType, object: &S::Object) -> bool {
        let rendered = match self.render(object) {
            Ok(value) => value,
            Err(error) => {
                return self
                    .send_line(WatchEvent::error(&error).to_json_line())
                    .await;
            }
        };
        self.send_line(WatchEvent::new(event_type, rendered).to_json_line())
            .await
    }

    fn render(&mut self, object: &S::Object) -> Result<Value, ApiError> {
        match self.negotiated.target {
            Target::Object => serde_json::to_value(object).map_err(ApiError::internal),
            Target::Table(version) => {
                // kubectl takes the columns from the first event and reuses them.
                let headers = !self.sent_headers;
                self.sent_headers = true;
                let table = respond::table(
                    self.storage.as_ref(),
                    version,
                    std::slice::from_ref(object),
                    self.include,
                    headers,
                );
                serde_json::to_value(table).map_err(ApiError::internal)
            }
            Target::PartialObjectMetadata(version) | Target::PartialObjectMetadataList(version) => {
                serde_json::to_value(PartialObjectMetadata::new(version, object.meta().clone()))
                    .map_err(ApiError::internal)
            }
        }
    }

    async fn send_bookmark(&mut self, rv: u64, initial_events_end: bool) -> bool {
        let (api_version, kind) = match self.negotiated.target {
            Target::PartialObjectMetadata(v) | Target::PartialObjectMetadataList(v) => (
                v.api_version().to_owned(),
                "PartialObjectMetadata".to_owned(),
            ),
            Target::Object | Target::Table(_) => (
                S::Object::api_version(&()).into_owned(),
                <S::Object as HasResourceInfo>::INFO.kind.to_owned(),
            ),
        };
        let rv = rv.to_string();
        let bookmark = if initial_events_end {
            Bookmark::initial_events_end(&api_version, &kind, &rv)
        } else {
            Bookmark::new(&api_version, &kind, &rv)
        };
        self.send_line(WatchEvent::bookmark(bookmark).to_json_line())
            .await
    }

    async fn send_line(&mut self, line: Result<Vec<u8>, serde_json::Error>) -> bool {
        match line {
            Ok(line) => self.tx.send(Ok(Bytes::from(line))).await.is_ok(),
            Err(err) => {
                tracing::error!(error = %err, "encoding a watch event");
                false
            }
        }
    }
}
