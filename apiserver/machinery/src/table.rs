//! Server-side printing (`Table`) and metadata-only responses (`PartialObjectMetadata`),
//! the two `meta.k8s.io` conversions clients ask for with `Accept: ...;as=...`.
//!
//! kubectl prints a Table's cells verbatim, so ages are formatted here as Go's printers
//! format them ([`human_duration`], [`age`]). Neither k8s-openapi nor kube-core defines
//! these types, so they are here, serialize-only, with Go's JSON field names.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

/// The version of `meta.k8s.io` a client asked for (`v1`; `v1beta1` for old clients).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MetaVersion {
    /// `meta.k8s.io/v1`
    V1,
    /// `meta.k8s.io/v1beta1`
    V1beta1,
}

impl MetaVersion {
    /// The `apiVersion` of objects in this version.
    pub fn api_version(self) -> &'static str {
        match self {
            MetaVersion::V1 => "meta.k8s.io/v1",
            MetaVersion::V1beta1 => "meta.k8s.io/v1beta1",
        }
    }
}

/// `includeObject`: what a Table row's `object` holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IncludeObject {
    /// Nothing.
    None,
    /// The object's `PartialObjectMetadata` (the default).
    #[default]
    Metadata,
    /// The whole object (kubectl asks for it with `--sort-by`).
    Object,
}

/// `metav1.Table`: columns and one row per object.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Table<O> {
    api_version: &'static str,
    kind: &'static str,
    /// The list's resourceVersion and continue token. `kubectl get -w` starts its watch
    /// from this resourceVersion, so a list must set it.
    pub metadata: ListMeta,
    /// The columns. Watch events after the first leave them empty (Go's `NoHeaders`), and
    /// kubectl keeps the previous ones.
    pub column_definitions: Vec<TableColumnDefinition>,
    /// The rows, one per object.
    pub rows: Vec<TableRow<O>>,
}

impl<O> Table<O> {
    /// An empty table of `version`, to fill in.
    pub fn new(version: MetaVersion) -> Self {
        Table {
            api_version: version.api_version(),
            kind: "Table",
            metadata: ListMeta::default(),
            column_definitions: Vec::new(),
            rows: Vec::new(),
        }
    }
}

/// `metav1.TableColumnDefinition`. Every field is always written, as Go does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TableColumnDefinition {
    /// The header kubectl prints (upper-cased).
    pub name: String,
    /// An OpenAPI type: `string`, `integer`, `number`, `boolean` or `date`.
    #[serde(rename = "type")]
    pub type_: String,
    /// An OpenAPI format; `name` marks the column that holds the object's name.
    pub format: String,
    /// What the column shows.
    pub description: String,
    /// 0 for columns shown by default, higher for those only `-o wide` shows.
    pub priority: i32,
}

impl TableColumnDefinition {
    /// A column of `type_` with no format.
    pub fn new(name: &str, type_: &str, description: &str, priority: i32) -> Self {
        TableColumnDefinition {
            name: name.to_owned(),
            type_: type_.to_owned(),
            format: String::new(),
            description: description.to_owned(),
            priority,
        }
    }

    /// The `Name` column every resource table starts with, as Go's default and custom
    /// resource table convertors define it (the description is ObjectMeta's).
    pub fn name() -> Self {
        TableColumnDefinition {
            format: "name".to_owned(),
            ..Self::new(
                "Name",
                "string",
                "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
                0,
            )
        }
    }

    /// The `Age` column of custom resources (`type: date`); fill its cells with [`age`].
    pub fn age() -> Self {
        Self::new(
            "Age",
            "date",
            "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata",
            0,
        )
    }
}

/// `metav1.TableRow`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TableRow<O> {
    /// One cell per column: a string, number, boolean or null.
    pub cells: Vec<serde_json::Value>,
    /// What `includeObject` asked for of the row's object (see [`RowObject`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<O>,
}

/// A row's object: its metadata as a [`PartialObjectMetadata`] (`includeObject=Metadata`,
/// the default, which kubectl needs for `-A`, `--show-labels` and `-L`) or the whole
/// object (`Object`). It borrows and serializes in place, so a Table of thousands neither
/// copies each object's metadata nor builds a JSON tree per row. `M` is the metadata's
/// type: an [`ObjectMeta`], or its JSON as stored (a `serde_json::value::RawValue`).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum RowObject<'a, T: ?Sized, M: ?Sized = ObjectMeta> {
    #[serde(rename_all = "camelCase")]
    Metadata {
        api_version: &'static str,
        kind: &'static str,
        metadata: &'a M,
    },
    Object(&'a T),
}

