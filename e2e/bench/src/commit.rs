//! The metadata store's durable commit beside the disk's floor (issue 41, ADRs 39 and 46):
//! a lone commit of a bound claim's size through `serve`'s own store, a 4 KiB append plus
//! `fdatasync` to a file beside it, and 4 KiB written over a page already written plus
//! `fdatasync` (what the store's log does, its blocks written ahead), taking turns so all
//! meet the same disk at the same moment. The target: the commit's p50 at most 2x the
//! append's. Beside them, a loopback round trip between two threads: with the append, the
//! floor issue 41 holds `serve`'s own part of a bind to, which the arrival scenario also
//! times at its rates' pace, beside its quiet pass and alone.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use battery_apiserver::meta_store::{Key, MetaStore, StoreError};

use crate::poisson::other_arrival_times;
use crate::report::{Row, Unit, mean_millis, millis, percentiles, quantile};

pub const COMMIT: &str = "durable commit";

/// About a bound claim's JSON with its lease record.
const RECORD_BYTES: usize = 2048;
const FLOOR_BYTES: usize = 4096;
/// Between one commit's end and the next one's start, so each comes alone, as a bind's
/// does below some hundreds a second.
const GAP: Duration = Duration::from_millis(1);

/// `rounds` of each, in a store made in the system's temporary directory, on the disk
/// `serve`'s store has in the bench's rig.
pub async fn run(rounds: usize) -> Result<Vec<Row>> {
    let dir = tempfile::Builder::new()
        .prefix("battery-bench-commit-")
        .tempdir()
        .context("a temporary directory")?;
    let store = Arc::new(MetaStore::open(&dir.path().join("store.redb"))?);
    let mut floor = FloorProbe::start()?;
    let mut overwrite = Floor::create(&dir.path().join("overwrite"), Write4k::Overwrite)?;
    let value = serde_json::json!({ "padding": "x".repeat(RECORD_BYTES) });
    let (mut commits, mut appends, mut overwrites) = (Vec::new(), Vec::new(), Vec::new());
    let mut trips = Vec::new();
    for round in 0..rounds {
        let key = Key::new("microvmclaims", Some("bench"), &format!("claim-{round}"));
        let started = Instant::now();
        store
            .transact(|txn| -> Result<(), StoreError> {
                txn.next_resource_version();
                txn.put(&key, &value)
            })
            .await
            .context("a durable commit")?;
        commits.push(started.elapsed());
        tokio::time::sleep(GAP).await;
        appends.push(floor.append()?);
        tokio::time::sleep(GAP).await;
        overwrites.push(overwrite.write().context("an overwrite and fdatasync")?);
        tokio::time::sleep(GAP).await;
        trips.push(floor.round_trip()?);
        tokio::time::sleep(GAP).await;
    }
    let mut rows = Vec::new();
    rows.extend(percentiles(COMMIT, APPENDED, &appends));
    rows.extend(percentiles(
        COMMIT,
        "4 KiB written over written blocks, fdatasync",
        &overwrites,
    ));
    rows.extend(percentiles(
        COMMIT,
        "the metadata store's lone commit",
        &commits,
    ));
    rows.extend(percentiles(COMMIT, "a loopback TCP round trip", &trips));
    if let Some(floor) = floor_millis(&appends, &trips) {
        rows.push(Row::new(
            COMMIT,
            "the floor of serve's own part of a bind (the append and a round trip), mean",
            floor,
            Unit::Millis,
        ));
    }
    let ratio = millis(quantile(&commits, 0.5)) / millis(quantile(&appends, 0.5));
    rows.push(
        Row::new(
            COMMIT,
            "the store's commit / the disk's floor p50",
            ratio,
            Unit::Times,
        )
        .at_most(2.0),
    );
    Ok(rows)
}

/// The disk's floor, as the figures name it.
pub const APPENDED: &str = "4 KiB appended, fdatasync (the disk's floor)";

