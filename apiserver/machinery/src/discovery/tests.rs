use axum::body::to_bytes;
use battery_types::{ResourceInfo, Scope, SubresourceInfo, Verb};
use http::HeaderValue;
use http::header::IF_NONE_MATCH;
use serde_json::{Value, json};

use super::*;

const GROUP: &str = "example.liquidmetal-x.dev";
const VERSION: &str = "v1beta1";

const WIDGETS: ResourceInfo = ResourceInfo {
    group: GROUP,
    version: VERSION,
    kind: "Widget",
    plural: "widgets",
    singular: "widget",
    short_names: &["wdg"],
    categories: &["example"],
    scope: Scope::Namespaced,
    // Deliberately unsorted: discovery sorts.
    verbs: &[
        Verb::Watch,
        Verb::Update,
        Verb::Patch,
        Verb::List,
        Verb::Get,
        Verb::DeleteCollection,
        Verb::Delete,
        Verb::Create,
    ],
    subresources: &[
        SubresourceInfo {
            name: "status",
            group: GROUP,
            version: VERSION,
            kind: "Widget",
            verbs: &[Verb::Update, Verb::Get, Verb::Patch],
            strategic_merge_patch: false,
        },
        SubresourceInfo {
            name: "lease",
            group: "coordination.k8s.io",
            version: "v1",
            kind: "Lease",
            verbs: &[Verb::Get, Verb::Update, Verb::Patch],
            strategic_merge_patch: false,
        },
    ],
};

const GADGETS: ResourceInfo = ResourceInfo {
    group: GROUP,
    version: VERSION,
    kind: "Gadget",
    plural: "gadgets",
    singular: "gadget",
    short_names: &[],
    categories: &[],
    scope: Scope::Cluster,
    verbs: &[Verb::List, Verb::Get],
    subresources: &[],
};

const RESOURCES: &[&ResourceInfo] = &[&WIDGETS, &GADGETS];

async fn body_of(response: Response) -> Bytes {
    to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("an in-memory body reads")
}

async fn json_of(response: Response) -> Value {
    serde_json::from_slice(&body_of(response).await).expect("the body is JSON")
}

#[test]
fn resource_list_is_what_the_go_installer_writes() {
    let list = serde_json::to_value(api_resource_list(GROUP, VERSION, RESOURCES)).unwrap();
    assert_eq!(
        list,
        json!({
            "apiVersion": "v1",
            "kind": "APIResourceList",
            "groupVersion": "example.liquidmetal-x.dev/v1beta1",
            "resources": [
                {
                    "name": "gadgets",
                    "singularName": "gadget",
                    "namespaced": false,
                    "kind": "Gadget",
                    "verbs": ["get", "list"],
                },
                {
                    "name": "widgets",
                    "singularName": "widget",
                    "namespaced": true,
                    "kind": "Widget",
                    "verbs": [
                        "create", "delete", "deletecollection", "get", "list", "patch",
                        "update", "watch",
                    ],
                    "shortNames": ["wdg"],
                    "categories": ["example"],
                },
                {
                    "name": "widgets/lease",
                    "singularName": "",
                    "namespaced": true,
                    "group": "coordination.k8s.io",
                    "version": "v1",
                    "kind": "Lease",
                    "verbs": ["get", "patch", "update"],
                },
                {
                    "name": "widgets/status",
                    "singularName": "",
                    "namespaced": true,
                    "kind": "Widget",
                    "verbs": ["get", "patch", "update"],
                },
            ],
        })
    );
}

#[test]
fn aggregated_discovery_is_the_v2_shape() {
    let list = serde_json::to_value(aggregated_discovery(
        GROUP,
        VERSION,
        RESOURCES,
        DiscoveryVersion::V2,
    ))
    .unwrap();
    assert_eq!(
        list,
        json!({
            "apiVersion": "apidiscovery.k8s.io/v2",
            "kind": "APIGroupDiscoveryList",
            "metadata": {},
            "items": [{
                "metadata": { "name": "example.liquidmetal-x.dev" },
                "versions": [{
                    "version": "v1beta1",
                    "freshness": "Current",
                    "resources": [
                        {
                            "resource": "gadgets",
                            "responseKind": { "group": GROUP, "version": VERSION, "kind": "Gadget" },
                            "scope": "Cluster",
                            "singularResource": "gadget",
                            "verbs": ["get", "list"],
                        },
                        {
                            "resource": "widgets",
                            "responseKind": { "group": GROUP, "version": VERSION, "kind": "Widget" },
                            "scope": "Namespaced",
                            "singularResource": "widget",
                            "verbs": [
                                "create", "delete", "deletecollection", "get", "list", "patch",
                                "update", "watch",
                            ],
                            "shortNames": ["wdg"],
                            "categories": ["example"],
                            "subresources": [
                                {
                                    "subresource": "lease",
                                    "responseKind": {
                                        "group": "coordination.k8s.io",
                                        "version": "v1",
                                        "kind": "Lease",
                                    },
                                    "verbs": ["get", "patch", "update"],
                                },
                                {
                                    "subresource": "status",
                                    "responseKind": { "group": GROUP, "version": VERSION, "kind": "Widget" },
                                    "verbs": ["get", "patch", "update"],
                                },
                            ],
                        },
                    ],
                }],
            }],
        })
    );

    // kube-rs, a real client, reads it.
    let parsed: kube::core::discovery::v2::APIGroupDiscoveryList =
        serde_json::from_value(list).unwrap();
    let resources = &parsed.items[0].versions[0].resources;
    assert_eq!(
        resources[1].subresources[0].subresource.as_deref(),
        Some("lease")
    );
}

