//! The server's clock, as Kubernetes records it: below everything that stamps an object.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// "Now" as Kubernetes records it in metadata: seconds precision.
pub fn server_now() -> Time {
    let now = Timestamp::now();
    Time(Timestamp::from_second(now.as_second()).unwrap_or(now))
}