/// `count` 4 KiB appends to a file in `dir`, each made durable: the disk's floor for a
/// durable commit, which other scenarios report beside their binds.
pub fn appends(dir: &Path, count: usize) -> Result<Vec<Duration>> {
    let path = dir.join("bench-durable-append");
    let mut floor = Floor::create(&path, Write4k::Append)?;
    let took = (0..count)
        .map(|_| floor.write())
        .collect::<std::io::Result<Vec<_>>>()?;
    std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    Ok(took)
}

/// The floor issue 41 holds `serve`'s own part of a bind to, in milliseconds: the mean of
/// `appends` (4 KiB and `fdatasync`) plus the mean of `trips` (loopback round trips).
pub fn floor_millis(appends: &[Duration], trips: &[Duration]) -> Option<f64> {
    Some(mean_millis(appends)? + mean_millis(trips)?)
}

/// The floor's parts, appends and round trips.
pub type FloorTimes = (Vec<Duration>, Vec<Duration>);

/// Runs `pass` while the floor's parts are timed beside it at `per_second`'s pace, `each`
/// of each at most, until it ends, so that each finds the machine as loaded as the pass's
/// requests do.
pub async fn floor_beside<T>(
    per_second: f64,
    each: usize,
    pass: impl Future<Output = Result<T>>,
) -> Result<(T, FloorTimes)> {
    let stop = Arc::new(AtomicBool::new(false));
    let probing = {
        let stop = stop.clone();
        tokio::task::spawn_blocking(move || probe_floor(Some(per_second), each, &stop))
    };
    let passed = pass.await;
    stop.store(true, Ordering::Release);
    let floor = probing.await.context("the floor's probe panicked")??;
    Ok((passed?, floor))
}

/// The floor's parts timed at `per_second`'s pace with nothing else running, `each` of
/// each, so each finds the machine as idle as a lone request would on a machine of its
/// own.
pub async fn floor_alone(per_second: f64, each: usize) -> Result<FloorTimes> {
    probe_floor_to_the_end(Some(per_second), each).await
}

/// The floor's parts back to back, `each` of each, the machine never idle between them:
/// against [`floor_alone`]'s, what waking an idle machine adds to work no lone request
/// can skip.
pub async fn floor_back_to_back(each: usize) -> Result<FloorTimes> {
    probe_floor_to_the_end(None, each).await
}

/// [`probe_floor`] on a blocking thread, with nothing to stop it before `each` of each.
async fn probe_floor_to_the_end(pace: Option<f64>, each: usize) -> Result<FloorTimes> {
    tokio::task::spawn_blocking(move || probe_floor(pace, each, &AtomicBool::new(false)))
        .await
        .context("the floor's probe panicked")?
}

/// Each part's p50 timed alone at `label`'s pace over its p50 back to back: the ratio
/// issue 41 holds a lone bind to (1.2x), for the floor's two parts.
pub fn paced_floor_rows(
    scenario: &'static str,
    label: &str,
    (paced_appends, paced_trips): &FloorTimes,
    (appends, trips): &FloorTimes,
) -> Vec<Row> {
    [
        ("append of 4 KiB and fdatasync", paced_appends, appends),
        ("loopback round trip", paced_trips, trips),
    ]
    .into_iter()
    .map(|(what, paced, back_to_back)| {
        Row::new(
            scenario,
            format!("{label}: the floor's {what}, paced alone / back to back p50"),
            millis(quantile(paced, 0.5)) / millis(quantile(back_to_back, 0.5)),
            Unit::Times,
        )
    })
    .collect()
}

