//! `bench`: the figures of issues 13 and 32, measured on the real binaries in one run. It starts a
//! real control plane with battery-apiserver installed, `battery-apiserver
//! embedded-battery`, `battery-apiserver serve` behind the APIService and one
//! `battery-agent` per simulated Host (see [`rig`]), runs each scenario, stops
//! every process, and prints one table (and, with `--json`, writes it as JSON). It builds
//! nothing: the binaries are the ones beside `bench` (or `--binary`), so
//! `cargo build --release -p battery-apiserver -p battery-agent -p battery-bench` then
//! `target/release/bench` measures release binaries. `docs/performance.md` holds a full
//! run and what it found.
//!
//! Three phases, each on fresh processes so nothing one leaves behind weighs on the other:
//! binding (serial latency beside raw `ClaimVM`, throughput, burst, open-loop arrival
//! rates, the metadata store's durable commit beside the disk's floor, time to first
//! output, exec, terminals and ports, and agent-sandbox on the same kube-apiserver); the
//! check of our SLOs (`docs/slo.md`, alone with `--phase slo`, which exits 1 on a miss);
//! then scale (lists, watches, memory). What users meet is measured through kube-apiserver
//! beside what `serve` does alone. Every scenario binds on a Pool of its own, sized so it
//! never runs dry.

mod arrival;
mod bind_split;
mod binds;
mod client;
mod commit;
mod configured_binds;
mod exec;
mod first_output;
mod poisson;
pub mod report;
mod rig;
mod sandbox;
mod scale;
mod served;
mod slo;
mod terminal;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use report::Report;
use rig::{BatteryStore, Rig};

/// The command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "bench",
    about = "Measures battery-apiserver against its targets (issues 13 and 32), straight to serve and through kube-apiserver: binds at open-loop arrival rates, throughput, burst, time to first output, agent-sandbox beside us, lists, watches, exec and memory."
)]
pub struct Args {
    /// Small sizes, a few seconds of work: for the test command, so the bench never rots.
    #[arg(long)]
    pub quick: bool,
    /// The battery-apiserver binary to measure; default: the one beside `bench`.
    #[arg(long)]
    pub binary: Option<PathBuf>,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// How many serial binds the bind latency scenario makes (default: the issue's
    /// 2,000; quick: 20). Each, and each raw ClaimVM beside it, takes a booted MicroVM.
    #[arg(long)]
    pub binds: Option<usize>,
    /// How many serial rounds the per-claim configuration scenario makes (default: 100;
    /// quick: 5). Each round is four binds: plain, env, a file, both.
    #[arg(long)]
    pub config_binds: Option<usize>,
    /// How many claims the scale phase lists and holds at most (default: the issue's
    /// 10,000; quick: 100). Each needs a MicroVM booted by the embedded battery first.
    #[arg(long)]
    pub claims: Option<usize>,
    /// How many claims the SLO check holds while it measures, so that lists are of at
    /// least this many (default: 1,000; quick: 20; the list SLO is stated up to 10,000).
    #[arg(long)]
    pub standing_claims: Option<usize>,
    /// Which phase to run: both (the default, the documented run), or one of them alone,
    /// as when profiling it.
    #[arg(long, value_enum, default_value_t = Phase::All)]
    pub phase: Phase,
    /// How the embedded battery delivers its events: as poolmgrd does (the default:
    /// polled every second, so a bind waiting for a MicroVM and a Pool's counts wait for
    /// the next poll), or on each commit, an extension of ours, to see our own speed.
    #[arg(long, value_enum, default_value_t = BatteryEvents::Poolmgrd)]
    pub battery_events: BatteryEvents,
    /// Where the embedded battery keeps its state: on disk (the default), as poolmgrd
    /// keeps its SQLite database, so a ClaimVM pays its commits' fsyncs; or in memory,
    /// as runs before 2026-12-07 did, which makes battery's part of a bind cheaper than
    /// a deployed battery's.
    #[arg(long, value_enum, default_value_t = BatteryStore::Disk)]
    pub battery_store: BatteryStore,
}

