//! Field errors in the words of `k8s.io/apimachinery/pkg/util/validation/field`, and the
//! apimachinery checks (names, label keys and values, conditions) the kinds are held to.
//!
//! A `FieldError` prints exactly as Go's `field.Error` does
//! (`spec.template.vcpu: Invalid value: 0: must be between 1 and 64, inclusive`), so the
//! apiserver can build the `422 Invalid` `Status` message and its `details.causes` from it
//! without rewording anything, and clients that match on Kubernetes' wording keep working.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::Value;

use crate::strconv::quote;

/// What is wrong with a field: the `field.ErrorType`s this API reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldErrorKind {
    /// A required field is missing or empty (`field.ErrorTypeRequired`).
    Required,
    /// The value is malformed or out of range (`field.ErrorTypeInvalid`).
    Invalid,
    /// The value is not one of an enumerated set (`field.ErrorTypeNotSupported`).
    NotSupported,
    /// The field may not be set, or not to this value, here (`field.ErrorTypeForbidden`).
    Forbidden,
    /// The value must be unique in its list and is not (`field.ErrorTypeDuplicate`).
    Duplicate,
    /// The value is longer than allowed (`field.ErrorTypeTooLong`).
    TooLong,
}

impl FieldErrorKind {
    /// The phrase Go prints for the kind (`field.ErrorType.String`), e.g. `Required value`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Required => "Required value",
            Self::Invalid => "Invalid value",
            Self::NotSupported => "Unsupported value",
            Self::Forbidden => "Forbidden",
            Self::Duplicate => "Duplicate value",
            Self::TooLong => "Too long",
        }
    }

    /// The `metav1.CauseType` a `Status` cause carries as `reason` for this kind, e.g.
    /// `FieldValueRequired`.
    pub const fn cause_type(self) -> &'static str {
        match self {
            Self::Required => "FieldValueRequired",
            Self::Invalid => "FieldValueInvalid",
            Self::NotSupported => "FieldValueNotSupported",
            Self::Forbidden => "FieldValueForbidden",
            Self::Duplicate => "FieldValueDuplicate",
            Self::TooLong => "FieldValueTooLong",
        }
    }

    /// Whether Go prints the bad value for this kind (`field.Error.ErrorBody`).
    const fn shows_value(self) -> bool {
        matches!(self, Self::Invalid | Self::NotSupported | Self::Duplicate)
    }
}

impl fmt::Display for FieldErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One invalid field, as apimachinery's `field.Error`.
#[derive(Clone, Debug, PartialEq)]
pub struct FieldError {
    /// The field's path, e.g. `spec.template.interfaces[0].deviceId`.
    pub field: String,
    /// What is wrong with it.
    pub kind: FieldErrorKind,
    /// The offending value, printed for `Invalid`, `NotSupported` and `Duplicate`; `None`
    /// leaves it out of the message (Go's `field.OmitValueType`).
    pub value: Option<Value>,
    /// What the value must be, in apimachinery's words; may be empty.
    pub detail: String,
}

