//! `components.schemas`: our kinds and their lists, the meta types they reference, and
//! the foreign kinds a subresource returns (the claim lease is a coordination.k8s.io/v1
//! `Lease`, a Pool's scale an autoscaling/v1 `Scale`).
//!
//! The meta schemas come from k8s-openapi's `schemars` feature rather than being written
//! by hand, so descriptions match kube-apiserver's and the definition names are Go's
//! (`io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta`). schemars' OpenAPI 3.0 settings put
//! them under `#/components/schemas/` and wrap a described `$ref` in `allOf`, as
//! kube-apiserver's v3 documents do.

use std::collections::{BTreeMap, BTreeSet};

use battery_types::ResourceInfo;
use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIResourceList, Condition, DeleteOptions, ListMeta, MicroTime, ObjectMeta, Patch, Status,
    Time, WatchEvent,
};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use k8s_openapi::schemars::SchemaGenerator;
use k8s_openapi::schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use super::convert;
use super::error::OpenApiError;
use super::names::{COMPONENTS, GVK_EXTENSION, Gvk, is_connect, name_of, rest_friendly_name};

const API_VERSION_DESCRIPTION: &str = "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const KIND_DESCRIPTION: &str = "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";
const METADATA_DESCRIPTION: &str = "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
const LIST_METADATA_DESCRIPTION: &str = "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";

/// The schemas of a document and the definition name of each kind it serves.
pub(super) struct Components {
    pub(super) schemas: Map<String, Value>,
    names: BTreeMap<Gvk, String>,
    /// The schemas of this group-version's own kinds and lists; the rest are Kubernetes'
    /// (meta types, `Lease`, `Scale`).
    pub(super) own: BTreeSet<String>,
}

impl Components {
    /// The definition name of the schema for `gvk`, if the document has one.
    pub(super) fn name_of(&self, gvk: &Gvk) -> Option<&str> {
        self.names.get(gvk).map(String::as_str)
    }
}

/// A `$ref` to a definition, wrapped in `allOf` so that it may carry a description
/// (OpenAPI 3.0 ignores a `$ref`'s siblings).
pub(super) fn described_ref(name: &str, description: &str) -> Value {
    json!({ "allOf": [{ "$ref": format!("{COMPONENTS}{name}") }], "description": description })
}

/// Builds the schemas for `kinds` of `group`/`version`, for `subresource_kinds` (kinds of
/// the same group-version that only a subresource reads or writes, each with its
/// structural schema) and for every foreign kind that a subresource returns.
pub(super) fn build(
    group: &str,
    version: &str,
    kinds: &[(&ResourceInfo, Value)],
    subresource_kinds: &[(&str, Value)],
) -> Result<Components, OpenApiError> {
    let mut generator = SchemaSettings::openapi3()
        .with(|settings| settings.meta_schema = None)
        .into_generator();
    // The meta types our operations and kinds refer to; the rest (OwnerReference,
    // ManagedFieldsEntry, FieldsV1, StatusDetails, StatusCause, Preconditions) follow
    // from their references.
    generator.subschema_for::<ObjectMeta>();
    generator.subschema_for::<ListMeta>();
    generator.subschema_for::<Time>();
    generator.subschema_for::<MicroTime>();
    generator.subschema_for::<Condition>();
    generator.subschema_for::<Status>();
    generator.subschema_for::<DeleteOptions>();
    generator.subschema_for::<WatchEvent<RawExtension>>();
    generator.subschema_for::<APIResourceList>();
    generator.subschema_for::<Patch>();

    let mut names = BTreeMap::new();
    let mut extensions: Vec<(String, Gvk)> = vec![
        (name_of::<Status>(), Gvk::new("", "v1", "Status")),
        // `metav1.AddToGroupVersion` registers these two in every served group-version, so
        // Go's definitions list each group-version (`apimachinery:pkg/apis/meta/v1/register.go`).
        (
            name_of::<DeleteOptions>(),
            Gvk::new(group, version, "DeleteOptions"),
        ),
        (
            name_of::<WatchEvent<RawExtension>>(),
            Gvk::new(group, version, "WatchEvent"),
        ),
    ];
    for (info, _) in kinds {
        if info.group != group || info.version != version {
            return Err(OpenApiError::ForeignResource {
                resource: info.plural.to_owned(),
                group_version: format!("{}/{}", info.group, info.version),
                expected: format!("{group}/{version}"),
            });
        }
        names.insert(
            Gvk::new(group, version, info.kind),
            rest_friendly_name(group, version, info.kind),
        );
    }
    for (kind, _) in subresource_kinds {
        names.insert(
            Gvk::new(group, version, kind),
            rest_friendly_name(group, version, kind),
        );
    }
    for (info, _) in kinds {
        for sub in info.subresources.iter().filter(|sub| !is_connect(sub)) {
            let gvk = Gvk::new(sub.group, sub.version, sub.kind);
            if names.contains_key(&gvk) {
                continue;
            }
            let name = foreign_kind(&mut generator, &gvk).ok_or_else(|| {
                OpenApiError::UnknownSubresourceKind {
                    subresource: format!("{}/{}", info.plural, sub.name),
                    kind: format!("{}/{} {}", sub.group, sub.version, sub.kind),
                }
            })?;
            extensions.push((name.clone(), gvk.clone()));
            names.insert(gvk, name);
        }
    }

    let mut schemas = generator.take_definitions(true);
    for schema in schemas.values_mut() {
        metadata_not_required(schema);
    }
    for (name, gvk) in extensions {
        if let Some(Value::Object(schema)) = schemas.get_mut(&name) {
            schema.insert(GVK_EXTENSION.to_owned(), json!([gvk.to_json()]));
        }
    }
    let mut own = BTreeSet::new();
    for (info, schema) in kinds {
        let name = rest_friendly_name(group, version, info.kind);
        let list_name = rest_friendly_name(group, version, &format!("{}List", info.kind));
        let gvk = Gvk::new(group, version, info.kind);
        schemas.insert(name.clone(), kind_schema(&gvk, schema)?);
        schemas.insert(list_name.clone(), list_schema(info, &name));
        own.extend([name, list_name]);
    }
    for (kind, schema) in subresource_kinds {
        let gvk = Gvk::new(group, version, kind);
        let name = rest_friendly_name(group, version, kind);
        schemas.insert(name.clone(), kind_schema(&gvk, schema)?);
        own.insert(name);
    }
    Ok(Components {
        schemas,
        names,
        own,
    })
}

