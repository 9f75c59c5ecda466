//! How the embedded battery fails: at start, and in a call, as battery answers a failure
//! of its own.

use std::fmt::Display;

use tonic::Status;

use super::store::StoreError;

/// Why the embedded battery could not start.
#[derive(Debug, thiserror::Error)]
pub enum BatteryError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("reading the listener's address: {0}")]
    Listener(#[source] std::io::Error),
    #[error("building gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("setting up the gRPC port's TLS")]
    Tls(#[source] tonic::transport::Error),
}

/// A store failure (or any internal failure) as battery answers it: INTERNAL.
pub(crate) fn internal(err: impl Display) -> Status {
    Status::internal(err.to_string())
}
