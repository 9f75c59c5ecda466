//! Schema dialects: a kind's structural schema (JSON Schema as kube and schemars write it,
//! which may use 2020-12 forms) down to OpenAPI 3.0, and OpenAPI 3.0 schemas down to
//! Swagger 2.0 for `/openapi/v2`.

use serde_json::{Map, Value};

use super::error::OpenApiError;
use super::names::{COMPONENTS, DEFINITIONS};

/// Keywords that take one subschema.
const SUBSCHEMA: &[&str] = &["items", "not", "additionalProperties"];
/// Keywords that take a list of subschemas.
const SUBSCHEMA_LISTS: &[&str] = &["allOf", "anyOf", "oneOf"];

/// Keywords a kind schema may not use: references (a CRD-style structural schema is
/// self-contained, and the document's own `$ref`s are ours to place) and JSON Schema
/// constructs that OpenAPI 3.0 cannot express.
const NOT_IN_OPENAPI_3_0: &[&str] = &[
    "$ref",
    "$defs",
    "definitions",
    "$anchor",
    "$dynamicRef",
    "$dynamicAnchor",
    "$recursiveRef",
    "prefixItems",
    "patternProperties",
    "propertyNames",
    "contains",
    "if",
    "then",
    "else",
    "dependentSchemas",
    "dependentRequired",
    "unevaluatedProperties",
    "unevaluatedItems",
];

/// Rewrites `schema`, a kind's structural schema, in place into OpenAPI 3.0 form:
/// type arrays become one `type` plus `nullable`, `{"type": "null"}` alternatives become
/// `nullable`, `const` becomes a one-value `enum`, `examples` becomes `example`, numeric
/// `exclusiveMinimum`/`exclusiveMaximum` become the 3.0 boolean form, and boolean
/// subschemas become objects. `kind` and `pointer` name the place for errors.
pub(super) fn to_openapi_3_0(
    kind: &str,
    pointer: &str,
    schema: &mut Value,
) -> Result<(), OpenApiError> {
    let unsupported = |pointer: &str, problem: String| OpenApiError::UnsupportedKindSchema {
        kind: kind.to_owned(),
        pointer: pointer.to_owned(),
        problem,
    };
    let object = match schema {
        Value::Bool(true) => {
            *schema = Value::Object(Map::new());
            return Ok(());
        }
        Value::Bool(false) => {
            *schema = serde_json::json!({ "not": {} });
            return Ok(());
        }
        Value::Object(object) => object,
        _ => {
            return Err(unsupported(
                pointer,
                "a schema must be an object".to_owned(),
            ));
        }
    };
    if let Some(keyword) = NOT_IN_OPENAPI_3_0.iter().find(|k| object.contains_key(**k)) {
        return Err(unsupported(
            pointer,
            format!("`{keyword}` has no OpenAPI 3.0 form in a self-contained schema"),
        ));
    }
    for annotation in ["$schema", "$id", "$comment"] {
        object.remove(annotation);
    }

    if let Some(Value::Array(types)) = object.get("type") {
        let mut named: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
        let nullable = named.len() != types.len();
        match named.len() {
            0 => {
                object.remove("type");
            }
            1 => {
                object.insert("type".to_owned(), named.remove(0));
            }
            _ => {
                return Err(unsupported(
                    pointer,
                    "a union of types is not a structural schema".to_owned(),
                ));
            }
        }
        if nullable {
            object.insert("nullable".to_owned(), Value::Bool(true));
        }
    }
    if object.get("type").is_some_and(|t| t == "null") {
        object.remove("type");
        object.insert("nullable".to_owned(), Value::Bool(true));
    }
    if let Some(value) = object.remove("const") {
        object
            .entry("enum")
            .or_insert_with(|| Value::Array(vec![value]));
    }
    if let Some(Value::Array(mut examples)) = object.remove("examples")
        && !examples.is_empty()
    {
        object
            .entry("example")
            .or_insert_with(|| examples.swap_remove(0));
    }
    for (exclusive, bound) in [
        ("exclusiveMinimum", "minimum"),
        ("exclusiveMaximum", "maximum"),
    ] {
        if let Some(limit) = object.get(exclusive).filter(|v| v.is_number()).cloned() {
            object.insert(bound.to_owned(), limit);
            object.insert(exclusive.to_owned(), Value::Bool(true));
        }
    }

    for keyword in SUBSCHEMA_LISTS {
        let Some(Value::Array(branches)) = object.get_mut(*keyword) else {
            continue;
        };
        let before = branches.len();
        branches.retain(|branch| !is_null_type(branch));
        let dropped_null = branches.len() != before;
        for (index, branch) in branches.iter_mut().enumerate() {
            to_openapi_3_0(kind, &format!("{pointer}/{keyword}/{index}"), branch)?;
        }
        if dropped_null {
            object.insert("nullable".to_owned(), Value::Bool(true));
            hoist_single_branch(object, keyword);
        }
    }
    for keyword in SUBSCHEMA {
        match object.get_mut(*keyword) {
            // 3.0 allows a boolean `additionalProperties`; elsewhere booleans are converted.
            Some(Value::Bool(_)) if *keyword == "additionalProperties" => {}
            Some(Value::Array(_)) if *keyword == "items" => {
                return Err(unsupported(
                    pointer,
                    "tuple `items` has no OpenAPI 3.0 form".to_owned(),
                ));
            }
            Some(subschema) => to_openapi_3_0(kind, &format!("{pointer}/{keyword}"), subschema)?,
            None => {}
        }
    }
    if let Some(Value::Object(properties)) = object.get_mut("properties") {
        for (name, property) in properties.iter_mut() {
            to_openapi_3_0(kind, &format!("{pointer}/properties/{name}"), property)?;
        }
    }
    Ok(())
}

