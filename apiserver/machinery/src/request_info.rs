//! `RequestInfo`: what a request asks for, in the terms authorization and audit use.
//!
//! A port of `apiserver:pkg/endpoints/request/requestinfo.go` (`NewRequestInfo`), with the
//! API prefixes `api` (groupless) and `apis`. The verb is the Kubernetes authorization
//! verb: GET on a collection is `list`, or `watch` with `?watch=true` or the deprecated
//! `/watch/` prefix; DELETE on a collection is `deletecollection`.
//!
//! One deliberate difference: Go splits the *decoded* path, so `a%2Fb` becomes two
//! segments, while our router (axum) matches the raw path and decodes each segment. This
//! parser decodes per segment too, so that authorization and the handler always see the
//! same namespace, resource and name.

use battery_types::Verb;
use battery_types::strconv::quote;
use http::Method;

use crate::params::list_options_for_request_info;
use crate::query::{QueryValues, go_bool, unescape};
use crate::status::{ApiError, Reason, group_resource, resource_details};

/// Subresources that open a stream to the object (`rest.Connecter` in Go) rather than
/// read or write it.
pub const CONNECT_SUBRESOURCES: &[&str] = &["exec", "attach", "portforward"];

/// `request.RequestInfo`. Empty strings mean "not present", as in Go, so the fields can be
/// copied into a SubjectAccessReview as they are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// Whether this is a request for a resource (`/api/v1/...`, `/apis/g/v/...`) rather
    /// than for a path like `/healthz` or `/apis`.
    pub is_resource_request: bool,
    /// The percent-decoded URL path.
    pub path: String,
    /// The authorization verb; for a non-resource request, the lowercase HTTP method.
    pub verb: String,
    /// `api` or `apis`.
    pub api_prefix: String,
    /// The API group; empty for the core group.
    pub api_group: String,
    /// The API version.
    pub api_version: String,
    /// The namespace; empty for cluster-scoped requests and for requests across all
    /// namespaces.
    pub namespace: String,
    /// The resource (plural), e.g. `pools`.
    pub resource: String,
    /// The subresource, e.g. `status`.
    pub subresource: String,
    /// The object's name, from the path or from a `metadata.name=` field selector.
    pub name: String,
    /// The path segments from the resource on: `[resource, name, subresource, ...]`.
    pub parts: Vec<String>,
    /// The raw `fieldSelector` for `list`, `watch` and `deletecollection` (for selector
    /// authorization), empty otherwise.
    pub field_selector: String,
    /// The raw `labelSelector`, likewise.
    pub label_selector: String,
}

