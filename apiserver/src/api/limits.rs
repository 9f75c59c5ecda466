//! Load the server refuses rather than queues (as linkerd2-proxy sheds load): a cap on
//! open watches, a per-user rate of creates (each create of a claim is a battery
//! `ClaimVM`), and a deadline on every request that is not long-running — each answered
//! with a `Status`, never a dropped connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use battery_api_machinery::status::ApiError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The limits, as configured.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Watches open at once, across all users.
    pub max_watches: usize,
    /// Creates per second each user may sustain.
    pub creates_per_second: f64,
    /// Creates a user may make at once before the rate applies.
    pub create_burst: u32,
    /// How long a request that is not a watch may take; kube-apiserver gives proxied
    /// requests 60 s, so ours must answer before that.
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_watches: 1000,
            creates_per_second: 50.0,
            create_burst: 200,
            request_timeout: Duration::from_secs(55),
        }
    }
}

/// A user's token bucket.
struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// The limits, enforced.
pub struct Limiter {
    limits: Limits,
    watches: Arc<Semaphore>,
    creates: Mutex<HashMap<String, Bucket>>,
}

impl Limiter {
    pub fn new(limits: Limits) -> Self {
        Self {
            watches: Arc::new(Semaphore::new(limits.max_watches)),
            limits,
            creates: Mutex::new(HashMap::new()),
        }
    }

    pub fn request_timeout(&self) -> Duration {
        self.limits.request_timeout
    }

    /// A slot for one more watch, held for as long as the watch streams.
    pub fn admit_watch(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        self.watches.clone().try_acquire_owned().map_err(|_| {
            ApiError::too_many_requests(
                format!(
                    "too many watches are open ({} at most); retry later",
                    self.limits.max_watches
                ),
                1,
            )
        })
    }

    /// Takes one create from `user`'s bucket.
    pub fn admit_create(&self, user: &str) -> Result<(), ApiError> {
        let now = Instant::now();
        let rate = self.limits.creates_per_second;
        let burst = f64::from(self.limits.create_burst);
        let mut buckets = self.creates.lock().unwrap_or_else(PoisonError::into_inner);
        // Full buckets carry no information: forget them so the map stays small.
        buckets
            .retain(|_, b| b.tokens + now.duration_since(b.updated).as_secs_f64() * rate < burst);
        let bucket = buckets.entry(user.to_owned()).or_insert(Bucket {
            tokens: burst,
            updated: now,
        });
        bucket.tokens =
            (bucket.tokens + now.duration_since(bucket.updated).as_secs_f64() * rate).min(burst);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait = ((1.0 - bucket.tokens) / rate).ceil().max(1.0);
        Err(ApiError::too_many_requests(
            format!("user {user} is creating objects faster than {rate}/s; retry later"),
            // At least a second, at most what fits a u32.
            wait.min(f64::from(u32::MAX)) as u32,
        ))
    }
}

/// The answer to a request that ran out of time (`apiserver:pkg/server/filters/timeout.go`).
pub fn timed_out() -> ApiError {
    ApiError::timeout(
        "request did not complete within requested timeout - context deadline exceeded",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use battery_api_machinery::status::Reason;

    fn limiter(burst: u32) -> Limiter {
        Limiter::new(Limits {
            max_watches: 2,
            creates_per_second: 1.0,
            create_burst: burst,
            request_timeout: Duration::from_secs(1),
        })
    }

    #[test]
    fn a_users_burst_is_allowed_then_refused_with_retry_after_and_users_are_apart() {
        let limiter = limiter(3);
        for _ in 0..3 {
            limiter.admit_create("alice").unwrap();
        }
        let refused = limiter.admit_create("alice").unwrap_err();
        assert_eq!(refused.reason(), Reason::TooManyRequests);
        assert_eq!(refused.retry_after_seconds(), Some(1));
        limiter.admit_create("bob").unwrap();
    }

    #[test]
    fn watches_beyond_the_cap_are_refused_until_one_ends() {
        let limiter = limiter(1);
        let first = limiter.admit_watch().unwrap();
        let _second = limiter.admit_watch().unwrap();
        assert_eq!(
            limiter.admit_watch().unwrap_err().reason(),
            Reason::TooManyRequests
        );
        drop(first);
        assert!(limiter.admit_watch().is_ok(), "a slot came free");
    }
}
