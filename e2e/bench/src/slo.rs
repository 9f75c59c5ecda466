//! The check of our published SLOs (`docs/slo.md`): the load they are stated for, made
//! through kube-apiserver as users meet us, for one window, and each SLI's p99 against its
//! SLO. Claims arrive at a fixed mean rate (Poisson, timed from arrival); each is bound,
//! read, has its lease renewed, every tenth runs `echo`, and is deleted. Meanwhile a
//! standing population of claims is listed once a period and one watch times the arrival
//! of every bind's event. `bench --phase slo` exits 1 if any SLO is missed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use http::{Method, StatusCode};

use super::binds::{bind, bind_many};
use super::client::{self, Client};
use super::exec::through_server;
use super::poisson::open_loop;
use super::report::{Row, millis, quantile};
use super::rig::{Rig, Route};
use super::scale::Watchers;
use battery_e2e::channel_exec;

pub const SLO: &str = "SLO (docs/slo.md)";

/// The load one check makes.
#[derive(Clone, Copy)]
pub struct Load {
    /// Claims bound beforehand and held, so lists are of this many and more.
    pub standing: usize,
    /// Creates per second, the rate the SLOs are stated for.
    pub per_second: f64,
    pub window: Duration,
    /// How often the namespace's claims are listed.
    pub list_every: Duration,
}

impl Load {
    pub fn arrivals(&self) -> usize {
        (self.per_second * self.window.as_secs_f64())
            .round()
            .max(1.0) as usize
    }

    /// The MicroVMs the check takes: one per standing claim and per arrival.
    pub fn microvms(&self) -> i32 {
        (self.standing + self.arrivals()) as i32
    }
}

/// What each SLO is about, and its p99 bound, as `docs/slo.md` states them.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Sli {
    Create,
    Get,
    Renew,
    Delete,
    List,
    WatchDelivery,
    ExecFirstByte,
}

impl Sli {
    const ALL: [Self; 7] = [
        Self::Create,
        Self::Get,
        Self::Renew,
        Self::Delete,
        Self::List,
        Self::WatchDelivery,
        Self::ExecFirstByte,
    ];

    fn name(self) -> &'static str {
        match self {
            Self::Create => "create (bind, 201 Bound)",
            Self::Get => "get a claim",
            Self::Renew => "renew (update lease)",
            Self::Delete => "delete (release)",
            Self::List => "list the namespace's claims",
            Self::WatchDelivery => "watch: 201 -> the event at a watcher",
            Self::ExecFirstByte => "exec: the first byte of echo",
        }
    }

    /// The SLO: the p99 it may not exceed, in milliseconds.
    fn p99_at_most(self) -> f64 {
        match self {
            Self::Create | Self::Renew | Self::Delete => 250.0,
            Self::Get => 100.0,
            Self::List | Self::WatchDelivery => 1000.0,
            Self::ExecFirstByte => 500.0,
        }
    }
}

/// Every tenth arrival runs `echo` before its delete.
const EXEC_EVERY: usize = 10;
/// How long the watch may take to see the last bind's event before the check fails.
const EVENT_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs the check on `pool`, of [`Load::microvms`] MicroVMs.
pub async fn run(rig: &Rig, pool: &str, load: Load) -> Result<Vec<Row>> {
    eprintln!("bench: {} standing claims", load.standing);
    bind_many(rig, Route::Kube, pool, "slo-standing", 0..load.standing, 64).await?;
    let kube = rig.kube_client().await?;
    let exec = Arc::new(rig.exec_client(Route::Kube));
    let mut watch = Watchers::open(rig, Route::Kube, 1).await?;
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let listing = tokio::spawn(list_until(kube.clone(), load.list_every, stopped));
    eprintln!(
        "bench: {} arrivals at {}/s through kube-apiserver",
        load.arrivals(),
        load.per_second
    );
    let lives = open_loop(load.per_second, load.arrivals(), |i, arrived| {
        let (kube, exec, pool) = (kube.clone(), exec.clone(), pool.to_owned());
        async move {
            let exec = (i % EXEC_EVERY == 0).then_some(&*exec);
            lifecycle(&kube, exec, &format!("slo-{i}"), &pool, arrived).await
        }
    })
    .await?;
    let mut took: HashMap<Sli, Vec<Duration>> = HashMap::new();
    let mut bound_at = HashMap::with_capacity(lives.len());
    for life in lives {
        for (sli, time) in life.took {
            took.entry(sli).or_default().push(time);
        }
        bound_at.insert(life.name, life.bound_at);
    }
    // The listing task is waiting for its next tick or in a list: either way it ends.
    let _ = stop.send(());
    let lists = listing.await.context("the listing panicked")??;
    took.insert(Sli::List, lists);
    took.insert(Sli::WatchDelivery, deliveries(&mut watch, &bound_at).await?);
    Ok(rows(load, &took))
}