/// Adds the schema of a foreign kind that a subresource may return, and names it.
fn foreign_kind(generator: &mut SchemaGenerator, gvk: &Gvk) -> Option<String> {
    match (gvk.group.as_str(), gvk.version.as_str(), gvk.kind.as_str()) {
        ("coordination.k8s.io", "v1", "Lease") => {
            generator.subschema_for::<Lease>();
            Some(name_of::<Lease>())
        }
        ("autoscaling", "v1", "Scale") => {
            generator.subschema_for::<Scale>();
            Some(name_of::<Scale>())
        }
        _ => None,
    }
}

/// k8s-openapi lists `metadata` as required because its Rust field is not an `Option`;
/// Go's types (`json:"metadata,omitempty"`) and kube-apiserver's definitions do not, and
/// `kubectl explain` would show the field as `-required-`.
fn metadata_not_required(schema: &mut Value) {
    let Some(Value::Array(required)) = schema.get_mut("required") else {
        return;
    };
    required.retain(|field| field != "metadata");
    if required.is_empty()
        && let Value::Object(object) = schema
    {
        object.remove("required");
    }
}

/// A kind's structural schema made into a definition, as kube-apiserver publishes a CRD's
/// (`apiextensions-apiserver:pkg/controller/openapi/builder/builder.go`): OpenAPI 3.0
/// form, `apiVersion` and `kind` described, `metadata` a reference to `ObjectMeta`, and
/// the kind's `x-kubernetes-group-version-kind` list that `kubectl explain` matches.
fn kind_schema(gvk: &Gvk, schema: &Value) -> Result<Value, OpenApiError> {
    let not_an_object = || OpenApiError::UnsupportedKindSchema {
        kind: gvk.kind.clone(),
        pointer: "#".to_owned(),
        problem: "a kind's schema must be an object".to_owned(),
    };
    if !schema.is_object() {
        return Err(not_an_object());
    }
    let mut schema = schema.clone();
    convert::to_openapi_3_0(&gvk.kind, "#", &mut schema)?;
    let Value::Object(object) = &mut schema else {
        return Err(not_an_object());
    };
    object
        .entry("type")
        .or_insert_with(|| Value::String("object".to_owned()));
    let properties = object
        .entry("properties")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(properties) = properties else {
        return Err(OpenApiError::UnsupportedKindSchema {
            kind: gvk.kind.clone(),
            pointer: "#/properties".to_owned(),
            problem: "`properties` must be an object".to_owned(),
        });
    };
    properties
        .entry("apiVersion")
        .or_insert_with(|| json!({ "description": API_VERSION_DESCRIPTION, "type": "string" }));
    properties
        .entry("kind")
        .or_insert_with(|| json!({ "description": KIND_DESCRIPTION, "type": "string" }));
    properties.insert(
        "metadata".to_owned(),
        described_ref(&name_of::<ObjectMeta>(), METADATA_DESCRIPTION),
    );
    object.insert(GVK_EXTENSION.to_owned(), json!([gvk.to_json()]));
    Ok(schema)
}

/// `<Kind>List`, as kube-apiserver publishes a CRD's list kind.
fn list_schema(info: &ResourceInfo, item_name: &str) -> Value {
    let list_kind = format!("{}List", info.kind);
    json!({
        "description": format!("{list_kind} is a list of {}", info.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": { "description": API_VERSION_DESCRIPTION, "type": "string" },
            "items": {
                "description": format!(
                    "List of {}. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md",
                    info.plural,
                ),
                "type": "array",
                "items": { "$ref": format!("{COMPONENTS}{item_name}") },
            },
            "kind": { "description": KIND_DESCRIPTION, "type": "string" },
            "metadata": described_ref(&name_of::<ListMeta>(), LIST_METADATA_DESCRIPTION),
        },
        GVK_EXTENSION: [Gvk::new(info.group, info.version, &list_kind).to_json()],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn definition_names_follow_kube_openapi() {
        assert_eq!(
            rest_friendly_name("battery.liquidmetal-x.dev", "v1alpha1", "Pool"),
            "dev.liquidmetal-x.battery.v1alpha1.Pool"
        );
        assert_eq!(
            name_of::<ObjectMeta>(),
            "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        );
        assert_eq!(name_of::<Lease>(), "io.k8s.api.coordination.v1.Lease");
        assert_eq!(name_of::<Scale>(), "io.k8s.api.autoscaling.v1.Scale");
    }

    #[test]
    fn metadata_is_optional_in_foreign_kinds() {
        let mut schema = json!({ "required": ["metadata"] });
        metadata_not_required(&mut schema);
        assert_eq!(schema, json!({}));
        let mut schema = json!({ "required": ["metadata", "spec"] });
        metadata_not_required(&mut schema);
        assert_eq!(schema, json!({ "required": ["spec"] }));
    }
}
