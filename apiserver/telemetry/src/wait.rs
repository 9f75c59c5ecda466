//! Waiting on conditions with deadlines, never on fixed sleeps: a test states how long a
//! condition may take, not how long it takes.

use std::fmt::Display;
use std::time::Duration;

use tokio::time::{Instant, timeout_at};

/// How often conditions are re-checked.
const POLL: Duration = Duration::from_millis(25);

/// What a check answers: whether it holds yet, with the value it found, or why not.
pub trait Check {
    /// What the check yields once it holds.
    type Value;
    /// The value, or (for the timeout's message) why the check does not hold yet.
    fn outcome(self) -> Result<Self::Value, String>;
}

impl Check for bool {
    type Value = ();
    fn outcome(self) -> Result<(), String> {
        if self {
            Ok(())
        } else {
            Err("not yet".to_owned())
        }
    }
}

impl<T> Check for Option<T> {
    type Value = T;
    fn outcome(self) -> Result<T, String> {
        self.ok_or_else(|| "nothing yet".to_owned())
    }
}

impl<T, E: Display> Check for Result<T, E> {
    type Value = T;
    fn outcome(self) -> Result<T, String> {
        self.map_err(|why| why.to_string())
    }
}

/// Re-runs `check` until it holds (`true`, `Some`, `Ok`), and returns what it found. A
/// check that hangs (an RPC with no answer) is cut off at the deadline. At `within` it
/// panics with `what` and the last reason `check` gave.
pub async fn eventually<C: Check>(
    within: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> C,
) -> C::Value {
    let deadline = Instant::now() + within;
    let bounded = async || match timeout_at(deadline, check()).await {
        Ok(outcome) => outcome.outcome(),
        Err(_) => Err("the last check got no answer before the deadline".to_owned()),
    };
    retry(within, bounded)
        .await
        .unwrap_or_else(|why| panic!("timed out after {within:?} waiting for {what}; last: {why}"))
}

/// Re-runs `attempt` until it succeeds, and returns its value; after `within`, its last
/// error. For harnesses that report a timeout as an error rather than fail a test.
pub async fn retry<T, E>(
    within: Duration,
    mut attempt: impl AsyncFnMut() -> Result<T, E>,
) -> Result<T, E> {
    let deadline = Instant::now() + within;
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(error) if Instant::now() >= deadline => return Err(error),
            Err(_) => tokio::time::sleep(POLL).await,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_what_the_check_found() {
        let mut calls = 0;
        let found = eventually(Duration::from_secs(10), "the third call", async || {
            calls += 1;
            (calls == 3).then_some(calls)
        })
        .await;
        assert_eq!(found, 3);
    }

    #[tokio::test]
    #[should_panic(expected = "waiting for never; last: not yet")]
    async fn panics_at_the_deadline_naming_what() {
        eventually(Duration::from_millis(50), "never", async || false).await;
    }

    #[tokio::test]
    async fn retry_gives_the_last_error() {
        let mut calls = 0;
        let last = retry(Duration::from_millis(50), async || {
            calls += 1;
            Err::<(), _>(calls)
        })
        .await;
        assert_eq!(last, Err(calls));
    }
}
