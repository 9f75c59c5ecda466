//! Waiting on conditions with deadlines, never on fixed sleeps.

use std::time::Duration;

use tokio::time::{Instant, timeout_at};

/// How often conditions are re-checked.
const POLL: Duration = Duration::from_millis(25);

/// Re-runs `check` until it returns `Ok`, and returns that value. At the deadline it
/// panics with `what` and the last reason `check` gave.
pub async fn eventually<T>(
    timeout: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let why = match timeout_at(deadline, check()).await {
            Ok(Ok(value)) => return value,
            Ok(Err(why)) => why,
            Err(_) => "the last check (an RPC) got no answer before the deadline".to_owned(),
        };
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}; last: {why}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Checks `check` repeatedly for `window` and panics the first time it fails: for
/// asserting that something does *not* happen (no provisioning, no scale-down).
pub async fn consistently(
    window: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> Result<(), String>,
) {
    let end = Instant::now() + window;
    loop {
        if let Err(why) = check().await {
            panic!("expected {what} to hold for {window:?}, but: {why}");
        }
        if Instant::now() >= end {
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}
