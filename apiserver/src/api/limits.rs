//! Load the server refuses rather than queues (as linkerd2-proxy sheds load): a cap on
//! open watches, a deadline on every request that is not long-running, and, when the
//! operator asks for one, a per-user rate of creates (off by default: in front of us,
//! kube-apiserver's API Priority and Fairness queues and sheds each user's requests, as it
//! does for built-in resources; ADR 32) — each answered with a `Status`, never a dropped
//! connection.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use battery_api_machinery::status::ApiError;
use governor::clock::Clock as _;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Every this many creates, users whose bucket has refilled are forgotten, so the
/// limiter holds only users who created within about a burst's refill time.
const FORGET_EVERY: u32 = 1024;

/// The limits, as configured.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Watches open at once, across all users.
    pub max_watches: usize,
    /// Each user's rate of creates, if limited here at all.
    pub creates: Option<CreateRate>,
    /// How long a request that is not a watch may take; kube-apiserver gives proxied
    /// requests 60 s, so ours must answer before that.
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_watches: 1000,
            creates: None,
            request_timeout: Duration::from_secs(55),
        }
    }
}

/// A per-user token bucket of creates.
#[derive(Debug, Clone, Copy)]
pub struct CreateRate {
    /// Creates per second each user may sustain.
    pub per_second: f64,
    /// Creates a user may make at once before the rate applies.
    pub burst: u32,
}

/// The limits, enforced.
pub struct Limiter {
    limits: Limits,
    watches: Arc<Semaphore>,
    /// A token bucket per user (GCRA, which is equivalent), when creates are limited.
    creates: Option<DefaultKeyedRateLimiter<String>>,
    /// Creates since users were last forgotten.
    since_forgetting: AtomicU32,
}

impl Limiter {
    pub fn new(limits: Limits) -> Self {
        Self {
            watches: Arc::new(Semaphore::new(limits.max_watches)),
            creates: limits
                .creates
                .map(|rate| RateLimiter::keyed(create_quota(rate))),
            since_forgetting: AtomicU32::new(0),
            limits,
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

    /// Takes one create from `user`'s bucket, when creates are limited.
    pub fn admit_create(&self, user: &str) -> Result<(), ApiError> {
        let (Some(creates), Some(rate)) = (&self.creates, self.limits.creates) else {
            return Ok(());
        };
        if self
            .since_forgetting
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(FORGET_EVERY)
        {
            // A full bucket carries no information: forget it so the map stays small.
            creates.retain_recent();
            creates.shrink_to_fit();
        }
        let refused = match creates.check_key(&user.to_owned()) {
            Ok(()) => return Ok(()),
            Err(refused) => refused,
        };
        let wait = refused.wait_time_from(creates.clock().now());
        Err(ApiError::too_many_requests(
            format!(
                "user {user} is creating objects faster than {}/s; retry later",
                rate.per_second
            ),
            // At least a second, at most what fits a u32.
            u32::try_from(wait.as_secs_f64().ceil() as u64)
                .unwrap_or(u32::MAX)
                .max(1),
        ))
    }
}

/// The configured rate and burst as a quota. A burst of 0 would refuse every create,
/// so it is taken as 1; a rate too fast for a nanosecond period is as good as none.
fn create_quota(rate: CreateRate) -> Quota {
    let burst = NonZeroU32::new(rate.burst).unwrap_or(NonZeroU32::MIN);
    Duration::try_from_secs_f64(1.0 / rate.per_second)
        .ok()
        .and_then(Quota::with_period)
        .unwrap_or_else(|| Quota::per_second(NonZeroU32::MAX))
        .allow_burst(burst)
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
            creates: Some(CreateRate {
                per_second: 1.0,
                burst,
            }),
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
    fn users_whose_bucket_refilled_are_forgotten() {
        let limiter = Limiter::new(Limits {
            creates: Some(CreateRate {
                per_second: 1000.0,
                burst: 1,
            }),
            ..Limits::default()
        });
        for n in 0..FORGET_EVERY * 4 {
            limiter.admit_create(&format!("user-{n}")).unwrap();
        }
        // Each bucket refills in a millisecond.
        std::thread::sleep(Duration::from_millis(20));
        for n in 0..FORGET_EVERY {
            limiter.admit_create(&format!("late-{n}")).unwrap();
        }
        let tracked = limiter.creates.as_ref().map_or(0, |c| c.len());
        assert!(tracked <= FORGET_EVERY as usize, "{tracked} users tracked");
    }

    #[test]
    fn without_a_rate_creates_are_not_limited_here() {
        let limiter = Limiter::new(Limits::default());
        for _ in 0..10_000 {
            limiter.admit_create("alice").unwrap();
        }
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
