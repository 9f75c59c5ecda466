//! Discovery documents for one group-version, built once from `ResourceInfo` and served
//! from memory, so they answer in microseconds even while battery is down (the aggregator
//! gives `/apis/<g>/<v>` five seconds and marks the whole APIService unavailable when it
//! fails: aggregated-apiserver.md §3, §11).
//!
//! - `/api`: `APIVersions` with no versions (an aggregated server has no core group).
//! - `/apis`: legacy `APIGroupList`, or the aggregated `APIGroupDiscoveryList`
//!   (apidiscovery.k8s.io/v2 or v2beta1, which have the same shape) with the content type,
//!   `ETag`, `Vary` and `Cache-Control` of `apiserver:pkg/endpoints/discovery/aggregated/etag.go`
//!   and 304 on a matching `If-None-Match`.
//! - `/apis/<g>`: `APIGroup`; `/apis/<g>/<v>`: `APIResourceList` as
//!   `apiserver:pkg/endpoints/installer.go` fills it.
//!
//! Which `/apis` representation to send is decided by `negotiate::Discovery::negotiate`;
//! these functions take it already decided. The documents are JSON only.
//!
//! The v2 types are defined here rather than taken from `kube::core::discovery::v2`:
//! those carry no `kind`/`apiVersion` and write empty lists that Go omits, and a client
//! only treats the body as aggregated discovery if the envelope is right.

use axum::body::{Body, Bytes};
use axum::response::Response;
use battery_types::{ResourceInfo, Scope, SubresourceInfo, Verb};
use http::header::{CACHE_CONTROL, CONTENT_TYPE, ETAG, VARY};
use http::{HeaderMap, HeaderValue, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIGroup, APIGroupList, APIResource, APIResourceList, APIVersions, GroupVersionForDiscovery,
    ListMeta,
};
use serde::{Deserialize, Serialize};

use crate::etag;
use crate::negotiate::DiscoveryVersion;

/// The kind of the aggregated discovery document served at `/apis`.
pub const AGGREGATED_KIND: &str = "APIGroupDiscoveryList";

/// `apiVersion` of the aggregated discovery document. kube-aggregator 1.27–1.29 ask only
/// for v2beta1, 1.30–1.36 for v2 then v2beta1, later ones for v2 only
/// (aggregated-apiserver.md §3.2), so both are served; the documents differ only in
/// `apiVersion` and content type.
pub fn aggregated_api_version(version: DiscoveryVersion) -> &'static str {
    match version {
        DiscoveryVersion::V2 => "apidiscovery.k8s.io/v2",
        DiscoveryVersion::V2beta1 => "apidiscovery.k8s.io/v2beta1",
    }
}

/// The `Content-Type` of the aggregated discovery document: client-go treats the body as
/// aggregated discovery only when the `g`, `v` and `as` parameters are present
/// (`ContentTypeIsGVK` in `client-go:discovery/discovery_client.go`).
pub fn aggregated_content_type(version: DiscoveryVersion) -> &'static str {
    match version {
        DiscoveryVersion::V2 => {
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
        }
        DiscoveryVersion::V2beta1 => {
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
        }
    }
}

/// `APIGroupDiscoveryList` (`api:apidiscovery/v2/types.go`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct APIGroupDiscoveryList {
    /// `apidiscovery.k8s.io/v2` or `apidiscovery.k8s.io/v2beta1`.
    pub api_version: String,
    /// Always `APIGroupDiscoveryList`.
    pub kind: String,
    /// Empty; Go writes `{}` as the struct is not a pointer.
    #[serde(default)]
    pub metadata: ListMeta,
    /// The groups, in priority order.
    pub items: Vec<APIGroupDiscovery>,
}

/// `APIGroupDiscovery`: one group and its versions, preferred version first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct APIGroupDiscovery {
    /// Only `name`, the group name, is set.
    pub metadata: GroupName,
    /// The versions, in descending order of preference.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<APIVersionDiscovery>,
}

/// The metadata of an `APIGroupDiscovery`: Go uses `ObjectMeta` but sets only its name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupName {
    /// The API group.
    pub name: String,
}

/// `APIVersionDiscovery`: the resources of one version.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct APIVersionDiscovery {
    /// The version, e.g. `v1alpha1`.
    pub version: String,
    /// The resources, sorted by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<APIResourceDiscovery>,
    /// `Current` or `Stale`; a server describing itself is always `Current`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub freshness: String,
}

/// `APIResourceDiscovery`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct APIResourceDiscovery {
    /// The plural resource name.
    pub resource: String,
    /// The kind the endpoint returns. Always set: client-go 0.26.0–0.26.3 panic on a nil
    /// one (kubernetes/kubernetes#118361).
    pub response_kind: GroupVersionKind,
    /// `Namespaced` or `Cluster`.
    pub scope: String,
    /// The singular resource name.
    pub singular_resource: String,
    /// The verbs, sorted.
    pub verbs: Vec<String>,
    /// Short names for kubectl.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub short_names: Vec<String>,
    /// Categories such as `all`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub categories: Vec<String>,
    /// The subresources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subresources: Vec<APISubresourceDiscovery>,
}

