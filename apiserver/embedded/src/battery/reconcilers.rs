//! The registry of running pool reconcilers (one per pool): starting one stops the
//! pool's previous one, nudges reach the running one, and stopping waits for every one
//! still exiting. What a reconciler does is [`super::reconciler`]'s.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::model::PoolKey;

/// What happened in a pool that a reconciler may react to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nudge {
    Claimed,
    Deleted,
}

struct Running {
    stop: CancellationToken,
    nudges: mpsc::Sender<Nudge>,
    /// Cancelled once the task has ended, cleanup of its cancelled provisions included.
    done: CancellationToken,
}

#[derive(Default)]
struct Slot {
    running: Option<Running>,
    /// The `done` of stopped reconcilers that may still be exiting: kept here rather than
    /// handed to one waiter, so a DeletePool cut short leaves them for the next one.
    exiting: Vec<CancellationToken>,
}

impl Slot {
    /// Cancels the running reconciler, if any, keeping it among the exiting ones.
    fn stop_running(&mut self) {
        self.exiting.retain(|done| !done.is_cancelled());
        if let Some(old) = self.running.take() {
            old.stop.cancel();
            self.exiting.push(old.done);
        }
    }

    fn is_idle(&self) -> bool {
        self.running.is_none() && self.exiting.iter().all(CancellationToken::is_cancelled)
    }
}

#[derive(Default)]
struct State {
    closed: bool,
    pools: HashMap<PoolKey, Slot>,
}

/// What a caller of [`Reconcilers::stop`] waits on: the pool's reconcilers ending.
pub(crate) struct Stopping(Vec<CancellationToken>);

impl Stopping {
    /// Until every reconciler has ended, its cancelled provisions cleaned up.
    pub(crate) async fn wait(self) {
        for done in self.0 {
            done.cancelled().await;
        }
    }
}

/// The reconciler of every pool.
#[derive(Default)]
pub(crate) struct Reconcilers {
    state: Mutex<State>,
}

impl Reconcilers {
    /// Starts the pool's reconciler, `task` given its stop token (a child of `shutdown`)
    /// and its inbox of nudges, stopping a running one without waiting for it
    /// (poolmgrd's UpdatePool): its provisions in flight are cancelled. Nothing starts
    /// once shut down.
    pub(crate) fn start<F>(
        &self,
        key: PoolKey,
        shutdown: &CancellationToken,
        task: impl FnOnce(CancellationToken, mpsc::Receiver<Nudge>) -> F,
    ) where
        F: Future<Output = ()> + Send + 'static,
    {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.closed {
            return;
        }
        state.pools.retain(|_, slot| !slot.is_idle());
        let slot = state.pools.entry(key).or_default();
        slot.stop_running();
        let stop = shutdown.child_token();
        let done = CancellationToken::new();
        // Capacity 1: nudges arriving while one is pending coalesce into it.
        let (nudges, inbox) = mpsc::channel(1);
        let ended = done.clone().drop_guard();
        let task = task(stop.clone(), inbox);
        tokio::spawn(async move {
            // Dropped when the task ends, however it ends.
            let _ended = ended;
            task.await;
        });
        slot.running = Some(Running { stop, nudges, done });
    }

    /// Stops the pool's reconciler (poolmgrd's StopReconcilerAndWait, whose waiting is
    /// the caller's): what it returns ends with it and with every earlier one still
    /// exiting.
    pub(crate) fn stop(&self, pool: &PoolKey) -> Stopping {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.pools.retain(|_, slot| !slot.is_idle());
        let Some(slot) = state.pools.get_mut(pool) else {
            return Stopping(Vec::new());
        };
        slot.stop_running();
        Stopping(slot.exiting.clone())
    }

    pub(crate) fn nudge(&self, pool: &PoolKey, nudge: Nudge) {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(running) = state.pools.get(pool).and_then(|slot| slot.running.as_ref()) {
            // A full buffer means a nudge is already pending: coalesced.
            let _ = running.nudges.try_send(nudge);
        }
    }

    /// Stops every reconciler for good and waits for them, as poolmgrd's shutdown does:
    /// their provisions in flight fail through the hook-failure policy first.
    pub(crate) async fn shutdown(&self) {
        let stopping = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.closed = true;
            let mut exiting = Vec::new();
            for (_, mut slot) in state.pools.drain() {
                slot.stop_running();
                exiting.append(&mut slot.exiting);
            }
            Stopping(exiting)
        };
        stopping.wait().await;
    }
}
