//! Typed query options, decoded and validated as Go's apiserver does.
//!
//! Each option type goes through the stages of Go's handlers, with Go's codes:
//! decoding (`ParameterCodec.DecodeParameters`: a malformed integer or selector is a 400
//! BadRequest), then validation (`ValidateListOptions`, `ValidateCreateOptions`, ...:
//! a 422 Invalid naming `ListOptions.meta.k8s.io` and the offending field), then conversion
//! into the typed values a handler uses. Handlers take them with the [`Options`] extractor.

use std::num::NonZeroU64;
use std::time::Duration;

use battery_types::strconv::is_print;
use battery_types::validation::FieldError;
use http::HeaderMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::negotiate::{PATCH_TYPES, PatchType, body_format};
use crate::query;
use crate::selectors::{FieldSelector, LabelSelector};
// `TableOptions`' field; the type sits in `table`, which reads it, so `table` needs
// nothing from here.
use crate::status::ApiError;
pub use crate::table::IncludeObject;

/// Options a handler takes from the request's query (and, for a patch, its
/// `Content-Type`), rejecting the request with an [`ApiError`] as Go would.
pub trait QueryOptions: Sized {
    /// Decodes and validates `query` (the raw query string, without `?`).
    fn from_request(query: &str, headers: &HeaderMap) -> Result<Self, ApiError>;
}

/// Decodes any `Deserialize` type from a query with Go's conversions: a scalar takes the
/// first of repeated values, a `Vec` takes all, a bool is false only for `0` and `false`,
/// integers are `strconv.ParseInt` (its error text is the 400's message).
pub fn decode_query<T: DeserializeOwned>(query: &str) -> Result<T, ApiError> {
    query::from_query(query).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// `NewInvalid(meta.k8s.io/<kind>, "", errors)`, as Go's handlers report bad options.
fn invalid_options(kind: &str, errors: &[FieldError]) -> Result<(), ApiError> {
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid_kind("meta.k8s.io", kind, "", errors))
    }
}

/// `resourceVersionMatch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResourceVersionMatch {
    /// At least as new as `resourceVersion`.
    NotOlderThan,
    /// Exactly at `resourceVersion` (lists only).
    Exact,
}

/// `ListOptions`, for list, watch and deletecollection.
///
/// Go's apiserver, with the WatchList feature on, also *defaults* a watch from `""` or `"0"`
/// to `sendInitialEvents=true` (`SetListOptionsDefaults`); that is the handler's decision,
/// not done here.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListOptions {
    /// `labelSelector`; empty matches everything.
    pub label_selector: LabelSelector,
    /// `fieldSelector`, parsed but not yet checked against the fields a resource serves:
    /// call [`FieldSelector::check_supported`].
    pub field_selector: FieldSelector,
    /// `watch`.
    pub watch: bool,
    /// `allowWatchBookmarks`.
    pub allow_watch_bookmarks: bool,
    /// `resourceVersion`; `None` when absent or empty.
    pub resource_version: Option<String>,
    /// `resourceVersionMatch`.
    pub resource_version_match: Option<ResourceVersionMatch>,
    /// `timeoutSeconds`. `None` when absent or 0 (the server picks); a negative value is a
    /// zero timeout, which ends a watch at once, as in Go.
    pub timeout: Option<Duration>,
    /// `limit`, when positive (Go ignores 0 and negative limits).
    pub limit: Option<NonZeroU64>,
    /// `continue`; `None` when absent or empty.
    pub continue_token: Option<String>,
    /// `sendInitialEvents`.
    pub send_initial_events: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RawListOptions {
    label_selector: String,
    field_selector: String,
    watch: bool,
    allow_watch_bookmarks: bool,
    resource_version: String,
    resource_version_match: String,
    timeout_seconds: Option<i64>,
    limit: i64,
    #[serde(rename = "continue")]
    continue_: String,
    send_initial_events: Option<bool>,
}

/// `ParameterCodec.DecodeParameters` into the internal ListOptions: the query, then both
/// selectors, each failure a 400.
fn decode_list_options(
    query: &str,
) -> Result<(RawListOptions, LabelSelector, FieldSelector), ApiError> {
    let raw: RawListOptions = decode_query(query)?;
    let labels = LabelSelector::parse(&raw.label_selector)?;
    let fields = FieldSelector::parse(&raw.field_selector)?;
    Ok((raw, labels, fields))
}

/// What request info needs from a list's query: `watch` and the field selector, or the
/// decoding error that makes Go fall back to reading `watch` alone.
pub(crate) fn list_options_for_request_info(
    query: &str,
) -> Result<(bool, FieldSelector), ApiError> {
    decode_list_options(query).map(|(raw, _, fields)| (raw.watch, fields))
}

