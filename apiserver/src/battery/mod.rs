//! Everything that speaks to battery: the gRPC client, the mapping of battery's status
//! codes to Kubernetes `Status` errors, and the conversion of specs both ways. Only this
//! module imports `battery-proto`.

mod client;
mod convert;
mod errors;
mod events;

pub use client::{
    BatteryClient, BatteryHost, BatteryPool, CLAIM_TIMEOUT, Lease, LeaseId, LeaseInfo,
};
pub use errors::{RETRY_AFTER_SECONDS, to_api_error};
pub use events::{BatteryEvent, EventKind};
