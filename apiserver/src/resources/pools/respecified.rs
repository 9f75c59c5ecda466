//! When we changed each Pool's spec in battery or deleted it: battery then cancels the
//! Pool's MicroVMs still booting and reports each as a failed hook, with nothing to tell
//! it from a hook of the user's failing, so the follower asks here.
//!
//! A change is kept as the span of its call, from just before we sent it until battery
//! answered (open while it runs): battery acts on it somewhere inside, so a MicroVM that
//! started booting before the span ended and failed after it began may be its doing.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::SystemTime;

/// The changes of a Pool remembered: more than arrive while one boot runs, since the
/// follower may read a cancellation after the changes that followed it.
const KEPT: usize = 32;

/// A change's span: when its call began, and when battery answered, once it has.
type Span = (SystemTime, Option<SystemTime>);

/// The spans of each Pool's latest changes, by (namespace, name).
#[derive(Default)]
pub(super) struct Respecifications(Mutex<HashMap<(String, String), VecDeque<Span>>>);

impl Respecifications {
    /// Notes that a change of the Pool is being sent now; returns its start, for
    /// [`Self::answered`].
    pub(super) fn sending(&self, namespace: &str, name: &str) -> SystemTime {
        let started = SystemTime::now();
        let mut pools = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let spans = pools
            .entry((namespace.to_owned(), name.to_owned()))
            .or_default();
        if spans.len() == KEPT {
            spans.pop_front();
        }
        spans.push_back((started, None));
        started
    }

    /// Notes that battery answered the change that began at `started`, however it did.
    pub(super) fn answered(&self, namespace: &str, name: &str, started: SystemTime) {
        let mut pools = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let span = pools
            .get_mut(&(namespace.to_owned(), name.to_owned()))
            .and_then(|spans| spans.iter_mut().find(|(start, _)| *start == started));
        if let Some((_, ended)) = span {
            *ended = Some(SystemTime::now());
        }
    }

    /// Whether one of our changes may have cancelled a MicroVM of the Pool that started
    /// booting at `booted` and failed at `failed`.
    pub(super) fn cancelled(
        &self,
        namespace: &str,
        name: &str,
        booted: SystemTime,
        failed: SystemTime,
    ) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&(namespace.to_owned(), name.to_owned()))
            .is_some_and(|spans| {
                spans.iter().any(|(started, ended)| {
                    booted <= ended.unwrap_or_else(SystemTime::now) && *started <= failed
                })
            })
    }

    /// Forgets a Pool that is gone.
    pub(super) fn forget(&self, namespace: &str, name: &str) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(namespace.to_owned(), name.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_boot_that_began_while_battery_took_the_change_is_ours_to_have_cancelled() {
        let changes = Respecifications::default();
        let started = changes.sending("ns", "pool");
        // The old reconciler started one more boot before battery acted on the change.
        let (booted, failed) = (SystemTime::now(), SystemTime::now());
        assert!(
            changes.cancelled("ns", "pool", booted, failed),
            "while the call runs"
        );
        changes.answered("ns", "pool", started);
        assert!(
            changes.cancelled("ns", "pool", booted, failed),
            "once answered too"
        );
    }

    #[test]
    fn a_boot_outside_every_change_is_the_hooks_own_failure() {
        let changes = Respecifications::default();
        let started = changes.sending("ns", "pool");
        changes.answered("ns", "pool", started);
        let after = SystemTime::now() + Duration::from_secs(1);
        assert!(
            !changes.cancelled("ns", "pool", after, after + Duration::from_secs(1)),
            "booted after the change was answered"
        );
        let before = started - Duration::from_secs(2);
        assert!(
            !changes.cancelled("ns", "pool", before, before + Duration::from_secs(1)),
            "failed before the change began"
        );
        assert!(
            !changes.cancelled("ns", "other", before, after),
            "another Pool"
        );
        changes.forget("ns", "pool");
        assert!(
            !changes.cancelled("ns", "pool", started, after),
            "forgotten"
        );
    }

    #[test]
    fn only_the_latest_changes_are_kept() {
        let changes = Respecifications::default();
        for _ in 0..=KEPT {
            let started = changes.sending("ns", "pool");
            changes.answered("ns", "pool", started);
        }
        let pools = changes.0.lock().unwrap();
        assert_eq!(pools[&("ns".to_owned(), "pool".to_owned())].len(), KEPT);
    }
}
