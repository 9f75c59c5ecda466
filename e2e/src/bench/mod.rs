//! `bench`: the figures of issue 13, measured on the real binaries in one run. It starts a
//! real control plane with battery-apiserver installed, `battery-apiserver
//! embedded-battery`, `battery-apiserver serve` behind the APIService and one
//! `battery-agent` per simulated Host (see [`rig`]), runs each scenario, stops
//! every process, and prints one table (and, with `--json`, writes it as JSON). It builds
//! nothing: the binaries are the ones beside `bench` (or `--binary`), so
//! `cargo build --release -p battery-apiserver -p battery-agent -p battery-e2e` then
//! `target/release/bench` measures release binaries. `docs/performance.md` holds a full
//! run and what it found.
//!
//! Two phases, each on fresh processes so nothing one leaves behind weighs on the other:
//! binding (serial latency beside raw `ClaimVM`, throughput, burst) and exec; then scale
//! (lists, watches, memory). Every scenario binds on a Pool of its own, sized so it never
//! runs dry. The CRD floor runs between them, on an etcd of its own.

mod binds;
mod client;
mod etcd;
mod exec;
pub mod report;
mod rig;
mod scale;

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use report::{NotRun, Report};
use rig::Rig;

/// The command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "bench",
    about = "Measures battery-apiserver against issue 13's targets: binds, the CRD floor on etcd, throughput, burst, lists, watches, exec and memory."
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
    /// Which phase to run: both (the default, the documented run), or one of them alone,
    /// as when profiling it.
    #[arg(long, value_enum, default_value_t = Phase::All)]
    pub phase: Phase,
}

/// The bench's phases, each on fresh processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Phase {
    All,
    /// Bind latency, per-claim configuration, throughput, burst, exec, then the CRD floor.
    Binding,
    /// Lists, watches and memory.
    Scale,
    /// Exec alone, on a Pool of its own, for profiling its path (the binding phase runs
    /// it on the bind latency scenario's Pool, with thousands of leases).
    Exec,
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
    crd_binds: usize,
    exec_rounds: usize,
    exec_bytes: usize,
    scale: scale::Sizes,
}

impl Sizes {
    /// The sizes.
    const FULL: Self = Self {
        serial_binds: 2000,
        config_binds: 100,
        throughput: [(1, 100), (8, 300), (64, 2000)],
        burst: 300,
        crd_binds: 500,
        exec_rounds: 20,
        exec_bytes: 256_000_000,
        scale: scale::Sizes {
            lists: [1000, 10_000],
            watchers: 1000,
            watched_binds: 20,
        },
    };

