//! OpenAPI for one group-version: the v3 root (`/openapi/v3`), the v3 group-version
//! document (`/openapi/v3/apis/<g>/<v>`, OpenAPI 3.0) and the v2 document (`/openapi/v2`,
//! Swagger 2.0), built once from `ResourceInfo` and each kind's structural schema, and
//! served from memory with kube-openapi's caching rules.
//!
//! What clients need from them (aggregated-apiserver.md §4): `kubectl explain` looks for
//! `/apis/<g>/<v>[/namespaces/{namespace}]/<plural>[/{name}]` with an operation carrying
//! `x-kubernetes-group-version-kind`, then for the schema whose
//! `x-kubernetes-group-version-kind` list holds that kind; kubectl sends
//! `fieldValidation=Strict` only if the kind's PATCH operation lists that parameter; and
//! `kubectl apply` computes a strategic merge patch if the PATCH operation accepts one, so
//! it is listed only for a subresource whose kind has no list to merge by key (`scale`).
//! The aggregator filters v2 to our paths and merges definitions by
//! name, so meta schemas keep kube-apiserver's names.
//!
//! The documents are built as `serde_json` values rather than with utoipa: utoipa 6 writes
//! only OpenAPI 3.1, whose type arrays and `$defs` the Kubernetes tooling (written against
//! kube-openapi's 3.0 `spec3`) does not read, cannot write Swagger 2.0, and derives paths
//! from annotated handlers while ours come from the `ResourceInfo` table.

mod convert;
mod error;
mod names;
mod paths;
mod query;
mod render;
mod schemas;
mod shared;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use battery_types::ResourceInfo;
use http::header::{ACCEPT, CACHE_CONTROL, CONTENT_TYPE, ETAG, EXPIRES, LOCATION, VARY};
use http::{HeaderMap, HeaderValue, StatusCode};
use serde_json::{Map, Value};

use crate::etag;
use crate::status::ApiError;

pub use error::OpenApiError;

/// The OpenAPI v3 document of `group`/`version` for `kinds`, each given with its
/// structural schema (a CRD's `spec.versions[].schema.openAPIV3Schema`).
pub fn v3_document(
    group: &str,
    version: &str,
    kinds: &[(&ResourceInfo, Value)],
) -> Result<Value, OpenApiError> {
    Ok(Built::new(group, version, kinds, &[])?.v3())
}

/// The OpenAPI v2 (Swagger 2.0) document of `group`/`version` for `kinds`.
pub fn v2_document(
    group: &str,
    version: &str,
    kinds: &[(&ResourceInfo, Value)],
) -> Result<Value, OpenApiError> {
    Ok(Built::new(group, version, kinds, &[])?.v2())
}

/// The paths and schemas of a group-version, ready to render in either dialect.
struct Built<'a> {
    group: &'a str,
    version: &'a str,
    paths: Vec<paths::PathItem>,
    components: schemas::Components,
    tag: String,
}

impl<'a> Built<'a> {
    fn new(
        group: &'a str,
        version: &'a str,
        kinds: &[(&ResourceInfo, Value)],
        subresource_kinds: &[(&str, Value)],
    ) -> Result<Self, OpenApiError> {
        let components = schemas::build(group, version, kinds, subresource_kinds)?;
        let infos: Vec<&ResourceInfo> = kinds.iter().map(|(info, _)| *info).collect();
        let paths = paths::build(group, version, &infos, &components)?;
        let (_, tag) = paths::operation_naming(group, version);
        Ok(Self {
            group,
            version,
            paths,
            components,
            tag,
        })
    }

    fn v3(&self) -> Value {
        render::v3(
            self.group,
            self.version,
            &self.paths,
            &self.components,
            &self.tag,
        )
    }

    fn v2(&self) -> Value {
        render::v2(
            self.group,
            self.version,
            &self.paths,
            &self.components,
            &self.tag,
        )
    }
}

/// A serialized document and its hash.
#[derive(Clone, Debug)]
pub struct Document {
    body: Bytes,
    hash: String,
    etag: HeaderValue,
}

