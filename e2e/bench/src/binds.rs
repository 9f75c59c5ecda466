//! Binding: serial latency beside raw `ClaimVM` on the same battery, throughput at a
//! given concurrency, and a burst of concurrent creates on a Pool just big enough.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use http::{Method, StatusCode};
use serde_json::Value;

use super::client::{self, Client};
use super::report::{Row, Unit, millis, percentiles, quantile, rank};
use super::rig::Route;
use super::served::{self, Observed};
use battery_e2e::api::{ClaimVmRequest, PoolRef, ReleaseVmRequest};

pub const LATENCY: &str = "bind latency";
pub const THROUGHPUT: &str = "bind throughput";
pub const BURST: &str = "burst";

/// Creates the claim `name` on `pool` and checks that the 201 says Bound; returns how
/// long it took and the claim.
pub async fn bind(client: &Client, name: &str, pool: &str) -> Result<(Duration, Value)> {
    bind_claim(client, &client::claim(name, pool)).await
}

/// Creates the claim `body` and checks that the 201 says Bound.
pub(super) async fn bind_claim(client: &Client, body: &Value) -> Result<(Duration, Value)> {
    let name = body["metadata"]["name"].as_str().unwrap_or_default();
    let started = Instant::now();
    let bound = client
        .json(
            Method::POST,
            &client::claims_path(),
            Some(body),
            StatusCode::CREATED,
        )
        .await?;
    let took = started.elapsed();
    if bound["status"]["phase"] != "Bound" {
        bail!("the claim {name} was answered 201 but not Bound: {bound}");
    }
    Ok((took, bound))
}

/// `count` serial binds on one keep-alive connection, each followed by a raw `ClaimVM`
/// on the same Pool of the same battery (released at once), so both see the same
/// machine at the same moment.
pub async fn latency(rig: &super::rig::Rig, pool: &PoolRef, count: usize) -> Result<Vec<Row>> {
    let client = rig.client().await?;
    let mut lease = rig.lease_client();
    let (mut binds, mut raws) = (Vec::with_capacity(count), Vec::with_capacity(count));
    let before = served::read(&client).await?;
    let cpu_before = rig.cpu_use()?;
    for i in 0..count {
        let (took, _) = bind(&client, &format!("latency-{i}"), &pool.name).await?;
        binds.push(took);
        let started = Instant::now();
        let response = lease
            .claim_vm(ClaimVmRequest {
                pool: Some(pool.clone()),
                request_id: String::new(),
            })
            .await
            .context("a raw ClaimVM")?
            .into_inner();
        raws.push(started.elapsed());
        lease
            .release_vm(ReleaseVmRequest {
                lease_id: response.lease_id,
            })
            .await
            .context("releasing a raw lease")?;
    }
    let cpu_after = rig.cpu_use()?;
    let after = served::read(&client).await?;
    let mut rows = Vec::new();
    let [p50, p90, p99] = percentiles(LATENCY, "POST -> 201 Bound", &binds);
    let floor = crate::commit::appends(&rig.store_dir(), DURABLE_WRITES)?;
    rows.extend([p50.at_most(2.0), p90, p99.at_most(10.0)]);
    rows.extend(percentiles(LATENCY, "raw ClaimVM", &raws));
    // Each bind less the raw ClaimVM of its own round: a difference of two quantiles
    // would set one round's slow bind against another round's slow ClaimVM.
    let overheads: Vec<f64> = binds
        .iter()
        .zip(&raws)
        .map(|(bind, raw)| millis(*bind) - millis(*raw))
        .collect();
    for p in [0.5_f64, 0.99] {
        let (ours, raw) = (quantile(&binds, p), quantile(&raws, p));
        let name = rank(p);
        let overhead = Row::new(
            LATENCY,
            format!("overhead over the round's ClaimVM {name}"),
            quantile(&overheads, p),
            Unit::Millis,
        );
        rows.push(if p == 0.5 {
            overhead.at_most(1.0)
        } else {
            overhead
        });
        rows.push(Row::new(
            LATENCY,
            format!("ratio POST / ClaimVM {name}"),
            millis(ours) / millis(raw),
            Unit::Times,
        ));
    }
    let [floor_p50, _, floor_p99] = percentiles(LATENCY, crate::commit::APPENDED, &floor);
    rows.extend([floor_p50, floor_p99]);
    rows.extend(where_the_time_goes(&binds, &before, &after)?);
    rows.extend(cpu_after.since(&cpu_before).rows(
        LATENCY,
        "a round (a bind, a raw ClaimVM and its release)",
        count as f64,
    ));
    Ok(rows)
}

