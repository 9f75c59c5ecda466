//! Why the documents could not be built: defects in the static inputs, below every part
//! that finds one.

/// Why the documents could not be built from the resource table and kind schemas. Each is
/// a defect in those static inputs, found at startup.
#[derive(Debug, thiserror::Error)]
pub enum OpenApiError {
    /// A kind's schema uses a construct that OpenAPI 3.0 (or a structural schema) lacks.
    #[error(
        "the schema of kind {kind} cannot be published as OpenAPI 3.0: at {pointer}: {problem}"
    )]
    UnsupportedKindSchema {
        /// The kind.
        kind: String,
        /// JSON pointer of the offending subschema, as a URI fragment.
        pointer: String,
        /// What is wrong there.
        problem: String,
    },
    /// A subresource returns a kind that is neither served here nor a known foreign kind.
    #[error("subresource {subresource} returns {kind}, for which there is no schema")]
    UnknownSubresourceKind {
        /// `<plural>/<subresource>`.
        subresource: String,
        /// `<group>/<version> <kind>`.
        kind: String,
    },
    /// A resource of another group-version was given.
    #[error("resource {resource} is in {group_version}, not in {expected}")]
    ForeignResource {
        /// The plural resource name.
        resource: String,
        /// Its group-version.
        group_version: String,
        /// The group-version being documented.
        expected: String,
    },
}
