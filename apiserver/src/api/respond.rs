//! Turning objects and lists into the representation the client negotiated: the object
//! itself, a Table (server-side printing) or PartialObjectMetadata, as
//! `apiserver:pkg/endpoints/handlers/response.go` `transformObject` does.

use axum::body::Body;
use axum::response::Response;
use battery_api_machinery::negotiate::{Negotiated, Target};
use battery_api_machinery::params::{IncludeObject, TableOptions};
use battery_api_machinery::status::ApiError;
use battery_api_machinery::table::{
    PartialObjectMetadata, PartialObjectMetadataList, RowObject, Table, TableColumnDefinition,
    TableRow, age,
};
use http::{HeaderValue, StatusCode, header};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use serde::Serialize;
use serde_json::value::RawValue;

use super::storage::{Storage, StoredItem};

/// Warnings for the `Warning` response header (unknown fields under `fieldValidation=Warn`).
pub type Warnings = Vec<String>;

/// A response with `body` in the negotiated format.
pub fn encoded<T: Serialize>(
    status: StatusCode,
    negotiated: &Negotiated,
    body: &T,
    warnings: &[String],
) -> Result<Response, ApiError> {
    let bytes = negotiated.format.encode(body, negotiated.pretty)?;
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(negotiated.format.content_type()),
    );
    for warning in warnings {
        // `299 - "text"` as Go's `warning.AddWarning`; text that cannot be a header is
        // dropped rather than failing the request it only annotates.
        let value = format!("299 - {}", serde_json::Value::String(warning.clone()));
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.append(header::WARNING, value);
        }
    }
    Ok(response)
}

/// The Table of `objects`, with the columns of `storage`.
pub fn table<'a, S: Storage>(
    storage: &S,
    negotiated_version: battery_api_machinery::table::MetaVersion,
    objects: &'a [S::Object],
    include: IncludeObject,
    with_headers: bool,
) -> Table<RowObject<'a, S::Object>> {
    let entries: Vec<_> = objects.iter().map(Entry::of).collect();
    table_of(
        storage,
        negotiated_version,
        &entries,
        |i| storage.table_cells(&objects[i]),
        include,
        with_headers,
    )
}

/// One item of a list as an answer borrows it: a decoded object, or a [`StoredItem`]'s
/// JSON.
struct Entry<'a, O: ?Sized, M: ?Sized> {
    object: &'a O,
    metadata: &'a M,
    name: &'a str,
    created: Option<&'a Time>,
}

impl<'a, O: kube::Resource>
    Entry<'a, O, k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>
{
    fn of(object: &'a O) -> Self {
        let meta = object.meta();
        Entry {
            object,
            metadata: meta,
            name: meta.name.as_deref().unwrap_or_default(),
            created: meta.creation_timestamp.as_ref(),
        }
    }
}

impl<'a> Entry<'a, RawValue, RawValue> {
    fn stored(item: &'a StoredItem) -> Self {
        Entry {
            object: &item.object,
            metadata: &item.metadata,
            name: &item.name,
            created: item.created.as_ref(),
        }
    }
}

/// The Table of `entries`, with the columns of `storage` and the `i`th entry's cells
/// from `cells(i)`.
fn table_of<'a, S: Storage, O: ?Sized, M: ?Sized>(
    storage: &S,
    version: battery_api_machinery::table::MetaVersion,
    entries: &[Entry<'a, O, M>],
    cells: impl Fn(usize) -> Vec<serde_json::Value>,
    include: IncludeObject,
    with_headers: bool,
) -> Table<RowObject<'a, O, M>> {
    let now = Timestamp::now();
    let mut table = table_head(storage, version, with_headers, entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let cells = row_cells(entry.name.to_owned(), cells(i), entry.created, now);
        let object = RowObject::new(include, version, entry.metadata, entry.object);
        table.rows.push(TableRow { cells, object });
    }
    table
}

/// A Table of `version` with room for `rows`, and with the storage's columns between
/// `Name` and `Age` when `with_headers`.
fn table_head<S: Storage, O>(
    storage: &S,
    version: battery_api_machinery::table::MetaVersion,
    with_headers: bool,
    rows: usize,
) -> Table<O> {
    let mut table = Table::new(version);
    if with_headers {
        table.column_definitions.push(TableColumnDefinition::name());
        table.column_definitions.extend(storage.table_columns());
        table.column_definitions.push(TableColumnDefinition::age());
    }
    table.rows.reserve(rows);
    table
}

