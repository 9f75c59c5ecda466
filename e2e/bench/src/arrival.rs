//! Open-loop arrivals: requests arrive at a fixed mean rate, with exponential gaps
//! (a Poisson process, as claims from many independent CI jobs do), and each is sent
//! when it arrives, whatever the ones before it are doing. Each is timed from its
//! arrival, not from when it was sent, so a backlog counts against the server (no
//! coordinated omission).
//!
//! Arrivals take turns through five kinds, so each sees the same machine at the same
//! moment: a bind straight to `serve`, a bind through kube-apiserver, a raw `ClaimVM` on
//! the same battery (released at once), and the references the targets name, a
//! ConfigMap's create and get through the same kube-apiserver. `serve`'s own histograms,
//! read before and after each rate, split its part of a bind: the request, the bind
//! inside it, battery's `ClaimVM`, and beside them the metadata store's durable writes.
//!
//! Then, at each rate, the quiet comparison: only a bind through kube-apiserver and a
//! ConfigMap create alternate, each on its own keep-alive connection, nothing else
//! loading etcd, so the reference create is as fast as the machine allows (the five-kind
//! mix slows it, which flatters us). Its binds' and creates' time is split from `serve`'s
//! and kube-apiserver's own histograms: kube-apiserver's part, `serve`'s, battery's
//! `ClaimVM`, the durable writes; and kube-apiserver's handling and etcd's create. In
//! both passes each bind through kube-apiserver is also split at `serve`'s steps, from
//! its trace in `serve`'s log, for where the slowest binds' time went (`bind_split`); in
//! the quiet pass, each of `serve`'s own steps has its p50 too.
//!
//! Beside the quiet pass, on a thread of its own, the floor issue 41 holds `serve`'s own
//! part of a bind to is timed at the same pace: arrivals of a Poisson stream of their own
//! alternate 4 KiB appended and `fdatasync`ed beside the rig's disk and a loopback round
//! trip, each finding the machine as loaded as the pass's binds do. `serve`'s own part of
//! the quiet pass's binds (its request less battery's `ClaimVM`) is held to their sum.
//! The same floor is then timed alone at that pace, for what the pass's load adds to it.
//!
//! Last at each rate, as many binds straight to `serve` as the first pass paced, each
//! sent when the one before is answered, taking turns with as many raw `ClaimVM`s: a
//! lone bind should cost what a streamed one does. Beside it, battery's own ratio (raw
//! `ClaimVM`), `serve`'s own part's (the quiet pass's against the streamed binds') and
//! the floor's parts' (alone at the pace against back to back) say whose the cost is.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use http::{Method, StatusCode};

use super::bind_split::{self, Split};
use super::binds::bind;
use super::client::{Client, NAMESPACE, configmaps_path, create_config_map};
use super::commit::{
    floor_alone, floor_back_to_back, floor_beside, floor_millis, paced_floor_rows,
};
use super::poisson::open_loop;
use super::report::{Row, Unit, mean_millis, millis, quantile, rank};
use super::rig::Rig;
use super::served::{self, Observed};
use battery_e2e::api::{ClaimVmRequest, PoolRef, ReleaseVmRequest};

pub const ARRIVAL: &str = "arrival rates";

/// A rate, and how long arrivals come at it.
#[derive(Clone, Copy)]
pub struct Rate {
    pub per_second: f64,
    pub lasting: Duration,
}

impl Rate {
    pub const fn new(per_second: f64, lasting_ms: u64) -> Self {
        Self {
            per_second,
            lasting: Duration::from_millis(lasting_ms),
        }
    }

    fn arrivals(self) -> usize {
        (self.per_second * self.lasting.as_secs_f64())
            .round()
            .max(1.0) as usize
    }

    /// Binds straight to `serve` back to back after the passes, as many as the first
    /// pass paced, for the paced ones' reference; as many raw `ClaimVM`s take turns with
    /// them.
    fn streamed(self) -> usize {
        self.arrivals().div_ceil(KINDS.len())
    }

    /// How many MicroVMs the rate's binds and raw ClaimVMs take, in both passes and the
    /// streamed ones.
    pub fn microvms(self) -> i32 {
        let passes: usize = [&KINDS[..], &QUIET_KINDS]
            .iter()
            .map(|kinds| {
                kinds.iter().filter(|kind| kind.takes_a_microvm()).count()
                    * self.arrivals().div_ceil(kinds.len())
            })
            .sum();
        (passes + 2 * self.streamed()) as i32
    }

    fn label(self) -> String {
        format!("{}/s", self.per_second)
    }
}