/// `APISubresourceDiscovery`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct APISubresourceDiscovery {
    /// The subresource name, e.g. `status`.
    pub subresource: String,
    /// The kind the endpoint returns.
    pub response_kind: GroupVersionKind,
    /// The kinds the endpoint accepts; Go's installer leaves this empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accepted_types: Vec<GroupVersionKind>,
    /// The verbs, sorted.
    pub verbs: Vec<String>,
}

/// `metav1.GroupVersionKind`: every field is written, even an empty core group.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupVersionKind {
    /// The API group, empty for core.
    pub group: String,
    /// The version.
    pub version: String,
    /// The kind.
    pub kind: String,
}

/// `/api`: `APIVersions` with no versions, as an aggregated server has no core group.
pub fn api_versions() -> APIVersions {
    APIVersions {
        server_address_by_client_cidrs: Vec::new(),
        versions: Vec::new(),
    }
}

/// `/apis/<group>`: the group with its only, preferred version.
pub fn api_group(group: &str, version: &str) -> APIGroup {
    let discovery_version = GroupVersionForDiscovery {
        group_version: format!("{group}/{version}"),
        version: version.to_owned(),
    };
    APIGroup {
        name: group.to_owned(),
        preferred_version: Some(discovery_version.clone()),
        server_address_by_client_cidrs: None,
        versions: vec![discovery_version],
    }
}

/// `/apis` for legacy clients: the one group served here.
pub fn api_group_list(group: &str, version: &str) -> APIGroupList {
    APIGroupList {
        groups: vec![api_group(group, version)],
    }
}

/// `/apis/<group>/<version>`: one entry per resource and one per subresource, named
/// `<plural>/<subresource>` with an empty singular name, sorted by name, as
/// `apiserver:pkg/endpoints/installer.go` produces them. A subresource's group and version
/// are set only where they differ from the parent's, like `deployments/scale`.
pub fn api_resource_list(
    group: &str,
    version: &str,
    resources: &[&ResourceInfo],
) -> APIResourceList {
    let mut entries = Vec::new();
    for info in resources {
        let namespaced = info.scope == Scope::Namespaced;
        entries.push(APIResource {
            categories: non_empty(info.categories),
            group: None,
            kind: info.kind.to_owned(),
            name: info.plural.to_owned(),
            namespaced,
            short_names: non_empty(info.short_names),
            singular_name: info.singular.to_owned(),
            storage_version_hash: None,
            verbs: sorted_verbs(info.verbs),
            version: None,
        });
        for sub in info.subresources {
            let foreign = sub.group != info.group || sub.version != info.version;
            entries.push(APIResource {
                categories: None,
                group: foreign.then(|| sub.group.to_owned()),
                kind: sub.kind.to_owned(),
                name: format!("{}/{}", info.plural, sub.name),
                namespaced,
                short_names: None,
                singular_name: String::new(),
                storage_version_hash: None,
                verbs: sorted_verbs(sub.verbs),
                version: foreign.then(|| sub.version.to_owned()),
            });
        }
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    APIResourceList {
        group_version: format!("{group}/{version}"),
        resources: entries,
    }
}

/// `/apis` as aggregated discovery: the one group-version served here, `Current`.
pub fn aggregated_discovery(
    group: &str,
    version: &str,
    resources: &[&ResourceInfo],
    api_version: DiscoveryVersion,
) -> APIGroupDiscoveryList {
    let mut entries: Vec<APIResourceDiscovery> = resources
        .iter()
        .map(|info| resource_discovery(info))
        .collect();
    entries.sort_by(|a, b| a.resource.cmp(&b.resource));
    APIGroupDiscoveryList {
        api_version: aggregated_api_version(api_version).to_owned(),
        kind: AGGREGATED_KIND.to_owned(),
        metadata: ListMeta::default(),
        items: vec![APIGroupDiscovery {
            metadata: GroupName {
                name: group.to_owned(),
            },
            versions: vec![APIVersionDiscovery {
                version: version.to_owned(),
                resources: entries,
                freshness: "Current".to_owned(),
            }],
        }],
    }
}

fn resource_discovery(info: &ResourceInfo) -> APIResourceDiscovery {
    let mut subresources: Vec<APISubresourceDiscovery> = info
        .subresources
        .iter()
        .map(|sub: &SubresourceInfo| APISubresourceDiscovery {
            subresource: sub.name.to_owned(),
            response_kind: GroupVersionKind {
                group: sub.group.to_owned(),
                version: sub.version.to_owned(),
                kind: sub.kind.to_owned(),
            },
            accepted_types: Vec::new(),
            verbs: sorted_verbs(sub.verbs),
        })
        .collect();
    subresources.sort_by(|a, b| a.subresource.cmp(&b.subresource));
    APIResourceDiscovery {
        resource: info.plural.to_owned(),
        response_kind: GroupVersionKind {
            group: info.group.to_owned(),
            version: info.version.to_owned(),
            kind: info.kind.to_owned(),
        },
        scope: match info.scope {
            Scope::Namespaced => "Namespaced",
            Scope::Cluster => "Cluster",
        }
        .to_owned(),
        singular_resource: info.singular.to_owned(),
        verbs: sorted_verbs(info.verbs),
        short_names: strings(info.short_names),
        categories: strings(info.categories),
        subresources,
    }
}

/// Discovery verbs in Go's order: sorted, as `installer.go` sorts them.
fn sorted_verbs(verbs: &[Verb]) -> Vec<String> {
    let mut names: Vec<String> = verbs.iter().map(|verb| verb.as_str().to_owned()).collect();
    names.sort();
    names.dedup();
    names
}

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|&value| value.to_owned()).collect()
}

