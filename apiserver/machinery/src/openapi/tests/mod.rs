//! Checks the documents the way their readers use them: kube-openapi's 3.0 dialect,
//! `kubectl explain`'s path and GVK lookup, and kubectl's `fieldValidation` and patch-type
//! probes; `serving` checks the handlers.

use std::collections::{BTreeMap, BTreeSet};

use battery_types::{ResourceInfo, Scope, SubresourceInfo, Verb};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::*;

mod serving;

const GROUP: &str = "example.liquidmetal-x.dev";
const VERSION: &str = "v1beta1";

/// A namespaced kind with the shapes kube's CRD schemas take: optional fields (nullable),
/// an enum, a map, a list of k8s-openapi `Condition`s and a nested optional struct.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "example.liquidmetal-x.dev",
    version = "v1beta1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus"
)]
struct WidgetSpec {
    /// How many widgets.
    replicas: u32,
    /// A note.
    note: Option<String>,
    /// How fast.
    mode: Mode,
    /// Free-form labels.
    selector: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, JsonSchema)]
enum Mode {
    Fast,
    Slow,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
struct WidgetStatus {
    /// Conditions.
    conditions: Vec<Condition>,
    /// Where it runs.
    host: Option<Placement>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, JsonSchema)]
struct Placement {
    /// Node name.
    node_name: String,
}

/// A cluster-scoped kind.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "example.liquidmetal-x.dev",
    version = "v1beta1",
    kind = "Gadget"
)]
struct GadgetSpec {
    /// Where.
    address: String,
}

const WIDGETS: ResourceInfo = ResourceInfo {
    group: GROUP,
    version: VERSION,
    kind: "Widget",
    plural: "widgets",
    singular: "widget",
    short_names: &["wdg"],
    categories: &["example"],
    scope: Scope::Namespaced,
    verbs: &[
        Verb::Get,
        Verb::List,
        Verb::Watch,
        Verb::Create,
        Verb::Update,
        Verb::Patch,
        Verb::Delete,
        Verb::DeleteCollection,
    ],
    subresources: &[
        SubresourceInfo {
            name: "status",
            group: GROUP,
            version: VERSION,
            kind: "Widget",
            verbs: &[Verb::Get],
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
        EXEC,
    ],
};

/// A connect subresource, named like `pods/exec`'s `PodExecOptions`.
const EXEC: SubresourceInfo = SubresourceInfo {
    name: "exec",
    group: GROUP,
    version: VERSION,
    kind: "WidgetExecOptions",
    verbs: &[Verb::Create, Verb::Get],
    strategic_merge_patch: false,
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
    verbs: &[
        Verb::Get,
        Verb::List,
        Verb::Watch,
        Verb::Create,
        Verb::Update,
        Verb::Patch,
        Verb::Delete,
    ],
    subresources: &[SubresourceInfo {
        name: "status",
        group: GROUP,
        version: VERSION,
        kind: "Gadget",
        verbs: &[Verb::Get, Verb::Update, Verb::Patch],
        strategic_merge_patch: false,
    }],
};

fn schema_of(
    crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Value {
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|validation| validation.open_api_v3_schema.as_ref())
        .expect("kube writes a schema");
    serde_json::to_value(schema).unwrap()
}

fn kinds() -> Vec<(&'static ResourceInfo, Value)> {
    vec![
        (&WIDGETS, schema_of(Widget::crd())),
        (&GADGETS, schema_of(Gadget::crd())),
    ]
}

fn v3() -> Value {
    v3_document(GROUP, VERSION, &kinds()).unwrap()
}

fn v2() -> Value {
    v2_document(GROUP, VERSION, &kinds()).unwrap()
}

/// Every `(pointer, value)` in `value`, depth first.
fn walk<'a>(pointer: String, value: &'a Value, out: &mut Vec<(String, &'a Value)>) {
    out.push((pointer.clone(), value));
    match value {
        Value::Object(object) => {
            for (key, child) in object {
                walk(format!("{pointer}/{key}"), child, out);
            }
        }
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                walk(format!("{pointer}/{index}"), child, out);
            }
        }
        _ => {}
    }
}

