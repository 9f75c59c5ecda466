//! A bind split at the instant `serve` asked battery's `ClaimVM`, which the bound claim's
//! `status.renewTime` records on `serve`'s clock, this machine's: before it, the client,
//! kube-apiserver's proxy and `serve`'s work before `ClaimVM`; after it, battery's
//! `ClaimVM`, `serve`'s work after it and the answer's way back. Each bind's own split
//! says where the slowest binds spent their time, which the servers' histograms, means
//! and buckets of 5 ms and more, cannot.

use std::time::{Duration, SystemTime};

use anyhow::{Context as _, Result};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use serde_json::Value;

use crate::report::{Row, Unit, mean_millis, quantile};

/// One bind's time on either side of `serve`'s asking battery.
#[derive(Clone, Copy)]
pub struct Split {
    before: Duration,
    after: Duration,
}

impl Split {
    /// The split of the bind `bound` answered just now, `took` after it arrived.
    pub fn of(bound: &Value, took: Duration) -> Result<Self> {
        let answered = SystemTime::now();
        let arrived = answered - took;
        let asked: MicroTime = serde_json::from_value(bound["status"]["renewTime"].clone())
            .context("a bound claim's status.renewTime")?;
        let asked = SystemTime::from(asked.0);
        // Both clocks are this machine's: a split off by a clock step reads as zero.
        Ok(Self {
            before: asked.duration_since(arrived).unwrap_or_default(),
            after: answered.duration_since(asked).unwrap_or_default(),
        })
    }

    fn total(self) -> Duration {
        self.before + self.after
    }
}

/// The rows of `label`'s binds split: each side's p50 over all of them, then each side's
/// mean over the slowest 1% (at least one), which hold the p99.
pub fn rows(scenario: &'static str, label: &str, splits: &[Split]) -> Vec<Row> {
    let sides = |splits: &[Split]| -> (Vec<Duration>, Vec<Duration>) {
        splits.iter().map(|s| (s.before, s.after)).unzip()
    };
    let (before, after) = sides(splits);
    let mut slowest = splits.to_vec();
    slowest.sort_by_key(|s| std::cmp::Reverse(s.total()));
    slowest.truncate(splits.len().div_ceil(100));
    let (slow_before, slow_after) = sides(&slowest);
    let of_all = |what: &str, side: &[Duration]| {
        (!side.is_empty()).then(|| {
            Row::millis(
                scenario,
                format!("{label}, a bind's p50: {what}"),
                quantile(side, 0.5),
            )
        })
    };
    let of_slowest = |what: &str, side: &[Duration]| {
        mean_millis(side).map(|mean| {
            Row::new(
                scenario,
                format!(
                    "{label}, the slowest 1% of binds ({}), mean: {what}",
                    slowest.len()
                ),
                mean,
                Unit::Millis,
            )
        })
    };
    let (to_claim_vm, from_claim_vm) = (
        "arrival to serve asking battery's ClaimVM",
        "serve asking battery's ClaimVM to the answer",
    );
    [
        of_all(to_claim_vm, &before),
        of_all(from_claim_vm, &after),
        of_slowest(to_claim_vm, &slow_before),
        of_slowest(from_claim_vm, &slow_after),
    ]
    .into_iter()
    .flatten()
    .collect()
}