#[test]
fn v2beta1_differs_only_in_api_version() {
    let v2 = aggregated_discovery(GROUP, VERSION, RESOURCES, DiscoveryVersion::V2);
    let beta = aggregated_discovery(GROUP, VERSION, RESOURCES, DiscoveryVersion::V2beta1);
    assert_eq!(beta.api_version, "apidiscovery.k8s.io/v2beta1");
    assert_eq!(
        APIGroupDiscoveryList {
            api_version: v2.api_version.clone(),
            ..beta
        },
        v2
    );
}

#[tokio::test]
async fn aggregated_response_carries_content_type_etag_and_caching() {
    let discovery = Discovery::new(GROUP, VERSION, RESOURCES);
    for api_version in [DiscoveryVersion::V2, DiscoveryVersion::V2beta1] {
        let response = discovery.aggregated(api_version, &HeaderMap::new());
        assert_eq!(response.status(), StatusCode::OK);
        let headers = response.headers().clone();
        assert_eq!(headers[CONTENT_TYPE], aggregated_content_type(api_version));
        assert_eq!(headers[VARY], "Accept");
        assert_eq!(headers[CACHE_CONTROL], "public");
        let body = body_of(response).await;
        let etag = format!("\"{}\"", etag::sha512_hex(&body));
        assert_eq!(headers[ETAG], etag.as_str());
        let document: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(document["apiVersion"], aggregated_api_version(api_version));

        let mut conditional = HeaderMap::new();
        conditional.insert(IF_NONE_MATCH, HeaderValue::try_from(etag.as_str()).unwrap());
        let response = discovery.aggregated(api_version, &conditional);
        assert_eq!(response.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(response.headers()[ETAG], etag.as_str());
        assert!(response.headers().get(CONTENT_TYPE).is_none());
        assert!(body_of(response).await.is_empty());

        conditional.insert(IF_NONE_MATCH, HeaderValue::from_static("\"stale\""));
        let response = discovery.aggregated(api_version, &conditional);
        assert_eq!(response.status(), StatusCode::OK);
    }
    let v2 = discovery.aggregated(DiscoveryVersion::V2, &HeaderMap::new());
    let beta = discovery.aggregated(DiscoveryVersion::V2beta1, &HeaderMap::new());
    assert_ne!(v2.headers()[ETAG], beta.headers()[ETAG]);
}

#[tokio::test]
async fn legacy_documents() {
    let discovery = Discovery::new(GROUP, VERSION, RESOURCES);
    let group_version =
        json!({ "groupVersion": "example.liquidmetal-x.dev/v1beta1", "version": "v1beta1" });

    let response = discovery.api_versions();
    assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
    assert_eq!(
        json_of(response).await,
        json!({ "apiVersion": "v1", "kind": "APIVersions", "versions": [], "serverAddressByClientCIDRs": [] })
    );

    let group = json_of(discovery.group()).await;
    assert_eq!(group["kind"], "APIGroup");
    assert_eq!(group["name"], GROUP);
    assert_eq!(group["versions"], json!([group_version]));
    assert_eq!(group["preferredVersion"], group_version);

    let list = json_of(discovery.group_list()).await;
    assert_eq!(list["kind"], "APIGroupList");
    assert_eq!(list["groups"][0]["name"], GROUP);

    let response = discovery.resource_list();
    assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
    let resources = json_of(response).await;
    assert_eq!(
        resources,
        serde_json::to_value(api_resource_list(GROUP, VERSION, RESOURCES)).unwrap()
    );
}

#[test]
#[should_panic(
    expected = "discovery for other.dev/v1 was given example.liquidmetal-x.dev/v1beta1 widgets"
)]
fn foreign_resources_are_a_startup_error() {
    Discovery::new("other.dev", "v1", RESOURCES);
}

/// battery's exec subresource is listed as `pods/exec` is: `create, get`.
#[test]
fn battery_exec_is_listed_like_pods_exec() {
    use battery_types::{GROUP, RESOURCES, VERSION};

    let list = api_resource_list(GROUP, VERSION, RESOURCES);
    let exec = list
        .resources
        .iter()
        .find(|resource| resource.name == "microvmclaims/exec")
        .expect("microvmclaims/exec is listed");
    assert_eq!(exec.verbs, ["create", "get"]);
    assert_eq!(exec.singular_name, "");
    assert!(exec.namespaced);
}
