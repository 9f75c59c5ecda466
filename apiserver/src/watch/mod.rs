//! Watch fan-out, as in k8s.io/apiserver's cacher (`pkg/storage/cacher/watch_cache.go`):
//! every committed change is one [`Change`] in a bounded window; each watcher replays
//! the window from its resourceVersion and then follows a broadcast channel. A watcher
//! that falls behind the channel is closed rather than stall the others (it re-watches
//! from its last resourceVersion), and a resourceVersion older than the window is
//! answered `410 Expired`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tokio::sync::broadcast;

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

/// One committed change to one object, with the object as clients see it then.
#[derive(Debug, Clone)]
pub struct Change {
    pub resource_version: u64,
    pub resource: &'static str,
    pub namespace: Option<String>,
    pub name: String,
    pub change_type: ChangeType,
    pub object: WatchedObject,
    /// The change's watch event as a JSON line, made by the first watcher that sends it
    /// as a plain object and then shared by all such watchers: a fan-out serializes the
    /// object once, not once per watcher.
    pub json_line: OnceLock<Result<axum::body::Bytes, String>>,
}

/// The object of a change, in its own type (a `Pool`, a `MicroVMClaim`): watchers of its
/// resource downcast it, so no watcher decodes it, and the window holds it more compactly
/// than as a `serde_json::Value`.
pub type WatchedObject = Arc<dyn std::any::Any + Send + Sync>;

/// The watch could not start from the resourceVersion asked for.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("too old resource version: {requested} ({oldest})")]
pub struct TooOld {
    pub requested: u64,
    /// The oldest resourceVersion a watch can still start from.
    pub oldest: u64,
}

struct Window {
    changes: VecDeque<Arc<Change>>,
    /// Watches may start from any resourceVersion at or after this one.
    oldest: u64,
}

/// A watcher's start: the window's changes it has not seen, then everything later.
#[derive(Debug)]
pub struct Subscription {
    pub backlog: Vec<Arc<Change>>,
    pub receiver: broadcast::Receiver<Arc<Change>>,
}

/// The fan-out of committed changes to watchers.
pub struct WatchHub {
    window: Mutex<Window>,
    capacity: usize,
    sender: broadcast::Sender<Arc<Change>>,
}

impl WatchHub {
    /// A hub keeping the last `capacity` changes, whose history starts at
    /// `current_rv` (changes before it are not known, so watches from older versions
    /// get 410).
    pub fn new(capacity: usize, current_rv: u64) -> Self {
        let (sender, _) = broadcast::channel(capacity.max(1));
        Self {
            window: Mutex::new(Window {
                changes: VecDeque::with_capacity(capacity),
                oldest: current_rv,
            }),
            capacity: capacity.max(1),
            sender,
        }
    }

    /// Records committed changes, in resourceVersion order. The caller publishes under
    /// the same lock that orders its commits, so watchers see changes in RV order.
    pub fn publish(&self, changes: impl IntoIterator<Item = Change>) {
        let mut window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        for change in changes {
            let change = Arc::new(change);
            if window.changes.len() == self.capacity
                && let Some(evicted) = window.changes.pop_front()
            {
                window.oldest = evicted.resource_version;
            }
            window.changes.push_back(change.clone());
            // No receiver is fine: nobody is watching.
            let _ = self.sender.send(change);
        }
    }

    /// The changes after `since` still in the window, and a receiver for every change
    /// published after them, taken atomically so none is lost or seen twice.
    pub fn subscribe(&self, since: u64) -> Result<Subscription, TooOld> {
        let window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        if since < window.oldest {
            return Err(TooOld {
                requested: since,
                oldest: window.oldest,
            });
        }
        let backlog = window
            .changes
            .iter()
            .filter(|c| c.resource_version > since)
            .cloned()
            .collect();
        Ok(Subscription {
            backlog,
            receiver: self.sender.subscribe(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(rv: u64) -> Change {
        Change {
            resource_version: rv,
            resource: "pools",
            namespace: Some("default".into()),
            name: format!("p{rv}"),
            change_type: ChangeType::Added,
            object: Arc::new(serde_json::json!({})),
            json_line: OnceLock::new(),
        }
    }

    #[test]
    fn replays_after_the_requested_version_then_follows_live() {
        let hub = WatchHub::new(10, 0);
        hub.publish([change(1), change(2), change(3)]);
        let Subscription {
            backlog,
            receiver: mut rx,
        } = hub.subscribe(1).unwrap();
        let rvs: Vec<u64> = backlog.iter().map(|c| c.resource_version).collect();
        assert_eq!(rvs, [2, 3]);
        hub.publish([change(4)]);
        assert_eq!(rx.try_recv().unwrap().resource_version, 4);
        assert!(rx.try_recv().is_err(), "nothing seen twice");
    }

    #[test]
    fn a_version_older_than_the_window_is_too_old() {
        let hub = WatchHub::new(2, 0);
        hub.publish([change(1), change(2), change(3), change(4)]);
        // 1 and 2 were evicted: a watch from 1 would miss 2.
        assert_eq!(
            hub.subscribe(1).unwrap_err(),
            TooOld {
                requested: 1,
                oldest: 2
            }
        );
        assert_eq!(hub.subscribe(2).unwrap().backlog.len(), 2);
    }

    #[test]
    fn history_before_start_is_unknown() {
        let hub = WatchHub::new(10, 7);
        assert!(hub.subscribe(6).is_err());
        assert!(hub.subscribe(7).unwrap().backlog.is_empty());
    }
}
