//! Each bind split at `serve`'s own steps: the bench runs `serve` with
//! `--slow-request-threshold 0s` and JSON logs, so every request's trace (its steps and
//! the time each took, on `serve`'s clock) is in its log, named by the claim. Joined with
//! the bench's time of the same bind, they say where each bind's time went: outside
//! `serve`'s routes (the client, the connections, kube-apiserver's proxy on that route),
//! `serve` up to sending `ClaimVM`, battery's `ClaimVM`, and `serve` from its answer to
//! the 201. The servers' histograms, means and buckets of 5 ms and more, cannot say it of
//! the slowest binds.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use serde_json::Value;

use crate::report::{Row, Unit, mean_millis, millis, quantile};

/// The step after which `ClaimVM` is on the wire, and the one that says it answered.
const SENT: &str = "ClaimVM sent";
const ANSWERED: &str = "ClaimVM answered";

/// One bind, as the bench timed it.
pub struct Split {
    /// How it reached `serve`: straight, or through kube-apiserver.
    route: &'static str,
    name: String,
    took: Duration,
}

impl Split {
    /// The bind of the claim `name` by `route`, answered `took` after it arrived.
    pub fn of(route: &'static str, name: &str, took: Duration) -> Self {
        Self {
            route,
            name: name.to_owned(),
            took,
        }
    }
}

/// One create as `serve` traced it: its total, and each step's time since the request
/// arrived.
pub struct Traced {
    total: Duration,
    steps: Vec<(String, Duration)>,
}

impl Traced {
    fn at(&self, step: &str) -> Option<Duration> {
        self.steps
            .iter()
            .find(|(what, _)| what == step)
            .map(|(_, at)| *at)
    }

    /// Each of `serve`'s own steps with its own time (since the step before it): every
    /// step but the wait for `ClaimVM`'s answer.
    fn own_steps(&self) -> impl Iterator<Item = (&str, Duration)> {
        let mut previous = Duration::ZERO;
        self.steps
            .iter()
            .map(move |(what, at)| {
                let took = at.saturating_sub(previous);
                previous = *at;
                (what.as_str(), took)
            })
            .filter(|(what, _)| *what != ANSWERED)
    }
}

/// `serve`'s JSON log, read on from where the last read stopped, so that each pass
/// parses only the lines written since the one before.
pub struct TraceLog {
    path: PathBuf,
    /// Bytes read so far, up to the end of a whole line.
    read: u64,
}

impl TraceLog {
    pub fn new(path: PathBuf) -> Self {
        Self { path, read: 0 }
    }

    /// The creates `serve` traced since the last read, by the name of what they created.
    pub fn read_new(&mut self) -> Result<HashMap<String, Traced>> {
        let mut text = String::new();
        let mut file =
            File::open(&self.path).with_context(|| format!("{}", self.path.display()))?;
        file.seek(SeekFrom::Start(self.read))?;
        file.read_to_string(&mut text)
            .with_context(|| format!("{}", self.path.display()))?;
        // A line still being written is read whole next time.
        let whole = text.rfind('\n').map_or(0, |end| end + 1);
        self.read += whole as u64;
        Ok(parse_traces(&text[..whole]))
    }
}

/// The creates traced in `text`, lines of `serve`'s JSON log, by the name of what they
/// created.
fn parse_traces(text: &str) -> HashMap<String, Traced> {
    let mut traced = HashMap::new();
    for line in text.lines() {
        let Ok(line) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if line["message"] != "slow request" || line["method"] != "POST" {
            continue;
        }
        let (Some(name), Some(total), Some(steps)) = (
            line["name"].as_str(),
            line["total_ms"].as_f64(),
            line["steps"].as_str(),
        ) else {
            continue;
        };
        traced.insert(
            name.to_owned(),
            Traced {
                total: from_millis(total),
                steps: parse_steps(steps),
            },
        );
    }
    traced
}

/// `authenticated +0.041 ms, ...` as each step with its time since arrival.
fn parse_steps(steps: &str) -> Vec<(String, Duration)> {
    let mut since_arrival = Duration::ZERO;
    steps
        .split(", ")
        .filter_map(|step| {
            let (what, took) = step.rsplit_once(" +")?;
            let took = took.strip_suffix(" ms")?.parse::<f64>().ok()?;
            since_arrival += from_millis(took);
            Some((what.to_owned(), since_arrival))
        })
        .collect()
}

fn from_millis(millis: f64) -> Duration {
    Duration::from_secs_f64(millis.max(0.0) / 1000.0)
}

