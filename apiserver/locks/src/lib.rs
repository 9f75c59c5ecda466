//! How our async code waits without holding up other tasks: one async lock per key,
//! forgotten once nobody holds or waits for it ([`KeyLocks`]), and a section that blocks
//! its thread on the disk while the runtime's other tasks go on ([`blocking`]).

#![deny(missing_docs)]

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::OwnedMutexGuard;

/// An async mutex per key, made on first use. The map keeps only the locks someone holds
/// or waits for, so it grows with the work in flight, not with every key ever locked.
#[derive(Debug)]
pub struct KeyLocks<K> {
    locks: Mutex<HashMap<K, Arc<tokio::sync::Mutex<()>>>>,
}

impl<K> Default for KeyLocks<K> {
    fn default() -> Self {
        Self {
            locks: Mutex::default(),
        }
    }
}

impl<K: Hash + Eq + Clone> KeyLocks<K> {
    /// Waits for the lock of `key`; it is released when the guard is dropped.
    pub async fn lock(&self, key: &K) -> OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(PoisonError::into_inner);
            // A lock only the map holds has no holder and no waiter: forget it.
            locks.retain(|_, lock| Arc::strong_count(lock) > 1);
            Arc::clone(locks.entry(key.clone()).or_default())
        };
        lock.lock_owned().await
    }
}

/// Runs `f`, which waits for the disk, at once on this thread, where the runtime's other
/// tasks need not wait for it: on a multi-threaded runtime tokio hands this worker's other
/// tasks to another thread meanwhile (as Go's scheduler hands on a goroutine's processor
/// while it is in a system call), and `f` does not wait for that thread to wake.
/// Elsewhere (a current-thread runtime, no runtime) it just runs `f`.
pub fn blocking<R>(f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_blocking_section_holds_up_no_other_task() {
        // On the one worker: the task spawned there can run while this one blocks only if
        // the worker's other tasks were handed on.
        tokio::spawn(async {
            let (started, start) = std::sync::mpsc::channel();
            let other = tokio::spawn(async move { started.send(()).unwrap() });
            blocking(|| {
                start
                    .recv_timeout(std::time::Duration::from_secs(60))
                    .expect("the other task never ran while this one blocked")
            });
            other.await.unwrap();
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn a_blocking_section_runs_on_a_current_thread_runtime() {
        assert_eq!(blocking(|| 7), 7);
    }

    #[tokio::test]
    async fn a_key_is_held_by_one_at_a_time_and_other_keys_are_free() {
        let locks = Arc::new(KeyLocks::default());
        let held = locks.lock(&"a").await;
        // Another key is not blocked by it.
        drop(locks.lock(&"b").await);
        let waiter = tokio::spawn({
            let locks = Arc::clone(&locks);
            async move { drop(locks.lock(&"a").await) }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a second holder of a");
        drop(held);
        waiter.await.unwrap();
    }

    fn kept<K>(locks: &KeyLocks<K>) -> usize {
        locks.locks.lock().unwrap().len()
    }

    #[tokio::test]
    async fn locks_nobody_holds_are_forgotten() {
        let locks = KeyLocks::default();
        for key in 0..100 {
            drop(locks.lock(&key).await);
        }
        // Each lock forgot the ones before it; only the last is still in the map.
        assert_eq!(kept(&locks), 1);
        let _held = locks.lock(&1000).await;
        assert_eq!(kept(&locks), 1);
    }
}
