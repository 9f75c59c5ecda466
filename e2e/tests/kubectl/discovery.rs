//! Discovery and OpenAPI, through the commands that read them (`api-resources`,
//! `api-versions`, `explain`, category expansion) and through `get --raw` of every
//! document, so a malformed body fails here rather than as an odd kubectl message.

use std::collections::{BTreeMap, BTreeSet};

use battery_e2e::apiserver::{ApiServer, Kubectl, Route};
use serde_json::Value;

use crate::{GROUP, GROUP_VERSION, assert_contains_all, create_claim, table, text};

crate::on_both_routes!(
    api_resources_lists_pools_claims_and_hosts,
    api_versions_lists_the_group_version,
    raw_discovery_documents_describe_the_group,
    raw_openapi_documents_describe_the_kinds,
    explain_shows_the_claim_spec_docs,
    get_battery_lists_every_kind_in_the_category,
);

const ALL_VERBS: &str = "create,delete,deletecollection,get,list,patch,update,watch";

/// What `api-resources -o wide` must print for each resource: name, short name,
/// namespaced, kind, verbs, categories (DESIGN §4).
const RESOURCES: &[[&str; 6]] = &[
    [
        "hosts",
        "bhost",
        "false",
        "Host",
        "create,delete,get,list,patch,update,watch",
        "battery",
    ],
    [
        "microvmclaims",
        "mvc",
        "true",
        "MicroVMClaim",
        ALL_VERBS,
        "battery",
    ],
    [
        "microvmprocesses",
        "mvp",
        "true",
        "MicroVMProcess",
        "create,delete,get,list,patch,update,watch",
        "battery",
    ],
    ["pools", "bpool", "true", "Pool", ALL_VERBS, "battery"],
];

/// The subresources discovery must list, with their verbs (DESIGN §4; `exec` and
/// `portforward` are connect subresources, which discovery shows as `create` and `get`
/// like `pods/exec` and `pods/portforward`;
/// `pools/scale` is checked further in `scale.rs`).
const SUBRESOURCES: &[(&str, &[&str])] = &[
    ("hosts/certificate", &["create"]),
    ("hosts/status", &["get", "patch", "update"]),
    ("microvmclaims/exec", &["create", "get"]),
    ("microvmclaims/lease", &["create", "get", "patch", "update"]),
    ("microvmclaims/portforward", &["create", "get"]),
    ("microvmclaims/status", &["get"]),
    ("microvmprocesses/attach", &["create", "get"]),
    ("microvmprocesses/stop", &["create"]),
    ("pools/scale", &["get", "patch", "update"]),
    ("pools/status", &["get"]),
];

const KINDS: &[&str] = &["Host", "MicroVMClaim", "MicroVMProcess", "Pool"];

/// The path of one claim, as both OpenAPI documents name it.
const CLAIM_PATH: &str =
    "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/{namespace}/microvmclaims/{name}";
const STRATEGIC_MERGE_PATCH: &str = "application/strategic-merge-patch+json";
/// The patch types the server accepts, as OpenAPI must advertise them.
const PATCH_TYPES: &[&str] = &[
    "application/apply-patch+yaml",
    "application/json-patch+json",
    "application/merge-patch+json",
];

async fn api_resources_lists_pools_claims_and_hosts(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let output = kubectl
            .ok(&["api-resources", "-o", "wide", "--api-group", GROUP])
            .await;
        let rows = table(&output);
        assert_eq!(
            rows[0],
            [
                "NAME",
                "SHORTNAMES",
                "APIVERSION",
                "NAMESPACED",
                "KIND",
                "VERBS",
                "CATEGORIES"
            ],
            "kubectl {}: api-resources header",
            kubectl.version()
        );
        let expected: Vec<Vec<&str>> = RESOURCES
            .iter()
            .map(|[name, short, namespaced, kind, verbs, categories]| {
                vec![
                    *name,
                    *short,
                    GROUP_VERSION,
                    *namespaced,
                    *kind,
                    *verbs,
                    *categories,
                ]
            })
            .collect();
        assert_eq!(
            rows[1..],
            expected,
            "kubectl {}: api-resources rows:\n{output}",
            kubectl.version()
        );
    }
}

/// The core group's versions kubectl sees: an aggregated server serves none, so straight
/// to it there are none, and through the aggregator there are kube-apiserver's own.
fn core_versions(route: Route) -> &'static [&'static str] {
    match route {
        Route::Direct => &[],
        Route::Aggregated => &["v1"],
    }
}