impl RequestInfo {
    /// `NewRequestInfo`. `path` is the raw (still percent-encoded) URL path and `query`
    /// the raw query without `?`.
    ///
    /// Fails with 400 BadRequest for a path segment with a malformed `%` escape or that is
    /// not UTF-8 once decoded, and for `/.../watch` with nothing after it. (Go answers the
    /// latter with a 500; it is the client's mistake, so we say so.)
    pub fn parse(method: &Method, path: &str, query: Option<&str>) -> Result<Self, ApiError> {
        let decoded_path = decode_path(path)?;
        let segments = split_path(path)?;
        let mut info = RequestInfo {
            path: decoded_path,
            verb: method.as_str().to_ascii_lowercase(),
            ..RequestInfo::default()
        };

        let mut parts: &[String] = &segments;
        let [prefix, rest @ ..] = parts else {
            return Ok(info);
        };
        if parts.len() < 3 || (prefix != "api" && prefix != "apis") {
            return Ok(info);
        }
        info.api_prefix = prefix.clone();
        parts = rest;
        if info.api_prefix == "apis" {
            // One part (the prefix) is consumed, so this asks "are there four parts?".
            let [group, rest @ ..] = parts else {
                return Ok(info);
            };
            if parts.len() < 3 {
                return Ok(info);
            }
            info.api_group = group.clone();
            parts = rest;
        }

        info.is_resource_request = true;
        let [version, rest @ ..] = parts else {
            return Ok(info);
        };
        info.api_version = version.clone();
        parts = rest;

        // `/{special verb}/...`: `watch` and `proxy`.
        let verb_via_path_prefix =
            matches!(parts.first().map(String::as_str), Some("watch" | "proxy"));
        if verb_via_path_prefix {
            let [verb, rest @ ..] = parts else {
                return Ok(info);
            };
            if rest.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "unable to determine kind and namespace from url, {}",
                    match query {
                        Some(q) => format!("{path}?{q}"),
                        None => path.to_owned(),
                    }
                )));
            }
            info.verb = verb.clone();
            parts = rest;
        } else {
            info.verb = match *method {
                Method::POST => "create",
                Method::GET | Method::HEAD => "get",
                Method::PUT => "update",
                Method::PATCH => "patch",
                Method::DELETE => "delete",
                _ => "",
            }
            .to_owned();
        }

        // `/namespaces/{namespace}/{resource}/...`: unless what follows the namespace is
        // one of its own subresources, the parts restart at the resource.
        if let [first, namespace, rest @ ..] = parts
            && first == "namespaces"
        {
            info.namespace = namespace.clone();
            if let Some(next) = rest.first()
                && next != "status"
                && next != "finalize"
            {
                parts = rest;
            }
        }
        info.parts = parts.to_vec();

        // resource/name/subresource/anything/else; `proxy` takes no subresource.
        if let Some(resource) = parts.first() {
            info.resource = resource.clone();
        }
        if let Some(name) = parts.get(1) {
            info.name = name.clone();
        }
        if info.verb != "proxy"
            && let Some(subresource) = parts.get(2)
        {
            info.subresource = subresource.clone();
        }
        let values = QueryValues::parse(query.unwrap_or_default());
        if info.name.is_empty() && info.verb == "get" {
            // Go decodes the whole ListOptions; if any of it is malformed, it still honours
            // `watch`, but not the field selector.
            match list_options_for_request_info(query.unwrap_or_default()) {
                Ok((watch, field_selector)) => {
                    info.verb = if watch { "watch" } else { "list" }.to_owned();
                    if let Some(name) = field_selector.requires_exact_match("metadata.name")
                        && is_path_segment_name(name)
                    {
                        info.name = name.to_owned();
                    }
                }
                Err(_) => {
                    let watch = values.first("watch").is_some_and(go_bool);
                    info.verb = if watch { "watch" } else { "list" }.to_owned();
                }
            }
        }
        if info.name.is_empty() && info.verb == "delete" {
            info.verb = "deletecollection".to_owned();
        }

        // Selectors are authorized only on the verbs that take them, and not on the
        // deprecated `/watch/` paths, whose single-object form ignores them.
        if !verb_via_path_prefix
            && matches!(info.verb.as_str(), "list" | "watch" | "deletecollection")
        {
            info.field_selector = values.first("fieldSelector").unwrap_or_default().to_owned();
            info.label_selector = values.first("labelSelector").unwrap_or_default().to_owned();
        }
        Ok(info)
    }

    /// The same request as authorization must see it. A connect subresource is
    /// authorized as `create` whichever method opens it: a WebSocket upgrade is a GET and
    /// must not need less than SPDY's POST. kube-apiserver keeps `get` in its request info
    /// and adds this as a second, synthetic check for `pods/exec` since 1.31
    /// (`AuthorizePodWebsocketUpgradeCreatePermission`); an aggregated server behind it
    /// makes that check itself, so through a cluster a Holder needs `get` (the
    /// aggregator's check) and `create` (ours).
    pub fn for_authorization(&self) -> std::borrow::Cow<'_, Self> {
        if self.verb == "get" && CONNECT_SUBRESOURCES.contains(&self.subresource.as_str()) {
            std::borrow::Cow::Owned(Self {
                verb: "create".to_owned(),
                ..self.clone()
            })
        } else {
            std::borrow::Cow::Borrowed(self)
        }
    }

    /// The verb as one of the resource verbs this server serves, or `None` for `proxy`, an
    /// unknown HTTP method, or a non-resource request.
    pub fn resource_verb(&self) -> Option<Verb> {
        if !self.is_resource_request {
            return None;
        }
        Some(match self.verb.as_str() {
            "get" => Verb::Get,
            "list" => Verb::List,
            "watch" => Verb::Watch,
            "create" => Verb::Create,
            "update" => Verb::Update,
            "patch" => Verb::Patch,
            "delete" => Verb::Delete,
            "deletecollection" => Verb::DeleteCollection,
            _ => return None,
        })
    }
}

/// `splitPath`: the path without leading and trailing slashes, split on `/`, each segment
/// percent-decoded. Empty segments inside the path are kept, as in Go.
fn split_path(path: &str) -> Result<Vec<String>, ApiError> {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        return Ok(Vec::new());
    }
    trimmed.split('/').map(decode_path).collect()
}