/// Means over the serial binds, from the bench and from `serve`'s histograms read before
/// and after them: what is `serve`'s, what its bind and battery take inside it, and (the
/// rest of the bench's mean) what the connection costs: TLS, HTTP/2, the bench's client.
fn where_the_time_goes(
    binds: &[Duration],
    before: &[Observed],
    after: &[Observed],
) -> Result<Vec<Row>> {
    let total: Duration = binds.iter().sum();
    let mut rows = vec![Row::millis(
        LATENCY,
        "POST -> 201 Bound mean",
        total / binds.len() as u32,
    )];
    let mean = |what: &str, before: Observed, after: Observed| {
        served::mean(before, after).map(|mean| {
            Row::new(
                LATENCY,
                format!("{what} mean, from its /metrics"),
                mean,
                Unit::Millis,
            )
        })
    };
    for (i, (what, _, _)) in served::SERIES.iter().enumerate() {
        rows.push(
            mean(what, before[i], after[i])
                .with_context(|| format!("/metrics: {what} observed nothing during the binds"))?,
        );
    }
    let (what, _, _) = served::FOLLOWER;
    let last = served::SERIES.len();
    rows.extend(mean(what, before[last], after[last]));
    rows.push(Row::new(
        LATENCY,
        format!("{what} per bind"),
        served::count(before[last], after[last]) / binds.len() as f64,
        Unit::Times,
    ));
    Ok(rows)
}

/// How many durable writes the disk's floor is timed over.
const DURABLE_WRITES: usize = 200;

/// `count` binds named `<prefix>-<i>` on `pool`, `concurrency` at a time over up to
/// eight connections (as many clients would hold); returns each one's latency and the
/// time they all took.
pub async fn bind_many(
    rig: &super::rig::Rig,
    route: Route,
    pool: &str,
    prefix: &str,
    range: std::ops::Range<usize>,
    concurrency: usize,
) -> Result<(Vec<Duration>, Duration)> {
    let mut clients = Vec::new();
    for _ in 0..concurrency.clamp(1, 8) {
        clients.push(rig.client_on(route).await?);
    }
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(range.start));
    let started = Instant::now();
    let workers = (0..concurrency).map(|worker| {
        let client = clients[worker % clients.len()].clone();
        let (next, end, pool, prefix) =
            (next.clone(), range.end, pool.to_owned(), prefix.to_owned());
        tokio::spawn(async move {
            let mut took = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= end {
                    return Ok::<_, anyhow::Error>(took);
                }
                took.push(bind(&client, &format!("{prefix}-{i}"), &pool).await?.0);
            }
        })
    });
    let mut all = Vec::new();
    for worker in futures::future::join_all(workers).await {
        all.extend(worker.context("a bind worker panicked")??);
    }
    Ok((all, started.elapsed()))
}

/// Binds per second at each concurrency, straight to `serve` and then through
/// kube-apiserver, each level on its own Pool (sized for both, never to run dry) so that
/// one level's leases never slow the next.
pub async fn throughput(
    rig: &super::rig::Rig,
    levels: &[(usize, usize, PoolRef)],
) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (concurrency, count, pool) in levels {
        for route in Route::BOTH {
            let prefix = format!("c{concurrency}{}", route_prefix(route));
            let (_, took) =
                bind_many(rig, route, &pool.name, &prefix, 0..*count, *concurrency).await?;
            let row = Row::new(
                THROUGHPUT,
                format!("binds/s at concurrency {concurrency}{}", route.suffix()),
                *count as f64 / took.as_secs_f64(),
                Unit::PerSecond,
            );
            rows.push(if *concurrency == 64 && route == Route::Direct {
                row.at_least(2000.0)
            } else {
                row
            });
        }
    }
    Ok(rows)
}

/// `count` creates at once, straight to `serve` and then through kube-apiserver, on a
/// Pool of twice `count`: until all are Bound, and their p99.
pub async fn burst(rig: &super::rig::Rig, pool: &PoolRef, count: usize) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for route in Route::BOTH {
        let prefix = format!("burst{}", route_prefix(route));
        let (binds, took) = bind_many(rig, route, &pool.name, &prefix, 0..count, count).await?;
        let all = Row::millis(
            BURST,
            format!("{count} creates: all Bound{}", route.suffix()),
            took,
        );
        rows.push(if route == Route::Direct {
            all.at_most(1000.0)
        } else {
            all
        });
        rows.push(Row::millis(
            BURST,
            format!("p99 of one create{}", route.suffix()),
            quantile(&binds, 0.99),
        ));
    }
    Ok(rows)
}

/// Keeps the claims of the two routes apart.
fn route_prefix(route: Route) -> &'static str {
    match route {
        Route::Direct => "",
        Route::Kube => "-kube",
    }
}