/// How the embedded battery delivers its events to subscribers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BatteryEvents {
    /// poolmgrd's: polled every second, replayed in batches of 100.
    Poolmgrd,
    /// Ours: each subscriber woken on each commit.
    OnCommit,
}

impl BatteryEvents {
    /// `embedded-battery`'s flags for it.
    fn battery_args(self) -> Vec<String> {
        match self {
            Self::Poolmgrd => Vec::new(),
            Self::OnCommit => vec!["--extension-events-on-commit".to_owned()],
        }
    }
}

/// The bench's phases, each on fresh processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Phase {
    All,
    /// Bind latency, per-claim configuration, throughput, burst, arrival rates, time to
    /// first output, exec, terminals and ports, then agent-sandbox.
    Binding,
    /// Lists, watches and memory.
    Scale,
    /// Exec, terminals and ports alone, on a Pool of their own, for profiling their paths
    /// (the binding phase runs them on the bind latency scenario's Pool, with thousands of
    /// leases).
    Exec,
    /// The open-loop arrival rates, the durable commit beside the disk's floor and time
    /// to first output alone, as when profiling a bind at low rates.
    Arrival,
    /// The metadata store's durable commit beside the disk's floor alone: no rig.
    Commit,
    /// The check of our SLOs (docs/slo.md) alone: exits 1 if any is missed.
    Slo,
}

impl Phase {
    fn runs(self, phase: Phase) -> bool {
        self == Phase::All || self == phase
    }
}

/// How big each scenario is.
struct Sizes {
    serial_binds: usize,
    /// Serial binds of each kind: plain, with env, with a file, with both from a Secret.
    config_binds: usize,
    /// (concurrency, binds) per throughput level.
    throughput: [(usize, usize); 3],
    burst: usize,
    /// Open-loop arrival rates, each for a while.
    arrival: [arrival::Rate; 4],
    /// Time to first output: serial claims, then a burst at once.
    first_output: (usize, usize),
    /// Lone durable commits of the metadata store, and as many appends beside them.
    commits: usize,
    /// agent-sandbox's SandboxClaims beside our binds: serial, then a burst at once.
    agent_sandbox: (usize, usize),
    exec_rounds: usize,
    exec_bytes: usize,
    terminal: terminal::Sizes,
    scale: scale::Sizes,
    slo: slo::Load,
}

impl Sizes {
    /// The sizes.
    const FULL: Self = Self {
        serial_binds: 2000,
        config_binds: 100,
        throughput: [(1, 100), (8, 300), (64, 2000)],
        burst: 300,
        // A thousand samples of each kind at the highest rate, for its p99.9.
        arrival: [
            arrival::Rate::new(1.0, 120_000),
            arrival::Rate::new(10.0, 60_000),
            arrival::Rate::new(100.0, 20_000),
            arrival::Rate::new(1000.0, 5_000),
        ],
        first_output: (100, 100),
        commits: 2000,
        agent_sandbox: (100, 300),
        exec_rounds: 20,
        exec_bytes: 256_000_000,
        terminal: terminal::Sizes {
            starts: 20,
            keystrokes: 200,
            forwarded_bytes: 64_000_000,
        },
        scale: scale::Sizes {
            lists: [1000, 10_000],
            watchers: 1000,
            watched_binds: 20,
        },
        // The rate the SLOs are stated for, for a minute (the SLOs' window is five).
        slo: slo::Load {
            standing: 1000,
            per_second: 100.0,
            window: Duration::from_secs(60),
            list_every: Duration::from_secs(1),
        },
    };

    /// Seconds of work, every scenario still measured.
    const QUICK: Self = Self {
        serial_binds: 20,
        config_binds: 5,
        throughput: [(1, 5), (8, 24), (64, 64)],
        burst: 30,
        arrival: [
            arrival::Rate::new(1.0, 5_000),
            arrival::Rate::new(10.0, 2_000),
            arrival::Rate::new(100.0, 1_000),
            arrival::Rate::new(1000.0, 200),
        ],
        first_output: (3, 10),
        commits: 20,
        agent_sandbox: (3, 10),
        exec_rounds: 3,
        exec_bytes: 1_000_000,
        terminal: terminal::Sizes {
            starts: 3,
            keystrokes: 10,
            forwarded_bytes: 1_000_000,
        },
        scale: scale::Sizes {
            lists: [30, 100],
            watchers: 20,
            watched_binds: 3,
        },
        slo: slo::Load {
            standing: 20,
            per_second: 20.0,
            window: Duration::from_secs(3),
            list_every: Duration::from_millis(250),
        },
    };
}

