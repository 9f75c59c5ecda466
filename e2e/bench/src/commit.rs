//! The metadata store's durable commit beside the disk's floor (issue 41, ADR 39): a lone
//! commit of a bound claim's size through `serve`'s own store, and a 4 KiB append plus
//! `fdatasync` to a file beside it, taking turns so both meet the same disk at the same
//! moment. The target: the commit's p50 at most 2x the append's.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use battery_apiserver::meta_store::{Key, MetaStore, StoreError};

use crate::report::{Row, Unit, millis, percentiles, quantile};

pub const COMMIT: &str = "durable commit";

/// About a bound claim's JSON with its lease record.
const RECORD_BYTES: usize = 2048;
const APPEND_BYTES: usize = 4096;
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
    let mut floor = Floor::create(&dir.path().join("floor"))?;
    let value = serde_json::json!({ "padding": "x".repeat(RECORD_BYTES) });
    let (mut commits, mut appends) = (Vec::new(), Vec::new());
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
        appends.push(floor.append().context("an append and fdatasync")?);
        tokio::time::sleep(GAP).await;
    }
    let mut rows = Vec::new();
    rows.extend(percentiles(
        COMMIT,
        "4 KiB appended, fdatasync (the disk's floor)",
        &appends,
    ));
    rows.extend(percentiles(
        COMMIT,
        "the metadata store's lone commit",
        &commits,
    ));
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

/// A file that grows by one 4 KiB record a sync, as a write-ahead log would.
struct Floor {
    file: File,
    record: [u8; APPEND_BYTES],
}

impl Floor {
    fn create(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(path)
            .with_context(|| format!("creating {}", path.display()))?;
        Ok(Self {
            file,
            record: [0x5a; APPEND_BYTES],
        })
    }

    fn append(&mut self) -> std::io::Result<Duration> {
        let started = Instant::now();
        self.file.write_all(&self.record)?;
        self.file.sync_data()?;
        Ok(started.elapsed())
    }
}