impl<'a, T: ?Sized, M: ?Sized> RowObject<'a, T, M> {
    /// What `include` asks for of `object`, whose metadata is `meta`; nothing for `None`.
    pub fn new(
        include: IncludeObject,
        version: MetaVersion,
        meta: &'a M,
        object: &'a T,
    ) -> Option<Self> {
        match include {
            IncludeObject::None => None,
            IncludeObject::Metadata => Some(RowObject::Metadata {
                api_version: version.api_version(),
                kind: PARTIAL_OBJECT_METADATA,
                metadata: meta,
            }),
            IncludeObject::Object => Some(RowObject::Object(object)),
        }
    }
}

const PARTIAL_OBJECT_METADATA: &str = "PartialObjectMetadata";

/// `metav1.PartialObjectMetadata`: an object's kind and metadata only. The metadata client
/// (garbage collector, quota and namespace controllers) asks for these, and its watch has
/// no fallback if it gets anything else.
/// `M` is the metadata's type, as for [`RowObject`].
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartialObjectMetadata<M = ObjectMeta> {
    api_version: &'static str,
    kind: &'static str,
    /// The object's metadata, whole.
    pub metadata: M,
}

impl<M> PartialObjectMetadata<M> {
    /// `meta.AsPartialObjectMetadata`: `metadata` under `kind: PartialObjectMetadata`.
    pub fn new(version: MetaVersion, metadata: M) -> Self {
        PartialObjectMetadata {
            api_version: version.api_version(),
            kind: PARTIAL_OBJECT_METADATA,
            metadata,
        }
    }
}

/// `metav1.PartialObjectMetadataList`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartialObjectMetadataList<M = ObjectMeta> {
    api_version: &'static str,
    kind: &'static str,
    /// The list's resourceVersion, continue token and remaining item count.
    pub metadata: ListMeta,
    /// The items, each a `PartialObjectMetadata` of the same version.
    pub items: Vec<PartialObjectMetadata<M>>,
}

impl<M> PartialObjectMetadataList<M> {
    /// `asPartialObjectMetadataList`: each item's metadata under the list's `metadata`.
    pub fn new(
        version: MetaVersion,
        metadata: ListMeta,
        items: impl IntoIterator<Item = M>,
    ) -> Self {
        PartialObjectMetadataList {
            api_version: version.api_version(),
            kind: "PartialObjectMetadataList",
            metadata,
            items: items
                .into_iter()
                .map(|m| PartialObjectMetadata::new(version, m))
                .collect(),
        }
    }
}

/// `k8s.io/apimachinery/pkg/util/duration.HumanDuration`: about two significant figures,
/// finer for short spans (`5s`, `119s`, `2m`, `9m59s`, `179m`, `3h`, `7h59m`, `47h`,
/// `2d`, `7d23h`, `729d`, `2y`, `7y364d`, `8y`).
pub fn human_duration(d: Duration) -> String {
    let seconds = d.as_secs();
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        return match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        return match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{days}d"),
            h => format!("{days}d{h}h"),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        return match days % 365 {
            0 => format!("{years}y"),
            d => format!("{years}y{d}d"),
        };
    }
    format!("{years}y")
}

