//! The embedded battery: an in-process implementation of battery's gRPC API
//! (`poolmgr.v1alpha1` PoolAdmin, Lease, Events, HostAdmin, plus gRPC health and
//! reflection), faithful to `reference/battery-api.md`, with simulated flintlock Hosts.
//!
//! It is a **simulation** for development and tests, never isolation: a simulated
//! Host "boots" a MicroVM by making a scratch directory and runs its exec'd commands
//! as local processes of the calling user.

mod battery;
pub mod local;
pub mod simhost;

pub use battery::{ApiSecurity, BatteryConfig, BatteryError, EmbeddedBattery, ServerTls};
