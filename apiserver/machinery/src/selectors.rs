//! `labelSelector` and `fieldSelector`: parsers, printers and matchers with the grammar,
//! validation and error messages of `apimachinery:pkg/labels/selector.go` and
//! `apimachinery:pkg/fields/selector.go`.
//!
//! Both parsers face the raw query of any caller, so they never panic, never recurse and
//! run in time linear in their input (plus the sort Go also does). Label keys and values
//! are checked by the same apimachinery validators that check object labels
//! (`battery_types::validation`).

mod field;
mod label;

pub use field::{FieldOperator, FieldSelector, FieldTerm};
pub use label::{LabelSelector, Operator, Requirement};