impl FieldError {
    /// `field.Required`: the field must be set.
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(field, FieldErrorKind::Required, None, detail)
    }

    /// `field.Invalid`: the value is malformed or out of range.
    pub fn invalid(
        field: impl Into<String>,
        value: impl Into<Value>,
        detail: impl Into<String>,
    ) -> Self {
        Self::new(field, FieldErrorKind::Invalid, Some(value.into()), detail)
    }

    /// `field.NotSupported`: the value is not one of `supported`, which the message lists.
    pub fn not_supported(
        field: impl Into<String>,
        value: impl Into<Value>,
        supported: &[&str],
    ) -> Self {
        let detail = if supported.is_empty() {
            String::new()
        } else {
            let quoted: Vec<String> = supported.iter().map(|value| quote(value)).collect();
            format!("supported values: {}", quoted.join(", "))
        };
        Self::new(
            field,
            FieldErrorKind::NotSupported,
            Some(value.into()),
            detail,
        )
    }

    /// `field.Forbidden`: the field may not be set (to this value) here.
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(field, FieldErrorKind::Forbidden, None, detail)
    }

    /// `field.Duplicate`: the value appears earlier in the same list.
    pub fn duplicate(field: impl Into<String>, value: impl Into<Value>) -> Self {
        Self::new(field, FieldErrorKind::Duplicate, Some(value.into()), "")
    }

    /// `field.TooLong`: the value is longer than `max_bytes`. Go never echoes a value that is
    /// too long, so none is kept.
    pub fn too_long(field: impl Into<String>, max_bytes: usize) -> Self {
        let unit = if max_bytes == 1 { "byte" } else { "bytes" };
        Self::new(
            field,
            FieldErrorKind::TooLong,
            None,
            format!("may not be more than {max_bytes} {unit}"),
        )
    }

    fn new(
        field: impl Into<String>,
        kind: FieldErrorKind,
        value: Option<Value>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            field: field.into(),
            kind,
            value,
            detail: detail.into(),
        }
    }

    /// The message without the field path (Go's `ErrorBody`), e.g.
    /// `Invalid value: 0: must be between 1 and 64, inclusive`. It is what a `Status`
    /// cause carries as `message`.
    pub fn body(&self) -> String {
        let mut body = self.kind.as_str().to_owned();
        if let Some(value) = self.value.as_ref().filter(|_| self.kind.shows_value()) {
            body.push_str(": ");
            body.push_str(&go_value(value));
        }
        if !self.detail.is_empty() {
            body.push_str(": ");
            body.push_str(&self.detail);
        }
        body
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

impl std::error::Error for FieldError {}

/// Prints a bad value as `field.Error.ErrorBody` does: numbers and booleans bare, strings
/// quoted. Go prints a nil value as the quoted string `"null"`, and that is kept. Lists and
/// objects, which Go dumps with `%#v` as Go syntax, are printed as compact JSON instead.
fn go_value(value: &Value) -> String {
    match value {
        Value::Null => quote("null"),
        Value::String(text) => quote(text),
        Value::Bool(_) | Value::Number(_) | Value::Array(_) | Value::Object(_) => value.to_string(),
    }
}

/// A field's path, built as apimachinery's `field.Path`: `spec.template`, then
/// `.interfaces`, `[0]` for a list index and `[key]` for a map key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FieldPath(String);

impl FieldPath {
    /// A path starting at the top-level field `root` (`spec`, `status`, `metadata`).
    pub fn new(root: &str) -> Self {
        Self(root.to_owned())
    }

    /// The path of the child field `name`.
    #[must_use]
    pub fn child(&self, name: &str) -> Self {
        Self(format!("{}.{name}", self.0))
    }

    /// The path of the list element at `index`.
    #[must_use]
    pub fn index(&self, index: usize) -> Self {
        Self(format!("{}[{index}]", self.0))
    }

    /// The path of the map entry at `key`.
    #[must_use]
    pub fn key(&self, key: &str) -> Self {
        Self(format!("{}[{key}]", self.0))
    }

    /// The path as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&FieldPath> for String {
    fn from(path: &FieldPath) -> Self {
        path.0.clone()
    }
}

impl From<FieldPath> for String {
    fn from(path: FieldPath) -> Self {
        path.0
    }
}

const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERROR_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_ERROR_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const QUALIFIED_NAME_MAX_LENGTH: usize = 63;
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_ERROR_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_MAX_LENGTH: usize = 63;

/// apimachinery's `validation.RegexError`: the rule, examples, and the regex it stands for.
/// The double space between examples (`'MyName',  or 'my.name'`) is Go's, kept so that
/// messages match Kubernetes' byte for byte.
fn regex_error(message: &str, regex: &str, examples: &[&str]) -> String {
    let mut out = message.to_owned();
    if examples.is_empty() {
        out.push_str(" (regex used for validation is '");
    } else {
        out.push_str(" (e.g. ");
        for (i, example) in examples.iter().enumerate() {
            if i > 0 {
                out.push_str(" or ");
            }
            out.push_str(&format!("'{example}', "));
        }
        out.push_str("regex used for validation is '");
    }
    out.push_str(regex);
    out.push_str("')");
    out
}

fn max_len_error(length: usize) -> String {
    format!("must be no more than {length} characters")
}

/// Whether `value` matches `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
fn is_dns1123_label_text(value: &str) -> bool {
    let bytes = value.as_bytes();
    let alphanumeric = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            alphanumeric(first)
                && alphanumeric(last)
                && bytes.iter().all(|b| alphanumeric(b) || *b == b'-')
        }
        _ => false,
    }
}