/// Asserts that `served` (group-versions, groups or OpenAPI paths) holds `ours` and, on
/// the direct route, nothing else; through kube-apiserver the cluster's own are there too,
/// and so is each of `cluster`.
#[track_caller]
fn assert_served(route: Route, served: &[&str], ours: &str, cluster: &[&str], what: &str) {
    match route {
        Route::Direct => assert_eq!(served, [ours], "{what}"),
        Route::Aggregated => {
            assert_eq!(
                served.iter().filter(|item| **item == ours).count(),
                1,
                "{what}: {ours} once in {served:?}"
            );
            for item in cluster {
                assert!(served.contains(item), "{what}: {item} in {served:?}");
            }
        }
    }
}

async fn api_versions_lists_the_group_version(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let output = kubectl.ok(&["api-versions"]).await;
        let served: Vec<&str> = output.lines().collect();
        let what = format!("kubectl {}: api-versions", kubectl.version());
        assert_served(route, &served, GROUP_VERSION, core_versions(route), &what);
        assert!(served.is_sorted(), "{what}: sorted: {served:?}");
    }
}

async fn raw_discovery_documents_describe_the_group(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let api = raw(&kubectl, "/api").await;
        assert_eq!(api["kind"], "APIVersions", "/api: {api:#}");
        assert_eq!(
            api["versions"],
            serde_json::json!(core_versions(route)),
            "/api: {api:#}"
        );

        let groups = raw(&kubectl, "/apis").await;
        assert_eq!(groups["kind"], "APIGroupList", "/apis: {groups:#}");
        let groups = groups["groups"].as_array().expect("/apis lists groups");
        let names: Vec<&str> = groups.iter().map(|group| text(&group["name"])).collect();
        assert_served(
            route,
            &names,
            GROUP,
            &["apps", "rbac.authorization.k8s.io"],
            "/apis",
        );
        let ours = groups
            .iter()
            .find(|group| group["name"] == GROUP)
            .expect("our group in /apis");
        assert_group(ours, "/apis");

        let group = raw(&kubectl, &format!("/apis/{GROUP}")).await;
        assert_eq!(group["kind"], "APIGroup", "/apis/{GROUP}: {group:#}");
        assert_group(&group, &format!("/apis/{GROUP}"));

        let path = format!("/apis/{GROUP_VERSION}");
        let list = raw(&kubectl, &path).await;
        assert_eq!(list["kind"], "APIResourceList", "{path}: {list:#}");
        assert_eq!(list["groupVersion"], GROUP_VERSION, "{path}: {list:#}");
        let by_name: BTreeMap<&str, &Value> = list["resources"]
            .as_array()
            .unwrap_or_else(|| panic!("{path} lists no resources: {list:#}"))
            .iter()
            .map(|resource| (text(&resource["name"]), resource))
            .collect();
        let expected_names: BTreeSet<&str> = RESOURCES
            .iter()
            .map(|[name, ..]| *name)
            .chain(SUBRESOURCES.iter().map(|(name, _)| *name))
            .collect();
        assert_eq!(
            by_name.keys().copied().collect::<BTreeSet<_>>(),
            expected_names,
            "{path}: the resources"
        );
        for [name, short, namespaced, kind, verbs, categories] in RESOURCES {
            let resource = by_name[name];
            let what = format!("{path}: {name}");
            assert_eq!(resource["kind"], *kind, "{what}: {resource:#}");
            assert_eq!(
                resource["namespaced"].as_bool(),
                Some(*namespaced == "true"),
                "{what}: {resource:#}"
            );
            assert_eq!(resource["shortNames"], serde_json::json!([short]), "{what}");
            assert_eq!(
                resource["categories"],
                serde_json::json!([categories]),
                "{what}"
            );
            assert_eq!(
                strings(&resource["verbs"]),
                verbs.split(',').collect::<Vec<_>>(),
                "{what}"
            );
        }
        for (name, verbs) in SUBRESOURCES {
            let subresource = by_name[name];
            assert_eq!(
                strings(&subresource["verbs"]),
                *verbs,
                "{path}: {name}: {subresource:#}"
            );
        }
        // The lease subresource speaks coordination.k8s.io/v1 Lease, not our kind.
        let lease = by_name["microvmclaims/lease"];
        for (field, value) in [
            ("group", "coordination.k8s.io"),
            ("version", "v1"),
            ("kind", "Lease"),
        ] {
            assert_eq!(
                lease[field], value,
                "{path}: microvmclaims/lease: {lease:#}"
            );
        }
    }
}

