//! One async lock per key, forgotten once nobody holds or waits for it: see [`KeyLocks`].

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

#[cfg(test)]
mod tests {
    use super::*;

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
