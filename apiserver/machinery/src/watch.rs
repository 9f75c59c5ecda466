//! The watch event envelope: one `{"type": ..., "object": ...}` JSON document per line
//! (`apiserver:pkg/endpoints/handlers/watch.go`).
//!
//! The object is whatever the client negotiated: the resource itself, a one-row `Table`, a
//! `PartialObjectMetadata`, a [`Bookmark`], or a `Status` for `ERROR`. Every one carries
//! `kind` and `apiVersion`, without which client decoders fail ("Object 'Kind' is missing").
//! k8s-openapi's `WatchEvent` is not used because its bookmarks and errors lack them.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use serde::Serialize;

use crate::status::ApiError;

/// The annotation on the bookmark that ends the initial events of a streaming list
/// (`sendInitialEvents=true`); informers wait for it before they report synced.
pub const INITIAL_EVENTS_END_ANNOTATION: &str = "k8s.io/initial-events-end";

/// `watch.EventType`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum EventType {
    /// The object appeared (or was there when the watch started).
    Added,
    /// The object changed.
    Modified,
    /// The object is gone; `object` is its last state.
    Deleted,
    /// Progress: the stream has reached `object.metadata.resourceVersion`.
    Bookmark,
    /// The watch failed; `object` is a `Status`, and the stream ends.
    Error,
}

/// One watch event.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WatchEvent<T> {
    /// What happened.
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// The object it happened to, in the negotiated representation.
    pub object: T,
}

impl<T: Serialize> WatchEvent<T> {
    /// An event of `event_type` for `object`.
    pub fn new(event_type: EventType, object: T) -> Self {
        WatchEvent { event_type, object }
    }

    /// The event as a line of the response: JSON and a newline, as Go's stream encoder
    /// writes it.
    pub fn to_json_line(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut line = serde_json::to_vec(self)?;
        line.push(b'\n');
        Ok(line)
    }
}

impl WatchEvent<Status> {
    /// An `ERROR` event carrying `error` as a `Status`, e.g. [`ApiError::expired`] for a
    /// resourceVersion older than the watch window, which makes a reflector relist.
    pub fn error(error: &ApiError) -> Self {
        WatchEvent {
            event_type: EventType::Error,
            object: error.to_status(),
        }
    }
}

impl WatchEvent<Bookmark> {
    /// A `BOOKMARK` event.
    pub fn bookmark(bookmark: Bookmark) -> Self {
        WatchEvent {
            event_type: EventType::Bookmark,
            object: bookmark,
        }
    }
}

/// The object of a `BOOKMARK` event: the watched kind with only a resourceVersion (and
/// annotations). For a metadata-only watch, the kind is `PartialObjectMetadata` in
/// `meta.k8s.io/v1`, as Go converts every event object, bookmarks included.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Bookmark {
    api_version: String,
    kind: String,
    metadata: BookmarkMetadata,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
struct BookmarkMetadata {
    resource_version: String,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: BTreeMap<String, String>,
}

impl Bookmark {
    /// A progress bookmark at `resource_version`.
    pub fn new(api_version: &str, kind: &str, resource_version: &str) -> Self {
        Bookmark {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            metadata: BookmarkMetadata {
                resource_version: resource_version.to_owned(),
                annotations: BTreeMap::new(),
            },
        }
    }

    /// The bookmark that ends the initial events of a streaming list, annotated
    /// `k8s.io/initial-events-end: "true"`.
    pub fn initial_events_end(api_version: &str, kind: &str, resource_version: &str) -> Self {
        let mut bookmark = Self::new(api_version, kind, resource_version);
        bookmark
            .metadata
            .annotations
            .insert(INITIAL_EVENTS_END_ANNOTATION.to_owned(), "true".to_owned());
        bookmark
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::table::{MetaVersion, PartialObjectMetadata, Table};

    fn line(json: &[u8]) -> serde_json::Value {
        assert_eq!(json.last(), Some(&b'\n'));
        assert_eq!(
            json.iter().filter(|b| **b == b'\n').count(),
            1,
            "one event per line"
        );
        serde_json::from_slice(json).unwrap()
    }

    #[test]
    fn objects_tables_and_metadata() {
        let object = json!({"kind": "Pool", "apiVersion": "battery.liquidmetal-x.dev/v1alpha1", "metadata": {"name": "a"}});
        let event = WatchEvent::new(EventType::Added, &object)
            .to_json_line()
            .unwrap();
        assert_eq!(line(&event), json!({"type": "ADDED", "object": object}));

        let table = WatchEvent::new(
            EventType::Modified,
            Table::<serde_json::Value>::new(MetaVersion::V1),
        )
        .to_json_line()
        .unwrap();
        assert_eq!(line(&table)["type"], "MODIFIED");
        assert_eq!(line(&table)["object"]["kind"], "Table");

        let partial = PartialObjectMetadata::new(
            MetaVersion::V1,
            k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta::default(),
        );
        let deleted = WatchEvent::new(EventType::Deleted, partial)
            .to_json_line()
            .unwrap();
        assert_eq!(
            line(&deleted),
            json!({"type": "DELETED", "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": {}}})
        );
    }

    #[test]
    fn bookmarks() {
        let plain = WatchEvent::bookmark(Bookmark::new(
            "battery.liquidmetal-x.dev/v1alpha1",
            "Pool",
            "42",
        ));
        assert_eq!(
            line(&plain.to_json_line().unwrap()),
            json!({"type": "BOOKMARK", "object": {
                "kind": "Pool", "apiVersion": "battery.liquidmetal-x.dev/v1alpha1",
                "metadata": {"resourceVersion": "42"},
            }})
        );
        let end = WatchEvent::bookmark(Bookmark::initial_events_end(
            "meta.k8s.io/v1",
            "PartialObjectMetadata",
            "43",
        ));
        assert_eq!(
            line(&end.to_json_line().unwrap()),
            json!({"type": "BOOKMARK", "object": {
                "kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                "metadata": {"resourceVersion": "43", "annotations": {"k8s.io/initial-events-end": "true"}},
            }})
        );
    }

    #[test]
    fn error_status() {
        let event = WatchEvent::error(&ApiError::expired("too old resource version: 5 (10)"));
        assert_eq!(
            line(&event.to_json_line().unwrap()),
            json!({"type": "ERROR", "object": {
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "too old resource version: 5 (10)", "reason": "Expired", "code": 410,
            }})
        );
    }
}