/// What one arrival does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    BindDirect,
    BindThroughKube,
    RawClaimVm,
    ConfigMapCreate,
    ConfigMapGet,
}

const KINDS: [Kind; 5] = [
    Kind::BindDirect,
    Kind::BindThroughKube,
    Kind::RawClaimVm,
    Kind::ConfigMapCreate,
    Kind::ConfigMapGet,
];

/// The quiet comparison's two kinds.
const QUIET_KINDS: [Kind; 2] = [Kind::BindThroughKube, Kind::ConfigMapCreate];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::BindDirect => "bind straight to serve",
            Self::BindThroughKube => "bind through kube-apiserver",
            Self::RawClaimVm => "raw ClaimVM",
            Self::ConfigMapCreate => "ConfigMap create through kube-apiserver",
            Self::ConfigMapGet => "ConfigMap get through kube-apiserver",
        }
    }

    fn takes_a_microvm(self) -> bool {
        matches!(
            self,
            Self::BindDirect | Self::BindThroughKube | Self::RawClaimVm
        )
    }
}

/// The ConfigMap every get reads.
const REFERENCE: &str = "arrival-reference";

/// What each arrival needs to send its request; clones share connections.
#[derive(Clone)]
struct Senders {
    direct: Client,
    /// The binds through kube-apiserver.
    kube: Client,
    /// The ConfigMaps, on a connection of their own to kube-apiserver.
    reference: Client,
    lease: battery_e2e::api::lease_client::LeaseClient<battery_e2e::BatteryChannel>,
}

/// Runs each rate on its own Pool (`pools[i]` for `rates[i]`, each of
/// [`Rate::microvms`]) and returns their rows.
pub async fn run(rig: &Rig, rates: &[Rate], pools: &[PoolRef]) -> Result<Vec<Row>> {
    let senders = Senders {
        direct: rig.client().await?,
        kube: rig.kube_client().await?,
        reference: rig.kube_client().await?,
        lease: rig.lease_client(),
    };
    let admin = rig.cluster().plane.admin().await;
    create_config_map(&senders.reference, REFERENCE)
        .await
        .context("creating the ConfigMap the gets read")?;
    let mut serve_log = bind_split::TraceLog::new(rig.serve_log());
    let mut rows = Vec::new();
    for (rate, pool) in rates.iter().zip(pools) {
        eprintln!(
            "bench: {} arrivals at {} for {:?}",
            rate.arrivals(),
            rate.label(),
            rate.lasting
        );
        let before = served::read(&senders.direct).await?;
        let (took, splits) = arrive(&senders, *rate, &pool.name, &KINDS, "arrival").await?;
        let paced = (
            samples_of(&KINDS, &took, Kind::BindDirect).to_vec(),
            samples_of(&KINDS, &took, Kind::RawClaimVm).to_vec(),
        );
        let after = served::read(&senders.direct).await?;
        rows.extend(rate_rows(*rate, &took));
        let traces = serve_log.read_new()?;
        rows.extend(bind_split::rows(ARRIVAL, &rate.label(), &splits, &traces));
        rows.extend(split_rows(*rate, &before, &after));

        eprintln!("bench: the quiet comparison at {}", rate.label());
        let before = (
            served::read(&senders.direct).await?,
            served::kube_read(&admin).await?,
        );
        // The floor beside the pass: as many of each part as the pass has binds.
        let binds = rate.arrivals().div_ceil(QUIET_KINDS.len());
        let quiet = arrive(&senders, *rate, &pool.name, &QUIET_KINDS, "quiet");
        let ((took, splits), beside) = floor_beside(rate.per_second, binds, quiet).await?;
        let after = (
            served::read(&senders.direct).await?,
            served::kube_read(&admin).await?,
        );
        rows.extend(quiet_rows(*rate, &took));
        let label = format!("{} quiet", rate.label());
        let traces = serve_log.read_new()?;
        rows.extend(bind_split::rows(ARRIVAL, &label, &splits, &traces));
        rows.extend(bind_split::step_rows(ARRIVAL, &label, &splits, &traces));
        let alone = floor_alone(rate.per_second, binds.clamp(1, FLOOR_SAMPLES)).await?;
        let quiet_own = served::own_part(&before.0, &after.0);
        rows.extend(quiet_split_rows(
            *rate,
            &took,
            &before,
            &after,
            Floors {
                own: quiet_own,
                beside: floor_millis(&beside.0, &beside.1),
                alone: floor_millis(&alone.0, &alone.1),
            },
        ));

        let before = served::read(&senders.direct).await?;
        let streamed = streamed(&senders, *rate, &pool.name).await?;
        let streamed_own = served::own_part(&before, &served::read(&senders.direct).await?);
        rows.extend(streamed_rows(
            *rate,
            &paced,
            &streamed,
            (quiet_own, streamed_own),
        ));
        let back_to_back = floor_back_to_back(alone.0.len()).await?;
        rows.extend(paced_floor_rows(
            ARRIVAL,
            &rate.label(),
            &alone,
            &back_to_back,
        ));
    }
    Ok(rows)
}