/// Runs the bench, prints the table, writes the JSON.
pub async fn main(args: Args) -> Result<()> {
    let binary = match &args.binary {
        Some(path) => path.clone(),
        None => beside_me("battery-apiserver")?,
    };
    // The agent is found beside `bench` by the e2e harness; check here, so that a missing
    // one is reported rather than built.
    beside_me("battery-agent")?;
    let report = run(&args, &binary).await?;
    println!("{}", report.table());
    if let Some(path) = &args.json {
        let json = serde_json::to_vec_pretty(&report)?;
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.phase == Phase::Slo {
        let missed: Vec<_> = report
            .rows
            .iter()
            .filter(|row| row.met == Some(false))
            .map(|row| row.figure.as_str())
            .collect();
        if !missed.is_empty() {
            bail!("SLOs missed: {}", missed.join("; "));
        }
    }
    Ok(())
}

async fn run(args: &Args, binary: &Path) -> Result<Report> {
    let sizes = if args.quick {
        &Sizes::QUICK
    } else {
        &Sizes::FULL
    };
    // With the defaults a user gets (no per-user rate of creates, ADR 32), but room for
    // the scale scenario's watches: straight to serve, then through kube-apiserver while
    // the first ones may still be closing. Every request's trace in serve's log, one
    // JSON line each, so the arrivals can split each bind at serve's steps.
    let serve_args = [
        "--max-watches".to_owned(),
        (2 * sizes.scale.watchers + 16).to_string(),
        "--log-format".to_owned(),
        "json".to_owned(),
        "--slow-request-threshold".to_owned(),
        "0s".to_owned(),
    ];
    let battery_args = args.battery_events.battery_args();
    let battery = (battery_args.as_slice(), args.battery_store);
    eprintln!(
        "bench: the embedded battery delivers events {}",
        match args.battery_events {
            BatteryEvents::Poolmgrd => "as poolmgrd does (polled every second)",
            BatteryEvents::OnCommit => "on each commit (our extension, not poolmgrd's)",
        }
    );
    let mut rows = Vec::new();

    if args.phase == Phase::Exec {
        eprintln!("bench: exec");
        let rig = Rig::start(binary, &serve_args, battery).await?;
        let pool = rig.create_pool("exec", 2).await?;
        rows.extend(exec::run(&rig, &pool.name, sizes.exec_rounds, sizes.exec_bytes).await?);
        eprintln!("bench: terminals and ports");
        rows.extend(terminal::run(&rig, &pool.name, sizes.terminal).await?);
        rig.stop().await;
        return Ok(report(args, binary, rows));
    }
    if args.phase == Phase::Commit {
        rows.extend(commit::run(sizes.commits).await?);
        return Ok(report(args, binary, rows));
    }
    if args.phase == Phase::Arrival {
        eprintln!("bench: open-loop arrivals and time to first output");
        let rig = Rig::start(binary, &serve_args, battery).await?;
        let (serial, burst) = sizes.first_output;
        let first = rig
            .create_pool("first-output", (serial + burst) as i32)
            .await?;
        let mut pools = Vec::new();
        for (name, rate) in ARRIVAL_POOLS.iter().zip(&sizes.arrival) {
            pools.push(rig.create_pool(name, rate.microvms()).await?);
        }
        rows.extend(arrival::run(&rig, &sizes.arrival, &pools).await?);
        eprintln!("bench: the durable commit beside the disk's floor");
        rows.extend(commit::run(sizes.commits).await?);
        rows.extend(first_output::run(&rig, &first.name, serial, burst).await?);
        rig.stop().await;
        return Ok(report(args, binary, rows));
    }
    if args.phase.runs(Phase::Binding) {
        binding_phase(args, binary, sizes, &serve_args, battery, &mut rows).await?;
    }
    if args.phase.runs(Phase::Slo) {
        eprintln!("bench: the SLO check");
        let rig = Rig::start(binary, &serve_args, battery).await?;
        let load = slo::Load {
            standing: args.standing_claims.unwrap_or(sizes.slo.standing),
            ..sizes.slo
        };
        let pool = rig.create_pool("slo", load.microvms()).await?;
        rows.extend(slo::run(&rig, &pool.name, load).await?);
        rig.stop().await;
    }
    if !args.phase.runs(Phase::Scale) {
        return Ok(report(args, binary, rows));
    }
    if !rows.is_empty() {
        // The scale phase waits minutes for its MicroVMs: show what is measured already.
        eprintln!(
            "bench: so far\n{}",
            report(args, binary, rows.clone()).table()
        );
    }
    eprintln!("bench: scale");
    let mut scale_sizes = sizes.scale.clone();
    if let Some(claims) = args.claims {
        scale_sizes.lists = [scale_sizes.lists[0].min(claims), claims];
    }
    let rig = Rig::start(binary, &serve_args, battery).await?;
    // The watched binds are made once straight to serve, once through kube-apiserver.
    let claims = scale_sizes.lists[1] + 2 * scale_sizes.watched_binds;
    eprintln!("bench: booting {claims} MicroVMs for the claims");
    let pool = rig.create_pool("scale", claims as i32).await?;
    rows.extend(scale::run(&rig, &pool.name, &scale_sizes).await?);
    rig.stop().await;
    Ok(report(args, binary, rows))
}

/// The Pools of [`Sizes::arrival`]'s rates, one each.
const ARRIVAL_POOLS: [&str; 4] = ["arrival-1", "arrival-10", "arrival-100", "arrival-1000"];

/// Bind latency beside raw `ClaimVM`, per-claim configuration, throughput, burst, arrival
/// rates, time to first output and exec on one rig; agent-sandbox last, since it leaves
/// its objects in the cluster.
async fn binding_phase(
    args: &Args,
    binary: &Path,
    sizes: &Sizes,
    serve_args: &[String],
    battery: (&[String], BatteryStore),
    rows: &mut Vec<report::Row>,
) -> Result<()> {
    eprintln!("bench: binding and exec");
    let rig = Rig::start(binary, serve_args, battery).await?;
    let serial_binds = args.binds.unwrap_or(sizes.serial_binds);
    let config_binds = args.config_binds.unwrap_or(sizes.config_binds);
    // Two claims a round, ours and the raw one, and the exec and terminal scenarios'
    // claims: a MicroVM booted for each beforehand.
    let serial_pool = (serial_binds * 2 + 2) as i32;
    let mut pools = vec![
        ("latency", serial_pool),
        // A burst straight to serve, then one through kube-apiserver.
        ("burst", 2 * sizes.burst as i32),
        // Four binds a round, and the claim the write alone is timed on.
        ("config", (config_binds * 4 + 1) as i32),
        (
            "first-output",
            (sizes.first_output.0 + sizes.first_output.1) as i32,
        ),
    ];
    // A MicroVM ready for every bind of both routes: a bind that waits for one measures
    // a boot.
    let levels = sizes
        .throughput
        .map(|(concurrency, count)| (concurrency, count, 2 * count as i32));
    let names = ["throughput-1", "throughput-8", "throughput-64"];
    pools.extend(
        names
            .iter()
            .zip(&levels)
            .map(|(name, level)| (*name, level.2)),
    );
    pools.extend(
        ARRIVAL_POOLS
            .iter()
            .zip(&sizes.arrival)
            .map(|(name, rate)| (*name, rate.microvms())),
    );
    let microvms: i32 = pools.iter().map(|(_, size)| size).sum();
    eprintln!("bench: booting {microvms} MicroVMs for the binds");
    // One at a time, for the reason of `FILL_STEP`.
    let mut created = Vec::with_capacity(pools.len());
    for (name, size) in &pools {
        created.push(rig.create_pool(name, *size).await?);
    }
    let pools = created;
    eprintln!("bench: {serial_binds} serial binds");
    rows.extend(binds::latency(&rig, &pools[0], serial_binds).await?);
    eprintln!("bench: {config_binds} rounds of per-claim configuration");
    rows.extend(configured_binds::with_config(&rig, &pools[2], config_binds).await?);
    let levels: Vec<_> = levels
        .iter()
        .zip(&pools[4..7])
        .map(|(&(concurrency, count, _), pool)| (concurrency, count, pool.clone()))
        .collect();
    eprintln!("bench: throughput, then the burst");
    rows.extend(binds::throughput(&rig, &levels).await?);
    rows.extend(binds::burst(&rig, &pools[1], sizes.burst).await?);
    eprintln!("bench: open-loop arrivals");
    rows.extend(arrival::run(&rig, &sizes.arrival, &pools[7..]).await?);
    eprintln!("bench: the durable commit beside the disk's floor");
    rows.extend(commit::run(sizes.commits).await?);
    eprintln!("bench: time to first output");
    let (serial, burst) = sizes.first_output;
    rows.extend(first_output::run(&rig, &pools[3].name, serial, burst).await?);
    eprintln!("bench: exec");
    rows.extend(exec::run(&rig, &pools[0].name, sizes.exec_rounds, sizes.exec_bytes).await?);
    eprintln!("bench: terminals and ports");
    rows.extend(terminal::run(&rig, &pools[0].name, sizes.terminal).await?);
    eprintln!("bench: agent-sandbox beside us");
    let (serial, burst) = sizes.agent_sandbox;
    rows.extend(sandbox::run(&rig, serial, burst).await?);
    rig.stop().await;
    Ok(())
}

fn report(args: &Args, binary: &Path, mut rows: Vec<report::Row>) -> Report {
    rows.sort_by_key(|row| ORDER.iter().position(|s| *s == row.scenario));
    Report {
        mode: format!(
            "{}{}{}",
            if args.quick { "quick" } else { "full" },
            match args.battery_events {
                BatteryEvents::Poolmgrd => ", battery's events polled as poolmgrd polls",
                BatteryEvents::OnCommit => ", battery's events on each commit (ours)",
            },
            match args.phase {
                Phase::All => "",
                Phase::Binding => ", binding phase only",
                Phase::Scale => ", scale phase only",
                Phase::Exec => ", exec, terminals and ports alone",
                Phase::Arrival => ", arrivals and first output alone",
                Phase::Commit => ", the durable commit alone",
                Phase::Slo => ", the SLO check alone",
            }
        ),
        machine: report::Machine::read(),
        build: build_profile(binary),
        other_side: format!(
            "embedded battery (its own process, 2 simulated Hosts, {}) and battery-agent, all on loopback; serve's metadata store on this machine's disk",
            args.battery_store.label()
        ),
        rows,
    }
}

/// The scenarios in the order, which the table keeps.
const ORDER: [&str; 13] = [
    slo::SLO,
    arrival::ARRIVAL,
    commit::COMMIT,
    first_output::FIRST_OUTPUT,
    binds::LATENCY,
    sandbox::AGENT_SANDBOX,
    binds::THROUGHPUT,
    binds::BURST,
    scale::LIST,
    scale::WATCH,
    exec::EXEC,
    terminal::TERMINAL,
    scale::MEMORY,
];

/// Every row's scenario, for a check that all produced numbers.
pub fn scenarios() -> &'static [&'static str] {
    &ORDER
}

/// The binary `name` beside this one.
fn beside_me(name: &str) -> Result<PathBuf> {
    let me = std::env::current_exe().context("this binary's path")?;
    let path = me.with_file_name(name);
    if !path.is_file() {
        bail!(
            "{} is missing: build it first, as in \
             cargo build --release -p battery-apiserver -p battery-agent -p battery-bench",
            path.display()
        );
    }
    Ok(path)
}

/// The cargo profile `binary` was built with, as its directory says (`release`, `debug`).
fn build_profile(binary: &Path) -> String {
    let profile = binary
        .parent()
        .and_then(Path::file_name)
        .map_or_else(|| "unknown".into(), |name| name.to_string_lossy());
    format!("{profile} ({})", binary.display())
}
