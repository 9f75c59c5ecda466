//! Telling battery a Pool's new spec. battery's UpdatePool restarts the Pool's reconciler
//! and cancels its MicroVMs still booting (`docs/reference/battery-behaviour.md` §7), so a
//! Pool has one UpdatePool in flight at a time, and the changes that arrive while it runs
//! reach battery together, as the next one: a Pool edited in a burst restarts twice, not
//! once per edit. A change that arrives alone is sent at once.
//!
//! Each change is computed on top of the one before it (the Pool's lock and its
//! resourceVersion order them), so the newest carries all of them, and everyone waiting
//! gets the answer to the call that carried theirs.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// What a waiter gets: the answer to the call that carried its change (or a later one).
pub(super) type Outcome<T, E> = Result<T, Arc<E>>;

/// The changes waiting for each key's call in flight.
pub(super) struct Coalescer<K, C, T, E> {
    queues: Mutex<HashMap<K, Queue<C, T, E>>>,
}

struct Queue<C, T, E> {
    /// The newest change not yet sent: it carries those it replaced.
    next: Option<C>,
    waiting: Vec<oneshot::Sender<Outcome<T, E>>>,
}

impl<K, C, T, E> Default for Coalescer<K, C, T, E> {
    fn default() -> Self {
        Self {
            queues: Mutex::default(),
        }
    }
}

impl<K, C, T, E> Coalescer<K, C, T, E>
where
    K: Hash + Eq + Clone + Send + 'static,
    C: Send + 'static,
    T: Clone + Send + 'static,
    E: Send + Sync + 'static,
{
    /// Whether a change for `key` is being sent or waits to be.
    pub(super) fn busy(&self, key: &K) -> bool {
        self.queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(key)
    }

    /// Sends `change` with `send`, at once when no call for `key` is in flight, or else
    /// with the changes that arrive before that call ends; the `send` of the change that
    /// found the key idle sends those that join it. The calls run in a task of their own,
    /// so a change is sent even if its requester goes away. The change is queued when
    /// this is called, before the answer is awaited.
    pub(super) fn submit<F, Fut>(
        self: &Arc<Self>,
        key: K,
        change: C,
        send: F,
    ) -> impl Future<Output = Outcome<T, E>> + use<K, C, T, E, F, Fut>
    where
        F: Fn(C) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let idle = {
            let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
            let idle = !queues.contains_key(&key);
            let queue = queues.entry(key.clone()).or_insert_with(|| Queue {
                next: None,
                waiting: Vec::new(),
            });
            queue.next = Some(change);
            queue.waiting.push(tx);
            idle
        };
        if idle {
            tokio::spawn(Arc::clone(self).drive(key, send));
        }
        async move {
            // The task answers every waiter before it ends; it ends early only if the
            // runtime shuts down, and then the request has gone with it.
            rx.await
                .unwrap_or_else(|_| panic!("the task sending a change ended unanswered"))
        }
    }

    /// Sends the key's newest change, answers its waiters, and again while changes
    /// arrived meanwhile.
    async fn drive<F, Fut>(self: Arc<Self>, key: K, send: F)
    where
        F: Fn(C) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        loop {
            let (change, waiting) = {
                let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
                let Some(queue) = queues.get_mut(&key) else {
                    return;
                };
                match queue.next.take() {
                    Some(change) => (change, std::mem::take(&mut queue.waiting)),
                    None => {
                        queues.remove(&key);
                        return;
                    }
                }
            };
            let outcome = send(change).await.map_err(Arc::new);
            for waiter in waiting {
                // A waiter that went away needs no answer.
                let _ = waiter.send(outcome.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::Notify;
    use tokio::task::JoinHandle;

    use super::*;

    /// A coalescer whose sender records each change it sends, holds change 1 until
    /// released, and has battery refuse change 13.
    #[derive(Clone, Default)]
    struct Rig {
        coalescer: Arc<Coalescer<&'static str, u32, u32, String>>,
        calls: Arc<Mutex<Vec<u32>>>,
        release: Arc<Notify>,
    }

    impl Rig {
        fn submit(
            &self,
            key: &'static str,
            change: u32,
        ) -> impl Future<Output = Outcome<u32, String>> + use<> {
            let (calls, release) = (self.calls.clone(), self.release.clone());
            self.coalescer.submit(key, change, move |change| {
                let (calls, release) = (calls.clone(), release.clone());
                async move {
                    calls.lock().unwrap().push(change);
                    if change == 1 {
                        release.notified().await;
                    }
                    if change == 13 {
                        Err("refused".to_owned())
                    } else {
                        Ok(change)
                    }
                }
            })
        }

        /// Change 1 sent, and held in flight.
        async fn first_in_flight(&self) -> JoinHandle<Outcome<u32, String>> {
            let first = tokio::spawn(self.submit("pool", 1));
            while self.calls.lock().unwrap().is_empty() {
                tokio::task::yield_now().await;
            }
            first
        }

        /// `changes` queued behind the call in flight.
        async fn queue(&self, changes: &[u32]) -> Vec<JoinHandle<Outcome<u32, String>>> {
            let waiting: Vec<_> = changes
                .iter()
                .map(|change| tokio::spawn(self.submit("pool", *change)))
                .collect();
            while self.coalescer.queues.lock().unwrap()["pool"].waiting.len() < changes.len() {
                tokio::task::yield_now().await;
            }
            waiting
        }
    }

    #[tokio::test]
    async fn a_change_alone_is_sent_at_once() {
        let rig = Rig::default();
        assert_eq!(rig.submit("pool", 2).await.unwrap(), 2);
        assert_eq!(*rig.calls.lock().unwrap(), [2]);
        assert!(!rig.coalescer.busy(&"pool"), "nothing is left queued");
    }

    #[tokio::test]
    async fn changes_arriving_while_one_is_sent_go_as_the_newest_of_them() {
        let rig = Rig::default();
        let first = rig.first_in_flight().await;
        let later = rig.queue(&[2, 3, 4]).await;
        rig.release.notify_one();
        assert_eq!(first.await.unwrap().unwrap(), 1);
        for waiter in later {
            assert_eq!(
                waiter.await.unwrap().unwrap(),
                4,
                "answered by the call carrying 4"
            );
        }
        assert_eq!(
            *rig.calls.lock().unwrap(),
            [1, 4],
            "two calls for four changes"
        );
        assert!(!rig.coalescer.busy(&"pool"));
    }

    #[tokio::test]
    async fn a_refusal_reaches_every_change_it_carried_and_other_keys_go_their_way() {
        let rig = Rig::default();
        let first = rig.first_in_flight().await;
        let later = rig.queue(&[12, 13]).await;
        // Another Pool's change is not held behind this one's call.
        assert_eq!(rig.submit("other", 7).await.unwrap(), 7);
        rig.release.notify_one();
        assert_eq!(first.await.unwrap().unwrap(), 1);
        for waiter in later {
            assert_eq!(*waiter.await.unwrap().unwrap_err(), "refused");
        }
    }
}