impl Document {
    fn new(value: &Value) -> Self {
        // A `serde_json::Value` always serializes.
        let body = Bytes::from(value.to_string());
        let hash = etag::sha512_hex(&body);
        let etag = HeaderValue::try_from(etag::quoted(&hash))
            .expect("a quoted hex digest is a valid header value");
        Self { body, hash, etag }
    }

    /// The JSON text.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The upper-case hex SHA-512 of the body: the `ETag` (quoted) and the `?hash=`.
    pub fn hash(&self) -> &str {
        &self.hash
    }
}

/// The three OpenAPI documents of a group-version, serialized once.
#[derive(Clone, Debug)]
pub struct OpenApi {
    v3_root: Document,
    v3: Document,
    v2: Document,
    v3_path: String,
    /// The v2 document as built here, and the definitions of our own kinds in it: what
    /// [`OpenApi::with_cluster_definitions`] starts from.
    v2_built: Arc<Value>,
    own: Arc<BTreeSet<String>>,
}

impl OpenApi {
    /// Builds and serializes the documents of `group`/`version`.
    pub fn new(
        group: &str,
        version: &str,
        kinds: &[(&ResourceInfo, Value)],
    ) -> Result<Self, OpenApiError> {
        Self::with_subresource_kinds(group, version, kinds, &[])
    }

    /// As [`OpenApi::new`], with kinds of the group-version that only a subresource reads
    /// or writes (a `HostCertificateRequest` posted to `hosts/<name>/certificate`), each
    /// with its structural schema.
    pub fn with_subresource_kinds(
        group: &str,
        version: &str,
        kinds: &[(&ResourceInfo, Value)],
        subresource_kinds: &[(&str, Value)],
    ) -> Result<Self, OpenApiError> {
        let built = Built::new(group, version, kinds, subresource_kinds)?;
        let v3 = Document::new(&built.v3());
        let v2_built = built.v2();
        let v2 = Document::new(&v2_built);
        let key = format!("apis/{group}/{version}");
        let v3_path = format!("/openapi/v3/{key}");
        let v3_root = Document::new(&render::v3_root(&key, &hashed_url(&v3_path, v3.hash())));
        Ok(Self {
            v3_root,
            v3,
            v2,
            v3_path,
            v2_built: Arc::new(v2_built),
            own: Arc::new(built.components.own),
        })
    }

    /// These documents with the v2 document's Kubernetes definitions (`ObjectMeta`,
    /// `Status`, `Lease`, `Scale`, ...) taken from `cluster`, the `definitions` of
    /// kube-apiserver's own `/openapi/v2`, so that its aggregator merges ours into its own
    /// without renaming any (see `shared`). Returns it and how many definitions were taken.
    /// The v3 documents stay: the aggregator serves each group-version's as it is.
    pub fn with_cluster_definitions(&self, cluster: &Map<String, Value>) -> (Self, usize) {
        let mut v2 = (*self.v2_built).clone();
        let adopted = shared::adopt(&mut v2, &self.own, cluster);
        let documents = Self {
            v2: Document::new(&v2),
            ..self.clone()
        };
        (documents, adopted)
    }

    /// The path of the v3 group-version document, `/openapi/v3/apis/<g>/<v>`.
    pub fn v3_group_version_path(&self) -> &str {
        &self.v3_path
    }

    /// The v3 root document.
    pub fn v3_root_document(&self) -> &Document {
        &self.v3_root
    }

    /// The v3 group-version document.
    pub fn v3_document(&self) -> &Document {
        &self.v3
    }

    /// The v2 document.
    pub fn v2_document(&self) -> &Document {
        &self.v2
    }

    /// `GET /openapi/v3`: JSON whatever the `Accept`, with `ETag` and 304, as
    /// `kube-openapi:pkg/handler3/handler.go` `HandleDiscovery`.
    pub fn v3_root(&self, request_headers: &HeaderMap) -> Response {
        conditional(&self.v3_root, request_headers)
    }

