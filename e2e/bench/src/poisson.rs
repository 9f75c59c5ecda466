//! Open-loop Poisson arrivals, which the arrival and SLO scenarios pace their requests
//! with: each request is sent when it arrives, whatever the ones before it are doing, and
//! timed from its arrival, so a backlog counts against the server (no coordinated
//! omission).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use tokio::sync::Semaphore;

/// The most requests in flight at once: past it an arrival waits for a slot, and its
/// wait is part of its time, so an overloaded run shows as slow rather than as a bench
/// that runs out of sockets or memory.
const MAX_IN_FLIGHT: usize = 2048;

/// Starts `count` arrivals of a Poisson process of mean rate `per_second`, each as
/// `arrival(i, when it arrived)` when it arrives, whatever the ones before it are doing
/// (up to [`MAX_IN_FLIGHT`] at once), and returns their results in arrival order.
pub async fn open_loop<T, F, Fut>(per_second: f64, count: usize, mut arrival: F) -> Result<Vec<T>>
where
    T: Send + 'static,
    F: FnMut(usize, Instant) -> Fut,
    Fut: std::future::Future<Output = Result<T>> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(count);
    for (i, at) in arrival_times(per_second).take(count).enumerate() {
        tokio::time::sleep_until(start + at).await;
        let arrived = Instant::now();
        let slot = slots.clone().acquire_owned().await?;
        let arrived = arrival(i, arrived);
        tasks.push(tokio::spawn(async move {
            let _slot = slot;
            arrived.await
        }));
    }
    let mut results = Vec::with_capacity(count);
    for task in tasks {
        results.push(task.await.context("an arrival panicked")??);
    }
    Ok(results)
}

/// When each arrival of a Poisson process of mean rate `per_second` comes, from 0. The
/// same on every run at a rate, so runs differ by the server only.
pub fn arrival_times(per_second: f64) -> impl Iterator<Item = Duration> {
    seeded_arrival_times(per_second, per_second.to_bits())
}

/// [`arrival_times`] of a second process at the same rate, independent of the first: a
/// probe that runs beside a pass arrives when the pass's requests do not, as a rule.
pub fn other_arrival_times(per_second: f64) -> impl Iterator<Item = Duration> {
    seeded_arrival_times(per_second, !per_second.to_bits())
}

fn seeded_arrival_times(per_second: f64, seed: u64) -> impl Iterator<Item = Duration> {
    let mut random = fastrand::Rng::with_seed(seed);
    let mut at = Duration::ZERO;
    std::iter::repeat_with(move || {
        // Exponential gaps of mean 1/rate; 1 - f64() is in (0, 1], so ln is finite.
        at += Duration::from_secs_f64(-(1.0 - random.f64()).ln() / per_second);
        at
    })
}