/// Sends `rate`'s arrivals, taking turns through `kinds`, and returns each kind's times
/// in `kinds`' order, and the binds through kube-apiserver split; `pass` names their
/// objects.
async fn arrive(
    senders: &Senders,
    rate: Rate,
    pool: &str,
    kinds: &[Kind],
    pass: &str,
) -> Result<(Vec<Vec<Duration>>, Vec<Split>)> {
    let times = open_loop(rate.per_second, rate.arrivals(), |i, arrived| {
        let kind = kinds[i % kinds.len()];
        let (senders, name, pool) = (
            senders.clone(),
            format!("{pass}-{}-{i}", rate.per_second),
            pool.to_owned(),
        );
        async move { send(&senders, kind, &name, &pool, arrived).await }
    })
    .await?;
    let (mut took, mut splits) = (vec![Vec::new(); kinds.len()], Vec::new());
    for (i, (time, split)) in times.into_iter().enumerate() {
        took[i % kinds.len()].push(time);
        splits.extend(split);
    }
    Ok((took, splits))
}

/// How many of each of the floor's parts a rate times alone, at most.
const FLOOR_SAMPLES: usize = 40;

/// One arrival's request, timed from `arrived` to its answer, and named for its split
/// if it is a bind.
async fn send(
    senders: &Senders,
    kind: Kind,
    name: &str,
    pool: &str,
    arrived: Instant,
) -> Result<(Duration, Option<Split>)> {
    match kind {
        Kind::BindDirect | Kind::BindThroughKube => {
            let client = match kind {
                Kind::BindDirect => &senders.direct,
                _ => &senders.kube,
            };
            bind(client, name, pool).await?;
            let took = arrived.elapsed();
            return Ok((took, Some(Split::of(kind.name(), name, took))));
        }
        Kind::RawClaimVm => {
            let mut lease = senders.lease.clone();
            let claimed = lease
                .claim_vm(ClaimVmRequest {
                    pool: Some(PoolRef {
                        name: pool.to_owned(),
                        namespace: NAMESPACE.to_owned(),
                    }),
                    request_id: String::new(),
                })
                .await
                .context("a raw ClaimVM")?
                .into_inner();
            let took = arrived.elapsed();
            lease
                .release_vm(ReleaseVmRequest {
                    lease_id: claimed.lease_id,
                })
                .await
                .context("releasing a raw lease")?;
            return Ok((took, None));
        }
        Kind::ConfigMapCreate => create_config_map(&senders.reference, name).await?,
        Kind::ConfigMapGet => {
            let path = format!("{}/{REFERENCE}", configmaps_path());
            let got = senders
                .reference
                .json(Method::GET, &path, None, StatusCode::OK)
                .await?;
            if got["metadata"]["name"] != REFERENCE {
                bail!("{path} answered {got}");
            }
        }
    }
    Ok((arrived.elapsed(), None))
}

/// Fewer samples than this, and a p99.9 is only the largest sample: not reported.
const SAMPLES_FOR_P999: usize = 1000;

/// Each of `kinds`' p50, p99 (and p99.9 where there are enough samples), `took` in
/// `kinds`' order, each figure named after `label`.
fn quantile_rows(label: &str, kinds: &[Kind], took: &[Vec<Duration>]) -> Vec<Row> {
    let mut rows = Vec::new();
    for (kind, samples) in kinds.iter().zip(took) {
        let mut quantiles = vec![0.5, 0.99];
        if samples.len() >= SAMPLES_FOR_P999 {
            quantiles.push(0.999);
        }
        for p in quantiles {
            rows.push(Row::millis(
                ARRIVAL,
                format!("{label}: {} {}", kind.name(), rank(p)),
                quantile(samples, p),
            ));
        }
    }
    rows
}

/// `kind`'s times in `took`, which is in `kinds`' order.
fn samples_of<'a>(kinds: &[Kind], took: &'a [Vec<Duration>], kind: Kind) -> &'a [Duration] {
    &took[kinds.iter().position(|k| *k == kind).expect("a kind")]
}

