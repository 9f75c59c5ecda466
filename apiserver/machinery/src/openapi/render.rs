//! Renders the path model and schemas as the v3 group-version document (OpenAPI 3.0), the
//! v3 root and the v2 document (Swagger 2.0), in the layout kube-apiserver serves:
//! `name`, `namespace` and `pretty` on the path item, the options on each operation.

use serde_json::{Map, Value, json};

use super::convert;
use super::names::{COMPONENTS, DEFINITIONS};
use super::paths::{Operation, PathItem, Payload};
use super::query::{self, QueryParam};
use super::schemas::Components;

const NAMESPACE_DESCRIPTION: &str = "object name and auth scope, such as for teams and projects";

/// Which document is being written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dialect {
    OpenApi3,
    Swagger2,
}

impl Dialect {
    fn reference(self, definition: &str) -> Value {
        let prefix = match self {
            Self::OpenApi3 => COMPONENTS,
            Self::Swagger2 => DEFINITIONS,
        };
        json!({ "$ref": format!("{prefix}{definition}") })
    }

    /// A parameter: v3 nests the type in `schema`, v2 puts it on the parameter.
    fn parameter(
        self,
        name: &str,
        location: &str,
        description: &str,
        ty: &str,
        required: bool,
    ) -> Value {
        let mut parameter = Map::new();
        parameter.insert("name".to_owned(), json!(name));
        parameter.insert("in".to_owned(), json!(location));
        parameter.insert("description".to_owned(), json!(description));
        if required {
            parameter.insert("required".to_owned(), json!(true));
        }
        // Go marks every parameter `uniqueItems`, a leftover of go-restful that clients
        // ignore; kept so the definitions merge with kube-apiserver's.
        let schema = json!({ "type": ty, "uniqueItems": true });
        match self {
            Self::OpenApi3 => {
                parameter.insert("schema".to_owned(), schema);
            }
            Self::Swagger2 => {
                if let Value::Object(schema) = schema {
                    parameter.extend(schema);
                }
            }
        }
        Value::Object(parameter)
    }

    fn query(self, param: &QueryParam) -> Value {
        self.parameter(
            param.name,
            "query",
            param.description,
            param.ty.as_str(),
            false,
        )
    }
}

/// The OpenAPI 3.0 document of the group-version.
pub(super) fn v3(
    group: &str,
    version: &str,
    items: &[PathItem],
    components: &Components,
    tag: &str,
) -> Value {
    json!({
        "openapi": "3.0.0",
        "info": { "title": group, "version": version },
        "paths": paths(Dialect::OpenApi3, items, tag),
        "components": {
            "schemas": components.schemas,
            "securitySchemes": { "BearerToken": bearer_token() },
        },
        "security": [{ "BearerToken": [] }],
    })
}

/// The Swagger 2.0 document of the group-version, its schemas converted as Go converts
/// CRD schemas for v2.
pub(super) fn v2(
    group: &str,
    version: &str,
    items: &[PathItem],
    components: &Components,
    tag: &str,
) -> Value {
    let mut definitions = components.schemas.clone();
    for schema in definitions.values_mut() {
        convert::to_swagger_2_0(schema);
    }
    json!({
        "swagger": "2.0",
        "info": { "title": group, "version": version },
        "paths": paths(Dialect::Swagger2, items, tag),
        "definitions": definitions,
        "securityDefinitions": { "BearerToken": bearer_token() },
        "security": [{ "BearerToken": [] }],
    })
}

/// The v3 root, listing only our group-version: the aggregator merges the roots of all
/// APIServices by key (`kube-openapi:pkg/handler3/handler.go` `OpenAPIV3Discovery`).
pub(super) fn v3_root(group_version_key: &str, server_relative_url: &str) -> Value {
    json!({ "paths": { group_version_key: { "serverRelativeURL": server_relative_url } } })
}