fn is_null_type(schema: &Value) -> bool {
    schema.as_object().is_some_and(|branch| {
        branch.get("type").is_some_and(|t| t == "null")
            && branch.keys().all(|k| k == "type" || k == "description")
    })
}

/// After dropping the null alternative of `anyOf: [X, null]` (schemars' form of
/// `Option<X>`), merges the one remaining alternative into the parent, so `kubectl explain`
/// sees X's fields directly rather than behind a combinator it does not follow.
fn hoist_single_branch(object: &mut Map<String, Value>, keyword: &str) {
    let single = matches!(object.get(keyword), Some(Value::Array(branches)) if branches.len() == 1);
    if !single {
        return;
    }
    let Some(Value::Array(mut branches)) = object.remove(keyword) else {
        return;
    };
    if let Value::Object(branch) = branches.remove(0) {
        for (key, value) in branch {
            object.entry(key).or_insert(value);
        }
    }
}

/// Rewrites an OpenAPI 3.0 schema of this document in place into Swagger 2.0 form, as
/// kube-apiserver serves CRD schemas in `/openapi/v2`
/// (`apiextensions-apiserver:pkg/controller/openapi/v2/conversion.go`
/// `ToStructuralOpenAPIV2`, whose rules work around old kubectl's v2 parser):
/// - `$ref`s point into `#/definitions/`, and the 3.0 wrapper `allOf: [{$ref}]` (used to
///   give a reference a description) becomes a `$ref` with siblings, as Go writes v2;
/// - `allOf`, `anyOf`, `oneOf` and `not` are dropped;
/// - a `nullable` schema loses `type`, `items` and `properties`, and leaves its parent's
///   `required` list;
/// - `x-kubernetes-preserve-unknown-fields` drops `items` and `properties`, and the `object`
///   type; an array left without `items` loses its type;
/// - a map whose values are `nullable` has no `required` list.
pub(super) fn to_swagger_2_0(schema: &mut Value) {
    let Value::Object(object) = schema else {
        return;
    };
    if let Some(Value::String(reference)) = object.get_mut("$ref")
        && let Some(name) = reference.strip_prefix(COMPONENTS)
    {
        *reference = format!("{DEFINITIONS}{name}");
    }
    let wrapped_ref = match object.get("allOf") {
        Some(Value::Array(branches)) if branches.len() == 1 => branches[0]
            .as_object()
            .filter(|branch| branch.len() == 1)
            .and_then(|branch| branch.get("$ref"))
            .cloned(),
        _ => None,
    };
    if let Some(reference) = wrapped_ref {
        object.remove("allOf");
        object.insert("$ref".to_owned(), reference);
        to_swagger_2_0(schema);
        return;
    }
    for keyword in ["allOf", "anyOf", "oneOf", "not"] {
        object.remove(keyword);
    }
    if object.remove("nullable") == Some(Value::Bool(true)) {
        object.remove("type");
        object.remove("items");
        object.remove("properties");
    }
    let preserve_unknown =
        object.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if preserve_unknown {
        object.remove("items");
        object.remove("properties");
    }
    if !object.contains_key("items") && object.get("type").is_some_and(|t| t == "array") {
        object.remove("type");
    }
    if preserve_unknown && object.get("type").is_some_and(|t| t == "object") {
        object.remove("type");
    }
    // Decided on the properties before they are converted, as Go's visitor does.
    let nullable_properties: Vec<String> = match object.get("properties") {
        Some(Value::Object(properties)) => properties
            .iter()
            .filter(|(_, property)| is_nullable(property))
            .map(|(name, _)| name.clone())
            .collect(),
        _ => Vec::new(),
    };
    let nullable_values = object.get("additionalProperties").is_some_and(is_nullable);
    if let Some(Value::Array(required)) = object.get_mut("required") {
        required.retain(|field| {
            field
                .as_str()
                .is_none_or(|field| !nullable_properties.iter().any(|name| name == field))
        });
        if required.is_empty() || nullable_values {
            object.remove("required");
        }
    }
    for keyword in ["items", "additionalProperties"] {
        if let Some(subschema) = object.get_mut(keyword) {
            to_swagger_2_0(subschema);
        }
    }
    if let Some(Value::Object(properties)) = object.get_mut("properties") {
        for property in properties.values_mut() {
            to_swagger_2_0(property);
        }
    }
}