async fn raw_openapi_documents_describe_the_kinds(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let v2 = raw(&kubectl, "/openapi/v2").await;
        assert_eq!(v2["swagger"], "2.0", "/openapi/v2");
        assert_kinds(&v2["definitions"], "/openapi/v2 definitions");
        let patch = &v2["paths"][CLAIM_PATH]["patch"];
        assert_claim_operation(patch, "/openapi/v2 PATCH claim");
        assert_patch_types(
            strings(&patch["consumes"]),
            "/openapi/v2 PATCH claim consumes",
        );

        let root = raw(&kubectl, "/openapi/v3").await;
        let gv_path = format!("apis/{GROUP_VERSION}");
        let url = text(&root["paths"][&gv_path]["serverRelativeURL"]).to_owned();
        assert!(
            url.starts_with(&format!("/openapi/v3/{gv_path}?hash=")),
            "/openapi/v3 points {gv_path} at {url}: {root:#}"
        );
        // Straight to us, only our group-version: the aggregator merges roots, so anything
        // else would claim paths another server owns. Through it, the cluster's too.
        let paths: Vec<&str> = root["paths"]
            .as_object()
            .expect("/openapi/v3 has paths")
            .keys()
            .map(String::as_str)
            .collect();
        assert_served(
            route,
            &paths,
            &gv_path,
            &["api/v1", "apis/apps/v1"],
            "/openapi/v3",
        );

        let v3_path = format!("/openapi/v3/{gv_path}");
        let v3 = raw(&kubectl, &v3_path).await;
        assert!(
            text(&v3["openapi"]).starts_with("3.0."),
            "{v3_path}: openapi {}",
            v3["openapi"]
        );
        assert_kinds(&v3["components"]["schemas"], &format!("{v3_path} schemas"));
        let patch = &v3["paths"][CLAIM_PATH]["patch"];
        assert_claim_operation(patch, &format!("{v3_path} PATCH claim"));
        let content = patch["requestBody"]["content"]
            .as_object()
            .unwrap_or_else(|| panic!("{v3_path}: PATCH claim has no requestBody: {patch:#}"));
        assert_patch_types(
            content.keys().map(String::as_str).collect(),
            &format!("{v3_path} PATCH claim requestBody"),
        );
        // What the root points at is the same document, under its hash.
        assert_eq!(
            raw(&kubectl, &url).await,
            v3,
            "{url} differs from {v3_path}"
        );
    }
}

async fn explain_shows_the_claim_spec_docs(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let output = kubectl.ok(&["explain", "microvmclaim.spec"]).await;
        assert_contains_all(
            &output,
            &[
                &format!("GROUP:      {GROUP}"),
                "KIND:       MicroVMClaim",
                "VERSION:    v1alpha1",
                "FIELD: spec <Object>",
                "poolRef\t<Object> -required-",
                "The Pool, in the claim's namespace, to take a MicroVM from. Immutable.",
                "serviceAccountName\t<string> -required-",
                "The Holder: the ServiceAccount",
            ],
            &format!("kubectl {} explain microvmclaim.spec", kubectl.version()),
        );
    }
}

async fn get_battery_lists_every_kind_in_the_category(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let claim = kubectl.unique("category");
        create_claim(&kubectl, &claim).await;
        let output = kubectl.ok(&["get", "battery", "-o", "name"]).await;
        let names: BTreeSet<&str> = output.lines().collect();
        let expected: BTreeSet<String> = [
            format!("host.{GROUP}/host-0"),
            format!("host.{GROUP}/host-1"),
            format!("microvmclaim.{GROUP}/{claim}"),
            format!("pool.{GROUP}/dev"),
        ]
        .into();
        assert_eq!(
            names,
            expected.iter().map(String::as_str).collect(),
            "kubectl {}: get battery -o name",
            kubectl.version()
        );
        kubectl.ok(&["delete", "mvc", &claim]).await;
    }
}

/// `kubectl get --raw <path>`, parsed.
async fn raw(kubectl: &Kubectl, path: &str) -> Value {
    kubectl.json(&["get", "--raw", path]).await
}

/// `group` (an `APIGroup`) names our group with v1alpha1 as its only and preferred version.
fn assert_group(group: &Value, what: &str) {
    let version = serde_json::json!({"groupVersion": GROUP_VERSION, "version": "v1alpha1"});
    assert_eq!(group["name"], GROUP, "{what}: {group:#}");
    assert_eq!(
        group["versions"],
        serde_json::json!([version]),
        "{what}: {group:#}"
    );
    assert_eq!(group["preferredVersion"], version, "{what}: {group:#}");
}