/// An AGE cell, as Go's printers' `translateTimestampSince`: `<unknown>` without a
/// creation time; a creation time up to a second in the future (clock skew) is `0s`, further
/// is `<invalid>`.
pub fn age(created: Option<&Time>, now: Timestamp) -> String {
    let Some(created) = created else {
        return "<unknown>".to_owned();
    };
    let elapsed = now.duration_since(created.0);
    if elapsed.is_negative() {
        // Go truncates to whole seconds toward zero before comparing with -1.
        return if elapsed.as_secs() < -1 {
            "<invalid>".to_owned()
        } else {
            "0s".to_owned()
        };
    }
    human_duration(elapsed.unsigned_abs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_object_serializes_as_the_owned_forms_do() {
        let meta = ObjectMeta {
            name: Some("c".into()),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        };
        let object = serde_json::json!({"kind": "MicroVMClaim", "metadata": {"name": "c"}});
        for version in [MetaVersion::V1, MetaVersion::V1beta1] {
            let borrowed = RowObject::new(IncludeObject::Metadata, version, &meta, &object);
            assert_eq!(
                serde_json::to_value(borrowed).unwrap(),
                serde_json::to_value(PartialObjectMetadata::new(version, meta.clone())).unwrap()
            );
        }
        let whole = RowObject::new(IncludeObject::Object, MetaVersion::V1, &meta, &object);
        assert_eq!(serde_json::to_value(whole).unwrap(), object);
        assert!(RowObject::new(IncludeObject::None, MetaVersion::V1, &meta, &object).is_none());
    }

    #[test]
    fn human_duration_boundaries() {
        let s = |n: u64| Duration::from_secs(n);
        let (m, h, d, y) = (60, 3600, 86_400, 365 * 86_400);
        let cases = [
            (s(0), "0s"),
            (Duration::from_millis(999), "0s"),
            (s(59), "59s"),
            (s(119), "119s"),
            (s(2 * m), "2m"),
            (s(2 * m + 1), "2m1s"),
            (s(9 * m + 59), "9m59s"),
            (s(10 * m), "10m"),
            (s(10 * m + 59), "10m"),
            (s(119 * m), "119m"),
            (s(179 * m + 59), "179m"),
            (s(3 * h), "3h"),
            (s(3 * h + m), "3h1m"),
            (s(7 * h + 59 * m + 59), "7h59m"),
            (s(8 * h), "8h"),
            (s(47 * h + 59 * m), "47h"),
            (s(48 * h), "2d"),
            (s(2 * d + 4 * h), "2d4h"),
            (s(7 * d + 23 * h + 59 * m), "7d23h"),
            (s(8 * d), "8d"),
            (s(729 * d + 23 * h), "729d"),
            (s(2 * y), "2y"),
            (s(2 * y + d), "2y1d"),
            (s(3 * y), "3y"),
            (s(7 * y + 364 * d), "7y364d"),
            (s(8 * y), "8y"),
            (s(8 * y + 200 * d), "8y"),
            (s(100 * y), "100y"),
            (Duration::MAX, "584942417355y"),
        ];
        for (duration, want) in cases {
            assert_eq!(human_duration(duration), want, "{duration:?}");
        }
    }

    #[test]
    fn age_cells() {
        let now: Timestamp = "2026-01-02T00:00:00Z".parse().unwrap();
        let at = |t: &str| Time(t.parse().unwrap());
        assert_eq!(age(None, now), "<unknown>");
        assert_eq!(age(Some(&at("2026-01-01T00:00:00Z")), now), "24h");
        assert_eq!(age(Some(&at("2026-01-02T00:00:01Z")), now), "0s");
        assert_eq!(age(Some(&at("2026-01-02T00:00:01.900Z")), now), "0s");
        assert_eq!(age(Some(&at("2026-01-02T00:00:02Z")), now), "<invalid>");
    }

    #[test]
    fn table_json() {
        let mut table = Table::new(MetaVersion::V1);
        table.metadata.resource_version = Some("7".into());
        table.column_definitions =
            vec![TableColumnDefinition::name(), TableColumnDefinition::age()];
        let meta = ObjectMeta {
            name: Some("a".into()),
            namespace: Some("ns".into()),
            ..Default::default()
        };
        table.rows.push(TableRow {
            cells: vec!["a".into(), "5m".into()],
            object: Some(
                serde_json::to_value(PartialObjectMetadata::new(MetaVersion::V1, meta)).unwrap(),
            ),
        });
        table.rows.push(TableRow {
            cells: vec!["b".into(), serde_json::Value::Null],
            object: None,
        });
        let json = serde_json::to_value(&table).unwrap();
        assert_eq!(json["kind"], "Table");
        assert_eq!(json["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(
            json["metadata"],
            serde_json::json!({"resourceVersion": "7"})
        );
        assert_eq!(
            json["columnDefinitions"][0],
            serde_json::json!({
                "name": "Name", "type": "string", "format": "name", "priority": 0,
                "description": TableColumnDefinition::name().description,
            })
        );
        assert_eq!(json["columnDefinitions"][1]["format"], "");
        assert_eq!(json["columnDefinitions"][1]["type"], "date");
        assert_eq!(
            json["rows"][0],
            serde_json::json!({
                "cells": ["a", "5m"],
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": {"name": "a", "namespace": "ns"}},
            })
        );
        assert_eq!(json["rows"][1], serde_json::json!({"cells": ["b", null]}));

        let empty =
            serde_json::to_value(Table::<serde_json::Value>::new(MetaVersion::V1beta1)).unwrap();
        assert_eq!(
            empty,
            serde_json::json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1beta1", "metadata": {}, "columnDefinitions": [], "rows": []})
        );
    }

    #[test]
    fn partial_object_metadata_list_json() {
        let list = PartialObjectMetadataList::new(
            MetaVersion::V1,
            ListMeta {
                resource_version: Some("9".into()),
                continue_: Some("c".into()),
                ..Default::default()
            },
            [ObjectMeta {
                name: Some("a".into()),
                ..Default::default()
            }],
        );
        assert_eq!(
            serde_json::to_value(list).unwrap(),
            serde_json::json!({
                "kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                "metadata": {"resourceVersion": "9", "continue": "c"},
                "items": [{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": {"name": "a"}}],
            })
        );
    }
}
