//! Helpers that shape the kinds' wire form and schema.

use schemars::Schema;
use serde_json::Value;

/// `skip_serializing_if` for optional booleans, which Kubernetes omits when false.
pub(crate) fn is_false(value: &bool) -> bool {
    !*value
}

/// A schema transform for a struct whose `fields` are required but decode to their zero
/// value when absent (`#[serde(default)]`), as Go's do: validation then reports them as
/// field errors (422) instead of the decoder failing (400). The schema still lists them as
/// required, and drops the `default` schemars derives from `#[serde(default)]`, because a
/// zero value is no API default.
pub(crate) fn required_fields(fields: &'static [&'static str]) -> impl FnMut(&mut Schema) {
    move |schema: &mut Schema| {
        if let Some(Value::Object(properties)) = schema.get_mut("properties") {
            for field in fields {
                if let Some(Value::Object(property)) = properties.get_mut(*field) {
                    property.remove("default");
                }
            }
        }
        let required = schema
            .ensure_object()
            .entry("required")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(required) = required {
            for field in fields {
                if !required.iter().any(|name| name == field) {
                    required.push(Value::from(*field));
                }
            }
        }
    }
}

/// A field transform for an optional enumerated string. schemars lists `null` among an
/// `Option`'s `enum` values, which readers of the OpenAPI document (`kubectl explain`) show
/// as a value; the field's `nullable` already says it may be absent.
pub(crate) fn drop_null_from_enum(schema: &mut Schema) {
    if let Some(Value::Array(values)) = schema.get_mut("enum") {
        values.retain(|value| !value.is_null());
    }
}