/// Whether `value` matches `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`.
fn is_qualified_name_text(value: &str) -> bool {
    let bytes = value.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// apimachinery's `validation.IsDNS1123Subdomain`: why `value` is not a lowercase RFC 1123
/// subdomain (the rule for most object names, e.g. Pools and ServiceAccounts); empty when
/// it is one.
pub fn is_dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errors.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !value.split('.').all(is_dns1123_label_text) {
        errors.push(regex_error(
            DNS1123_SUBDOMAIN_ERROR_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errors
}

/// apimachinery's `validation.IsQualifiedName`: why `value` is not a label key (an optional
/// DNS subdomain prefix and `/`, then a name of at most 63 characters); empty when it is one.
pub fn is_qualified_name(value: &str) -> Vec<String> {
    let name_error = || {
        regex_error(
            QUALIFIED_NAME_ERROR_MSG,
            QUALIFIED_NAME_FMT,
            &["MyName", "my.name", "123-abc"],
        )
    };
    let mut errors = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errors.push("prefix part must be non-empty".to_owned());
            } else {
                errors.extend(
                    is_dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|error| format!("prefix part {error}")),
                );
            }
            *name
        }
        _ => {
            return vec![format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                name_error()
            )];
        }
    };
    if name.is_empty() {
        errors.push("name part must be non-empty".to_owned());
    } else if name.len() > QUALIFIED_NAME_MAX_LENGTH {
        errors.push(format!(
            "name part {}",
            max_len_error(QUALIFIED_NAME_MAX_LENGTH)
        ));
    }
    if !is_qualified_name_text(name) {
        errors.push(format!("name part {}", name_error()));
    }
    errors
}

/// apimachinery's `validation.IsValidLabelValue`: why `value` is not a label value (empty,
/// or at most 63 characters of the qualified-name alphabet); empty when it is one.
pub fn is_valid_label_value(value: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LENGTH {
        errors.push(max_len_error(LABEL_VALUE_MAX_LENGTH));
    }
    if !value.is_empty() && !is_qualified_name_text(value) {
        errors.push(regex_error(
            LABEL_VALUE_ERROR_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errors
}

/// apimachinery's `ValidateLabels`: every key a qualified name, every value a label value.
pub fn validate_labels<'a>(
    labels: impl IntoIterator<Item = (&'a String, &'a String)>,
    path: &FieldPath,
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (key, value) in labels {
        errors.extend(
            is_qualified_name(key)
                .into_iter()
                .map(|message| FieldError::invalid(path, key.as_str(), message)),
        );
        errors.extend(
            is_valid_label_value(value)
                .into_iter()
                .map(|message| FieldError::invalid(path, value.as_str(), message)),
        );
    }
    errors
}

const CONDITION_REASON_FMT: &str = "[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?";
const CONDITION_REASON_ERROR_MSG: &str = "a condition reason must start with alphabetic character, optionally followed by a string of alphanumeric characters or '_,:', and must end with an alphanumeric character or '_'";
const CONDITION_REASON_MAX_LENGTH: usize = 1024;
const CONDITION_MESSAGE_MAX_LENGTH: usize = 32 * 1024;
/// `metav1.ConditionStatus` values, sorted as Go's `sets.List` lists them in the message.
const CONDITION_STATUSES: &[&str] = &["False", "True", "Unknown"];

fn is_condition_reason_text(reason: &str) -> bool {
    let bytes = reason.as_bytes();
    let inner = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b',' | b':');
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphabetic()
                && (last.is_ascii_alphanumeric() || *last == b'_')
                && bytes.iter().all(inner)
        }
        _ => false,
    }
}