/// Go's `omitempty` for the optional lists of `APIResource`.
fn non_empty(values: &[&str]) -> Option<Vec<String>> {
    (!values.is_empty()).then(|| strings(values))
}

/// The discovery documents of one group-version, serialized once.
#[derive(Clone, Debug)]
pub struct Discovery {
    api_versions: Bytes,
    group_list: Bytes,
    group: Bytes,
    resource_list: Bytes,
    aggregated_v2: Aggregated,
    aggregated_v2beta1: Aggregated,
}

#[derive(Clone, Debug)]
struct Aggregated {
    body: Bytes,
    quoted_etag: HeaderValue,
}

impl Discovery {
    /// Builds and serializes every document for `group`/`version`.
    ///
    /// # Panics
    ///
    /// If a resource belongs to another group-version: the resource table is static, so
    /// this is a programming error to catch at startup.
    pub fn new(group: &str, version: &str, resources: &[&ResourceInfo]) -> Self {
        for info in resources {
            assert!(
                info.group == group && info.version == version,
                "discovery for {group}/{version} was given {}/{} {}",
                info.group,
                info.version,
                info.plural,
            );
        }
        let aggregated = |api_version| {
            let body = to_json(&aggregated_discovery(
                group,
                version,
                resources,
                api_version,
            ));
            let quoted_etag = HeaderValue::try_from(etag::quoted(&etag::sha512_hex(&body)))
                .expect("a quoted hex digest is a valid header value");
            Aggregated { body, quoted_etag }
        };
        Self {
            api_versions: to_json(&api_versions()),
            group_list: to_json(&api_group_list(group, version)),
            group: to_json(&api_group(group, version)),
            resource_list: to_json(&api_resource_list(group, version, resources)),
            aggregated_v2: aggregated(DiscoveryVersion::V2),
            aggregated_v2beta1: aggregated(DiscoveryVersion::V2beta1),
        }
    }

    /// `GET /api`.
    pub fn api_versions(&self) -> Response {
        json(self.api_versions.clone())
    }

    /// `GET /apis` when the client accepts only the legacy `APIGroupList`.
    pub fn group_list(&self) -> Response {
        json(self.group_list.clone())
    }

    /// `GET /apis` when the client accepts aggregated discovery `api_version`: the document
    /// with `ETag`, `Vary: Accept` and `Cache-Control: public`, or 304 with no body when
    /// `request_headers` carry a matching `If-None-Match`
    /// (`apiserver:pkg/endpoints/discovery/aggregated/etag.go` `ServeHTTPWithETag`).
    pub fn aggregated(
        &self,
        api_version: DiscoveryVersion,
        request_headers: &HeaderMap,
    ) -> Response {
        let document = match api_version {
            DiscoveryVersion::V2 => &self.aggregated_v2,
            DiscoveryVersion::V2beta1 => &self.aggregated_v2beta1,
        };
        let not_modified = document
            .quoted_etag
            .to_str()
            .is_ok_and(|quoted| etag::if_none_match(request_headers, quoted));
        let (status, body) = if not_modified {
            (StatusCode::NOT_MODIFIED, Body::empty())
        } else {
            (StatusCode::OK, Body::from(document.body.clone()))
        };
        let mut response = Response::new(body);
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(ETAG, document.quoted_etag.clone());
        headers.insert(VARY, HeaderValue::from_static("Accept"));
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("public"));
        if !not_modified {
            headers.insert(
                CONTENT_TYPE,
                HeaderValue::from_static(aggregated_content_type(api_version)),
            );
        }
        response
    }

    /// `GET /apis/<group>`.
    pub fn group(&self) -> Response {
        json(self.group.clone())
    }

    /// `GET /apis/<group>/<version>`: the availability probe and discovery fallback.
    pub fn resource_list(&self) -> Response {
        json(self.resource_list.clone())
    }
}

/// Serializes a discovery document. These types hold only strings, bools and lists, for
/// which serde_json cannot fail.
fn to_json<T: Serialize>(document: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(document).expect("discovery documents serialize to JSON"))
}

fn json(body: Bytes) -> Response {
    let mut response = Response::new(Body::from(body));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests;