/// One arrival's times, and when its bind was answered (for the watch's delay).
struct Life {
    name: String,
    bound_at: Instant,
    took: Vec<(Sli, Duration)>,
}

/// A claim's life as a user's program leads it: bound (timed from its arrival, so a
/// backlog counts), read, renewed, perhaps `echo` run in it, then released.
async fn lifecycle(
    kube: &Client,
    exec: Option<&channel_exec::Client>,
    name: &str,
    pool: &str,
    arrived: Instant,
) -> Result<Life> {
    bind(kube, name, pool).await?;
    let bound_at = Instant::now();
    let mut took = vec![(Sli::Create, bound_at - arrived)];
    let path = format!("{}/{name}", client::claims_path());
    let started = Instant::now();
    kube.json(Method::GET, &path, None, StatusCode::OK).await?;
    took.push((Sli::Get, started.elapsed()));
    let lease_path = format!("{path}/lease");
    let lease = kube
        .json(Method::GET, &lease_path, None, StatusCode::OK)
        .await?;
    let started = Instant::now();
    kube.json(Method::PUT, &lease_path, Some(&lease), StatusCode::OK)
        .await?;
    took.push((Sli::Renew, started.elapsed()));
    if let Some(exec) = exec {
        let run = through_server(exec, name, &["echo", "slo"]).await?;
        took.push((Sli::ExecFirstByte, run.first_byte));
    }
    let started = Instant::now();
    let (status, body) = kube
        .send(Method::DELETE, &path, "application/json", None)
        .await?;
    if !status.is_success() {
        bail!("{path}: {status}: {}", String::from_utf8_lossy(&body));
    }
    took.push((Sli::Delete, started.elapsed()));
    Ok(Life {
        name: name.to_owned(),
        bound_at,
        took,
    })
}

/// Lists the namespace's claims once every `period` until `stopped`; returns each time.
async fn list_until(
    kube: Client,
    period: Duration,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) -> Result<Vec<Duration>> {
    let mut ticks = tokio::time::interval(period);
    let mut took = Vec::new();
    loop {
        tokio::select! {
            _ = &mut stopped => return Ok(took),
            _ = ticks.tick() => {
                let started = Instant::now();
                kube.json(Method::GET, &client::claims_path(), None, StatusCode::OK)
                    .await?;
                took.push(started.elapsed());
            }
        }
    }
}

/// For each bind, from its 201 to its first event at the watch (zero when the event came
/// first).
async fn deliveries(
    watch: &mut Watchers,
    bound_at: &HashMap<String, Instant>,
) -> Result<Vec<Duration>> {
    let mut delays = HashMap::with_capacity(bound_at.len());
    while delays.len() < bound_at.len() {
        let (_, name, at) = tokio::time::timeout(EVENT_TIMEOUT, watch.seen.recv())
            .await
            .with_context(|| {
                format!(
                    "the watch saw {} of {} binds within {EVENT_TIMEOUT:?} of the last",
                    delays.len(),
                    bound_at.len()
                )
            })?
            .context("the watch ended")?;
        if let Some(bound) = bound_at.get(&name) {
            delays
                .entry(name)
                .or_insert_with(|| at.saturating_duration_since(*bound));
        }
    }
    Ok(delays.into_values().collect())
}

/// Each SLI's p50, and its p99 against its SLO.
fn rows(load: Load, took: &HashMap<Sli, Vec<Duration>>) -> Vec<Row> {
    let under = format!(
        "at {}/s over {:?}, {}+ claims",
        load.per_second, load.window, load.standing
    );
    let mut rows = Vec::new();
    for sli in Sli::ALL {
        let samples = &took[&sli];
        rows.push(Row::millis(
            SLO,
            format!("{} p50 {under} ({} samples)", sli.name(), samples.len()),
            quantile(samples, 0.5),
        ));
        rows.push(
            Row::new(
                SLO,
                format!("{} p99 {under}", sli.name()),
                millis(quantile(samples, 0.99)),
                super::report::Unit::Millis,
            )
            .at_most(sli.p99_at_most()),
        );
    }
    rows
}