/// Times the floor's parts on this thread, which they block: at `pace`'s per-second rate,
/// arrivals of a Poisson stream independent of the passes' alternate an append and a
/// round trip, `each` of each at most, until `stop` is set; with no pace, back to back.
fn probe_floor(pace: Option<f64>, each: usize, stop: &AtomicBool) -> Result<FloorTimes> {
    let mut probe = FloorProbe::start()?;
    let (mut appends, mut trips) = (Vec::new(), Vec::new());
    let arrivals: Box<dyn Iterator<Item = Duration>> = match pace {
        Some(per_second) => Box::new(other_arrival_times(per_second)),
        None => Box::new(std::iter::repeat(Duration::ZERO)),
    };
    let start = Instant::now();
    for (i, at) in arrivals.take(2 * each).enumerate() {
        std::thread::sleep((start + at).saturating_duration_since(Instant::now()));
        if stop.load(Ordering::Acquire) {
            break;
        }
        if i % 2 == 0 {
            appends.push(probe.append()?);
        } else {
            trips.push(probe.round_trip()?);
        }
    }
    Ok((appends, trips))
}

/// The floor's two parts, each timed alone when asked: a 4 KiB append and `fdatasync`
/// to a file in the system's temporary directory (the disk `serve`'s store has in the
/// bench's rig), and a loopback round trip.
struct FloorProbe {
    append: Floor,
    echo: Echo,
    /// Holds the file until the probe is dropped.
    _dir: tempfile::TempDir,
}

impl FloorProbe {
    fn start() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("battery-bench-floor-")
            .tempdir()
            .context("a temporary directory")?;
        Ok(Self {
            append: Floor::create(&dir.path().join("append"), Write4k::Append)?,
            echo: Echo::start().context("a loopback echo")?,
            _dir: dir,
        })
    }

    /// 4 KiB appended and made durable.
    fn append(&mut self) -> Result<Duration> {
        self.append.write().context("an append and fdatasync")
    }

    /// One byte to a thread and back over loopback TCP.
    fn round_trip(&mut self) -> Result<Duration> {
        self.echo.round_trip().context("a loopback round trip")
    }
}

/// A connection to a thread that echoes each byte back: a lone request's round trip on
/// loopback, the second part of the floor issue 41 names.
struct Echo(TcpStream);

impl Echo {
    fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let address = listener.local_addr()?;
        // Ends when the bench's end of the connection closes.
        std::thread::spawn(move || -> std::io::Result<()> {
            let (mut peer, _) = listener.accept()?;
            peer.set_nodelay(true)?;
            let mut byte = [0u8; 1];
            loop {
                peer.read_exact(&mut byte)?;
                peer.write_all(&byte)?;
            }
        });
        let stream = TcpStream::connect(address)?;
        stream.set_nodelay(true)?;
        Ok(Self(stream))
    }

    fn round_trip(&mut self) -> std::io::Result<Duration> {
        let started = Instant::now();
        self.0.write_all(&[1])?;
        self.0.read_exact(&mut [0u8; 1])?;
        Ok(started.elapsed())
    }
}

/// Where a floor puts its 4 KiB.
#[derive(Clone, Copy)]
enum Write4k {
    /// At the file's end, as a write-ahead log without blocks ahead does: the sync also
    /// writes the file's new size.
    Append,
    /// Over the file's first page, written once before: the sync writes the data alone.
    Overwrite,
}

/// A file that takes one 4 KiB record a sync.
struct Floor {
    file: File,
    record: [u8; FLOOR_BYTES],
    write: Write4k,
}

impl Floor {
    fn create(path: &Path, write: Write4k) -> Result<Self> {
        let file = OpenOptions::new()
            .create_new(true)
            .append(matches!(write, Write4k::Append))
            .write(true)
            .open(path)
            .with_context(|| format!("creating {}", path.display()))?;
        let mut floor = Self {
            file,
            record: [0x5a; FLOOR_BYTES],
            write,
        };
        if let Write4k::Overwrite = write {
            floor.file.write_all(&floor.record)?;
            floor.file.sync_all()?;
        }
        Ok(floor)
    }

    fn write(&mut self) -> std::io::Result<Duration> {
        let started = Instant::now();
        match self.write {
            Write4k::Append => self.file.write_all(&self.record)?,
            Write4k::Overwrite => self.file.write_all_at(&self.record, 0)?,
        }
        self.file.sync_data()?;
        Ok(started.elapsed())
    }
}
