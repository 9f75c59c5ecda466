//! What counts as use of a claim, for its idle timeout: every exec session (a command, a
//! terminal, a file copy, which runs as one) and port-forward holds the claim busy for
//! as long as it is open, and its start and end are the claim's latest activity.
//! Renewing the lease is not use. Whatever else keeps a claim in use (a background
//! process running in it, `processes/index.rs`) takes a [`ActivityHold`] for its life,
//! or calls [`ClaimActivity::touch`] for something that is over at once.
//!
//! This is the live view, in memory; the limits' enforcer (`limits.rs`) writes it to
//! the store (`ActivityRecord`) so a restart neither forgets it nor counts a session cut
//! by the restart as idleness.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::meta_store::Key;

/// Where a claim's last activity is kept: beside its record, not in it, so writing it
/// makes no new resourceVersion and no watch event.
const RESOURCE: &str = "microvmclaimactivity";

/// The key of the activity record of the claim `namespace/name`.
pub(super) fn key(namespace: &str, name: &str) -> Key {
    Key::new(RESOURCE, Some(namespace), name)
}

/// What the store keeps of a claim's activity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct ActivityRecord {
    /// When it was last used.
    pub(super) last: MicroTime,
    /// Whether something held it busy when this was written: after a restart, which ended
    /// that, the claim counts as used at the restart.
    pub(super) busy: bool,
}

#[derive(Debug)]
struct Entry {
    /// Sessions and running background processes holding the claim busy now.
    holds: usize,
    /// When it was last used: the latest start or end of a hold, or a touch.
    last: Timestamp,
    /// Whether it changed since the store was last told.
    unsaved: bool,
}

/// The claims' activity, by claim uid.
#[derive(Debug, Default)]
pub struct ClaimActivity {
    claims: Mutex<HashMap<String, Entry>>,
}

/// Holds a claim busy until dropped; its start and its end are activity.
pub struct ActivityHold {
    activity: Arc<ClaimActivity>,
    uid: String,
}

/// Whether a claim is in use, and if not since when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Use {
    Busy,
    IdleSince(Timestamp),
    /// Nothing is known of it: no activity and no baseline.
    Unknown,
}

impl ClaimActivity {
    fn claims(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // Each operation leaves the map consistent, so a panic elsewhere harms nothing.
        self.claims.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds the claim `uid` busy until the hold drops.
    pub fn hold(self: &Arc<Self>, uid: &str) -> ActivityHold {
        self.used(uid, 1);
        ActivityHold {
            activity: self.clone(),
            uid: uid.to_owned(),
        }
    }

    /// Records a use of the claim `uid` that is over at once.
    pub fn touch(&self, uid: &str) {
        self.used(uid, 0);
    }

    /// Records a use of the claim `uid` now, which takes `holds` more holds of it.
    fn used(&self, uid: &str, holds: usize) {
        let now = Timestamp::now();
        let mut claims = self.claims();
        let entry = claims.entry(uid.to_owned()).or_insert(Entry {
            holds: 0,
            last: now,
            unsaved: true,
        });
        entry.holds += holds;
        entry.last = now;
        entry.unsaved = true;
    }

    /// Starts the idle clock of the claim `uid` at `since` (its bind, or what the store
    /// says after a restart), unless it was used since.
    pub(super) fn start(&self, uid: &str, since: Timestamp) {
        let mut claims = self.claims();
        let entry = claims.entry(uid.to_owned()).or_insert(Entry {
            holds: 0,
            last: since,
            unsaved: false,
        });
        entry.last = entry.last.max(since);
    }

    /// Whether the claim `uid` is in use, and if not since when.
    pub(super) fn use_of(&self, uid: &str) -> Use {
        match self.claims().get(uid) {
            None => Use::Unknown,
            Some(entry) if entry.holds > 0 => Use::Busy,
            Some(entry) => Use::IdleSince(entry.last),
        }
    }

    /// The activity of the claims in `uids` not yet written to the store, marked written.
    pub(super) fn unsaved<'a>(
        &self,
        uids: impl IntoIterator<Item = &'a str>,
    ) -> Vec<(String, ActivityRecord)> {
        let mut claims = self.claims();
        uids.into_iter()
            .filter_map(|uid| {
                let entry = claims.get_mut(uid).filter(|e| e.unsaved)?;
                entry.unsaved = false;
                let record = ActivityRecord {
                    last: MicroTime(entry.last),
                    busy: entry.holds > 0,
                };
                Some((uid.to_owned(), record))
            })
            .collect()
    }

    /// Marks the claim `uid`'s activity as not yet written, after a write failed.
    pub(super) fn unsave(&self, uid: &str) {
        if let Some(entry) = self.claims().get_mut(uid) {
            entry.unsaved = true;
        }
    }

    /// Forgets the claim `uid`: it ended, or was released.
    pub(super) fn forget(&self, uid: &str) {
        self.claims().remove(uid);
    }
}

impl Drop for ActivityHold {
    fn drop(&mut self) {
        let mut claims = self.activity.claims();
        // Gone when its claim ended meanwhile: nothing to record then.
        if let Some(entry) = claims.get_mut(&self.uid) {
            entry.holds = entry.holds.saturating_sub(1);
            entry.last = Timestamp::now();
            entry.unsaved = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_keeps_a_claim_busy_and_its_end_is_activity() {
        let activity = Arc::new(ClaimActivity::default());
        let bound = Timestamp::now() - std::time::Duration::from_secs(60);
        activity.start("a", bound);
        assert_eq!(activity.use_of("a"), Use::IdleSince(bound));
        let hold = activity.hold("a");
        let second = activity.hold("a");
        assert_eq!(activity.use_of("a"), Use::Busy);
        drop(hold);
        assert_eq!(activity.use_of("a"), Use::Busy, "one session is still open");
        drop(second);
        let Use::IdleSince(since) = activity.use_of("a") else {
            panic!("idle once every hold ended");
        };
        assert!(since > bound);
        // A later baseline never moves the clock back.
        activity.start("a", bound);
        assert_eq!(activity.use_of("a"), Use::IdleSince(since));
        assert_eq!(activity.use_of("b"), Use::Unknown);
    }

    #[test]
    fn unsaved_activity_is_handed_out_once_and_forgotten_claims_record_nothing() {
        let activity = Arc::new(ClaimActivity::default());
        activity.start("a", Timestamp::now());
        assert!(activity.unsaved(["a"]).is_empty(), "a baseline is no news");
        let hold = activity.hold("a");
        let saved = activity.unsaved(["a", "b"]);
        assert_eq!(saved.len(), 1);
        assert!(saved[0].1.busy);
        assert!(activity.unsaved(["a"]).is_empty());
        activity.unsave("a");
        assert_eq!(activity.unsaved(["a"]).len(), 1);
        activity.forget("a");
        drop(hold);
        assert_eq!(activity.use_of("a"), Use::Unknown);
    }
}