/// A bind's time in four parts, from its trace.
struct Parts([Duration; 4]);

const PARTS: [&str; 4] = [
    "outside serve's routes (the client, the connections, any proxy)",
    "serve, arrival to ClaimVM sent",
    "ClaimVM sent to answered",
    "serve, ClaimVM answered to its answer",
];

impl Parts {
    fn of(split: &Split, traced: &Traced) -> Option<Self> {
        let (sent, answered) = (traced.at(SENT)?, traced.at(ANSWERED)?);
        Some(Self([
            split.took.saturating_sub(traced.total),
            sent,
            answered.saturating_sub(sent),
            traced.total.saturating_sub(answered),
        ]))
    }
}

/// The rows of `label`'s binds split at `serve`'s steps, for each route in the order
/// they came.
pub fn rows(
    scenario: &'static str,
    label: &str,
    splits: &[Split],
    traces: &HashMap<String, Traced>,
) -> Vec<Row> {
    by_route(splits)
        .into_iter()
        .flat_map(|(route, of_route)| {
            route_rows(scenario, &format!("{label}, {route}"), &of_route, traces)
        })
        .collect()
}

/// The p50 of each of `serve`'s own steps over `label`'s binds, for each route, in the
/// order the steps happen: where `serve`'s own part of a bind goes, the wait for
/// `ClaimVM` left out.
pub fn step_rows(
    scenario: &'static str,
    label: &str,
    splits: &[Split],
    traces: &HashMap<String, Traced>,
) -> Vec<Row> {
    let mut rows = Vec::new();
    for (route, of_route) in by_route(splits) {
        let mut steps: Vec<(&str, Vec<Duration>)> = Vec::new();
        for traced in of_route.iter().filter_map(|split| traces.get(&split.name)) {
            for (what, took) in traced.own_steps() {
                match steps.iter_mut().find(|(step, _)| *step == what) {
                    Some((_, times)) => times.push(took),
                    None => steps.push((what, vec![took])),
                }
            }
        }
        rows.extend(steps.into_iter().map(|(what, times)| {
            Row::millis(
                scenario,
                format!("{label}, {route}, a bind's p50 of serve's step up to \"{what}\""),
                quantile(&times, 0.5),
            )
        }));
    }
    rows
}

