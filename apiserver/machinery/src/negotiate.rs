//! Content negotiation: what to answer from `Accept`, how to read a body from
//! `Content-Type`.
//!
//! `Accept` is parsed as Go's apiserver parses it (`munnerz/goautoneg` and
//! `apiserver:pkg/endpoints/handlers/negotiation/negotiate.go`): clauses are ordered by
//! `q`, then by specificity, and the *first* clause this server can serve wins, with its
//! `as`/`g`/`v` parameters asking for a conversion (a `Table`, `PartialObjectMetadata`,
//! aggregated discovery). Nothing acceptable is a 406, which the aggregator and clients rely
//! on to fall back (kubernetes/kubernetes#119662). We serve JSON and YAML, not protobuf.

use std::collections::BTreeMap;

use http::HeaderMap;
use http::header::{ACCEPT, CONTENT_TYPE, USER_AGENT};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::query::{QueryValues, go_parse_bool};
use crate::status::{ApiError, Reason};
use crate::table::MetaVersion;

/// A serialization this server reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// `application/json`, the default and the only one a watch can stream.
    Json,
    /// `application/yaml`.
    Yaml,
}

/// The media types we serialize, in Go's order of preference.
const FORMATS: [Format; 2] = [Format::Json, Format::Yaml];
const MEDIA_TYPES: [&str; 2] = ["application/json", "application/yaml"];
const STREAM_MEDIA_TYPES: [&str; 1] = ["application/json;stream=watch"];

impl Format {
    /// The `Content-Type` of a response in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Yaml => "application/yaml",
        }
    }

    fn subtype(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Yaml => "yaml",
        }
    }

    /// Decodes a request body; a malformed body is a 400 BadRequest.
    pub fn decode<T: DeserializeOwned>(self, body: &[u8]) -> Result<T, ApiError> {
        let result = match self {
            Format::Json => serde_json::from_slice(body).map_err(|e| e.to_string()),
            Format::Yaml => serde_norway::from_slice(body).map_err(|e| e.to_string()),
        };
        result.map_err(|e| {
            ApiError::bad_request(format!("error decoding the request body as {self}: {e}"))
        })
    }

    /// Encodes a response body; JSON is indented when `pretty` (YAML always is).
    pub fn encode<T: Serialize>(self, value: &T, pretty: bool) -> Result<Vec<u8>, ApiError> {
        match self {
            Format::Json if pretty => serde_json::to_vec_pretty(value).map_err(ApiError::internal),
            Format::Json => serde_json::to_vec(value).map_err(ApiError::internal),
            Format::Yaml => serde_norway::to_string(value)
                .map(String::into_bytes)
                .map_err(ApiError::internal),
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Format::Json => "JSON",
            Format::Yaml => "YAML",
        })
    }
}

/// What a resource GET, LIST or WATCH should return.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// The object or list itself.
    Object,
    /// `as=Table`: server-side printing, what `kubectl get` asks for.
    Table(MetaVersion),
    /// `as=PartialObjectMetadata`: metadata only, for one object or each watch event.
    PartialObjectMetadata(MetaVersion),
    /// `as=PartialObjectMetadataList`: metadata only, for a list.
    PartialObjectMetadataList(MetaVersion),
}

impl Target {
    /// Go's 406 when the metadata conversion does not fit the result
    /// (`asPartialObjectMetadata[List]` in `apiserver:pkg/endpoints/handlers/response.go`):
    /// `PartialObjectMetadata` of a list, or `PartialObjectMetadataList` of one object. Go
    /// ends the message with the Go type in parentheses, which has no equivalent here.
    pub fn check_fits(self, is_list: bool) -> Result<(), ApiError> {
        match self {
            Target::PartialObjectMetadata(_) if is_list => Err(ApiError::new(
                Reason::NotAcceptable,
                "you requested PartialObjectMetadata, but the requested object is a list",
            )),
            Target::PartialObjectMetadataList(_) if !is_list => Err(ApiError::new(
                Reason::NotAcceptable,
                "you requested PartialObjectMetadataList, but the requested object is not a list",
            )),
            _ => Ok(()),
        }
    }
}