/// A row's cells: the name, the storage's cells, the age.
fn row_cells(
    name: String,
    cells: Vec<serde_json::Value>,
    created: Option<&Time>,
    now: Timestamp,
) -> Vec<serde_json::Value> {
    let mut row = Vec::with_capacity(cells.len() + 2);
    row.push(serde_json::Value::String(name));
    row.extend(cells);
    row.push(serde_json::Value::String(age(created, now)));
    row
}

/// One object, as negotiated.
pub fn object<S: Storage>(
    storage: &S,
    status: StatusCode,
    negotiated: &Negotiated,
    table_options: TableOptions,
    object: &S::Object,
    warnings: &[String],
) -> Result<Response, ApiError> {
    match negotiated.target {
        Target::Object => encoded(status, negotiated, object, warnings),
        Target::Table(version) => {
            let table = table(
                storage,
                version,
                std::slice::from_ref(object),
                table_options.include_object,
                true,
            );
            encoded(status, negotiated, &table, warnings)
        }
        Target::PartialObjectMetadata(version) => encoded(
            status,
            negotiated,
            &PartialObjectMetadata::new(version, object.meta().clone()),
            warnings,
        ),
        // A list representation asked for one object.
        Target::PartialObjectMetadataList(_) => Err(not_acceptable()),
    }
}

/// A list, as negotiated.
pub fn list<S: Storage>(
    storage: &S,
    negotiated: &Negotiated,
    table_options: TableOptions,
    items: &[S::Object],
    metadata: ListMeta,
) -> Result<Response, ApiError> {
    let entries: Vec<_> = items.iter().map(Entry::of).collect();
    list_of(
        storage,
        negotiated,
        table_options,
        &entries,
        |i| storage.table_cells(&items[i]),
        metadata,
    )
}

/// A list of stored items (compact JSON only), as negotiated: their JSON is copied, not
/// encoded again.
pub fn stored_list<S: Storage>(
    storage: &S,
    negotiated: &Negotiated,
    table_options: TableOptions,
    items: &[StoredItem],
    metadata: ListMeta,
) -> Result<Response, ApiError> {
    let entries: Vec<_> = items.iter().map(Entry::stored).collect();
    list_of(
        storage,
        negotiated,
        table_options,
        &entries,
        |i| items[i].cells.clone(),
        metadata,
    )
}

/// A list of `entries`, as negotiated; the `i`th entry's Table cells are `cells(i)`.
fn list_of<S: Storage, O: Serialize + ?Sized, M: Serialize + ?Sized>(
    storage: &S,
    negotiated: &Negotiated,
    table_options: TableOptions,
    entries: &[Entry<'_, O, M>],
    cells: impl Fn(usize) -> Vec<serde_json::Value>,
    metadata: ListMeta,
) -> Result<Response, ApiError> {
    match negotiated.target {
        Target::Object => {
            let info = <S::Object as battery_types::HasResourceInfo>::INFO;
            let objects: Vec<&O> = entries.iter().map(|entry| entry.object).collect();
            let list = ObjectList {
                api_version: S::Object::api_version(&()).into_owned(),
                kind: format!("{}List", info.kind),
                metadata,
                items: &objects,
            };
            encoded(StatusCode::OK, negotiated, &list, &[])
        }
        Target::Table(version) => {
            let include = table_options.include_object;
            let mut table = table_of(storage, version, entries, cells, include, true);
            table.metadata = metadata;
            encoded(StatusCode::OK, negotiated, &table, &[])
        }
        Target::PartialObjectMetadataList(version) => encoded(
            StatusCode::OK,
            negotiated,
            &PartialObjectMetadataList::new(
                version,
                metadata,
                entries.iter().map(|entry| entry.metadata),
            ),
            &[],
        ),
        Target::PartialObjectMetadata(_) => Err(not_acceptable()),
    }
}

/// Go answers a conversion that does not fit the result with 406.
fn not_acceptable() -> ApiError {
    ApiError::not_acceptable(&["application/json", "application/yaml"])
}

/// A list whose items are `I`: the objects, or their JSON as stored.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ObjectList<'a, I> {
    api_version: String,
    kind: String,
    metadata: ListMeta,
    items: &'a [I],
}