/// `splits` by route, each route in the order it first came.
fn by_route(splits: &[Split]) -> Vec<(&'static str, Vec<&Split>)> {
    let mut routes: Vec<(&'static str, Vec<&Split>)> = Vec::new();
    for split in splits {
        match routes.iter_mut().find(|(route, _)| *route == split.route) {
            Some((_, of_route)) => of_route.push(split),
            None => routes.push((split.route, vec![split])),
        }
    }
    routes
}

/// The rows of one route's binds: each part's p50 over all of them, then each part's
/// mean over the slowest 1% (at least one), which hold the p99, and the step of
/// `serve`'s own (not the wait for `ClaimVM`) that took longest among those, on average.
fn route_rows(
    scenario: &'static str,
    label: &str,
    splits: &[&Split],
    traces: &HashMap<String, Traced>,
) -> Vec<Row> {
    let joined: Vec<(&Split, &Traced, Parts)> = splits
        .iter()
        .copied()
        .filter_map(|split| {
            let traced = traces.get(&split.name)?;
            Some((split, traced, Parts::of(split, traced)?))
        })
        .collect();
    let mut rows = vec![Row::new(
        scenario,
        format!("{label}: binds without serve's trace"),
        (splits.len() - joined.len()) as f64,
        Unit::Count,
    )];
    if joined.is_empty() {
        return rows;
    }
    for (i, part) in PARTS.iter().enumerate() {
        let all: Vec<Duration> = joined.iter().map(|(_, _, parts)| parts.0[i]).collect();
        rows.push(Row::millis(
            scenario,
            format!("{label}, a bind's p50: {part}"),
            quantile(&all, 0.5),
        ));
    }
    let mut slowest: Vec<&(&Split, &Traced, Parts)> = joined.iter().collect();
    slowest.sort_by_key(|(split, _, _)| std::cmp::Reverse(split.took));
    slowest.truncate(joined.len().div_ceil(100));
    let of_slowest = format!("{label}, the slowest 1% of binds ({}), mean", slowest.len());
    for (i, part) in PARTS.iter().enumerate() {
        let side: Vec<Duration> = slowest.iter().map(|(_, _, parts)| parts.0[i]).collect();
        if let Some(mean) = mean_millis(&side) {
            rows.push(Row::new(
                scenario,
                format!("{of_slowest}: {part}"),
                mean,
                Unit::Millis,
            ));
        }
    }
    let mut by_step: HashMap<&str, Duration> = HashMap::new();
    for (_, traced, _) in &slowest {
        for (what, took) in traced.own_steps() {
            *by_step.entry(what).or_default() += took;
        }
    }
    if let Some((step, total)) = by_step.into_iter().max_by_key(|(_, total)| *total) {
        rows.push(Row::new(
            scenario,
            format!("{of_slowest}: serve's longest step but ClaimVM, up to \"{step}\""),
            millis(total) / slowest.len() as f64,
            Unit::Millis,
        ));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_parse_to_their_times_since_arrival() {
        let steps = parse_steps(
            "authenticated +0.040 ms, ClaimVM sent +1.000 ms, ClaimVM answered +2.500 ms, \
             and 3 more steps",
        );
        let at: Vec<(&str, u128)> = steps
            .iter()
            .map(|(what, at)| (what.as_str(), at.as_micros()))
            .collect();
        assert_eq!(
            at,
            [
                ("authenticated", 40),
                ("ClaimVM sent", 1_040),
                ("ClaimVM answered", 3_540)
            ]
        );
    }

    #[test]
    fn the_log_is_read_on_from_the_last_whole_line() {
        use std::io::Write as _;
        let line = |name: &str| {
            serde_json::json!({
                "message": "slow request", "method": "POST", "name": name,
                "total_ms": 2.0, "steps": "ClaimVM sent +1.000 ms"
            })
            .to_string()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("server.log");
        let (first, second) = (line("first"), line("second"));
        let (begun, rest) = second.split_at(10);
        std::fs::write(&path, format!("{first}\n{begun}")).unwrap();
        let mut log = TraceLog::new(path.clone());
        let read = log.read_new().unwrap();
        assert_eq!(read.keys().collect::<Vec<_>>(), ["first"]);
        let mut file = File::options().append(true).open(&path).unwrap();
        writeln!(file, "{rest}").unwrap();
        let read = log.read_new().unwrap();
        assert_eq!(read.keys().collect::<Vec<_>>(), ["second"]);
        assert_eq!(read["second"].total, Duration::from_millis(2));
    }

    #[test]
    fn a_bind_splits_into_four_parts_that_sum_to_its_time() {
        let traced = Traced {
            total: Duration::from_millis(5),
            steps: parse_steps("ClaimVM sent +1.000 ms, ClaimVM answered +3.000 ms"),
        };
        let split = Split::of("straight", "a", Duration::from_millis(8));
        let Parts(parts) = Parts::of(&split, &traced).unwrap();
        assert_eq!(
            parts.map(|part| part.as_millis()),
            [3, 1, 3, 1],
            "outside, before, ClaimVM, after"
        );
        let rows = rows(
            "s",
            "10/s",
            &[split],
            &HashMap::from([("a".into(), traced)]),
        );
        assert_eq!(rows[0].value, 0.0, "every bind traced");
        let longest = rows.last().unwrap();
        assert!(
            longest.figure.ends_with("up to \"ClaimVM sent\""),
            "{}",
            longest.figure
        );
        assert_eq!(longest.value, 1.0, "the step before ClaimVM, not its wait");
    }

    #[test]
    fn each_of_serves_steps_has_its_p50_in_the_order_they_happen() {
        let traced = |steps: &str| Traced {
            total: Duration::from_millis(9),
            steps: parse_steps(steps),
        };
        let traces = HashMap::from([
            (
                "a".into(),
                traced("decoded +1.000 ms, ClaimVM answered +3.000 ms, recorded +1.000 ms"),
            ),
            (
                "b".into(),
                traced("decoded +2.000 ms, ClaimVM answered +4.000 ms, recorded +3.000 ms"),
            ),
            (
                "c".into(),
                traced("decoded +3.000 ms, ClaimVM answered +5.000 ms, recorded +2.000 ms"),
            ),
        ]);
        let splits = ["a", "b", "c"].map(|name| Split::of("via", name, Duration::from_millis(9)));
        let rows = step_rows("s", "10/s", &splits, &traces);
        let figures: Vec<(&str, f64)> = rows
            .iter()
            .map(|row| (row.figure.as_str(), row.value))
            .collect();
        assert_eq!(
            figures,
            [
                (
                    "10/s, via, a bind's p50 of serve's step up to \"decoded\"",
                    2.0
                ),
                (
                    "10/s, via, a bind's p50 of serve's step up to \"recorded\"",
                    2.0
                ),
            ],
            "ClaimVM's wait left out"
        );
    }
}
