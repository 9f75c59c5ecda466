//! `docs/reference/api.md`, rendered from the OpenAPI v3 document a fresh
//! `battery-apiserver dev` serves, so the reference cannot drift from the server: every
//! endpoint with its actions, and every field of each of our kinds with its type,
//! default, allowed values and description.

use std::fmt::Write as _;

use battery_e2e::apiserver::{ApiServer, Route};
use serde_json::{Map, Value};

/// The document's path: our group-version's OpenAPI v3.
const DOCUMENT: &str = "/openapi/v3/apis/battery.liquidmetal-x.dev/v1alpha1";
/// The page, relative to `docs/`.
const PAGE: &str = "reference/api.md";
/// Set to `1` to write the page instead of comparing it.
const UPDATE_VAR: &str = "BATTERY_DOCS_UPDATE";
/// Regenerates the page.
const REGENERATE: &str =
    "BATTERY_DOCS_UPDATE=1 cargo test -p battery-e2e --test docs api_reference";
/// The schemas' name prefix for our group (its reversed domain).
const OUR_SCHEMAS: &str = "dev.liquidmetal-x.battery.v1alpha1.";
/// The kinds the page documents, in its order; each is served (or, for
/// HostCertificateRequest, posted to `hosts/{name}/certificate`).
const KINDS: [&str; 4] = ["Pool", "MicroVMClaim", "Host", "HostCertificateRequest"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_reference_is_rendered_from_the_servers_openapi_document() {
    let server = ApiServer::start(Route::Direct).await;
    let kubectl = server.kubectls().next().expect("a kubectl release");
    let document = kubectl.json(&["get", "--raw", DOCUMENT]).await;
    let rendered = render(&document);
    let path = crate::docs_dir().join(PAGE);
    if std::env::var(UPDATE_VAR).as_deref() == Ok("1") {
        std::fs::write(&path, &rendered)
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    if checked_in != rendered {
        let first = checked_in
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| checked_in.lines().count().min(rendered.lines().count()));
        panic!(
            "docs/{PAGE} differs from the server's OpenAPI document from line {}:\n  \
             checked in: {:?}\n  rendered:   {:?}\nregenerate it with `{REGENERATE}`",
            first + 1,
            checked_in.lines().nth(first).unwrap_or("(end of file)"),
            rendered.lines().nth(first).unwrap_or("(end of file)"),
        );
    }
}

#[test]
fn every_field_is_listed_with_its_description() {
    let document = serde_json::json!({
        "paths": {},
        "components": {"schemas": {format!("{OUR_SCHEMAS}Pool"): {
            "description": "A pool.",
            "required": ["spec"],
            "properties": {
                "metadata": {"allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}], "description": "Meta."},
                "spec": {"type": "object", "description": "The spec.", "properties": {
                    "size": {"type": "integer", "format": "int32", "default": 1, "description": "How many | which."},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Labels of `a|b` <here>."},
                    "items": {"type": "array", "items": {"type": "object", "properties": {
                        "kind": {"type": "string", "enum": ["A", "B"], "description": "Which."}
                    }}, "description": "Items."}
                }}
            }
        }}}
    });
    let page = render(&document);
    for row in [
        "| `metadata` | ObjectMeta |  | Meta. |",
        "| `spec` | object | yes | The spec. |",
        "| `spec.items` | []object |  | Items. |",
        "| `spec.items[].kind` | string |  | Which. One of `A`, `B`. |",
        "| `spec.labels` | map[string]string |  | Labels of `a\\|b` &lt;here&gt;. |",
        "| `spec.size` | integer (int32) |  | How many \\| which. Default: `1`. |",
    ] {
        assert!(page.contains(row), "no row {row:?} in:\n{page}");
    }
}

/// The page for `document` (an OpenAPI v3 group-version document).
fn render(document: &Value) -> String {
    let mut page = format!(
        "# API reference\n\n\
         `battery.liquidmetal-x.dev/v1alpha1`, as the server describes itself: this page is \
         rendered from the OpenAPI v3 document it serves at `{DOCUMENT}` (the one \
         `kubectl explain` reads), so it lists exactly what is served. Do not edit it by \
         hand: `e2e/tests/docs/api_reference.rs` fails when it differs from a fresh \
         render, and `{REGENERATE}` writes it anew.\n\n\
         Types are OpenAPI's; `[]T` is a list of T, `map[string]T` an object with any keys. \
         Fields of Kubernetes' own types (`ObjectMeta`, `Condition`, …) are documented by \
         Kubernetes.\n\n## Endpoints\n\n\
         Paths under `/apis/battery.liquidmetal-x.dev/v1alpha1`, with the Kubernetes action \
         each method performs.\n\n| path | actions |\n|---|---|\n"
    );
    let prefix = "/apis/battery.liquidmetal-x.dev/v1alpha1";
    for (path, item) in document["paths"].as_object().into_iter().flatten() {
        let actions: Vec<String> = item
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(method, operation)| {
                let action = operation.get("x-kubernetes-action")?.as_str()?;
                Some(format!("{} ({action})", method.to_uppercase()))
            })
            .collect();
        if actions.is_empty() {
            continue;
        }
        let path = path.strip_prefix(prefix).unwrap_or(path);
        let _ = writeln!(page, "| `{path}` | {} |", actions.join(", "));
    }
    let schemas = &document["components"]["schemas"];
    for kind in KINDS {
        let Some(schema) = schemas.get(format!("{OUR_SCHEMAS}{kind}")) else {
            continue;
        };
        let _ = write!(
            page,
            "\n## {kind}\n\n{}\n\n| field | type | required | description |\n|---|---|---|---|\n",
            text(schema["description"].as_str().unwrap_or_default())
        );
        fields(&mut page, "", schema);
    }
    page
}

/// One row per property of `schema` (an object), then the rows of its own fields,
/// each path prefixed with `prefix`.
fn fields(page: &mut String, prefix: &str, schema: &Value) {
    let empty = Map::new();
    let properties = schema["properties"].as_object().unwrap_or(&empty);
    let required: Vec<&str> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for (name, property) in properties {
        let path = format!("{prefix}{name}");
        let mut description = text(property["description"].as_str().unwrap_or_default());
        if let Some(values) = property["enum"].as_array() {
            let values: Vec<String> = values.iter().map(|v| format!("`{}`", plain(v))).collect();
            let _ = write!(description, " One of {}.", values.join(", "));
        }
        if let Some(default) = property.get("default") {
            let _ = write!(
                description,
                " Default: `{}`.",
                plain(default).replace('|', "\\|")
            );
        }
        let needed = if required.contains(&name.as_str()) {
            "yes"
        } else {
            ""
        };
        let _ = writeln!(
            page,
            "| `{path}` | {} | {needed} | {} |",
            type_name(property),
            description.trim()
        );
        // Nested objects, list items and map values are documented field by field.
        if property.get("properties").is_some() {
            fields(page, &format!("{path}."), property);
        } else if property["items"].get("properties").is_some() {
            fields(page, &format!("{path}[]."), &property["items"]);
        } else if property["additionalProperties"].get("properties").is_some() {
            fields(
                page,
                &format!("{path}.*."),
                &property["additionalProperties"],
            );
        }
    }
}

/// A property's type as the page writes it.
fn type_name(schema: &Value) -> String {
    if let Some(reference) = schema["allOf"][0]["$ref"]
        .as_str()
        .or(schema["$ref"].as_str())
    {
        return reference.rsplit('.').next().unwrap_or(reference).to_owned();
    }
    if schema.get("x-kubernetes-int-or-string").is_some() {
        return "integer or string".to_owned();
    }
    match schema["type"].as_str() {
        Some("array") => format!("[]{}", type_name(&schema["items"])),
        Some("object") if schema.get("additionalProperties").is_some() => {
            format!("map[string]{}", type_name(&schema["additionalProperties"]))
        }
        Some(name) => match schema["format"].as_str() {
            Some(format) => format!("{name} ({format})"),
            None => name.to_owned(),
        },
        None => "any".to_owned(),
    }
}

/// A JSON value as a default or enum value shows it: strings bare, the rest as JSON.
fn plain(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A description made safe for one Markdown table cell: on one line, `|` escaped, and
/// outside code spans, `<`, `>` and `*` shown as written rather than read as HTML or
/// emphasis.
fn text(description: &str) -> String {
    let one_line = description.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = String::new();
    for (i, part) in one_line.split('`').enumerate() {
        if i > 0 {
            out.push('`');
        }
        let part = part.replace('|', "\\|");
        if i % 2 == 1 {
            out.push_str(&part);
        } else {
            out.push_str(
                &part
                    .replace('<', "&lt;")
                    .replace('>', "&gt;")
                    .replace('*', "\\*"),
            );
        }
    }
    out
}