/// `ours` against `reference` at quantile `p`, `took` in `kinds`' order.
fn ratio_row(
    label: &str,
    kinds: &[Kind],
    took: &[Vec<Duration>],
    (ours, reference): (Kind, Kind),
    p: f64,
) -> Row {
    let of = |kind| samples_of(kinds, took, kind);
    Row::new(
        ARRIVAL,
        format!(
            "{label}: {} / {} {}",
            ours.name(),
            reference.name(),
            rank(p)
        ),
        millis(quantile(of(ours), p)) / millis(quantile(of(reference), p)),
        Unit::Times,
    )
}

/// Each kind's quantiles, then the targets' ratios: a bind through kube-apiserver
/// against a ConfigMap's create (at most 1x) and get (at most 2x) there, and a bind
/// straight to `serve` against raw `ClaimVM` (at most 1.5x at p50).
fn rate_rows(rate: Rate, took: &[Vec<Duration>]) -> Vec<Row> {
    let label = rate.label();
    let mut rows = quantile_rows(&label, &KINDS, took);
    let ratio = |pair, p| ratio_row(&label, &KINDS, took, pair, p);
    for p in [0.5, 0.99] {
        rows.push(ratio((Kind::BindThroughKube, Kind::ConfigMapCreate), p).at_most(1.0));
    }
    rows.push(ratio((Kind::BindThroughKube, Kind::ConfigMapGet), 0.5).at_most(2.0));
    rows.push(ratio((Kind::BindDirect, Kind::RawClaimVm), 0.5).at_most(1.5));
    rows
}

/// `rate`'s count of binds straight to `serve` and as many raw `ClaimVM`s, taking turns,
/// each sent when the one before it is answered (issue 41's streamed claims): the binds'
/// times, then the `ClaimVM`s'.
async fn streamed(
    senders: &Senders,
    rate: Rate,
    pool: &str,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut binds, mut claims) = (Vec::new(), Vec::new());
    for i in 0..rate.streamed() {
        let name = format!("streamed-{}-{i}", rate.per_second);
        binds.push(bind(&senders.direct, &name, pool).await?.0);
        let sent = Instant::now();
        claims.push(send(senders, Kind::RawClaimVm, &name, pool, sent).await?.0);
    }
    Ok((binds, claims))
}

/// A lone bind straight to `serve`, paced at `rate`, against one streamed back to back:
/// at most 1.2x at p50 (issue 41). Beside it, whose the difference is: battery's raw
/// `ClaimVM` paced against streamed, and `serve`'s own part (`own`: the quiet pass's
/// mean, then the streamed binds').
fn streamed_rows(
    rate: Rate,
    (paced_binds, paced_claims): &(Vec<Duration>, Vec<Duration>),
    (streamed_binds, streamed_claims): &(Vec<Duration>, Vec<Duration>),
    own: (Option<f64>, Option<f64>),
) -> Vec<Row> {
    let p50_ratio = |what: &str, paced: &[Duration], streamed: &[Duration]| {
        Row::new(
            ARRIVAL,
            format!("{}: {what}, paced / back to back p50", rate.label()),
            millis(quantile(paced, 0.5)) / millis(quantile(streamed, 0.5)),
            Unit::Times,
        )
    };
    let mut rows = vec![
        p50_ratio("bind straight to serve", paced_binds, streamed_binds).at_most(1.2),
        p50_ratio("battery's raw ClaimVM", paced_claims, streamed_claims),
    ];
    if let (Some(paced), Some(streamed)) = own {
        rows.push(Row::new(
            ARRIVAL,
            format!(
                "{}: serve's own part of a bind streamed, mean",
                rate.label()
            ),
            streamed,
            Unit::Millis,
        ));
        rows.push(Row::new(
            ARRIVAL,
            format!(
                "{}: serve's own part of a bind, quiet pass / back to back, means",
                rate.label()
            ),
            paced / streamed,
            Unit::Times,
        ));
    }
    rows
}

/// The quiet comparison's quantiles and its targets: a bind through kube-apiserver at
/// most 1x a ConfigMap's create at p50 and 1.25x at p99 (issue 41).
fn quiet_rows(rate: Rate, took: &[Vec<Duration>]) -> Vec<Row> {
    let label = format!("{} quiet", rate.label());
    let mut rows = quantile_rows(&label, &QUIET_KINDS, took);
    let pair = (Kind::BindThroughKube, Kind::ConfigMapCreate);
    rows.push(ratio_row(&label, &QUIET_KINDS, took, pair, 0.5).at_most(1.0));
    rows.push(ratio_row(&label, &QUIET_KINDS, took, pair, 0.99).at_most(1.25));
    rows
}

