//! The steps of one request, logged when it took longer than a threshold, as Kubernetes'
//! `k8s.io/utils/trace` (`utiltrace.New`, `Step`, `LogIfLong`): a slow request says where
//! its time went without a debug log of every request. The layer that counts requests
//! starts one per request and leaves it in the request's extensions; the layers, the
//! handlers and a storage each add the steps they know of.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// At most this many steps are kept: a bind that retries `ClaimVM` until its deadline
/// adds two a retry. The log says how many more there were.
const MAX_STEPS: usize = 32;

/// A request's steps so far; cloning shares them. `Trace::default()` records nothing,
/// for work no request started (a restart's recovery, tests).
#[derive(Clone, Default)]
pub struct Trace(Option<Arc<Steps>>);

struct Steps {
    started: Instant,
    recorded: Mutex<Recorded>,
}

#[derive(Default)]
struct Recorded {
    steps: Vec<(&'static str, Instant)>,
    dropped: usize,
    /// The object's name: from the path, or once a create's body is decoded.
    name: Option<String>,
}

/// What a finished request was, for its log line.
pub struct Finished<'a> {
    pub method: &'a http::Method,
    pub path: &'a str,
    pub status: u16,
    pub elapsed: Duration,
}

impl Trace {
    /// A trace of a request that arrived at `started`.
    pub fn start(started: Instant) -> Self {
        Self(Some(Arc::new(Steps {
            started,
            recorded: Mutex::new(Recorded {
                steps: Vec::with_capacity(16),
                ..Recorded::default()
            }),
        })))
    }

    /// The trace the request in `extensions` carries; one that records nothing when none
    /// was started (a stack built without the counting layer, as in tests).
    pub fn of(extensions: &http::Extensions) -> Self {
        extensions.get::<Self>().cloned().unwrap_or_default()
    }

    /// Records that `what` is done, now.
    pub fn step(&self, what: &'static str) {
        let Some(steps) = &self.0 else { return };
        let now = Instant::now();
        let mut recorded = steps.lock();
        if recorded.steps.len() < MAX_STEPS {
            recorded.steps.push((what, now));
        } else {
            recorded.dropped += 1;
        }
    }

    /// Names the object the request is about.
    pub fn name(&self, name: &str) {
        if let Some(steps) = &self.0 {
            steps.lock().name = Some(name.to_owned());
        }
    }

    /// Logs the request with its steps when it took at least `threshold`.
    pub fn log_if_long(&self, threshold: Duration, finished: &Finished<'_>) {
        let Some(steps) = &self.0 else { return };
        if finished.elapsed < threshold {
            return;
        }
        let recorded = steps.lock();
        let Finished {
            method,
            path,
            status,
            elapsed,
        } = finished;
        tracing::info!(
            %method,
            %path,
            name = recorded.name.as_deref(),
            status,
            total_ms = microsecond_millis(*elapsed),
            steps = %recorded.render(steps.started),
            "slow request"
        );
    }
}

impl Steps {
    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        // A step is a push: a panic elsewhere cannot leave the list half written.
        self.recorded
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Recorded {
    /// Each step with the time since the one before it (since the request arrived for
    /// the first), as `utiltrace` prints them: `authenticated +0.041 ms, ...`.
    fn render(&self, started: Instant) -> String {
        let mut out = String::new();
        let mut previous = started;
        for (what, at) in &self.steps {
            let sep = if out.is_empty() { "" } else { ", " };
            let since = at.saturating_duration_since(previous);
            let _ = write!(out, "{sep}{what} +{:.3} ms", millis(since));
            previous = *at;
        }
        if self.dropped > 0 {
            let _ = write!(out, ", and {} more steps", self.dropped);
        }
        out
    }
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Milliseconds to the microsecond, as the steps print them.
fn microsecond_millis(duration: Duration) -> f64 {
    duration.as_micros() as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_render_in_order_with_the_time_since_the_one_before() {
        let started = Instant::now();
        let recorded = Recorded {
            steps: vec![
                ("authenticated", started + Duration::from_micros(41)),
                ("ClaimVM answered", started + Duration::from_micros(2_541)),
            ],
            dropped: 0,
            name: None,
        };
        assert_eq!(
            recorded.render(started),
            "authenticated +0.041 ms, ClaimVM answered +2.500 ms"
        );
    }

    #[test]
    fn steps_past_the_bound_are_counted_not_kept() {
        let trace = Trace::start(Instant::now());
        for _ in 0..MAX_STEPS + 3 {
            trace.step("ClaimVM aborted");
        }
        let steps = trace.0.as_ref().unwrap().lock();
        assert_eq!(steps.steps.len(), MAX_STEPS);
        assert!(
            steps.render(Instant::now()).ends_with(", and 3 more steps"),
            "{}",
            steps.render(Instant::now())
        );
    }

    #[test]
    fn a_trace_no_request_started_records_nothing() {
        let trace = Trace::default();
        trace.step("authenticated");
        trace.name("a");
        assert!(trace.0.is_none());
    }
}