/// Each of our kinds has a schema tagged with its group-version-kind (how kubectl finds
/// the schema for `explain` and field validation) that describes metadata, spec, status.
fn assert_kinds(schemas: &Value, what: &str) {
    let schemas = schemas
        .as_object()
        .unwrap_or_else(|| panic!("{what}: not an object"));
    for kind in KINDS {
        let gvk = serde_json::json!([{"group": GROUP, "version": "v1alpha1", "kind": kind}]);
        let schema = schemas
            .values()
            .find(|schema| schema["x-kubernetes-group-version-kind"] == gvk)
            .unwrap_or_else(|| panic!("{what}: no schema tagged {gvk}"));
        for field in ["apiVersion", "kind", "metadata", "spec", "status"] {
            assert!(
                schema["properties"].get(field).is_some(),
                "{what}: {kind} has no property {field}"
            );
        }
    }
}

/// A PATCH of one claim is described as kube-apiserver describes its own operations.
fn assert_claim_operation(operation: &Value, what: &str) {
    assert_eq!(
        operation["x-kubernetes-action"], "patch",
        "{what}: {operation:#}"
    );
    assert_eq!(
        operation["x-kubernetes-group-version-kind"],
        serde_json::json!({"group": GROUP, "version": "v1alpha1", "kind": "MicroVMClaim"}),
        "{what}"
    );
}

/// The patch types offered are exactly those the server accepts: no strategic merge
/// patch, which kubectl would otherwise pick for `apply` and `patch`.
fn assert_patch_types(mut offered: Vec<&str>, what: &str) {
    offered.sort_unstable();
    assert!(
        !offered.contains(&STRATEGIC_MERGE_PATCH),
        "{what}: {offered:?}"
    );
    assert_eq!(offered, PATCH_TYPES, "{what}");
}

/// A JSON array of strings, sorted.
fn strings(value: &Value) -> Vec<&str> {
    let mut strings: Vec<&str> = value
        .as_array()
        .unwrap_or_else(|| panic!("expected an array of strings, got {value}"))
        .iter()
        .map(text)
        .collect();
    strings.sort_unstable();
    strings
}

/// Through kube-apiserver our `/openapi/v2` is merged into the cluster's: our kinds are
/// there, no Kubernetes definition of ours was renamed `<name>_v2` (the aggregator renames
/// one that differs from its own; `serve` takes them from the cluster), no `$ref` dangles,
/// the protobuf form (what client-go asks for first) is served, and `kubectl explain`
/// reads the merged v2 document as well as our v3 one.
#[tokio::test]
async fn openapi_v2_merges_into_the_clusters_without_renaming() {
    let server = ApiServer::start(Route::Aggregated).await;
    let kubectl = server.kubectls().last().expect("a kubectl release");
    let v2 = raw(&kubectl, "/openapi/v2").await;
    let definitions = v2["definitions"].as_object().expect("definitions");
    for kind in KINDS {
        let name = format!("dev.liquidmetal-x.battery.v1alpha1.{kind}");
        assert!(definitions.contains_key(&name), "/openapi/v2 lacks {name}");
    }
    let renamed: Vec<&String> = definitions
        .keys()
        .filter(|name| {
            name.rsplit_once("_v")
                .is_some_and(|(_, n)| n.parse::<u32>().is_ok())
        })
        .collect();
    assert!(renamed.is_empty(), "renamed in the merge: {renamed:?}");
    let text = v2.to_string();
    let dangling: BTreeSet<&str> = text
        .split("\"$ref\":\"#/definitions/")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .filter(|name| !definitions.contains_key(*name))
        .collect();
    assert!(dangling.is_empty(), "dangling $refs: {dangling:?}");

    let cluster = server.cluster().expect("a real control plane");
    let request = http::Request::get("/openapi/v2")
        .header(
            http::header::ACCEPT,
            "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
        )
        .body(kube::client::Body::empty())
        .expect("a request");
    let response = cluster
        .plane
        .admin()
        .await
        .send(request)
        .await
        .expect("GET /openapi/v2 as protobuf");
    assert_eq!(response.status(), http::StatusCode::OK);
    let body = response
        .into_body()
        .collect_bytes()
        .await
        .expect("the protobuf document");
    let claim = b"dev.liquidmetal-x.battery.v1alpha1.MicroVMClaim";
    assert!(
        body.windows(claim.len()).any(|window| window == claim),
        "the protobuf /openapi/v2 lacks the MicroVMClaim definition"
    );

    for kubectl in server.kubectls() {
        let output = kubectl
            .ok(&[
                "explain",
                "microvmclaims.spec",
                "--output=plaintext-openapiv2",
            ])
            .await;
        assert_contains_all(
            &output,
            &["KIND:     MicroVMClaim", "poolRef", "serviceAccountName"],
            &format!("kubectl {} explain from /openapi/v2", kubectl.version()),
        );
    }
}