/// `serve`'s own part of the quiet pass's binds and the floor it is held to, means in
/// milliseconds.
struct Floors {
    /// `serve`'s request less `ClaimVM` ([`served::own_part`]).
    own: Option<f64>,
    /// The floor timed beside the pass, at its pace: what the verdict holds `own` to.
    beside: Option<f64>,
    /// The floor timed at that pace with nothing else running.
    alone: Option<f64>,
}

/// Where the quiet comparison's time went, as means in milliseconds: a bind's through
/// kube-apiserver (the client's, the connections' and kube-apiserver's proxy, whose
/// share the create's client-and-connection part bounds; `serve`'s outside its bind,
/// its bind outside battery, battery's `ClaimVM`) and a ConfigMap
/// create's (the client's, kube-apiserver's handling, etcd's create), each part the
/// difference of two nested histograms' means; beside them the durable writes' mean,
/// which counts the follower's writes too, so is a bind's only roughly (a bind's two run
/// beside its `ClaimVM` and after its answer, ADR 48). `before` and `after` are (`serve`'s,
/// kube-apiserver's) histograms; a part whose histograms observed nothing is left out.
/// Last, `serve`'s own part over the floor timed beside the pass: it must not exceed it.
fn quiet_split_rows(
    rate: Rate,
    took: &[Vec<Duration>],
    before: &(Vec<served::Observed>, Vec<served::Observed>),
    after: &(Vec<served::Observed>, Vec<served::Observed>),
    floors: Floors,
) -> Vec<Row> {
    let serve = |i: usize| served::mean(before.0[i], after.0[i]);
    let kube = |i: usize| served::mean(before.1[i], after.1[i]);
    let minus = |a: Option<f64>, b: Option<f64>| Some(a? - b?);
    let (bind, create) = (mean_millis(&took[0]), mean_millis(&took[1]));
    let (request, inside, claim_vm, write) = (
        serve(served::REQUEST),
        serve(served::BIND),
        serve(served::CLAIM_VM),
        serve(served::WRITES),
    );
    let parts = [
        ("a bind, as its client saw it", bind),
        (
            "a bind: the client, the connections and kube-apiserver's proxy",
            minus(bind, request),
        ),
        (
            "a bind: serve's request outside its bind",
            minus(request, inside),
        ),
        (
            "a bind: serve's bind outside ClaimVM",
            minus(inside, claim_vm),
        ),
        ("a bind: battery's ClaimVM", claim_vm),
        ("serve's durable writes (the follower's too)", write),
        ("a create, as its client saw it", create),
        (
            "a create: the client and the connection",
            minus(create, kube(0)),
        ),
        (
            "a create: kube-apiserver's handling outside etcd",
            minus(kube(0), kube(1)),
        ),
        ("a create: etcd's create", kube(1)),
        (
            "the floor of serve's own part: 4 KiB appended and fdatasynced, and a loopback \
             round trip, at this pace beside the pass",
            floors.beside,
        ),
        ("the same floor at this pace alone", floors.alone),
    ];
    let mut rows: Vec<Row> = parts
        .into_iter()
        .filter_map(|(what, mean)| {
            mean.map(|mean| {
                Row::new(
                    ARRIVAL,
                    format!("{} quiet, mean: {what}", rate.label()),
                    mean,
                    Unit::Millis,
                )
            })
        })
        .collect();
    // How many writes that mean spans: two are the bind's own, the rest the follower's.
    if !took[0].is_empty() {
        rows.push(Row::new(
            ARRIVAL,
            format!("{} quiet: serve's durable writes per bind", rate.label()),
            served::count(before.0[served::WRITES], after.0[served::WRITES]) / took[0].len() as f64,
            Unit::Times,
        ));
    }
    if let (Some(own), Some(floor)) = (floors.own, floors.beside) {
        rows.push(
            Row::new(
                ARRIVAL,
                format!(
                    "{} quiet: serve's own part of a bind / its floor, means",
                    rate.label()
                ),
                own / floor,
                Unit::Times,
            )
            .at_most(1.0),
        );
    }
    rows
}

/// `serve`'s means over the rate's binds (both routes), from its histograms.
fn split_rows(rate: Rate, before: &[Observed], after: &[Observed]) -> Vec<Row> {
    served::SERIES
        .iter()
        .zip(before.iter().zip(after))
        .filter_map(|((what, _, _), (before, after))| {
            served::mean(*before, *after).map(|mean| {
                Row::new(
                    ARRIVAL,
                    format!("{}: {what} mean, from its /metrics", rate.label()),
                    mean,
                    Unit::Millis,
                )
            })
        })
        .collect()
}