fn all_nodes(document: &Value) -> Vec<(String, &Value)> {
    let mut nodes = Vec::new();
    walk(String::new(), document, &mut nodes);
    nodes
}

/// All `$ref` targets in `document`.
fn references(document: &Value) -> Vec<(String, String)> {
    all_nodes(document)
        .into_iter()
        .filter_map(|(pointer, node)| {
            let target = node.as_object()?.get("$ref")?.as_str()?;
            Some((pointer, target.to_owned()))
        })
        .collect()
}

/// The operations of `document` as `(path, method, operation)`.
fn operations(document: &Value) -> Vec<(String, String, &Value)> {
    let mut out = Vec::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            if method != "parameters" {
                out.push((path.clone(), method.clone(), operation));
            }
        }
    }
    out
}

fn gvk(group: &str, version: &str, kind: &str) -> Value {
    json!({ "group": group, "version": version, "kind": kind })
}

fn names(parameters: &Value) -> BTreeSet<String> {
    parameters
        .as_array()
        .map(|parameters| {
            parameters
                .iter()
                .map(|p| p["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The document is OpenAPI 3.0: the openapiv3 crate (which models 3.0 only: a 3.1 `type`
/// array or a misplaced field fails) reads it, and no schema uses a 3.1-only construct.
fn assert_openapi_3_0(document: &Value) {
    assert_eq!(document["openapi"], "3.0.0");
    let parsed: openapiv3::OpenAPI = serde_json::from_value(document.clone()).unwrap();
    assert!(parsed.components.is_some());
    for (pointer, node) in all_nodes(document) {
        let Some(object) = node.as_object() else {
            continue;
        };
        // Under `properties` the keys are field names, not keywords.
        if pointer.ends_with("/properties") {
            continue;
        }
        for keyword in [
            "$defs",
            "const",
            "examples",
            "prefixItems",
            "$schema",
            "unevaluatedProperties",
        ] {
            assert!(!object.contains_key(keyword), "{keyword} at {pointer}");
        }
        if let Some(ty) = object.get("type") {
            assert!(ty.is_string() && ty != "null", "type {ty} at {pointer}");
        }
        for bound in ["exclusiveMinimum", "exclusiveMaximum"] {
            assert!(
                object.get(bound).is_none_or(Value::is_boolean),
                "{bound} at {pointer}"
            );
        }
    }
}

/// Every `$ref` of `document` names a schema it holds under `prefix`.
fn assert_references_resolve(document: &Value, prefix: &str, schemas: &Value) {
    let schemas = schemas.as_object().unwrap();
    let refs = references(document);
    assert!(!refs.is_empty());
    for (pointer, target) in refs {
        let name = target
            .strip_prefix(prefix)
            .unwrap_or_else(|| panic!("{pointer}: {target} is not under {prefix}"));
        assert!(schemas.contains_key(name), "{pointer}: {target} is missing");
    }
}

/// What `kubectl explain` does (`kubectl:pkg/explain/v2`): find the resource's paths, take
/// the GVK of an operation there, then the one schema listing that GVK.
fn assert_explainable(document: &Value, info: &ResourceInfo) {
    let schemas = document["components"]["schemas"].as_object().unwrap();
    let base = format!("/apis/{}/{}", info.group, info.version);
    let collection = match info.scope {
        Scope::Namespaced => format!("{base}/namespaces/{{namespace}}/{}", info.plural),
        Scope::Cluster => format!("{base}/{}", info.plural),
    };
    let expected = gvk(info.group, info.version, info.kind);
    for path in [collection.clone(), format!("{collection}/{{name}}")] {
        let operation = &document["paths"][&path]["get"];
        assert_eq!(
            operation["x-kubernetes-group-version-kind"], expected,
            "{path}"
        );
    }
    let matching: Vec<&String> = schemas
        .iter()
        .filter(|(_, schema)| {
            schema["x-kubernetes-group-version-kind"]
                .as_array()
                .is_some_and(|list| list.contains(&expected))
        })
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        matching,
        [&names::rest_friendly_name(
            info.group,
            info.version,
            info.kind
        )]
    );
    let schema = &schemas[matching[0]];
    assert_eq!(
        schema["properties"]["metadata"]["allOf"][0]["$ref"],
        "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    );
    assert_eq!(schema["properties"]["apiVersion"]["type"], "string");
    assert_eq!(schema["properties"]["kind"]["type"], "string");
    if info.scope == Scope::Cluster {
        let namespaced = format!("/namespaces/{{namespace}}/{}", info.plural);
        assert!(
            document["paths"]
                .as_object()
                .unwrap()
                .keys()
                .all(|path| !path.contains(&namespaced))
        );
    }
}

/// kubectl's probes of the PATCH operations: `fieldValidation` listed (so it validates on
/// the server) and no strategic merge patch (so `apply` sends a merge patch) except on a
/// `scale` subresource, which serves one. Returns how many PATCH operations there are.
fn assert_patches(document: &Value, dialect: &str) -> usize {
    let patches: Vec<_> = operations(document)
        .into_iter()
        .filter(|(_, method, _)| method == "patch")
        .collect();
    for (path, _, operation) in &patches {
        assert!(
            names(&operation["parameters"]).contains("fieldValidation"),
            "{dialect} {path}"
        );
        let types: Vec<String> = if dialect == "v3" {
            operation["requestBody"]["content"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect()
        } else {
            serde_json::from_value(operation["consumes"].clone()).unwrap()
        };
        let expected: &[&str] = if path.ends_with("/scale") {
            &[
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
            ]
        } else {
            &[
                "application/apply-patch+yaml",
                "application/json-patch+json",
                "application/merge-patch+json",
            ]
        };
        assert_eq!(types, expected, "{dialect} {path}");
    }
    patches.len()
}

/// Every operation has an action matching its method and a GVK, unique IDs, and the
/// options of its verb.
fn assert_operations(document: &Value) {
    let mut ids = BTreeSet::new();
    for (path, method, operation) in operations(document) {
        let id = operation["operationId"].as_str().unwrap().to_owned();
        assert!(ids.insert(id), "{path} {method}: duplicate operationId");
        if path.ends_with('/') {
            // The group-version's APIResourceList, which Go gives no action either.
            continue;
        }
        let action = operation["x-kubernetes-action"].as_str().unwrap();
        let allowed: &[&str] = match method.as_str() {
            "get" => &["get", "list", "connect"],
            "post" => &["post", "connect"],
            "put" => &["put"],
            "patch" => &["patch"],
            "delete" => &["delete", "deletecollection"],
            other => panic!("{path}: unexpected method {other}"),
        };
        assert!(allowed.contains(&action), "{path} {method}: {action}");
        assert!(
            operation["x-kubernetes-group-version-kind"].is_object(),
            "{path} {method}"
        );
        let parameters = names(&operation["parameters"]);
        if matches!(action, "post" | "put" | "patch") {
            for name in ["dryRun", "fieldManager", "fieldValidation"] {
                assert!(parameters.contains(name), "{path} {method}: {name}");
            }
        }
        if action == "list" {
            for name in [
                "labelSelector",
                "fieldSelector",
                "limit",
                "continue",
                "resourceVersion",
                "watch",
                "timeoutSeconds",
                "allowWatchBookmarks",
                "sendInitialEvents",
            ] {
                assert!(parameters.contains(name), "{path}: {name}");
            }
        }
    }
}

/// The v2 document is Swagger 2.0 with resolvable `#/definitions/` references and none of
/// the 3.0 forms.
fn assert_swagger_2_0(document: &Value) {
    assert_eq!(document["swagger"], "2.0");
    assert_references_resolve(document, "#/definitions/", &document["definitions"]);
    for (pointer, node) in all_nodes(document) {
        let Some(object) = node.as_object() else {
            continue;
        };
        if pointer.ends_with("/properties") {
            continue;
        }
        for keyword in [
            "nullable",
            "allOf",
            "anyOf",
            "oneOf",
            "requestBody",
            "content",
        ] {
            assert!(!object.contains_key(keyword), "{keyword} at {pointer}");
        }
    }
}

#[test]
fn v3_is_openapi_3_0() {
    assert_openapi_3_0(&v3());
}

#[test]
fn every_v3_reference_resolves_inside_the_document() {
    let document = v3();
    let schemas = &document["components"]["schemas"];
    assert_references_resolve(&document, "#/components/schemas/", schemas);
    let schemas = schemas.as_object().unwrap();
    for name in [
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
        "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta",
        "io.k8s.apimachinery.pkg.apis.meta.v1.Time",
        "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime",
        "io.k8s.apimachinery.pkg.apis.meta.v1.OwnerReference",
        "io.k8s.apimachinery.pkg.apis.meta.v1.ManagedFieldsEntry",
        "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1",
        "io.k8s.apimachinery.pkg.apis.meta.v1.Condition",
        "io.k8s.apimachinery.pkg.apis.meta.v1.Status",
        "io.k8s.apimachinery.pkg.apis.meta.v1.StatusDetails",
        "io.k8s.apimachinery.pkg.apis.meta.v1.StatusCause",
        "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
        "io.k8s.apimachinery.pkg.apis.meta.v1.Preconditions",
        "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent",
        "io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList",
        "io.k8s.apimachinery.pkg.apis.meta.v1.APIResource",
        "io.k8s.apimachinery.pkg.apis.meta.v1.Patch",
        "io.k8s.apimachinery.pkg.runtime.RawExtension",
        "io.k8s.api.coordination.v1.Lease",
        "io.k8s.api.coordination.v1.LeaseSpec",
        "dev.liquidmetal-x.example.v1beta1.Widget",
        "dev.liquidmetal-x.example.v1beta1.WidgetList",
        "dev.liquidmetal-x.example.v1beta1.Gadget",
        "dev.liquidmetal-x.example.v1beta1.GadgetList",
    ] {
        assert!(schemas.contains_key(name), "{name} is missing");
    }
}

#[test]
fn explain_finds_each_kind() {
    let document = v3();
    assert_explainable(&document, &WIDGETS);
    assert_explainable(&document, &GADGETS);
    let schemas = &document["components"]["schemas"];
    // Doc comments reach `kubectl explain widget.spec.replicas`.
    let widget = &schemas["dev.liquidmetal-x.example.v1beta1.Widget"];
    assert_eq!(
        widget["properties"]["spec"]["properties"]["replicas"]["description"],
        "How many widgets."
    );
    assert_eq!(
        widget["properties"]["spec"]["properties"]["note"]["nullable"],
        true
    );
}

#[test]
fn patch_operations_offer_field_validation_and_no_strategic_merge() {
    // widgets, widgets/lease, gadgets, gadgets/status.
    assert_eq!(assert_patches(&v3(), "v3"), 4);
    assert_eq!(assert_patches(&v2(), "v2"), 4);
}

#[test]
fn operations_carry_actions_gvks_and_options() {
    let document = v3();
    assert_operations(&document);

    let base = format!("/apis/{GROUP}/{VERSION}");
    let item = &document["paths"][format!("{base}/namespaces/{{namespace}}/widgets/{{name}}")];
    assert_eq!(
        names(&item["parameters"]),
        BTreeSet::from(["name".into(), "namespace".into(), "pretty".into()])
    );
    assert_eq!(
        item["get"]["operationId"],
        "readExampleLiquidmetalXDevV1beta1NamespacedWidget"
    );
    assert_eq!(
        item["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/dev.liquidmetal-x.example.v1beta1.Widget"
    );
    let collection = &document["paths"][format!("{base}/namespaces/{{namespace}}/widgets")];
    assert_eq!(
        collection["delete"]["operationId"],
        "deleteExampleLiquidmetalXDevV1beta1CollectionNamespacedWidget"
    );
    assert_eq!(
        collection["post"]["responses"]["201"]["description"],
        "Created"
    );
    assert_eq!(
        document["paths"][format!("{base}/widgets")]["get"]["operationId"],
        "listExampleLiquidmetalXDevV1beta1WidgetForAllNamespaces"
    );
    assert_eq!(
        document["paths"][format!("{base}/")]["get"]["responses"]["200"]["content"]["application/json"]
            ["schema"]["$ref"],
        "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList"
    );
    // Gadgets lack deletecollection, so their collection has no DELETE.
    assert!(document["paths"][format!("{base}/gadgets")]["delete"].is_null());
}

#[test]
fn subresources_document_their_own_kind() {
    let document = v3();
    let schemas = &document["components"]["schemas"];
    let named = format!("/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/widgets/{{name}}");

    let status = &document["paths"][format!("{named}/status")];
    assert_eq!(
        status["get"]["x-kubernetes-group-version-kind"],
        gvk(GROUP, VERSION, "Widget")
    );
    assert_eq!(
        status["get"]["operationId"],
        "readExampleLiquidmetalXDevV1beta1NamespacedWidgetStatus"
    );
    // Only the verbs the subresource has.
    assert!(status["put"].is_null() && status["patch"].is_null());

    let lease = &document["paths"][format!("{named}/lease")];
    let lease_gvk = gvk("coordination.k8s.io", "v1", "Lease");
    for method in ["get", "put", "patch"] {
        assert_eq!(
            lease[method]["x-kubernetes-group-version-kind"], lease_gvk,
            "{method}"
        );
    }
    assert_eq!(
        lease["put"]["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/io.k8s.api.coordination.v1.Lease"
    );
    let lease_schema = &schemas["io.k8s.api.coordination.v1.Lease"];
    assert_eq!(
        lease_schema["x-kubernetes-group-version-kind"],
        json!([lease_gvk])
    );
    // k8s-openapi's Rust-only `required: [metadata]` is not published.
    assert!(lease_schema.get("required").is_none());

    let exec = &document["paths"][format!("{named}/exec")];
    for method in ["get", "post"] {
        assert_eq!(exec[method]["x-kubernetes-action"], "connect", "{method}");
        assert_eq!(
            exec[method]["responses"]["200"]["content"]["*/*"]["schema"]["type"],
            "string"
        );
    }
    assert_eq!(
        exec["post"]["operationId"],
        "connectExampleLiquidmetalXDevV1beta1PostNamespacedWidgetExec"
    );
}

#[test]
fn meta_schemas_carry_go_group_version_kinds() {
    let document = v3();
    let schemas = &document["components"]["schemas"];
    assert_eq!(
        schemas["io.k8s.apimachinery.pkg.apis.meta.v1.Status"]["x-kubernetes-group-version-kind"],
        json!([gvk("", "v1", "Status")])
    );
    assert_eq!(
        schemas["io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions"]["x-kubernetes-group-version-kind"],
        json!([gvk(GROUP, VERSION, "DeleteOptions")])
    );
    assert_eq!(
        schemas["dev.liquidmetal-x.example.v1beta1.WidgetList"]["x-kubernetes-group-version-kind"],
        json!([gvk(GROUP, VERSION, "WidgetList")])
    );
    // schemars' 3.0 form of a described reference, as kube-apiserver writes it.
    assert_eq!(
        schemas["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]["properties"]["creationTimestamp"]
            ["allOf"][0]["$ref"],
        "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.Time"
    );
}

#[test]
fn v2_is_swagger_2_0() {
    let document = v2();
    assert_swagger_2_0(&document);
    let definitions = &document["definitions"];
    let named = format!("/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/widgets/{{name}}");
    let put = &document["paths"][&named]["put"];
    assert_eq!(put["parameters"][0]["in"], "body");
    assert_eq!(
        put["parameters"][0]["schema"]["$ref"],
        "#/definitions/dev.liquidmetal-x.example.v1beta1.Widget"
    );
    assert_eq!(
        put["responses"]["200"]["schema"]["$ref"],
        "#/definitions/dev.liquidmetal-x.example.v1beta1.Widget"
    );
    assert_eq!(
        put["x-kubernetes-group-version-kind"],
        gvk(GROUP, VERSION, "Widget")
    );
    assert_eq!(
        definitions["dev.liquidmetal-x.example.v1beta1.Widget"]["properties"]["metadata"]["$ref"],
        "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    );
}

#[test]
fn inputs_that_cannot_be_published_are_refused() {
    const ORPHAN: ResourceInfo = ResourceInfo {
        subresources: &[SubresourceInfo {
            name: "eviction",
            group: "policy",
            version: "v1",
            kind: "Eviction",
            verbs: &[Verb::Create],
            strategic_merge_patch: false,
        }],
        ..GADGETS
    };
    let error = v3_document(GROUP, VERSION, &[(&ORPHAN, json!({ "type": "object" }))]).unwrap_err();
    assert_eq!(
        error.to_string(),
        "subresource gadgets/eviction returns policy/v1 Eviction, for which there is no schema"
    );

    let error = v3_document("other.dev", "v1", &kinds()).unwrap_err();
    assert!(
        matches!(error, OpenApiError::ForeignResource { .. }),
        "{error}"
    );

    let referencing =
        json!({ "type": "object", "properties": { "spec": { "$ref": "#/$defs/Spec" } } });
    let error = v3_document(GROUP, VERSION, &[(&GADGETS, referencing)]).unwrap_err();
    assert!(
        matches!(error, OpenApiError::UnsupportedKindSchema { .. }),
        "{error}"
    );
}

/// A `scale` subresource, as `deployments/scale`: its operations carry the autoscaling/v1
/// Scale GVK and schema, and its PATCH takes the strategic merge patches it serves.
#[test]
fn a_scale_subresource_publishes_the_scale_kind() {
    const SCALED: ResourceInfo = ResourceInfo {
        subresources: &[SubresourceInfo {
            name: "scale",
            group: "autoscaling",
            version: "v1",
            kind: "Scale",
            verbs: &[Verb::Get, Verb::Update, Verb::Patch],
            strategic_merge_patch: true,
        }],
        ..GADGETS
    };
    let kinds = [(&SCALED, schema_of(Gadget::crd()))];
    let path = format!("/apis/{GROUP}/{VERSION}/gadgets/{{name}}/scale");
    let scale_gvk = gvk("autoscaling", "v1", "Scale");
    let strategic = [
        "application/json-patch+json",
        "application/merge-patch+json",
        "application/strategic-merge-patch+json",
    ];

    let v3 = v3_document(GROUP, VERSION, &kinds).unwrap();
    let item = &v3["paths"][&path];
    for method in ["get", "put", "patch"] {
        assert_eq!(
            item[method]["x-kubernetes-group-version-kind"], scale_gvk,
            "v3 {method}"
        );
    }
    assert_eq!(
        item["get"]["operationId"],
        "readExampleLiquidmetalXDevV1beta1GadgetScale"
    );
    assert_eq!(
        item["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/io.k8s.api.autoscaling.v1.Scale"
    );
    let content: Vec<&str> = item["patch"]["requestBody"]["content"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(content, strategic);
    let schemas = &v3["components"]["schemas"];
    assert_eq!(
        schemas["io.k8s.api.autoscaling.v1.Scale"]["x-kubernetes-group-version-kind"],
        json!([scale_gvk])
    );
    for part in ["ScaleSpec", "ScaleStatus"] {
        assert!(
            schemas
                .get(format!("io.k8s.api.autoscaling.v1.{part}"))
                .is_some(),
            "no {part}"
        );
    }
    // The parent's own PATCH still offers no strategic merge patch.
    let parent = &v3["paths"][format!("/apis/{GROUP}/{VERSION}/gadgets/{{name}}")]["patch"];
    assert!(
        !parent["requestBody"]["content"]
            .as_object()
            .unwrap()
            .contains_key("application/strategic-merge-patch+json")
    );

    let v2 = v2_document(GROUP, VERSION, &kinds).unwrap();
    let patch = &v2["paths"][&path]["patch"];
    assert_eq!(patch["x-kubernetes-group-version-kind"], scale_gvk);
    assert_eq!(patch["consumes"], json!(strategic));
    assert_eq!(
        v2["definitions"]["io.k8s.api.autoscaling.v1.Scale"]["x-kubernetes-group-version-kind"],
        json!([scale_gvk])
    );
}

/// The production inputs: battery's resource table and the schemas kube derives for its
/// kinds pass every check above.
#[test]
fn battery_resources_publish() {
    use battery_types::{
        GROUP, HasResourceInfo, Host, HostCertificateRequest, MicroVMClaim, MicroVMProcess, Pool,
        RESOURCES,
    };

    let kinds = [
        (&Pool::INFO, schema_of(Pool::crd())),
        (&MicroVMClaim::INFO, schema_of(MicroVMClaim::crd())),
        (&MicroVMProcess::INFO, schema_of(MicroVMProcess::crd())),
        (&Host::INFO, schema_of(Host::crd())),
    ];
    assert_eq!(kinds.len(), RESOURCES.len());
    let subresource_kinds = [(
        "HostCertificateRequest",
        schema_of(HostCertificateRequest::crd()),
    )];
    // Without the schema of the kind only `hosts/certificate` speaks, nothing publishes.
    assert!(matches!(
        v3_document(GROUP, battery_types::VERSION, &kinds),
        Err(OpenApiError::UnknownSubresourceKind { .. })
    ));
    let openapi =
        OpenApi::with_subresource_kinds(GROUP, battery_types::VERSION, &kinds, &subresource_kinds)
            .unwrap();
    let parse = |document: &Document| -> Value { serde_json::from_slice(document.body()).unwrap() };
    let document = parse(openapi.v3_document());
    assert_openapi_3_0(&document);
    assert_references_resolve(
        &document,
        "#/components/schemas/",
        &document["components"]["schemas"],
    );
    assert_operations(&document);
    assert!(assert_patches(&document, "v3") > 0);
    for info in RESOURCES {
        assert_explainable(&document, info);
    }
    let exec = &document["paths"][format!(
        "/apis/{GROUP}/{}/namespaces/{{namespace}}/microvmclaims/{{name}}/exec",
        battery_types::VERSION
    )];
    assert_eq!(exec["post"]["x-kubernetes-action"], "connect");
    let attach = &document["paths"][format!(
        "/apis/{GROUP}/{}/namespaces/{{namespace}}/microvmprocesses/{{name}}/attach",
        battery_types::VERSION
    )];
    assert_eq!(attach["post"]["x-kubernetes-action"], "connect");
    let certificate = &document["paths"][format!(
        "/apis/{GROUP}/{}/hosts/{{name}}/certificate",
        battery_types::VERSION
    )];
    assert_eq!(
        certificate["post"]["x-kubernetes-group-version-kind"]["kind"],
        "HostCertificateRequest"
    );

    let document = parse(openapi.v2_document());
    assert_swagger_2_0(&document);
    assert!(assert_patches(&document, "v2") > 0);
}
