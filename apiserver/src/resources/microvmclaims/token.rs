//! What the claims' ServiceAccount tokens share below the storage (ADR 43): when a token
//! is replaced, and the rotation task of each claim that has one.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

/// The longest a token is used before it is replaced, as the kubelet's token manager.
const MAX_AGE: Duration = Duration::from_secs(24 * 60 * 60);
/// For the end-to-end tests only, which cannot wait 8 of a token's 10 minutes: a token is
/// also replaced once it is this many seconds old.
pub const REFRESH_AFTER_ENV: &str = "BATTERY_APISERVER_TOKEN_REFRESH_AFTER_SECONDS";

fn refresh_after_override() -> Option<Duration> {
    static AFTER: OnceLock<Option<Duration>> = OnceLock::new();
    *AFTER.get_or_init(|| {
        let after = std::env::var(REFRESH_AFTER_ENV).ok()?.parse().ok()?;
        tracing::warn!(
            seconds = after,
            "{REFRESH_AFTER_ENV} is set: claims' tokens are replaced that often (a test setting)"
        );
        Some(Duration::from_secs(after))
    })
}

/// When a token that expires at `expires`, issued for `lifetime_seconds`, is replaced: at
/// 80% of its lifetime or once it is 24 hours old, whichever comes first, as the kubelet
/// replaces a Pod's (`pkg/kubelet/token`); sooner when `after` says so.
pub(super) fn refresh_at(
    expires: Timestamp,
    lifetime_seconds: i64,
    after: Option<Duration>,
) -> Timestamp {
    let issued = expires.as_second().saturating_sub(lifetime_seconds);
    let mut age = (lifetime_seconds.saturating_mul(8) / 10).min(secs(MAX_AGE));
    if let Some(after) = after {
        age = age.min(secs(after));
    }
    Timestamp::from_second(issued.saturating_add(age)).unwrap_or(expires)
}

/// [`refresh_at`] with the test setting, if any.
pub(super) fn refresh_time(expires: Timestamp, lifetime_seconds: i64) -> Timestamp {
    refresh_at(expires, lifetime_seconds, refresh_after_override())
}

fn secs(duration: Duration) -> i64 {
    i64::try_from(duration.as_secs()).unwrap_or(i64::MAX)
}

/// The rotation task of each claim that has a token, by claim uid.
#[derive(Default)]
pub(super) struct Rotations(Mutex<HashMap<String, tokio::task::AbortHandle>>);

impl Rotations {
    /// Keeps `task` as the claim's rotation, ending one it had.
    pub(super) fn insert(&self, uid: &str, task: tokio::task::AbortHandle) {
        let previous = self.lock().insert(uid.to_owned(), task);
        if let Some(previous) = previous {
            previous.abort();
        }
    }

    /// Ends the claim's rotation.
    pub(super) fn end(&self, uid: &str) {
        if let Some(task) = self.lock().remove(uid) {
            task.abort();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, tokio::task::AbortHandle>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    #[test]
    fn a_token_is_replaced_at_80_percent_of_its_life_or_after_a_day() {
        // An hour's token issued at 1000 s: at 48 minutes.
        assert_eq!(refresh_at(at(1000 + 3600), 3600, None), at(1000 + 2880));
        // A week's token: after 24 hours.
        let week = 7 * 24 * 3600;
        assert_eq!(refresh_at(at(1000 + week), week, None), at(1000 + 86_400));
        // The test setting only ever brings it forward.
        let after = Some(Duration::from_secs(5));
        assert_eq!(refresh_at(at(1000 + 600), 600, after), at(1005));
        let late = Some(Duration::from_secs(10_000));
        assert_eq!(refresh_at(at(1000 + 600), 600, late), at(1480));
    }
}