fn is_nullable(schema: &Value) -> bool {
    schema.get("nullable") == Some(&Value::Bool(true))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn converted(mut schema: Value) -> Result<Value, OpenApiError> {
        to_openapi_3_0("Pool", "#", &mut schema).map(|()| schema)
    }

    #[test]
    fn type_arrays_become_nullable() {
        let schema = json!({
            "type": "object",
            "properties": {
                "a": { "type": ["string", "null"] },
                "b": { "type": ["integer"] },
                "c": { "type": "null" },
            },
        });
        assert_eq!(
            converted(schema).unwrap(),
            json!({
                "type": "object",
                "properties": {
                    "a": { "type": "string", "nullable": true },
                    "b": { "type": "integer" },
                    "c": { "nullable": true },
                },
            })
        );
    }

    #[test]
    fn null_alternatives_are_hoisted() {
        let schema = json!({
            "description": "optional host",
            "anyOf": [
                { "type": "object", "properties": { "x": { "const": "y" } } },
                { "type": "null" },
            ],
        });
        assert_eq!(
            converted(schema).unwrap(),
            json!({
                "description": "optional host",
                "nullable": true,
                "type": "object",
                "properties": { "x": { "enum": ["y"] } },
            })
        );
    }

    #[test]
    fn json_schema_2020_keywords_are_rewritten() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "integer",
            "exclusiveMinimum": 0,
            "examples": [3, 4],
            "items": true,
            "additionalProperties": false,
        });
        assert_eq!(
            converted(schema).unwrap(),
            json!({
                "type": "integer",
                "minimum": 0,
                "exclusiveMinimum": true,
                "example": 3,
                "items": {},
                "additionalProperties": false,
            })
        );
    }

    #[test]
    fn references_and_unrepresentable_keywords_are_refused() {
        for schema in [
            json!({ "properties": { "a": { "$ref": "#/$defs/A" } } }),
            json!({ "$defs": { "A": {} } }),
            json!({ "prefixItems": [{}] }),
            json!({ "type": ["string", "integer"] }),
            json!({ "items": [{}, {}] }),
        ] {
            let error = converted(schema.clone()).unwrap_err();
            assert!(
                matches!(error, OpenApiError::UnsupportedKindSchema { .. }),
                "{schema}: {error}"
            );
        }
        let error = converted(json!({ "properties": { "a": { "$ref": "#/x" } } })).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the schema of kind Pool cannot be published as OpenAPI 3.0: at #/properties/a: \
             `$ref` has no OpenAPI 3.0 form in a self-contained schema"
        );
    }

    #[test]
    fn swagger_2_0_follows_go_v2_conversion() {
        let mut schema = json!({
            "type": "object",
            "required": ["maybe", "name"],
            "properties": {
                "metadata": {
                    "allOf": [{ "$ref": "#/components/schemas/io.k8s.X" }],
                    "description": "meta",
                },
                "maybe": { "type": "object", "nullable": true, "properties": { "a": {} } },
                "name": { "type": "string" },
                "free": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": true,
                    "properties": { "a": {} },
                },
                "anything": { "type": "array", "x-kubernetes-preserve-unknown-fields": true, "items": {} },
                "either": { "type": "string", "oneOf": [{ "enum": ["a"] }] },
                "list": { "type": "array", "items": { "$ref": "#/components/schemas/io.k8s.Y" } },
                "sparse": {
                    "type": "object",
                    "required": ["k"],
                    "additionalProperties": { "type": "string", "nullable": true },
                },
            },
        });
        to_swagger_2_0(&mut schema);
        assert_eq!(
            schema,
            json!({
                "type": "object",
                "required": ["name"],
                "properties": {
                    "metadata": { "$ref": "#/definitions/io.k8s.X", "description": "meta" },
                    "maybe": {},
                    "name": { "type": "string" },
                    "free": { "x-kubernetes-preserve-unknown-fields": true },
                    "anything": { "x-kubernetes-preserve-unknown-fields": true },
                    "either": { "type": "string" },
                    "list": { "type": "array", "items": { "$ref": "#/definitions/io.k8s.Y" } },
                    "sparse": { "type": "object", "additionalProperties": {} },
                },
            })
        );
    }
}
