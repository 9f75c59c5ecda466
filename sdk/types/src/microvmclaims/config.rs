//! A claim's own configuration: environment variables for every exec session and files
//! written into the MicroVM at bind, in the shapes a Pod uses (`env[].valueFrom`,
//! `secretKeyRef`, `configMapKeyRef`), so warm pools need not be per tenant.
//!
//! Only references live here and in the stored claim; the values are read at bind by the
//! API server (after a SubjectAccessReview for the requesting user) and never stored.
//! Our own types rather than k8s-openapi's `EnvVar`: its schema offers `fieldRef` and
//! `resourceFieldRef`, which mean nothing for a MicroVM; the JSON of what we keep is the
//! same.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::validation::{FieldError, FieldPath, validate_dns_subdomain_name};
use crate::wire::required_fields;

/// Environment variables a claim may carry: each is given to every exec session.
pub const MAX_ENV: usize = 256;
/// Files a claim may carry: each costs an agent session at bind.
pub const MAX_FILES: usize = 32;
/// A ConfigMap's file's mode when none is given: Kubernetes' `defaultMode` (0644).
pub const DEFAULT_CONFIG_MAP_FILE_MODE: i32 = 0o644;
/// A Secret's file's mode when none is given: its owner's only (0600), stricter than a
/// Pod's 0644, since a MicroVM's users are not a Pod's one container.
pub const DEFAULT_SECRET_FILE_MODE: i32 = 0o600;

/// One environment variable: a literal `value`, or `valueFrom` a key of a Secret or a
/// ConfigMap in the claim's namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = required_fields(&["name"]))]
pub struct ClaimEnvVar {
    /// The variable's name.
    #[serde(default)]
    pub name: String,
    /// The variable's value. Not a secret: it is stored and shown with the claim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Where the value comes from, when not `value`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvVarSource>,
}

/// The source of an environment variable's value: exactly one of the two.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvVarSource {
    /// A key of a Secret in the claim's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeySelector>,
    /// A key of a ConfigMap in the claim's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeySelector>,
}

/// A key of a Secret or a ConfigMap, as `SecretKeySelector` and `ConfigMapKeySelector`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = required_fields(&["name", "key"]))]
pub struct KeySelector {
    /// The object's name.
    #[serde(default)]
    pub name: String,
    /// The key in its `data` (or a ConfigMap's `binaryData`).
    #[serde(default)]
    pub key: String,
    /// When true, a missing object or key leaves the variable unset (the file unwritten)
    /// instead of failing the bind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

impl KeySelector {
    /// Whether a missing object or key is fine.
    pub fn is_optional(&self) -> bool {
        self.optional == Some(true)
    }
}

/// A file written into the MicroVM at bind, with the content of one key of a Secret or a
/// ConfigMap: exactly one of the two.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = required_fields(&["path"]))]
pub struct ClaimFile {
    /// The file's absolute path in the MicroVM; missing parent directories are made.
    #[serde(default)]
    pub path: String,
    /// The file's permission bits, 0 to 0777 (in JSON a decimal number, as a Pod's
    /// `defaultMode`: 0600 is 384). Default 0600 for a Secret's key, 0644 for a
    /// ConfigMap's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<i32>,
    /// The key of a Secret in the claim's namespace to write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeySelector>,
    /// The key of a ConfigMap in the claim's namespace to write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeySelector>,
}

impl ClaimFile {
    /// The mode the file gets.
    pub fn mode_or_default(&self) -> i32 {
        self.mode.unwrap_or(match self.reference() {
            Some((SourceKind::ConfigMap, _)) => DEFAULT_CONFIG_MAP_FILE_MODE,
            _ => DEFAULT_SECRET_FILE_MODE,
        })
    }
}

/// What a value or a file's content is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SourceKind {
    /// A Secret (`secretKeyRef`).
    Secret,
    /// A ConfigMap (`configMapKeyRef`).
    ConfigMap,
}

impl SourceKind {
    /// The Kind, as messages name it.
    pub fn kind(self) -> &'static str {
        match self {
            Self::Secret => "Secret",
            Self::ConfigMap => "ConfigMap",
        }
    }

    /// The core resource, as RBAC and SubjectAccessReview name it.
    pub fn resource(self) -> &'static str {
        match self {
            Self::Secret => "secrets",
            Self::ConfigMap => "configmaps",
        }
    }
}

/// The one reference of a `valueFrom` or a file, if exactly one is given.
fn one_ref<'a>(
    secret: Option<&'a KeySelector>,
    config_map: Option<&'a KeySelector>,
) -> Option<(SourceKind, &'a KeySelector)> {
    match (secret, config_map) {
        (Some(selector), None) => Some((SourceKind::Secret, selector)),
        (None, Some(selector)) => Some((SourceKind::ConfigMap, selector)),
        _ => None,
    }
}

impl EnvVarSource {
    /// The reference, when exactly one is given (as validation requires).
    pub fn reference(&self) -> Option<(SourceKind, &KeySelector)> {
        one_ref(
            self.secret_key_ref.as_ref(),
            self.config_map_key_ref.as_ref(),
        )
    }
}

impl ClaimFile {
    /// The reference, when exactly one is given (as validation requires).
    pub fn reference(&self) -> Option<(SourceKind, &KeySelector)> {
        one_ref(
            self.secret_key_ref.as_ref(),
            self.config_map_key_ref.as_ref(),
        )
    }
}

