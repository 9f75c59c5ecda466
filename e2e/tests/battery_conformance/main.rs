//! battery conformance suite: checks battery's gRPC API (reference/battery-api.md §3 and
//! §4) against the embedded battery (default, one per test) or an external poolmgrd
//! (`BATTERY_CONFORMANCE_ADDRESS`). See `e2e/README.md`.

mod deletion;
mod events;
mod hooks;
mod hosts;
mod inflight;
mod leases;
mod pools;
mod races;
mod replenish;
mod restart;
