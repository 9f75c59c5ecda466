//! The server's clock, as Kubernetes records it: below everything that stamps an object.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// "Now" as Kubernetes records it in metadata: seconds precision.
pub fn server_now() -> Time {
    in_seconds(Timestamp::now())
}

/// `at` as Kubernetes records a `Time`: seconds precision.
pub fn in_seconds(at: Timestamp) -> Time {
    Time(Timestamp::from_second(at.as_second()).unwrap_or(at))
}
