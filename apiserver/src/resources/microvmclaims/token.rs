//! What the claims' ServiceAccount tokens share below the storage (ADR 43): when a token
//! is replaced, the rotation task of each claim that has one, and what the claim's Event
//! says when replacing keeps failing.

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

/// Tries in a row that fail to replace a claim's token before its claim gets a Warning
/// Event: one failure is retried within a second, so only a lasting cause is told.
pub(super) const FAILURES_BEFORE_EVENT: u32 = 3;
/// The reason of the Warning Event on a claim whose token cannot be replaced.
pub(super) const ROTATION_FAILING: &str = "TokenRotationFailing";
/// The reason of the Normal Event on such a claim once its token is replaced again.
pub(super) const ROTATED: &str = "TokenRotated";
/// The most of a cause an Event carries.
const CAUSE_CHARS: usize = 512;

/// Why a claim's token could not be replaced, by the step that failed, so that the
/// claim's Event says what to do. Causes are kube-apiserver's or the guest's words; the
/// guest's never carry the token being written (`without`).
#[derive(Debug)]
pub(super) enum RotationFailure {
    /// The claim's record could not be read: the server's own trouble.
    Record(String),
    /// The cluster refused the token, or could not be asked.
    Request { account: String, why: String },
    /// The token could not be written into the guest.
    Write(String),
}

impl std::fmt::Display for RotationFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Record(why) => write!(f, "reading the claim's record: {why}"),
            Self::Request { account, why } => {
                write!(f, "requesting a token of ServiceAccount {account}: {why}")
            }
            Self::Write(why) => write!(f, "writing it into the MicroVM: {why}"),
        }
    }
}

/// `text` with every copy of `secret` taken out, for a cause the guest wrote.
pub(super) fn without(text: &str, secret: &str) -> String {
    if secret.is_empty() {
        return text.to_owned();
    }
    text.replace(secret, "[REDACTED]")
}

/// What the Warning Event says of a claim in `namespace` whose token `tries` tries in a
/// row failed to replace, the last for `failure`; `expires` is when the token in the
/// guest expires, if known (sooner, if its ServiceAccount is gone).
pub(super) fn failing_message(
    namespace: &str,
    failure: &RotationFailure,
    tries: u32,
    expires: Option<Timestamp>,
) -> String {
    let mut cause = failure.to_string();
    if let Some((cut, _)) = cause.char_indices().nth(CAUSE_CHARS) {
        cause.truncate(cut);
        cause.push('…');
    }
    let until = expires.map_or_else(
        || "the token in the MicroVM expires within its expirationSeconds".to_owned(),
        |at| format!("the token in the MicroVM expires at {at}"),
    );
    let fix = match failure {
        RotationFailure::Record(_) => "see the API server's log".to_owned(),
        RotationFailure::Request { account, .. } => format!(
            "check that ServiceAccount {account} exists (`kubectl get serviceaccount {account} \
             -n {namespace}`) and that the API server may request its tokens"
        ),
        RotationFailure::Write(_) => "check the claim's HostReady condition, and that the \
             guest can write /var/run/secrets/kubernetes.io/serviceaccount"
            .to_owned(),
    };
    format!(
        "cannot replace the ServiceAccount token in the MicroVM ({tries} tries in a row): \
         {cause}; {until}. The server keeps trying: {fix}, or release the claim and claim \
         again"
    )
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
    fn the_failing_event_says_what_failed_when_the_token_stops_and_what_to_do() {
        let gone = RotationFailure::Request {
            account: "runner".to_owned(),
            why: "serviceaccounts \"runner\" not found".to_owned(),
        };
        assert_eq!(
            failing_message("ci", &gone, 3, Some(at(1_800_000_000))),
            "cannot replace the ServiceAccount token in the MicroVM (3 tries in a row): \
             requesting a token of ServiceAccount runner: serviceaccounts \"runner\" not \
             found; the token in the MicroVM expires at 2027-01-15T08:00:00Z. The \
             server keeps trying: check that ServiceAccount runner exists (`kubectl get \
             serviceaccount runner -n ci`) and that the API server may request its tokens, \
             or release the claim and claim again"
        );
        // A guest's words never carry the token being written, and a long cause is cut.
        let said = format!("tar: {} {}", "eyJ.secret", "x".repeat(2000));
        let write = RotationFailure::Write(without(&said, "eyJ.secret"));
        let message = failing_message("ci", &write, 3, None);
        assert!(!message.contains("eyJ.secret"), "{message}");
        assert!(
            message.contains("[REDACTED]") && message.len() < 1024,
            "{message}"
        );
        assert!(message.contains("HostReady") && message.contains("within its expirationSeconds"));
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