/// The outcome of negotiating a resource response.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Negotiated {
    /// What to convert the result to.
    pub target: Target,
    /// How to serialize it.
    pub format: Format,
    /// Indent JSON (`pretty=1` in `Accept`, `?pretty=true`, or a curl, Wget or browser
    /// User-Agent, as Go's `isPrettyPrint`).
    pub pretty: bool,
}

impl Negotiated {
    /// `NegotiateOutputMediaType` for a resource endpoint. Whether a `Table` or
    /// `PartialObjectMetadata` fits the object or list at hand is the handler's to check,
    /// as in Go, where a mismatch is also a 406.
    pub fn for_resource(headers: &HeaderMap, query: Option<&str>) -> Result<Self, ApiError> {
        let (clause, format) = negotiate(&accept(headers), Endpoint::Resource)
            .ok_or_else(|| ApiError::not_acceptable(&MEDIA_TYPES))?;
        let target = match clause.convert {
            None => Target::Object,
            Some(convert) => {
                // The endpoint admitted only meta.k8s.io v1/v1beta1 conversions.
                let version = if convert.version == "v1" {
                    MetaVersion::V1
                } else {
                    MetaVersion::V1beta1
                };
                match convert.kind.as_str() {
                    "Table" => Target::Table(version),
                    "PartialObjectMetadata" => Target::PartialObjectMetadata(version),
                    _ => Target::PartialObjectMetadataList(version),
                }
            }
        };
        let pretty = format == Format::Json && (clause.pretty || is_pretty_print(headers, query));
        Ok(Negotiated {
            target,
            format,
            pretty,
        })
    }

    /// `NegotiateOutputMediaTypeStream` for a watch: the negotiated format must be one we
    /// can stream (JSON), else 406 naming `application/json;stream=watch`.
    pub fn for_watch(headers: &HeaderMap) -> Result<Self, ApiError> {
        let not_acceptable = || ApiError::not_acceptable(&STREAM_MEDIA_TYPES);
        let negotiated = Self::for_resource(headers, None).map_err(|_| not_acceptable())?;
        if negotiated.format != Format::Json {
            return Err(not_acceptable());
        }
        Ok(Negotiated {
            pretty: false,
            ..negotiated
        })
    }
}

/// The `apidiscovery.k8s.io` version of an aggregated discovery document.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DiscoveryVersion {
    /// `apidiscovery.k8s.io/v2`, GA since Kubernetes 1.30.
    V2,
    /// `apidiscovery.k8s.io/v2beta1`, which aggregators of 1.26–1.29 ask for.
    V2beta1,
}

impl DiscoveryVersion {
    /// The version string, `v2` or `v2beta1`.
    pub fn as_str(self) -> &'static str {
        match self {
            DiscoveryVersion::V2 => "v2",
            DiscoveryVersion::V2beta1 => "v2beta1",
        }
    }
}

/// Which discovery document to answer `/apis` (or `/api`) with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Discovery {
    /// The legacy `APIGroupList` (or `APIVersions`).
    Legacy(Format),
    /// An `APIGroupDiscoveryList`.
    Aggregated(DiscoveryVersion, Format),
}

impl Discovery {
    /// The aggregated-discovery wrapper's choice (`apiserver:pkg/endpoints/discovery/
    /// aggregated/wrapper.go`): the aggregated document if a clause asks for it, else the
    /// legacy one if a clause accepts plain JSON or YAML, else 406.
    pub fn negotiate(headers: &HeaderMap) -> Result<Self, ApiError> {
        let header = accept(headers);
        if let Some((clause, format)) = negotiate(&header, Endpoint::AggregatedDiscovery) {
            let version = match clause.convert {
                Some(convert) if convert.version == "v2beta1" => DiscoveryVersion::V2beta1,
                _ => DiscoveryVersion::V2,
            };
            return Ok(Discovery::Aggregated(version, format));
        }
        match negotiate(&header, Endpoint::LegacyDiscovery) {
            Some((_, format)) => Ok(Discovery::Legacy(format)),
            None => Err(ApiError::not_acceptable(&MEDIA_TYPES)),
        }
    }
}