fn bearer_token() -> Value {
    json!({
        "type": "apiKey",
        "description": "Bearer Token authentication",
        "name": "authorization",
        "in": "header",
    })
}

fn paths(dialect: Dialect, items: &[PathItem], tag: &str) -> Value {
    let mut paths = Map::new();
    for item in items {
        let mut path = Map::new();
        let mut parameters = Vec::new();
        if let Some(kind) = &item.name_of {
            parameters.push(dialect.parameter(
                "name",
                "path",
                &format!("name of the {kind}"),
                "string",
                true,
            ));
        }
        if item.namespaced {
            parameters.push(dialect.parameter(
                "namespace",
                "path",
                NAMESPACE_DESCRIPTION,
                "string",
                true,
            ));
        }
        parameters.push(dialect.query(&query::PRETTY));
        path.insert("parameters".to_owned(), Value::Array(parameters));
        for operation in &item.operations {
            path.insert(
                operation.method.as_str().to_owned(),
                render_operation(dialect, operation, tag),
            );
        }
        paths.insert(item.path.clone(), Value::Object(path));
    }
    Value::Object(paths)
}

fn render_operation(dialect: Dialect, operation: &Operation, tag: &str) -> Value {
    let mut out = Map::new();
    out.insert("tags".to_owned(), json!([tag]));
    out.insert("description".to_owned(), json!(operation.description));
    out.insert("operationId".to_owned(), json!(operation.id));
    let mut parameters: Vec<Value> = operation.query.iter().map(|p| dialect.query(p)).collect();

    match dialect {
        Dialect::OpenApi3 => {
            if let Some(body) = &operation.body {
                let content: Map<String, Value> = body
                    .content_types
                    .iter()
                    .map(|ty| {
                        (
                            ty.to_string(),
                            json!({ "schema": dialect.reference(&body.schema) }),
                        )
                    })
                    .collect();
                out.insert(
                    "requestBody".to_owned(),
                    json!({ "content": content, "required": body.required }),
                );
            }
        }
        Dialect::Swagger2 => {
            let consumes = operation
                .body
                .as_ref()
                .map_or(&["*/*"][..], |body| body.content_types);
            out.insert("consumes".to_owned(), json!(consumes));
            out.insert("produces".to_owned(), json!(operation.produces));
            out.insert("schemes".to_owned(), json!(["https"]));
            if let Some(body) = &operation.body {
                parameters.insert(
                    0,
                    json!({
                        "name": "body",
                        "in": "body",
                        "required": body.required,
                        "schema": dialect.reference(&body.schema),
                    }),
                );
            }
        }
    }
    if !parameters.is_empty() {
        out.insert("parameters".to_owned(), Value::Array(parameters));
    }

    let mut responses = Map::new();
    for reply in &operation.responses {
        let schema = match &reply.payload {
            Payload::Nothing => None,
            Payload::Definition(definition) => Some(dialect.reference(definition)),
            Payload::Text => Some(json!({ "type": "string" })),
        };
        let mut response = Map::new();
        response.insert("description".to_owned(), json!(reply.description));
        if let Some(schema) = schema {
            match dialect {
                Dialect::OpenApi3 => {
                    let content: Map<String, Value> = operation
                        .produces
                        .iter()
                        .map(|ty| (ty.to_string(), json!({ "schema": schema })))
                        .collect();
                    response.insert("content".to_owned(), Value::Object(content));
                }
                Dialect::Swagger2 => {
                    response.insert("schema".to_owned(), schema);
                }
            }
        }
        responses.insert(reply.code.to_owned(), Value::Object(response));
    }
    out.insert("responses".to_owned(), Value::Object(responses));

    if let Some(action) = operation.action {
        out.insert("x-kubernetes-action".to_owned(), json!(action));
    }
    if let Some(gvk) = &operation.gvk {
        out.insert("x-kubernetes-group-version-kind".to_owned(), gvk.to_json());
    }
    Value::Object(out)
}
