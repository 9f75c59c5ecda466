//! The live exec sessions, by claim uid: capped, counted in `/metrics`, ended together
//! when their claim is released or expires, and each its claim's activity while open.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use battery_api_machinery::status::ApiError;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::resources::microvmclaims::activity::{ActivityHold, ClaimActivity};

/// Sessions open at once, across all claims, unless the server is told otherwise: each
/// holds a few MiB at most (two bounded queues and the relay's HTTP/2 window).
pub const DEFAULT_MAX_SESSIONS: usize = 512;
/// When a client refused for the cap should try again.
const RETRY_AFTER_SECONDS: u32 = 1;

type Live = HashMap<String, HashMap<u64, CancellationToken>>;

/// Every live session's cancellation, by the uid of its claim.
pub struct ExecSessions {
    live: Mutex<Live>,
    permits: Arc<Semaphore>,
    max: usize,
    next_id: AtomicU64,
    open: Gauge,
    /// Cancelled when the server shuts down: every session ends, saying so.
    shutting_down: CancellationToken,
    /// Each open session holds its claim in use, for the claim's idle timeout.
    activity: Arc<ClaimActivity>,
}

impl ExecSessions {
    /// At most `max` sessions at once; `open` counts them.
    pub fn new(max: usize, open: Gauge) -> Self {
        Self {
            live: Mutex::default(),
            permits: Arc::new(Semaphore::new(max)),
            max,
            next_id: AtomicU64::new(0),
            open,
            shutting_down: CancellationToken::new(),
            activity: Arc::default(),
        }
    }

    /// The claims' activity, which the sessions keep.
    pub fn activity(&self) -> Arc<ClaimActivity> {
        self.activity.clone()
    }

    fn live(&self) -> std::sync::MutexGuard<'_, Live> {
        // The map is consistent after every operation, so a panic elsewhere leaves
        // nothing half done in it.
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot under the cap, taken before any work for the session is done; 429 when
    /// full (shed, not queued: an exec client retries), 503 once shutting down.
    pub fn admit(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        if self.shutting_down.is_cancelled() {
            return Err(ApiError::service_unavailable(
                "the API server is shutting down; run the command again",
            ));
        }
        self.permits.clone().try_acquire_owned().map_err(|_| {
            ApiError::too_many_requests(
                format!(
                    "too many exec sessions are open ({}); try again later",
                    self.max
                ),
                RETRY_AFTER_SECONDS,
            )
        })
    }

    /// Registers a session of the claim `uid`; it lives, and holds the claim in use,
    /// until the guard drops.
    pub fn register(self: &Arc<Self>, uid: &str, permit: OwnedSemaphorePermit) -> SessionGuard {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        self.live()
            .entry(uid.to_owned())
            .or_default()
            .insert(id, token.clone());
        self.open.inc();
        SessionGuard {
            sessions: self.clone(),
            uid: uid.to_owned(),
            id,
            token,
            shutting_down: self.shutting_down.clone(),
            _activity: self.activity.hold(uid),
            _permit: permit,
        }
    }

    /// Ends every session, each with a Status saying the server shuts down, and admits
    /// no more.
    pub fn end_all(&self) {
        self.shutting_down.cancel();
    }

    /// Waits up to `grace` for every session to have ended.
    pub async fn drained(&self, grace: std::time::Duration) {
        let all = u32::try_from(self.max).unwrap_or(u32::MAX);
        if tokio::time::timeout(grace, self.permits.acquire_many(all))
            .await
            .is_err()
        {
            tracing::info!("exec sessions still open after {grace:?}; cutting them");
        }
    }

    /// Ends every session of the claim `uid`: it was released or expired.
    pub fn end_claim(&self, uid: &str) {
        let ended = self.live().remove(uid);
        for token in ended.into_iter().flat_map(HashMap::into_values) {
            token.cancel();
        }
    }
}

/// One live session's place in the registry.
pub struct SessionGuard {
    sessions: Arc<ExecSessions>,
    uid: String,
    id: u64,
    token: CancellationToken,
    shutting_down: CancellationToken,
    _activity: ActivityHold,
    _permit: OwnedSemaphorePermit,
}

impl SessionGuard {
    /// Cancelled when the session's claim is released or expires.
    pub fn ended(&self) -> &CancellationToken {
        &self.token
    }

    /// Cancelled when the server shuts down.
    pub fn shutting_down(&self) -> &CancellationToken {
        &self.shutting_down
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        let mut live = self.sessions.live();
        if let Some(sessions) = live.get_mut(&self.uid) {
            sessions.remove(&self.id);
            if sessions.is_empty() {
                live.remove(&self.uid);
            }
        }
        self.sessions.open.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_sheds_with_429_and_frees_on_drop() {
        let sessions = Arc::new(ExecSessions::new(1, Gauge::default()));
        let first = sessions.register("a", sessions.admit().unwrap());
        let refused = sessions.admit().unwrap_err();
        assert_eq!(refused.code(), http::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.retry_after_seconds(), Some(RETRY_AFTER_SECONDS));
        drop(first);
        assert!(sessions.admit().is_ok());
    }

    #[test]
    fn ending_a_claim_cancels_its_sessions_only_and_the_gauge_follows() {
        let open = Gauge::default();
        let sessions = Arc::new(ExecSessions::new(4, open.clone()));
        let a1 = sessions.register("a", sessions.admit().unwrap());
        let a2 = sessions.register("a", sessions.admit().unwrap());
        let b = sessions.register("b", sessions.admit().unwrap());
        assert_eq!(open.get(), 3);
        sessions.end_claim("a");
        assert!(a1.ended().is_cancelled() && a2.ended().is_cancelled());
        assert!(!b.ended().is_cancelled());
        drop((a1, a2));
        assert_eq!(open.get(), 1);
        drop(b);
        assert_eq!(open.get(), 0);
        assert!(sessions.live().is_empty());
    }

    #[tokio::test]
    async fn shutting_down_ends_every_session_refuses_new_ones_and_waits_for_them() {
        let sessions = Arc::new(ExecSessions::new(4, Gauge::default()));
        let a = sessions.register("a", sessions.admit().unwrap());
        let b = sessions.register("b", sessions.admit().unwrap());
        sessions.end_all();
        assert!(a.shutting_down().is_cancelled() && b.shutting_down().is_cancelled());
        let refused = sessions.admit().unwrap_err();
        assert_eq!(refused.code(), http::StatusCode::SERVICE_UNAVAILABLE);
        // Drained once both have ended; not before.
        let grace = std::time::Duration::from_secs(5);
        let drained = tokio::spawn({
            let sessions = sessions.clone();
            async move { sessions.drained(grace).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!drained.is_finished(), "drained with two sessions open");
        drop((a, b));
        tokio::time::timeout(grace, drained).await.unwrap().unwrap();
    }
}