impl ListOptions {
    /// Refuses a streaming list (`sendInitialEvents`), with the error Go gives when the
    /// WatchList feature is off. A server that cannot send the initial-events-end bookmark
    /// must refuse: clients fall back to list-then-watch only on an error, and wait forever
    /// otherwise.
    pub fn forbid_send_initial_events(&self) -> Result<(), ApiError> {
        if self.watch && self.send_initial_events.is_some() {
            return invalid_options(
                "ListOptions",
                &[FieldError::forbidden(
                    "sendInitialEvents",
                    "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
                )],
            );
        }
        Ok(())
    }
}

/// `ValidateListOptions` (`apimachinery:pkg/apis/meta/internalversion/validation/validation.go`),
/// for a server with the WatchList feature.
fn validate_list_options(raw: &RawListOptions) -> Vec<FieldError> {
    const EXACT: &str = "Exact";
    const NOT_OLDER_THAN: &str = "NotOlderThan";
    let mut errors = Vec::new();
    let rvm = raw.resource_version_match.as_str();
    if raw.watch {
        if raw.send_initial_events.is_some() && rvm != NOT_OLDER_THAN {
            errors.push(FieldError::forbidden(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if !rvm.is_empty() {
            if raw.send_initial_events.is_none() {
                errors.push(FieldError::forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            if rvm != NOT_OLDER_THAN {
                errors.push(FieldError::not_supported(
                    "resourceVersionMatch",
                    rvm,
                    &[NOT_OLDER_THAN],
                ));
            }
            if !raw.continue_.is_empty() {
                errors.push(FieldError::forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
        }
        return errors;
    }
    if !rvm.is_empty() {
        if raw.resource_version.is_empty() {
            errors.push(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if !raw.continue_.is_empty() {
            errors.push(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
        if rvm != EXACT && rvm != NOT_OLDER_THAN {
            errors.push(FieldError::not_supported(
                "resourceVersionMatch",
                rvm,
                &[EXACT, NOT_OLDER_THAN, ""],
            ));
        }
        if rvm == EXACT && raw.resource_version == "0" {
            errors.push(FieldError::forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
    }
    if raw.send_initial_events.is_some() {
        errors.push(FieldError::forbidden(
            "sendInitialEvents",
            "sendInitialEvents is forbidden for list",
        ));
    }
    errors
}

impl QueryOptions for ListOptions {
    fn from_request(query: &str, _headers: &HeaderMap) -> Result<Self, ApiError> {
        let (raw, label_selector, field_selector) = decode_list_options(query)?;
        invalid_options("ListOptions", &validate_list_options(&raw))?;
        let non_empty = |s: String| (!s.is_empty()).then_some(s);
        Ok(ListOptions {
            label_selector,
            field_selector,
            watch: raw.watch,
            allow_watch_bookmarks: raw.allow_watch_bookmarks,
            resource_version_match: match raw.resource_version_match.as_str() {
                "Exact" => Some(ResourceVersionMatch::Exact),
                "NotOlderThan" => Some(ResourceVersionMatch::NotOlderThan),
                _ => None,
            },
            resource_version: non_empty(raw.resource_version),
            timeout: match raw.timeout_seconds {
                None | Some(0) => None,
                Some(seconds) => Some(Duration::from_secs(u64::try_from(seconds).unwrap_or(0))),
            },
            limit: u64::try_from(raw.limit).ok().and_then(NonZeroU64::new),
            continue_token: non_empty(raw.continue_),
            send_initial_events: raw.send_initial_events,
        })
    }
}

/// `fieldValidation`: what to do with unknown or duplicate fields in a body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them and say so in a `Warning` header (Go's default).
    #[default]
    Warn,
    /// Refuse the request (what kubectl sends).
    Strict,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RawWriteOptions {
    dry_run: Vec<String>,
    field_manager: String,
    field_validation: String,
    force: Option<bool>,
}

/// The checks shared by create, update and patch options, in Go's order.
fn validate_write_options(raw: &RawWriteOptions, errors: &mut Vec<FieldError>) {
    // `ValidateFieldManager`: at most 128 bytes, all printable.
    const FIELD_MANAGER_MAX_LENGTH: usize = 128;
    if raw.field_manager.len() > FIELD_MANAGER_MAX_LENGTH {
        errors.push(FieldError::too_long(
            "fieldManager",
            FIELD_MANAGER_MAX_LENGTH,
        ));
    }
    for (i, c) in raw
        .field_manager
        .char_indices()
        .filter(|(_, c)| !is_print(*c))
    {
        errors.push(FieldError::invalid(
            "fieldManager",
            raw.field_manager.as_str(),
            format!("invalid character U+{:04X} (at position {i})", u32::from(c)),
        ));
    }
    errors.extend(validate_dry_run(&raw.dry_run));
    if !matches!(
        raw.field_validation.as_str(),
        "" | "Ignore" | "Warn" | "Strict"
    ) {
        errors.push(FieldError::not_supported(
            "fieldValidation",
            raw.field_validation.as_str(),
            &["", "Ignore", "Strict", "Warn"],
        ));
    }
}

/// `ValidateDryRun`: `All` is the only dry-run mode.
fn validate_dry_run(dry_run: &[String]) -> Option<FieldError> {
    dry_run
        .iter()
        .any(|v| v != "All")
        .then(|| FieldError::not_supported("dryRun", dry_run.to_vec(), &["All"]))
}

fn field_validation(raw: &str) -> FieldValidation {
    match raw {
        "Ignore" => FieldValidation::Ignore,
        "Strict" => FieldValidation::Strict,
        _ => FieldValidation::Warn,
    }
}

/// `CreateOptions`, for POST.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CreateOptions {
    /// `dryRun=All`: validate, persist nothing, cause no side effects.
    pub dry_run: bool,
    /// `fieldManager`, when given.
    pub field_manager: Option<String>,
    /// `fieldValidation`, `Warn` when not given.
    pub field_validation: FieldValidation,
}

/// `UpdateOptions`, for PUT.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpdateOptions {
    /// `dryRun=All`.
    pub dry_run: bool,
    /// `fieldManager`, when given.
    pub field_manager: Option<String>,
    /// `fieldValidation`, `Warn` when not given.
    pub field_validation: FieldValidation,
}

/// Decodes and validates the options of a create or update, as `kind`.
fn write_options(
    query: &str,
    kind: &str,
) -> Result<(bool, Option<String>, FieldValidation), ApiError> {
    let raw: RawWriteOptions = decode_query(query)?;
    let mut errors = Vec::new();
    validate_write_options(&raw, &mut errors);
    invalid_options(kind, &errors)?;
    let manager = (!raw.field_manager.is_empty()).then_some(raw.field_manager);
    Ok((
        !raw.dry_run.is_empty(),
        manager,
        field_validation(&raw.field_validation),
    ))
}

impl QueryOptions for CreateOptions {
    fn from_request(query: &str, _headers: &HeaderMap) -> Result<Self, ApiError> {
        let (dry_run, field_manager, field_validation) = write_options(query, "CreateOptions")?;
        Ok(CreateOptions {
            dry_run,
            field_manager,
            field_validation,
        })
    }
}

impl QueryOptions for UpdateOptions {
    fn from_request(query: &str, _headers: &HeaderMap) -> Result<Self, ApiError> {
        let (dry_run, field_manager, field_validation) = write_options(query, "UpdateOptions")?;
        Ok(UpdateOptions {
            dry_run,
            field_manager,
            field_validation,
        })
    }
}

/// `PatchOptions`, for PATCH, with the patch type from `Content-Type`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatchOptions {
    /// How to apply the body.
    pub patch_type: PatchType,
    /// `dryRun=All`.
    pub dry_run: bool,
    /// `fieldManager`; always present for an apply patch.
    pub field_manager: Option<String>,
    /// `fieldValidation`, `Warn` when not given.
    pub field_validation: FieldValidation,
    /// `force`: take over conflicting fields in an apply patch.
    pub force: bool,
}

impl QueryOptions for PatchOptions {
    /// Go's order: an unknown patch type is a 415 before the query is read.
    fn from_request(query: &str, headers: &HeaderMap) -> Result<Self, ApiError> {
        Self::from_request_among(query, headers, PATCH_TYPES)
    }
}

impl PatchOptions {
    /// As [`QueryOptions::from_request`], for an endpoint that accepts the patch types
    /// `accepted` (the `scale` subresource takes strategic merge patches).
    pub fn from_request_among(
        query: &str,
        headers: &HeaderMap,
        accepted: &[PatchType],
    ) -> Result<Self, ApiError> {
        let patch_type = PatchType::from_headers_among(headers, accepted)?;
        let raw: RawWriteOptions = decode_query(query)?;
        // `ValidatePatchOptions`.
        let mut errors = Vec::new();
        if patch_type == PatchType::Apply {
            if raw.field_manager.is_empty() {
                errors.push(FieldError::required(
                    "fieldManager",
                    "is required for apply patch",
                ));
            }
        } else if raw.force.is_some() {
            errors.push(FieldError::forbidden(
                "force",
                "may not be specified for non-apply patch",
            ));
        }
        validate_write_options(&raw, &mut errors);
        invalid_options("PatchOptions", &errors)?;
        Ok(PatchOptions {
            patch_type,
            dry_run: !raw.dry_run.is_empty(),
            field_manager: (!raw.field_manager.is_empty()).then_some(raw.field_manager),
            field_validation: field_validation(&raw.field_validation),
            force: raw.force.unwrap_or(false),
        })
    }
}

/// `propagationPolicy`: what happens to the dependents of a deleted object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PropagationPolicy {
    /// Leave the dependents (finalizer `orphan`).
    Orphan,
    /// Delete the object now, its dependents in the background.
    Background,
    /// Delete the dependents first (finalizer `foregroundDeletion`).
    Foreground,
}

/// `DeleteOptions`, for DELETE and deletecollection: from the body when there is one
/// (what kubectl sends), else from the query, never merged, as in Go's `DeleteResource`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeleteOptions {
    /// `dryRun=All`.
    pub dry_run: bool,
    /// `gracePeriodSeconds`.
    pub grace_period_seconds: Option<i64>,
    /// `preconditions` (body only): delete only if uid and resourceVersion still match,
    /// else 409 Conflict.
    pub preconditions: Option<meta::Preconditions>,
    /// `propagationPolicy`.
    pub propagation_policy: Option<PropagationPolicy>,
    /// The deprecated `orphanDependents`; `false` is what makes Go answer 202 for a delete
    /// that did not finish.
    pub orphan_dependents: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RawDeleteQuery {
    grace_period_seconds: Option<i64>,
    orphan_dependents: Option<bool>,
    propagation_policy: Option<String>,
    dry_run: Vec<String>,
}

impl DeleteOptions {
    /// Reads the options from `body` (JSON or YAML, by `Content-Type`; a 415 otherwise)
    /// when it is not empty, else from `query`, then applies `ValidateDeleteOptions`.
    pub fn from_request(query: &str, headers: &HeaderMap, body: &[u8]) -> Result<Self, ApiError> {
        let options: meta::DeleteOptions = if body.is_empty() {
            let raw: RawDeleteQuery = decode_query(query)?;
            meta::DeleteOptions {
                grace_period_seconds: raw.grace_period_seconds,
                orphan_dependents: raw.orphan_dependents,
                propagation_policy: raw.propagation_policy,
                dry_run: (!raw.dry_run.is_empty()).then_some(raw.dry_run),
                ..Default::default()
            }
        } else {
            let options: meta::DeleteOptions = body_format(headers)?.decode(body)?;
            // Any group's `DeleteOptions` is accepted, for old clients; another kind is not.
            if options
                .kind
                .as_deref()
                .is_some_and(|kind| kind != "DeleteOptions")
            {
                return Err(ApiError::bad_request(
                    "decoded object cannot be converted to DeleteOptions",
                ));
            }
            options
        };

        let mut errors = Vec::new();
        if options.orphan_dependents.is_some()
            && let Some(policy) = &options.propagation_policy
        {
            errors.push(FieldError::invalid(
                "propagationPolicy",
                policy.as_str(),
                "orphanDependents and deletionPropagation cannot be both set",
            ));
        }
        let propagation_policy = match options.propagation_policy.as_deref() {
            None => None,
            Some("Orphan") => Some(PropagationPolicy::Orphan),
            Some("Background") => Some(PropagationPolicy::Background),
            Some("Foreground") => Some(PropagationPolicy::Foreground),
            Some(other) => {
                errors.push(FieldError::not_supported(
                    "propagationPolicy",
                    other,
                    &["Foreground", "Background", "Orphan", "nil"],
                ));
                None
            }
        };
        let dry_run = options.dry_run.unwrap_or_default();
        errors.extend(validate_dry_run(&dry_run));
        invalid_options("DeleteOptions", &errors)?;
        Ok(DeleteOptions {
            dry_run: !dry_run.is_empty(),
            grace_period_seconds: options.grace_period_seconds,
            preconditions: options.preconditions,
            propagation_policy,
            orphan_dependents: options.orphan_dependents,
        })
    }
}

/// `TableOptions`, read only when a Table was negotiated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TableOptions {
    /// `includeObject`.
    pub include_object: IncludeObject,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct RawTableOptions {
    include_object: String,
}

impl QueryOptions for TableOptions {
    /// `optionsForTransform`: a bad `includeObject` is a 400, not a 422.
    fn from_request(query: &str, _headers: &HeaderMap) -> Result<Self, ApiError> {
        let raw: RawTableOptions = decode_query(query)?;
        let include_object = match raw.include_object.as_str() {
            "" | "Metadata" => IncludeObject::Metadata,
            "None" => IncludeObject::None,
            "Object" => IncludeObject::Object,
            other => {
                let error = FieldError::invalid(
                    "includeObject",
                    other,
                    "must be 'Metadata', 'Object', 'None', or empty",
                );
                return Err(ApiError::bad_request(format!(
                    "Unable to convert to Table as requested: {error}"
                )));
            }
        };
        Ok(TableOptions { include_object })
    }
}

#[cfg(test)]
mod tests;
