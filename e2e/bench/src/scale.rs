//! Scale: lists of many claims (Table, JSON, paged), watch fan-out to many watchers, and
//! the API server's memory idle, holding many claims, and with the watches open.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use http::{Method, StatusCode};
use http_body_util::BodyExt as _;
use tokio::sync::mpsc;

use super::binds::{bind, bind_many};
use super::client::{self, Client};
use super::report::{Row, Unit, percentiles, quantile};
use super::rig::{Rig, Route};
use battery_e2e::api::ListLeasesRequest;

pub const LIST: &str = "list at scale";
pub const WATCH: &str = "watch fan-out";
pub const MEMORY: &str = "memory";

/// What kubectl asks for by default: a Table, falling back to JSON.
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
/// Each list is timed this many times; the median is reported.
const LIST_ROUNDS: usize = 5;
/// Watches per HTTP/2 connection: under hyper's default stream limit, as several
/// clients would hold them.
const WATCHES_PER_CONNECTION: usize = 100;
/// How long every watcher may take to see one event before the run fails.
const EVENT_TIMEOUT: Duration = Duration::from_secs(30);
/// How many creates are in flight while claims pile up.
const FILL_CONCURRENCY: usize = 64;

/// The sizes of the scale phase.
#[derive(Clone)]
pub struct Sizes {
    /// The two claim counts lists are timed at.
    pub lists: [usize; 2],
    pub watchers: usize,
    /// Binds whose events are timed at every watcher.
    pub watched_binds: usize,
}

/// Runs the phase on `rig`, whose Pool `pool` holds a MicroVM for every claim it makes.
pub async fn run(rig: &Rig, pool: &str, sizes: &Sizes) -> Result<Vec<Row>> {
    let idle = rig.serve_memory()?;
    let mut rows = vec![
        Row::new(MEMORY, "RSS idle", idle.resident, Unit::Megabytes).at_most(30.0),
        Row::new(
            MEMORY,
            "RSS idle: anonymous (heap, stacks)",
            idle.anonymous,
            Unit::Megabytes,
        ),
        Row::new(
            MEMORY,
            "RSS idle: mapped from files (the binary's code)",
            idle.mapped_files,
            Unit::Megabytes,
        ),
    ];
    let client = rig.client().await?;
    let mut made = 0;
    for (i, &count) in sizes.lists.iter().enumerate() {
        eprintln!("bench: {count} claims, then their lists");
        bind_many(
            rig,
            Route::Direct,
            pool,
            "scale",
            made..count,
            FILL_CONCURRENCY,
        )
        .await?;
        made = count;
        for route in Route::BOTH {
            let client = rig.client_on(route).await?;
            let last = i + 1 == sizes.lists.len();
            rows.extend(lists(rig, route, &client, count, last).await?);
        }
    }
    let at_claims = rig.serve_memory()?.resident;
    rows.push(Row::new(
        MEMORY,
        format!("RSS at {made} claims"),
        at_claims,
        Unit::Megabytes,
    ));
    eprintln!("bench: {} watches", sizes.watchers);
    let watchers = Watchers::open(rig, Route::Direct, sizes.watchers).await?;
    let with_watches = rig.serve_memory()?;
    rows.push(
        Row::new(
            MEMORY,
            format!("RSS at {made} claims + {} watches", sizes.watchers),
            with_watches.resident,
            Unit::Megabytes,
        )
        .at_most(200.0),
    );
    let delays = watchers
        .time_binds(&client, pool, "watched", sizes.watched_binds)
        .await?;
    let [p50, _, p99] = percentiles(
        WATCH,
        &format!("201 -> event at each of {} watchers", sizes.watchers),
        &delays,
    );
    rows.extend([p50, p99.at_most(50.0)]);
    eprintln!("bench: {} watches through kube-apiserver", sizes.watchers);
    let watchers = Watchers::open(rig, Route::Kube, sizes.watchers).await?;
    let kube = rig.kube_client().await?;
    let delays = watchers
        .time_binds(&kube, pool, "watched-kube", sizes.watched_binds)
        .await?;
    let [p50, _, p99] = percentiles(
        WATCH,
        &format!(
            "201 -> event at each of {} watchers through kube-apiserver",
            sizes.watchers
        ),
        &delays,
    );
    rows.extend([p50, p99]);
    rows.push(Row::new(
        MEMORY,
        "peak RSS (VmHWM) of the run",
        with_watches.peak,
        Unit::Megabytes,
    ));
    Ok(rows)
}