/// apimachinery's `metav1validation.ValidateConditions`: condition types unique and label
/// keys, statuses `True`/`False`/`Unknown`, reasons set and CamelCase-ish, messages at most
/// 32 KiB. `lastTransitionTime` is not checked: the type requires it, so a condition
/// without one fails to decode before it gets here.
pub fn validate_conditions(conditions: &[Condition], path: &FieldPath) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (i, condition) in conditions.iter().enumerate() {
        let path = path.index(i);
        if conditions[..i]
            .iter()
            .any(|earlier| earlier.type_ == condition.type_)
        {
            errors.push(FieldError::duplicate(
                path.child("type"),
                condition.type_.as_str(),
            ));
        }
        errors.extend(
            is_qualified_name(&condition.type_)
                .into_iter()
                .map(|message| {
                    FieldError::invalid(path.child("type"), condition.type_.as_str(), message)
                }),
        );
        if !CONDITION_STATUSES.contains(&condition.status.as_str()) {
            errors.push(FieldError::not_supported(
                path.child("status"),
                condition.status.as_str(),
                CONDITION_STATUSES,
            ));
        }
        if let Some(generation) = condition
            .observed_generation
            .filter(|generation| *generation < 0)
        {
            errors.push(FieldError::invalid(
                path.child("observedGeneration"),
                generation,
                "must be greater than or equal to zero",
            ));
        }
        if condition.reason.is_empty() {
            errors.push(FieldError::required(path.child("reason"), "must be set"));
        } else {
            if !is_condition_reason_text(&condition.reason) {
                errors.push(FieldError::invalid(
                    path.child("reason"),
                    condition.reason.as_str(),
                    regex_error(CONDITION_REASON_ERROR_MSG, CONDITION_REASON_FMT, &[]),
                ));
            }
            if condition.reason.len() > CONDITION_REASON_MAX_LENGTH {
                errors.push(FieldError::too_long(
                    path.child("reason"),
                    CONDITION_REASON_MAX_LENGTH,
                ));
            }
        }
        if condition.message.len() > CONDITION_MESSAGE_MAX_LENGTH {
            errors.push(FieldError::too_long(
                path.child("message"),
                CONDITION_MESSAGE_MAX_LENGTH,
            ));
        }
    }
    errors
}

/// Messages for checks that Kubernetes words in its own validators, shared by the kinds.
pub(crate) mod messages {
    /// `apimachineryvalidation.IsNegativeErrorMsg`.
    pub(crate) const NON_NEGATIVE: &str = "must be greater than or equal to 0";
    /// `pkg/apis/core/validation`'s `isNotPositiveErrorMsg`.
    pub(crate) const POSITIVE: &str = "must be greater than zero";
    /// `apimachineryvalidation.FieldImmutableErrorMsg`.
    pub(crate) const IMMUTABLE: &str = "field is immutable";
    /// `validation.IsValidCIDR`.
    pub(crate) const CIDR: &str = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)";
    /// `validation.IsValidIP`.
    pub(crate) const IP: &str = "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)";

    /// `validation.InclusiveRangeError`.
    pub(crate) fn inclusive_range(low: i64, high: i64) -> String {
        format!("must be between {low} and {high}, inclusive")
    }

    /// `validation.IsInRange`'s lower half, for a bound other than 0.
    pub(crate) fn at_least(low: i64) -> String {
        format!("must be greater than or equal to {low}")
    }
}

/// Invalid-value errors for an object name that must be a DNS subdomain (apimachinery's
/// `NameIsDNSSubdomain`), or `Required value` when it is empty.
pub(crate) fn validate_dns_subdomain_name(name: &str, path: &FieldPath) -> Vec<FieldError> {
    if name.is_empty() {
        return vec![FieldError::required(path, "")];
    }
    is_dns1123_subdomain(name)
        .into_iter()
        .map(|message| FieldError::invalid(path, name, message))
        .collect()
}

/// `Invalid value` unless `value` is a `host:port` address with a port in 1–65535; IPv6
/// hosts go in brackets, as Go's `net.SplitHostPort` wants them.
pub(crate) fn validate_host_port(value: &str, path: &FieldPath) -> Option<FieldError> {
    const DETAIL: &str = "must be a host:port address with a port between 1 and 65535 (e.g. 10.0.0.5:9090 or [2001:db8::5]:9090)";
    let valid = value.rsplit_once(':').is_some_and(|(host, port)| {
        let host_ok = match host
            .strip_prefix('[')
            .and_then(|rest| rest.strip_suffix(']'))
        {
            Some(ipv6) => ipv6.parse::<std::net::Ipv6Addr>().is_ok(),
            None => !host.is_empty() && !host.contains([':', '[', ']', '/', ' ']),
        };
        let port_ok = port.bytes().all(|b| b.is_ascii_digit())
            && port.parse::<u16>().is_ok_and(|port| port > 0);
        host_ok && port_ok
    });
    (!valid).then(|| FieldError::invalid(path, value, DETAIL))
}

#[cfg(test)]
mod tests;