    /// Seconds of work, every scenario still measured.
    const QUICK: Self = Self {
        serial_binds: 20,
        config_binds: 5,
        throughput: [(1, 5), (8, 24), (64, 64)],
        burst: 30,
        crd_binds: 10,
        exec_rounds: 3,
        exec_bytes: 1_000_000,
        scale: scale::Sizes {
            lists: [30, 100],
            watchers: 20,
            watched_binds: 3,
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
    Ok(())
}

async fn run(args: &Args, binary: &Path) -> Result<Report> {
    let sizes = if args.quick {
        &Sizes::QUICK
    } else {
        &Sizes::FULL
    };
    // The bench measures the server, not its per-user create limiter, which would refuse
    // a run at these rates with 429s.
    let mut serve_args: Vec<String> = [
        "--creates-per-second",
        "1000000",
        "--create-burst",
        "1000000",
    ]
    .map(str::to_owned)
    .into();
    serve_args.extend([
        "--max-watches".to_owned(),
        (sizes.scale.watchers + 16).to_string(),
    ]);
    let mut rows = Vec::new();
    let mut not_run = Vec::new();

    if args.phase == Phase::Exec {
        eprintln!("bench: exec");
        let rig = Rig::start(binary, &serve_args).await?;
        let pool = rig.create_pool("exec", 1).await?;
        rows.extend(exec::run(&rig, &pool.name, sizes.exec_rounds, sizes.exec_bytes).await?);
        rig.stop().await;
        return Ok(report(args, binary, rows, not_run));
    }
    if args.phase.runs(Phase::Binding) {
        binding_phase(args, binary, sizes, &serve_args, &mut rows, &mut not_run).await?;
    }
    if !args.phase.runs(Phase::Scale) {
        return Ok(report(args, binary, rows, not_run));
    }
    if !rows.is_empty() {
        // The scale phase waits minutes for its MicroVMs: show what is measured already.
        eprintln!(
            "bench: so far\n{}",
            report(args, binary, rows.clone(), not_run.clone()).table()
        );
    }
    eprintln!("bench: scale");
    let mut scale_sizes = sizes.scale.clone();
    if let Some(claims) = args.claims {
        scale_sizes.lists = [scale_sizes.lists[0].min(claims), claims];
    }
    let rig = Rig::start(binary, &serve_args).await?;
    let claims = scale_sizes.lists[1] + scale_sizes.watched_binds;
    eprintln!("bench: booting {claims} MicroVMs for the claims");
    let pool = rig.create_pool("scale", claims as i32).await?;
    rows.extend(scale::run(&rig, &pool.name, &scale_sizes).await?);
    rig.stop().await;
    Ok(report(args, binary, rows, not_run))
}

/// Bind latency beside raw `ClaimVM`, per-claim configuration, throughput, burst and exec
/// on one rig; then the CRD floor on an etcd of its own.
async fn binding_phase(
    args: &Args,
    binary: &Path,
    sizes: &Sizes,
    serve_args: &[String],
    rows: &mut Vec<report::Row>,
    not_run: &mut Vec<NotRun>,
) -> Result<()> {
    eprintln!("bench: binding and exec");
    let rig = Rig::start(binary, serve_args).await?;
    let serial_binds = args.binds.unwrap_or(sizes.serial_binds);
    let config_binds = args.config_binds.unwrap_or(sizes.config_binds);
    // Two claims a round, ours and the raw one, and the exec scenario's claim: a
    // MicroVM booted for each beforehand.
    let serial_pool = (serial_binds * 2 + 1) as i32;
    let mut pools = vec![
        ("latency", serial_pool),
        ("burst", sizes.burst as i32),
        // Four binds a round, and the claim the write alone is timed on.
        ("config", (config_binds * 4 + 1) as i32),
    ];
    // A MicroVM ready for every bind: a bind that waits for one measures a boot.
    let levels = sizes
        .throughput
        .map(|(concurrency, count)| (concurrency, count, count as i32));
    let names = ["throughput-1", "throughput-8", "throughput-64"];
    pools.extend(
        names
            .iter()
            .zip(&levels)
            .map(|(name, level)| (*name, level.2)),
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
    let latency = binds::latency(&rig, &pools[0], serial_binds).await?;
    rows.extend(latency.rows.iter().cloned());
    eprintln!("bench: {config_binds} rounds of per-claim configuration");
    rows.extend(binds::with_config(&rig, &pools[2], config_binds).await?);
    let levels: Vec<_> = levels
        .iter()
        .zip(&pools[3..])
        .map(|(&(concurrency, count, _), pool)| (concurrency, count, pool.clone()))
        .collect();
    eprintln!("bench: throughput, then the burst");
    rows.extend(binds::throughput(&rig, &levels).await?);
    rows.extend(binds::burst(&rig, &pools[1], sizes.burst).await?);
    eprintln!("bench: exec");
    rows.extend(exec::run(&rig, &pools[0].name, sizes.exec_rounds, sizes.exec_bytes).await?);
    rig.stop().await;

    eprintln!("bench: the CRD floor");
    match etcd::find() {
        Some(path) => {
            let dir = tempfile::Builder::new()
                .prefix("battery-bench-etcd-")
                .tempdir()?;
            let claim = serde_json::to_vec(&latency.claim)?;
            rows.extend(
                etcd::run(&path, dir.path(), sizes.crd_binds, &claim, &latency.binds).await?,
            );
        }
        None => not_run.push(NotRun {
            scenario: etcd::CRD_FLOOR,
            reason: "no etcd on the PATH (apt-get install etcd-server)".to_owned(),
        }),
    }

    Ok(())
}

fn report(args: &Args, binary: &Path, mut rows: Vec<report::Row>, not_run: Vec<NotRun>) -> Report {
    rows.sort_by_key(|row| ORDER.iter().position(|s| *s == row.scenario));
    Report {
        mode: format!(
            "{}{}",
            if args.quick { "quick" } else { "full" },
            match args.phase {
                Phase::All => "",
                Phase::Binding => ", binding phase only",
                Phase::Scale => ", scale phase only",
                Phase::Exec => ", exec alone",
            }
        ),
        machine: report::Machine::read(),
        build: build_profile(binary),
        other_side: "embedded battery (its own process, 2 simulated Hosts) and battery-agent, all on loopback; serve's metadata store on this machine's disk",
        rows,
        not_run,
    }
}

/// The scenarios in the order, which the table keeps.
const ORDER: [&str; 8] = [
    binds::LATENCY,
    etcd::CRD_FLOOR,
    binds::THROUGHPUT,
    binds::BURST,
    scale::LIST,
    scale::WATCH,
    exec::EXEC,
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
             cargo build --release -p battery-apiserver -p battery-agent -p battery-e2e",
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