/// Percent-decodes a path or segment (where `+` is a plain character). Rejects what axum's
/// `Path` extractor also rejects, a malformed escape or bytes that are not UTF-8, so the
/// handler cannot be reached with a path this parser did not understand.
fn decode_path(path: &str) -> Result<String, ApiError> {
    unescape(path, false)
        .and_then(|bytes| String::from_utf8(bytes).ok())
        .ok_or_else(|| ApiError::bad_request(format!("invalid URL path: {}", quote(path))))
}

/// `content.IsPathSegmentName` found no problem: not `.` or `..`, no `/` or `%`.
fn is_path_segment_name(name: &str) -> bool {
    name != "." && name != ".." && !name.contains(['/', '%'])
}

/// The errors that describe a refused request by its `RequestInfo`. They sit here, not in
/// `status`, so that `status` needs nothing above it: Go too builds them beside the request's
/// attributes (`responsewriters.ForbiddenStatusError`), not in apimachinery's `errors`.
impl ApiError {
    /// The authorizer's refusal, worded as `ForbiddenStatusError`
    /// (`apiserver:pkg/endpoints/handlers/responsewriters/errors.go`):
    /// `pools.battery.liquidmetal-x.dev "x" is forbidden: User "alice" cannot get resource
    /// "pools" in API group "battery.liquidmetal-x.dev" in the namespace "default": <reason>`.
    pub fn forbidden(user: &str, request: &RequestInfo, reason: &str) -> Self {
        let sentence = if !request.is_resource_request {
            format!(
                "User {} cannot {} path {}",
                quote(user),
                request.verb,
                quote(&request.path)
            )
        } else {
            let mut resource = request.resource.clone();
            if !request.subresource.is_empty() {
                resource.push('/');
                resource.push_str(&request.subresource);
            }
            let scope = if request.namespace.is_empty() {
                "at the cluster scope".to_owned()
            } else {
                format!("in the namespace {}", quote(&request.namespace))
            };
            format!(
                "User {} cannot {} resource {} in API group {} {scope}",
                quote(user),
                request.verb,
                quote(&resource),
                quote(&request.api_group),
            )
        };
        // Go HTML-escapes the sentence because it echoes user-controlled path segments.
        let sentence = sentence
            .replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;");
        let why = if reason.is_empty() {
            sentence
        } else {
            format!("{sentence}: {reason}")
        };
        // `NewForbidden` qualifies the message by the resource (without subresource).
        let (group, resource) = if request.is_resource_request {
            (request.api_group.as_str(), request.resource.as_str())
        } else {
            ("", "")
        };
        let message = match (group_resource(group, resource), request.name.as_str()) {
            (qualified, _) if qualified.is_empty() => format!("forbidden: {why}"),
            (qualified, "") => format!("{qualified} is forbidden: {why}"),
            (qualified, name) => format!("{qualified} {} is forbidden: {why}", quote(name)),
        };
        Self::with_details(
            Reason::Forbidden,
            message,
            resource_details(group, resource, &request.name),
        )
    }

    /// A subresource that does not serve a verb: `NewMethodNotSupported` on the
    /// subresource, `patch is not supported on resources of kind
    /// "microvmclaims/lease.battery.liquidmetal-x.dev"`.
    pub fn subresource_method_not_allowed(request: &RequestInfo, action: &str) -> Self {
        let resource = group_resource(
            &request.api_group,
            &format!("{}/{}", request.resource, request.subresource),
        );
        Self::with_details(
            Reason::MethodNotAllowed,
            format!(
                "{action} is not supported on resources of kind {}",
                quote(&resource)
            ),
            resource_details(&request.api_group, &request.resource, ""),
        )
    }
}

/// The [`RequestInfo`] the request-info layer left in a request's extensions, as Go's
/// `request.RequestInfoFrom` reads it from the context; a 500 if the layer did not run,
/// which is a bug in how the stack was built.
pub fn of(extensions: &http::Extensions) -> Result<&RequestInfo, ApiError> {
    extensions.get::<RequestInfo>().ok_or_else(|| {
        ApiError::internal(std::io::Error::other(
            "the request reached a handler without passing the request-info layer",
        ))
    })
}

#[cfg(test)]
mod tests;
