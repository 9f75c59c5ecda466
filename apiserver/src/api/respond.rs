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
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use serde::Serialize;

use super::storage::Storage;

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
    let now = Timestamp::now();
    let mut table = Table::new(negotiated_version);
    let columns = storage.table_columns();
    let width = columns.len() + 2;
    if with_headers {
        table.column_definitions.push(TableColumnDefinition::name());
        table.column_definitions.extend(columns);
        table.column_definitions.push(TableColumnDefinition::age());
    }
    table.rows.reserve(objects.len());
    for object in objects {
        let meta = object.meta();
        let mut cells = Vec::with_capacity(width);
        cells.push(serde_json::Value::String(
            meta.name.clone().unwrap_or_default(),
        ));
        cells.extend(storage.table_cells(object));
        cells.push(serde_json::Value::String(age(
            meta.creation_timestamp.as_ref(),
            now,
        )));
        let object = RowObject::new(include, negotiated_version, meta, object);
        table.rows.push(TableRow { cells, object });
    }
    table
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
    match negotiated.target {
        Target::Object => {
            let info = <S::Object as battery_types::HasResourceInfo>::INFO;
            let list = ObjectList {
                api_version: S::Object::api_version(&()).into_owned(),
                kind: format!("{}List", info.kind),
                metadata,
                items,
            };
            encoded(StatusCode::OK, negotiated, &list, &[])
        }
        Target::Table(version) => {
            let mut table = table(storage, version, items, table_options.include_object, true);
            table.metadata = metadata;
            encoded(StatusCode::OK, negotiated, &table, &[])
        }
        Target::PartialObjectMetadataList(version) => encoded(
            StatusCode::OK,
            negotiated,
            &PartialObjectMetadataList::new(
                version,
                metadata,
                items.iter().map(|o| o.meta().clone()),
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

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ObjectList<'a, T> {
    api_version: String,
    kind: String,
    metadata: ListMeta,
    items: &'a [T],
}
