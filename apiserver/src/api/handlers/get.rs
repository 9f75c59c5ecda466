//! get (`apiserver:pkg/endpoints/handlers/get.go` `GetResource`).

use axum::response::Response;
use battery_api_machinery::negotiate::Negotiated;
use battery_api_machinery::params::TableOptions;
use battery_api_machinery::status::ApiError;
use http::StatusCode;

use crate::api::RequestContext;
use crate::api::respond;
use crate::api::storage::Storage;

pub async fn get<S: Storage>(
    storage: &S,
    ctx: &RequestContext,
    name: &str,
    negotiated: &Negotiated,
    table: TableOptions,
) -> Result<Response, ApiError> {
    let object = storage.get(ctx, name).await?;
    ctx.trace.step("read from storage");
    respond::object(storage, StatusCode::OK, negotiated, table, &object, &[])
}