    /// `GET /openapi/v3/apis/<g>/<v>[?hash=<hash>]`, as `HandleGroupVersion`: 406 unless
    /// `Accept` allows JSON (the protobuf form is not served); with a `hash` that is not
    /// the document's, 301 to the current URL; with the current one, cacheable for a year
    /// (`Cache-Control: public, immutable`, `Expires`); `ETag` and 304 either way. An
    /// empty `hash` counts as none, as Go's `Query().Get` reads it.
    pub fn v3_group_version(&self, hash: Option<&str>, request_headers: &HeaderMap) -> Response {
        if !accepts_json(request_headers) {
            return not_acceptable();
        }
        let Some(hash) = hash.filter(|hash| !hash.is_empty()) else {
            return varying(conditional(&self.v3, request_headers));
        };
        if hash != self.v3.hash() {
            let location = hashed_url(&self.v3_path, self.v3.hash());
            let mut response = Response::new(Body::empty());
            *response.status_mut() = StatusCode::MOVED_PERMANENTLY;
            response.headers_mut().insert(
                LOCATION,
                HeaderValue::try_from(location).expect("a path and hex digest form a valid header"),
            );
            return varying(response);
        }
        let mut response = varying(conditional(&self.v3, request_headers));
        let expires = httpdate::fmt_http_date(SystemTime::now() + ONE_YEAR);
        let headers = response.headers_mut();
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("public, immutable"));
        headers.insert(
            EXPIRES,
            HeaderValue::try_from(expires).expect("an HTTP date is a valid header"),
        );
        response
    }

    /// `GET /openapi/v2`: 406 unless `Accept` allows JSON, else the document with `ETag` and
    /// 304 (`kube-openapi:pkg/handler/handler.go`).
    pub fn v2(&self, request_headers: &HeaderMap) -> Response {
        if !accepts_json(request_headers) {
            return not_acceptable();
        }
        varying(conditional(&self.v2, request_headers))
    }
}

/// How long a hashed v3 URL may be cached: a year, as Go's `time.Now().AddDate(1, 0, 0)`.
const ONE_YEAR: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// `constructServerRelativeURL`: the document's path with `?hash=`.
fn hashed_url(path: &str, hash: &str) -> String {
    format!("{path}?hash={hash}")
}

/// The body as `application/json`, or 304 with no body when `If-None-Match` names the
/// document (Go's `http.ServeContent`); `ETag` on both.
fn conditional(document: &Document, request_headers: &HeaderMap) -> Response {
    let not_modified = document
        .etag
        .to_str()
        .is_ok_and(|quoted| etag::if_none_match(request_headers, quoted));
    let mut response = if not_modified {
        let mut response = Response::new(Body::empty());
        *response.status_mut() = StatusCode::NOT_MODIFIED;
        response
    } else {
        let mut response = Response::new(Body::from(document.body.clone()));
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    };
    response.headers_mut().insert(ETAG, document.etag.clone());
    response
}

/// Marks a response of a negotiated document as depending on `Accept`.
fn varying(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(VARY, HeaderValue::from_static("Accept"));
    response
}

/// 406 as a `Status`, for an `Accept` without JSON.
fn not_acceptable() -> Response {
    varying(ApiError::not_acceptable(&["application/json"]).into_response())
}

/// Whether `Accept` admits `application/json`, as kube-openapi's handlers match clauses:
/// a missing header means `*/*`, and `*` matches any type or subtype. A clause with
/// `q=0` refuses the type (RFC 9110 §12.4.2).
fn accepts_json(request_headers: &HeaderMap) -> bool {
    let mut clauses = request_headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .filter(|clause| !clause.is_empty())
        .peekable();
    if clauses.peek().is_none() {
        return true;
    }
    clauses.any(|clause| {
        let mut parts = clause.split(';').map(str::trim);
        let media_type = parts.next().unwrap_or_default().to_ascii_lowercase();
        let refused = parts.any(|parameter| {
            parameter
                .strip_prefix("q=")
                .and_then(|q| q.parse::<f32>().ok())
                .is_some_and(|q| q == 0.0)
        });
        let admits = match media_type.split_once('/') {
            Some((ty, subtype)) => {
                (ty == "application" || ty == "*") && (subtype == "json" || subtype == "*")
            }
            None => false,
        };
        admits && !refused
    })
}

#[cfg(test)]
mod tests;