/// `validation.IsEnvVarName`'s rule.
const ENV_NAME_DETAIL: &str = "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')";
/// `validation.IsConfigMapKey`'s rule.
const KEY_DETAIL: &str = "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')";
/// `validation.IsConfigMapKey`'s length limit.
const MAX_KEY_BYTES: usize = 253;

fn is_env_name(name: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_');
    name.chars().all(allowed) && !name.starts_with(|c: char| c.is_ascii_digit())
}

/// Checks `env`, at `path` (`spec.env`).
pub(crate) fn validate_env(env: &[ClaimEnvVar], path: &FieldPath) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if env.len() > MAX_ENV {
        errors.push(FieldError::forbidden(
            path,
            format!("must have at most {MAX_ENV} items"),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for (index, var) in env.iter().enumerate() {
        let at = path.index(index);
        let name = at.child("name");
        if var.name.is_empty() {
            errors.push(FieldError::required(&name, ""));
        } else if !is_env_name(&var.name) {
            errors.push(FieldError::invalid(
                &name,
                var.name.as_str(),
                ENV_NAME_DETAIL,
            ));
        } else if !seen.insert(var.name.as_str()) {
            // A Pod lets the last one win; a claim's env is a map, so say it plainly.
            errors.push(FieldError::duplicate(&name, var.name.as_str()));
        }
        let Some(source) = &var.value_from else {
            continue;
        };
        let from = at.child("valueFrom");
        if var.value.as_deref().is_some_and(|v| !v.is_empty()) {
            errors.push(FieldError::invalid(
                &from,
                "",
                "may not be specified when `value` is not empty",
            ));
        }
        match (&source.secret_key_ref, &source.config_map_key_ref) {
            (None, None) => errors.push(FieldError::invalid(
                &from,
                "",
                "must specify one of: `configMapKeyRef` or `secretKeyRef`",
            )),
            (Some(_), Some(_)) => errors.push(FieldError::invalid(
                &from,
                "",
                "may not have more than one field specified at a time",
            )),
            (Some(selector), None) => {
                errors.extend(validate_selector(selector, &from.child("secretKeyRef")));
            }
            (None, Some(selector)) => {
                errors.extend(validate_selector(selector, &from.child("configMapKeyRef")));
            }
        }
    }
    errors
}

/// Checks `files`, at `path` (`spec.files`).
pub(crate) fn validate_files(files: &[ClaimFile], path: &FieldPath) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if files.len() > MAX_FILES {
        errors.push(FieldError::forbidden(
            path,
            format!("must have at most {MAX_FILES} items"),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for (index, file) in files.iter().enumerate() {
        let at = path.index(index);
        let file_path = at.child("path");
        if file.path.is_empty() {
            errors.push(FieldError::required(&file_path, ""));
        } else if let Some(why) = path_problem(&file.path) {
            errors.push(FieldError::invalid(&file_path, file.path.as_str(), why));
        } else if !seen.insert(file.path.trim_end_matches('/')) {
            errors.push(FieldError::duplicate(&file_path, file.path.as_str()));
        }
        if let Some(mode) = file.mode
            && !(0..=0o777).contains(&mode)
        {
            errors.push(FieldError::invalid(
                at.child("mode"),
                mode,
                "must be a number between 0 and 0777 (octal), both inclusive",
            ));
        }
        match (&file.secret_key_ref, &file.config_map_key_ref) {
            (None, None) => errors.push(FieldError::required(
                &at,
                "must specify one of: `configMapKeyRef` or `secretKeyRef`",
            )),
            (Some(_), Some(_)) => errors.push(FieldError::forbidden(
                &at,
                "may not have more than one of `configMapKeyRef` and `secretKeyRef`",
            )),
            (Some(selector), None) => {
                errors.extend(validate_selector(selector, &at.child("secretKeyRef")));
            }
            (None, Some(selector)) => {
                errors.extend(validate_selector(selector, &at.child("configMapKeyRef")));
            }
        }
    }
    errors
}

/// Why `path` cannot name a file: it must be absolute, name a file (not `/` or a path
/// ending in `/`), and have no `.` or `..` component, so it means the same wherever the
/// writing shell stands.
fn path_problem(path: &str) -> Option<&'static str> {
    if !path.starts_with('/') {
        return Some("must be an absolute path");
    }
    if path.contains('\0') {
        return Some("must not contain NUL");
    }
    if path.ends_with('/') {
        return Some("must name a file, not end in '/'");
    }
    if path[1..].split('/').any(|part| part == ".." || part == ".") {
        return Some("must not contain '.' or '..'");
    }
    None
}

fn validate_selector(selector: &KeySelector, path: &FieldPath) -> Vec<FieldError> {
    let mut errors = validate_dns_subdomain_name(&selector.name, &path.child("name"));
    let key = path.child("key");
    if selector.key.is_empty() {
        errors.push(FieldError::required(&key, ""));
    } else if selector.key.len() > MAX_KEY_BYTES {
        errors.push(FieldError::too_long(&key, MAX_KEY_BYTES));
    } else if !selector
        .key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        errors.push(FieldError::invalid(&key, selector.key.as_str(), KEY_DETAIL));
    } else if selector.key == "." || selector.key == ".." {
        errors.push(FieldError::invalid(
            &key,
            selector.key.as_str(),
            "must not be '.' or '..'",
        ));
    }
    errors
}
