//! The battery boundary: the only module that knows gRPC. Its client hands the rest of
//! the server typed answers ([`BatteryPool`], [`Lease`], [`BatteryHost`], [`BatteryEvent`])
//! and one typed error ([`BatteryError`], whose [`Failure`] says what battery decided);
//! `objects` turns battery's answers into Kubernetes objects. Only this module imports
//! `battery-proto` or `tonic`.

mod channel;
mod client;
mod convert;
mod errors;
mod events;
pub mod objects;

pub use channel::{BatteryEndpoint, ChannelError, Security, TlsSettings};
pub use client::{
    BatteryClient, BatteryHost, BatteryPool, CLAIM_TIMEOUT, DELETE_POOL_TIMEOUT, Lease, LeaseId,
    LeaseInfo,
};
pub use errors::{BatteryError, Failure, RETRY_AFTER_SECONDS, Rpc};
pub use events::{BatteryEvent, EventKind};
