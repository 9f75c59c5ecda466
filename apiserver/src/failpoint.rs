//! Crash points for the fault-injection tests: when `BATTERY_APISERVER_CRASH_AT` names
//! a point, the process aborts there, exactly as a kill at that instant would stop it.
//! Unset (always, outside those tests) it costs one comparison.

use std::sync::OnceLock;

/// The environment variable that names the crash point.
pub const CRASH_AT: &str = "BATTERY_APISERVER_CRASH_AT";

/// Every point, in the order a bind, release or pool deletion passes them, then the
/// metadata store's: a commit that changes a claim, after its record is written to the
/// log (by its sync, ADR 52), after the log's sync (before anyone is answered, but a
/// pending bind's claim, ADR 48),
/// and a checkpoint between redb's durable commit and the log's truncation (ADR 39).
pub const POINTS: &[&str] = &[
    "bind:pending",
    "bind:claimed",
    "release:released",
    "pool-delete:deleted",
    "commit:logged",
    "commit:synced",
    "commit:checkpointed",
];

fn armed() -> Option<&'static str> {
    static ARMED: OnceLock<Option<String>> = OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var(CRASH_AT).ok())
        .as_deref()
}

/// Aborts the process if `point` is the armed crash point.
pub fn crash_point(point: &'static str) {
    debug_assert!(POINTS.contains(&point), "unknown crash point {point}");
    if armed() == Some(point) {
        eprintln!("battery-apiserver: crashing at {point} ({CRASH_AT})");
        std::process::abort();
    }
}
