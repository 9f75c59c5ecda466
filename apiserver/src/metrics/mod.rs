//! `/metrics`: what the server does, in OpenMetrics text through `prometheus-client`, one
//! [`Registry`] per server (a global one would be shared by every server in a test
//! process). `docs/metrics.md` lists every series. It sits below everything that counts —
//! the HTTP layers, the battery client, the storages — so none of them imports upwards.
//!
//! Every label value comes from a fixed set — the resource table's names, the API verbs,
//! HTTP codes, the outcome enums here — or names an object the caller was authorized to
//! create (a Pool), so no request can add series: an unknown resource or verb is `other`.
//! This reproduces what `apiserver:pkg/endpoints/metrics/metrics.go` `CleanVerb` and
//! `cleanResource` guard against.

mod layer;
mod registry;

pub use layer::{Observer, observe};
pub use registry::{BatteryOutcome, BindOutcome, CONTENT_TYPE, Metrics, PoolCounts};
