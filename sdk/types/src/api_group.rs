//! The group and version every kind here belongs to: below the kinds and the resource
//! table, which both name them.

/// The API group of every kind here.
pub const GROUP: &str = "battery.liquidmetal-x.dev";
/// The API version of every kind here.
pub const VERSION: &str = "v1alpha1";
/// `<GROUP>/<VERSION>`, the kinds' `apiVersion`.
pub const API_VERSION: &str = "battery.liquidmetal-x.dev/v1alpha1";
