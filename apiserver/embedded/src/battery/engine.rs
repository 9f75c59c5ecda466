//! The state every service and background task shares: configuration, store, host
//! connections, reconcilers, per-pool locks and the tracked background tasks.

use std::sync::{Arc, Mutex, PoisonError};

use battery_locks::KeyLocks;
use battery_proto::poolmgr::v1alpha1::EventType;
use tokio::sync::{OwnedMutexGuard, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::config::BatteryConfig;
use super::connections::HostConnections;
use super::model::PoolKey;
use super::reconcilers::{Nudge, Reconcilers};
use super::store::Store;

pub(crate) struct Engine {
    pub(crate) config: BatteryConfig,
    pub(crate) store: Store,
    pub(crate) hosts: HostConnections,
    pub(crate) reconcilers: Reconcilers,
    /// battery's per-pool lock for CreatePool, UpdatePool and DeletePool (§3.2).
    pool_locks: KeyLocks<PoolKey>,
    /// battery's hostRefsMu: CreatePool and UpdatePool hold it shared from their host
    /// check to their write, RemoveHost exclusively, so a pool never names a host that
    /// was removed in between.
    pub(crate) host_refs: tokio::sync::RwLock<()>,
    /// Detached work (deletions, claims, event streams, abandoned creates, the sweeper);
    /// None once shut down.
    tasks: Mutex<Option<JoinSet<()>>>,
    shutdown: CancellationToken,
}

impl Engine {
    pub(crate) fn new(config: BatteryConfig, store: Store) -> Arc<Self> {
        Arc::new(Self {
            config,
            store,
            hosts: HostConnections::default(),
            reconcilers: Reconcilers::default(),
            pool_locks: KeyLocks::default(),
            host_refs: tokio::sync::RwLock::new(()),
            tasks: Mutex::new(Some(JoinSet::new())),
            shutdown: CancellationToken::new(),
        })
    }

    /// Cancelled when the battery shuts down.
    pub(crate) fn shutdown_token(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// Appends an event. Events are best effort, as in battery (§4.6): a failed insert is
    /// logged and dropped.
    pub(crate) fn emit(&self, pool: &PoolKey, vm_uid: &str, kind: EventType) {
        if let Err(err) = self.store.append_event(pool, vm_uid, kind) {
            tracing::warn!(pool = %pool, vm = vm_uid, event = kind.as_str_name(), error = %err, "event dropped");
        }
    }

    /// Tells the pool's reconciler about a claim or a deletion.
    pub(crate) fn nudge(&self, pool: &PoolKey, nudge: Nudge) {
        self.reconcilers.nudge(pool, nudge);
    }

    /// Runs `task` in the background, stopped at shutdown at the latest; false (and the
    /// task dropped) once shut down.
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) -> bool {
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(tasks) = tasks.as_mut() else {
            return false;
        };
        // Reap finished tasks so the set stays small.
        while tasks.try_join_next().is_some() {}
        tasks.spawn(task);
        true
    }

    /// Runs `task` detached from the caller, so that dropping the caller (a cancelled RPC)
    /// does not cut it short, and waits for its result. None once shut down.
    pub(crate) async fn detached<T: Send + 'static>(
        &self,
        task: impl Future<Output = T> + Send + 'static,
    ) -> Option<T> {
        let (done, result) = oneshot::channel();
        let spawned = self.spawn(async move {
            // The receiver is gone only if the caller was dropped; the work is done anyway.
            let _ = done.send(task.await);
        });
        if !spawned {
            return None;
        }
        result.await.ok()
    }

    /// Takes the per-pool lock.
    pub(crate) async fn lock_pool(&self, pool: &PoolKey) -> OwnedMutexGuard<()> {
        self.pool_locks.lock(pool).await
    }

    /// Stops everything in the background: signals shutdown, waits for the reconcilers
    /// (their provisions in flight hook-failed, as poolmgrd's shutdown does), then aborts
    /// and awaits the remaining tasks.
    pub(crate) async fn stop_background(&self) {
        self.shutdown.cancel();
        self.reconcilers.shutdown().await;
        let tasks = self
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(mut tasks) = tasks {
            tasks.abort_all();
            while tasks.join_next().await.is_some() {}
        }
    }
}