/// The body of a create or update: JSON (also when no `Content-Type` is given) or YAML;
/// anything else is a 415 (`NegotiateInputSerializer`).
pub fn body_format(headers: &HeaderMap) -> Result<Format, ApiError> {
    let Some(value) = headers.get(CONTENT_TYPE) else {
        return Ok(Format::Json);
    };
    let value = String::from_utf8_lossy(value.as_bytes());
    if value.is_empty() {
        return Ok(Format::Json);
    }
    let essence = parse_media_type(&value);
    FORMATS
        .into_iter()
        .find(|f| essence.as_deref() == Some(f.content_type()))
        .ok_or_else(|| ApiError::unsupported_media_type(&MEDIA_TYPES))
}

/// The kinds of PATCH this server applies. Strategic merge patch only where a kind has no
/// list to merge by key (the `scale` subresource): elsewhere, like Go for custom
/// resources, we answer it with 415, which is what makes the garbage collector fall back
/// to a merge patch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PatchType {
    /// `application/json-patch+json` (RFC 6902).
    JsonPatch,
    /// `application/merge-patch+json` (RFC 7386).
    MergePatch,
    /// `application/strategic-merge-patch+json`, for kinds whose lists are all atomic.
    StrategicMergePatch,
    /// `application/apply-patch+yaml`: server-side apply.
    Apply,
}

/// What a resource's PATCH accepts.
pub const PATCH_TYPES: &[PatchType] = &[
    PatchType::JsonPatch,
    PatchType::MergePatch,
    PatchType::Apply,
];

impl PatchType {
    /// The media type.
    pub fn content_type(self) -> &'static str {
        match self {
            PatchType::JsonPatch => "application/json-patch+json",
            PatchType::MergePatch => "application/merge-patch+json",
            PatchType::StrategicMergePatch => "application/strategic-merge-patch+json",
            PatchType::Apply => "application/apply-patch+yaml",
        }
    }

    /// The patch type from `Content-Type`, one of a resource's [`PATCH_TYPES`].
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, ApiError> {
        Self::from_headers_among(headers, PATCH_TYPES)
    }

    /// The patch type from `Content-Type`, compared as Go's `PatchResource` does: the text
    /// before any `;`, exactly. Anything but one of `accepted` is a 415 listing them.
    pub fn from_headers_among(
        headers: &HeaderMap,
        accepted: &[PatchType],
    ) -> Result<Self, ApiError> {
        let value = headers
            .get(CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()))
            .unwrap_or_default();
        let essence = match value.find(';') {
            Some(i) if i > 0 => &value[..i],
            _ => &value[..],
        };
        accepted
            .iter()
            .copied()
            .find(|p| p.content_type() == essence)
            .ok_or_else(|| {
                let accepted: Vec<&str> = accepted.iter().map(|p| p.content_type()).collect();
                ApiError::unsupported_media_type(&accepted)
            })
    }
}

/// The endpoint restrictions of Go's negotiation: which conversions a clause may ask for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    /// `RequestScope`: `Table`, `PartialObjectMetadata[List]` in meta.k8s.io v1/v1beta1.
    Resource,
    /// `DiscoveryEndpointRestrictions`: `APIGroupDiscoveryList` only.
    AggregatedDiscovery,
    /// `DefaultEndpointRestrictions`: no conversion at all.
    LegacyDiscovery,
}

/// The `as`, `g` and `v` parameters of a clause (`MediaTypeOptions.Convert`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Convert {
    kind: String,
    group: String,
    version: String,
}

