//! The bench's results: rows of figures against the targets, the machine they
//! were measured on, the table printed at the end and the JSON file.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

/// What a figure is measured in.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Unit {
    #[serde(rename = "ms")]
    Millis,
    #[serde(rename = "1/s")]
    PerSecond,
    #[serde(rename = "MB")]
    Megabytes,
    #[serde(rename = "MB/s")]
    MegabytesPerSecond,
    /// A ratio of two figures of the same run.
    #[serde(rename = "x")]
    Times,
    /// How many of something (writes, Pods), or an average of such counts.
    #[serde(rename = "count")]
    Count,
}

impl Unit {
    fn suffix(self) -> &'static str {
        match self {
            Self::Millis => " ms",
            Self::PerSecond => "/s",
            Self::Megabytes => " MB",
            Self::MegabytesPerSecond => " MB/s",
            Self::Times => "x",
            Self::Count => "",
        }
    }
}

/// A target of the issue.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Target {
    AtMost(f64),
    AtLeast(f64),
}

/// One figure of one scenario.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub scenario: &'static str,
    pub figure: String,
    pub value: f64,
    pub unit: Unit,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
    /// Whether the target is met; absent without a target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub met: Option<bool>,
}

impl Row {
    pub fn new(scenario: &'static str, figure: impl Into<String>, value: f64, unit: Unit) -> Self {
        Self {
            scenario,
            figure: figure.into(),
            value,
            unit,
            target: None,
            met: None,
        }
    }

    pub fn millis(scenario: &'static str, figure: impl Into<String>, value: Duration) -> Self {
        Self::new(scenario, figure, millis(value), Unit::Millis)
    }

    pub fn at_most(mut self, limit: f64) -> Self {
        self.target = Some(Target::AtMost(limit));
        self.met = Some(self.value <= limit);
        self
    }

    pub fn at_least(mut self, floor: f64) -> Self {
        self.target = Some(Target::AtLeast(floor));
        self.met = Some(self.value >= floor);
        self
    }

    fn value_text(&self, value: f64) -> String {
        let digits = if value.abs() >= 100.0 {
            0
        } else if value.abs() >= 10.0 {
            1
        } else {
            2
        };
        format!("{value:.digits$}{}", self.unit.suffix())
    }

    fn target_text(&self) -> String {
        match self.target {
            Some(Target::AtMost(limit)) => format!("<= {}", self.value_text(limit)),
            Some(Target::AtLeast(floor)) => format!(">= {}", self.value_text(floor)),
            None => String::new(),
        }
    }

    /// `met`, or `missed by` the gap and how many times the target it is.
    fn verdict(&self) -> String {
        let Some(target) = self.target else {
            return String::new();
        };
        if self.met == Some(true) {
            return "met".to_owned();
        }
        let (gap, times) = match target {
            Target::AtMost(limit) => (self.value - limit, self.value / limit),
            Target::AtLeast(floor) => (
                floor - self.value,
                floor / self.value.max(f64::MIN_POSITIVE),
            ),
        };
        format!("missed by {} ({times:.1}x)", self.value_text(gap))
    }
}

/// The machine the figures were measured on.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    pub memory_mb: u64,
    pub kernel: String,
}

impl Machine {
    /// Read from /proc.
    pub fn read() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|line| line.strip_prefix("model name"))
            .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
            .unwrap_or_else(|| "unknown".to_owned());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_mb = meminfo
            .lines()
            .find_map(|line| line.strip_prefix("MemTotal:"))
            .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb / 1024);
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned();
        Self {
            cores: std::thread::available_parallelism().map_or(1, usize::from),
            cpu,
            memory_mb,
            kernel,
        }
    }
}

/// Everything one run found.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub mode: String,
    pub machine: Machine,
    /// The profile of the battery-apiserver measured, as its target directory names it.
    pub build: String,
    pub other_side: String,
    pub rows: Vec<Row>,
}

impl Report {
    /// The table, as Markdown, with the machine and the setup above it.
    pub fn table(&self) -> String {
        let m = &self.machine;
        let mut out = format!(
            "machine: {} cores ({}), {} MB, Linux {}\nbuild: {}\nother side: {}\nmode: {}\n\n",
            m.cores, m.cpu, m.memory_mb, m.kernel, self.build, self.other_side, self.mode
        );
        out.push_str("| scenario | figure | value | target | verdict |\n|---|---|---:|---|---|\n");
        for row in &self.rows {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                row.scenario,
                row.figure,
                row.value_text(row.value),
                row.target_text(),
                row.verdict()
            );
        }
        out
    }
}

pub fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// The mean of `samples` in milliseconds; `None` for none.
pub fn mean_millis(samples: &[Duration]) -> Option<f64> {
    (!samples.is_empty())
        .then(|| samples.iter().map(|d| millis(*d)).sum::<f64>() / samples.len() as f64)
}

/// The `p`-th quantile (0 < p <= 1) of `samples` by nearest rank.
pub fn quantile<T: Copy + PartialOrd>(samples: &[T], p: f64) -> T {
    assert!(!samples.is_empty(), "a quantile of no samples");
    let mut sorted = samples.to_vec();
    sorted.sort_unstable_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    // Nearest rank: the smallest sample with at least p of all at or below it.
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `p50` for 0.5, `p99.9` for 0.999.
pub fn rank(p: f64) -> String {
    let percent = p * 100.0;
    if (percent - percent.round()).abs() < 1e-9 {
        format!("p{percent:.0}")
    } else {
        format!("p{percent:.1}")
    }
}

/// Rows for p50, p90 and p99 of `samples`, named `<what> p50` and so on.
pub fn percentiles(scenario: &'static str, what: &str, samples: &[Duration]) -> [Row; 3] {
    [0.5, 0.9, 0.99].map(|p| {
        Row::millis(
            scenario,
            format!("{what} {}", rank(p)),
            quantile(samples, p),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(quantile(&samples, 0.5), Duration::from_millis(50));
        assert_eq!(quantile(&samples, 0.99), Duration::from_millis(99));
        assert_eq!(quantile(&samples, 1.0), Duration::from_millis(100));
        assert_eq!(quantile(&samples[..1], 0.99), Duration::from_millis(100));
        assert_eq!(
            [0.5, 0.99, 0.999].map(rank),
            ["p50", "p99", "p99.9"].map(str::to_owned)
        );
    }

    #[test]
    fn verdicts_say_by_how_much() {
        let row = Row::new("bind latency", "p50", 8.0, Unit::Millis).at_most(2.0);
        assert_eq!(row.verdict(), "missed by 6.00 ms (4.0x)");
        let row = Row::new("throughput", "c=64", 1000.0, Unit::PerSecond).at_least(2000.0);
        assert_eq!(row.verdict(), "missed by 1000/s (2.0x)");
        let row = Row::new("memory", "idle", 20.0, Unit::Megabytes).at_most(30.0);
        assert_eq!(row.verdict(), "met");
        assert_eq!(Row::new("x", "y", 1.0, Unit::Times).verdict(), "");
    }
}