/// The median time of `LIST_ROUNDS` lists of all claims (Table and JSON), and of paged
/// lists with limit=500 (the first page, and all pages), with `count` claims stored; and
/// of the raw `ListLeases` of all pools that each list makes of battery.
async fn lists(
    rig: &Rig,
    route: Route,
    client: &Client,
    count: usize,
    with_target: bool,
) -> Result<Vec<Row>> {
    let path = client::claims_path();
    let timed = |accept: &'static str, limit: bool| {
        let path = path.clone();
        async move {
            let (mut all, mut first) = (Vec::new(), Vec::new());
            for _ in 0..LIST_ROUNDS {
                // The server's time: each request until its whole body is in, without
                // the bench's own parsing of it (which kubectl's would add).
                let mut spent = Duration::ZERO;
                let mut continue_token = String::new();
                let mut items = 0;
                let mut first_page = None;
                loop {
                    let page = if limit {
                        format!("{path}?limit=500&continue={continue_token}")
                    } else {
                        path.clone()
                    };
                    let started = Instant::now();
                    let (status, body) = client.send(Method::GET, &page, accept, None).await?;
                    spent += started.elapsed();
                    if status != StatusCode::OK {
                        bail!("{page}: {status}: {}", String::from_utf8_lossy(&body));
                    }
                    first_page.get_or_insert(spent);
                    let list: serde_json::Value = serde_json::from_slice(&body)?;
                    items += list["items"]
                        .as_array()
                        .or(list["rows"].as_array())
                        .map_or(0, Vec::len);
                    continue_token = list["metadata"]["continue"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    if continue_token.is_empty() {
                        break;
                    }
                }
                if items != count {
                    bail!("{path}: listed {items} claims, not {count}");
                }
                all.push(spent);
                first.extend(first_page);
            }
            Ok((quantile(&all, 0.5), quantile(&first, 0.5)))
        }
    };
    let (table, _) = timed(TABLE, false).await?;
    let (json, _) = timed("application/json", false).await?;
    let (pages, first_page) = timed("application/json", true).await?;
    let on = route.suffix();
    let target = |row: Row| {
        if with_target && route == Route::Direct {
            row.at_most(100.0)
        } else {
            row
        }
    };
    let mut rows = vec![
        target(Row::millis(LIST, format!("Table of {count}{on}"), table)),
        target(Row::millis(LIST, format!("JSON of {count}{on}"), json)),
        Row::millis(
            LIST,
            format!("limit=500 first page of {count}{on}"),
            first_page,
        ),
        Row::millis(LIST, format!("limit=500 all pages of {count}{on}"), pages),
    ];
    if route == Route::Direct {
        let mut lease = rig.lease_client();
        let mut raw = Vec::with_capacity(LIST_ROUNDS);
        for _ in 0..LIST_ROUNDS {
            let started = Instant::now();
            lease
                .list_leases(ListLeasesRequest { pool_ref: None })
                .await
                .context("a raw ListLeases")?;
            raw.push(started.elapsed());
        }
        rows.push(Row::millis(
            LIST,
            format!("raw ListLeases of {count} leases"),
            quantile(&raw, 0.5),
        ));
    }
    Ok(rows)
}

/// Watches of the claims, each reporting the name of every claim it sees and when.
pub(super) struct Watchers {
    count: usize,
    /// Which watcher saw which claim, when.
    pub(super) seen: mpsc::UnboundedReceiver<(usize, String, Instant)>,
    _connections: Vec<Client>,
}

impl Watchers {
    /// Opens `count` watches from the current resourceVersion, so that none replays the
    /// claims already stored.
    pub(super) async fn open(rig: &Rig, route: Route, count: usize) -> Result<Self> {
        let path = client::claims_path();
        let first = rig.client_on(route).await?;
        let list = first
            .json(
                Method::GET,
                &format!("{path}?limit=1"),
                None,
                StatusCode::OK,
            )
            .await?;
        let rv = list["metadata"]["resourceVersion"]
            .as_str()
            .context("a list without a resourceVersion")?
            .to_owned();
        let watch = format!("{path}?watch=1&resourceVersion={rv}&allowWatchBookmarks=false");
        let (tx, seen) = mpsc::unbounded_channel();
        let mut connections = vec![first];
        for _ in 1..count.div_ceil(WATCHES_PER_CONNECTION) {
            connections.push(rig.client_on(route).await?);
        }
        for i in 0..count {
            let client = &connections[i / WATCHES_PER_CONNECTION];
            let response = client
                .open(Method::GET, &watch, "application/json", None)
                .await?;
            if response.status() != StatusCode::OK {
                bail!("watch {i}: {}", response.status());
            }
            let tx = tx.clone();
            let mut body = response.into_body();
            // Ends when the server or the bench closes the watch.
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                while let Some(Ok(frame)) = body.frame().await {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    buffer.extend_from_slice(&data);
                    let at = Instant::now();
                    while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = buffer.drain(..=end).collect();
                        let event: serde_json::Value =
                            serde_json::from_slice(&line).unwrap_or_default();
                        if let Some(name) = event["object"]["metadata"]["name"].as_str() {
                            let _ = tx.send((i, name.to_owned(), at));
                        }
                    }
                }
            });
        }
        Ok(Self {
            count,
            seen,
            _connections: connections,
        })
    }

    /// Binds `binds` claims one after the other, each once every watcher saw the last,
    /// and returns, per bind and watcher, the time from the 201 to the event (0 for an
    /// event that arrived before the 201 did).
    async fn time_binds(
        mut self,
        client: &Client,
        pool: &str,
        prefix: &str,
        binds: usize,
    ) -> Result<Vec<Duration>> {
        let mut delays = Vec::with_capacity(binds * self.count);
        // A claim's later events (or one seen before its 201) wait here; only the first
        // event of each claim at each watcher counts.
        let mut seen: HashMap<String, HashMap<usize, Instant>> = HashMap::new();
        for i in 0..binds {
            let name = format!("{prefix}-{i}");
            bind(client, &name, pool).await?;
            let answered = Instant::now();
            while seen.get(&name).map_or(0, HashMap::len) < self.count {
                let (watcher, claim, at) = tokio::time::timeout(EVENT_TIMEOUT, self.seen.recv())
                    .await
                    .with_context(|| {
                        let saw = seen.get(&name).map_or(0, HashMap::len);
                        format!(
                            "{saw} of {} watchers saw {name} within {EVENT_TIMEOUT:?}",
                            self.count
                        )
                    })?
                    .context("every watch ended")?;
                seen.entry(claim).or_default().entry(watcher).or_insert(at);
            }
            let arrivals = seen.remove(&name).unwrap_or_default();
            delays.extend(
                arrivals
                    .values()
                    .map(|at| at.saturating_duration_since(answered)),
            );
        }
        Ok(delays)
    }
}