impl Endpoint {
    fn allows(self, format: Format, convert: Option<&Convert>) -> bool {
        let Some(c) = convert else {
            return self != Endpoint::AggregatedDiscovery;
        };
        match self {
            Endpoint::Resource => {
                c.group == "meta.k8s.io"
                    && (c.version == "v1" || c.version == "v1beta1")
                    && match c.kind.as_str() {
                        // Go restricts Table to JSON and YAML; those are all we have.
                        "Table" => matches!(format, Format::Json | Format::Yaml),
                        "PartialObjectMetadata" | "PartialObjectMetadataList" => true,
                        _ => false,
                    }
            }
            Endpoint::AggregatedDiscovery => {
                c.group == "apidiscovery.k8s.io"
                    && (c.version == "v2" || c.version == "v2beta1")
                    && c.kind == "APIGroupDiscoveryList"
            }
            Endpoint::LegacyDiscovery => false,
        }
    }

    /// `AllowsServerVersion`: the `sv` parameter.
    fn allows_server_version(self, version: &str) -> bool {
        self == Endpoint::Resource && version == "v1"
    }
}

/// One clause of an `Accept` header (`goautoneg.Accept`).
#[derive(Clone, Debug, PartialEq)]
struct Clause {
    media_type: String,
    subtype: String,
    q: f64,
    params: BTreeMap<String, String>,
}

/// The accepted clause, reduced to what the caller needs.
struct Accepted {
    convert: Option<Convert>,
    pretty: bool,
}

fn accept(headers: &HeaderMap) -> String {
    headers
        .get(ACCEPT)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default()
}

/// `NegotiateMediaTypeOptions`: the first clause, in preference order, that one of our
/// formats matches and the endpoint allows.
fn negotiate(header: &str, endpoint: Endpoint) -> Option<(Accepted, Format)> {
    if header.is_empty() {
        return endpoint.allows(Format::Json, None).then_some((
            Accepted {
                convert: None,
                pretty: false,
            },
            Format::Json,
        ));
    }
    for clause in parse_accept(header) {
        for format in FORMATS {
            let matches = (clause.media_type == "application"
                && (clause.subtype == format.subtype() || clause.subtype == "*"))
                || (clause.media_type == "*" && clause.subtype == "*");
            if matches && let Some(accepted) = accept_options(&clause, format, endpoint) {
                return Some((accepted, format));
            }
        }
    }
    None
}

/// `acceptMediaTypeOptions`: whether the clause's parameters can be honoured with `format`.
fn accept_options(clause: &Clause, format: Format, endpoint: Endpoint) -> Option<Accepted> {
    let mut convert: Option<Convert> = None;
    let mut pretty = false;
    for (key, value) in &clause.params {
        match key.as_str() {
            "as" => convert.get_or_insert_with(Convert::default).kind = value.clone(),
            "g" => convert.get_or_insert_with(Convert::default).group = value.clone(),
            "v" => convert.get_or_insert_with(Convert::default).version = value.clone(),
            // Only JSON has a stream serializer, and the only stream is a watch.
            "stream" if !value.is_empty() && (format != Format::Json || value != "watch") => {
                return None;
            }
            "sv" if !value.is_empty() && !endpoint.allows_server_version(value) => return None,
            "pretty" => pretty = value == "1",
            _ => {}
        }
    }
    endpoint
        .allows(format, convert.as_ref())
        .then_some(Accepted { convert, pretty })
}

