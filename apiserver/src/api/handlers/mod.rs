//! The generic verbs over any [`Storage`](super::storage::Storage), one file per verb as
//! `apiserver:pkg/endpoints/handlers/{get,create,update,patch,delete}.go`; what they
//! share is in `shared.rs`, below them.

mod create;
mod delete;
mod get;
mod list;
mod patch;
mod shared;
mod update;

// Re-exported for the subresources' patch path.
pub(super) use battery_api_machinery::patch::{apply_patch, patch_precondition};

pub use create::create;
pub(super) use create::create_object;
pub use delete::{delete, delete_collection};
pub use get::get;
pub use list::{list, matches, select};
pub use patch::patch;
pub use shared::Write;
pub(super) use shared::{Manager, decode_object, info, unknown_fields};
pub(super) use update::replace;
pub use update::update;