/// `goautoneg.ParseAccept`: clauses split on `,` and `;`, trimmed of spaces only; `q`
/// parsed as a float (0 when malformed, and not dropped: Go still negotiates it, last);
/// clauses that are not `type/subtype` or `*` are skipped.
fn parse_accept(header: &str) -> Vec<Clause> {
    let mut clauses = Vec::new();
    for part in header.split(',') {
        let mut pieces = part.trim_matches(' ').split(';');
        let media_range = pieces.next().unwrap_or_default();
        let mut sp = media_range.split('/');
        let (Some(media_type), subtype, None) = (sp.next(), sp.next(), sp.next()) else {
            continue;
        };
        let media_type = media_type.trim_matches(' ');
        let subtype = match subtype {
            Some(subtype) => subtype.trim_matches(' '),
            None if media_type == "*" => "*",
            None => continue,
        };
        let mut clause = Clause {
            media_type: media_type.to_owned(),
            subtype: subtype.to_owned(),
            q: 1.0,
            params: BTreeMap::new(),
        };
        for param in pieces {
            let Some((key, value)) = param.split_once('=') else {
                continue;
            };
            let key = key.trim_matches(' ');
            if key == "q" {
                // Go parses with bitSize 32 and keeps the value even on error (0, or ±Inf
                // when out of range).
                clause.q = value.parse::<f32>().map(f64::from).unwrap_or(0.0);
            } else {
                clause
                    .params
                    .insert(key.to_owned(), value.trim_matches(' ').to_owned());
            }
        }
        clauses.push(clause);
    }
    sort_clauses(&mut clauses);
    clauses
}

/// goautoneg's `Less`, which is not a strict order (a wildcard with a higher `q` and a
/// specific type with a lower one are each "less" than the other), so the result depends
/// on the algorithm. Go's `sort.Sort` runs insertion sort on up to 12 elements; we do the
/// same there, which covers every real header. Longer lists, which only an attacker sends,
/// get a stable O(n log n) sort by `q`, then specificity, so they cannot cost quadratic time.
fn sort_clauses(clauses: &mut [Clause]) {
    let less = |a: &Clause, b: &Clause| {
        a.q > b.q
            || (a.media_type != "*" && b.media_type == "*")
            || (a.subtype != "*" && b.subtype == "*")
    };
    if clauses.len() <= 12 {
        for i in 1..clauses.len() {
            let mut j = i;
            while j > 0 && less(&clauses[j], &clauses[j - 1]) {
                clauses.swap(j, j - 1);
                j -= 1;
            }
        }
    } else {
        clauses.sort_by(|a, b| {
            b.q.total_cmp(&a.q)
                .then_with(|| (a.media_type == "*").cmp(&(b.media_type == "*")))
                .then_with(|| (a.subtype == "*").cmp(&(b.subtype == "*")))
        });
    }
}

/// `mime.ParseMediaType`, reduced to what negotiation needs: the lowercased `type/subtype`,
/// or `None` when the media type or one of its parameters is malformed (Go then answers
/// 415 too).
fn parse_media_type(value: &str) -> Option<String> {
    let mut pieces = value.split(';');
    let essence = pieces
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let (media_type, subtype) = essence.split_once('/')?;
    if !is_token(media_type) || !is_token(subtype) {
        return None;
    }
    for param in pieces {
        let param = param.trim();
        if param.is_empty() {
            continue;
        }
        let (key, value) = param.split_once('=')?;
        let quoted = value.len() >= 2 && value.starts_with('"') && value.ends_with('"');
        if !is_token(key.trim_end()) || !(quoted || is_token(value.trim_start())) {
            return None;
        }
    }
    Some(essence)
}

/// RFC 7230 `token`: visible ASCII except separators.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b))
}

/// Go's `isPrettyPrint`: `?pretty=<bool>` when present and non-empty, else a User-Agent of
/// curl, Wget or a browser.
fn is_pretty_print(headers: &HeaderMap, query: Option<&str>) -> bool {
    if let Some(query) = query.filter(|q| q.contains("pretty"))
        && let Some(value) = QueryValues::parse(query)
            .first("pretty")
            .filter(|v| !v.is_empty())
    {
        return go_parse_bool(value).unwrap_or(false);
    }
    headers
        .get(USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ua| {
            ua.starts_with("curl") || ua.starts_with("Wget") || ua.starts_with("Mozilla/5.0")
        })
}

#[cfg(test)]
mod tests;
