//! `/metrics` in Prometheus text: requests by verb, resource and code, and their
//! latency, recorded by the request-logging layer. Hand-rolled because a global recorder
//! would be shared by every server in a test process.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use battery_api_machinery::request_info::RequestInfo;
use battery_api_machinery::status::ErrorSource;

/// Latency bucket bounds in seconds, as apiserver_request_duration_seconds'.
const BUCKETS: &[f64] = &[
    0.005, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

#[derive(Default)]
struct Series {
    count: u64,
    sum: f64,
    buckets: Vec<u64>,
}

/// The counters.
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), Series>>,
}

impl Metrics {
    fn observe(&self, verb: &str, resource: &str, code: u16, elapsed: Duration) {
        let mut requests = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        let series = requests
            .entry((verb.to_owned(), resource.to_owned(), code))
            .or_insert_with(|| Series {
                buckets: vec![0; BUCKETS.len()],
                ..Series::default()
            });
        let seconds = elapsed.as_secs_f64();
        series.count += 1;
        series.sum += seconds;
        for (bound, bucket) in BUCKETS.iter().zip(series.buckets.iter_mut()) {
            if seconds <= *bound {
                *bucket += 1;
            }
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let requests = self.requests.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = String::new();
        out.push_str(
            "# HELP battery_apiserver_requests_total Requests by verb, resource and HTTP code.\n",
        );
        out.push_str("# TYPE battery_apiserver_requests_total counter\n");
        for ((verb, resource, code), series) in requests.iter() {
            let _ = writeln!(
                out,
                "battery_apiserver_requests_total{{verb=\"{verb}\",resource=\"{resource}\",code=\"{code}\"}} {}",
                series.count
            );
        }
        out.push_str("# HELP battery_apiserver_request_duration_seconds Request latency by verb and resource.\n");
        out.push_str("# TYPE battery_apiserver_request_duration_seconds histogram\n");
        let mut by_route: BTreeMap<(&str, &str), Series> = BTreeMap::new();
        for ((verb, resource, _), series) in requests.iter() {
            let merged = by_route.entry((verb, resource)).or_insert_with(|| Series {
                buckets: vec![0; BUCKETS.len()],
                ..Series::default()
            });
            merged.count += series.count;
            merged.sum += series.sum;
            for (m, s) in merged.buckets.iter_mut().zip(&series.buckets) {
                *m += s;
            }
        }
        for ((verb, resource), series) in by_route {
            for (bound, count) in BUCKETS.iter().zip(&series.buckets) {
                let _ = writeln!(
                    out,
                    "battery_apiserver_request_duration_seconds_bucket{{verb=\"{verb}\",resource=\"{resource}\",le=\"{bound}\"}} {count}"
                );
            }
            let _ = writeln!(
                out,
                "battery_apiserver_request_duration_seconds_bucket{{verb=\"{verb}\",resource=\"{resource}\",le=\"+Inf\"}} {}",
                series.count
            );
            let _ = writeln!(
                out,
                "battery_apiserver_request_duration_seconds_sum{{verb=\"{verb}\",resource=\"{resource}\"}} {}",
                series.sum
            );
            let _ = writeln!(
                out,
                "battery_apiserver_request_duration_seconds_count{{verb=\"{verb}\",resource=\"{resource}\"}} {}",
                series.count
            );
        }
        out
    }
}

/// The layer that logs each request once and counts it. An error's internal cause,
/// which the response body never carries, is logged here.
pub async fn observe(
    State(metrics): State<std::sync::Arc<Metrics>>,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let info = RequestInfo::parse(&method, &path, request.uri().query()).ok();
    let response = next.run(request).await;
    let elapsed = started.elapsed();
    let status = response.status();
    let (verb, resource) = info
        .as_ref()
        .map(|i| (i.verb.as_str(), i.resource.as_str()))
        .unwrap_or((method.as_str(), ""));
    metrics.observe(verb, resource, status.as_u16(), elapsed);
    match response.extensions().get::<ErrorSource>() {
        Some(source) if status.is_server_error() => {
            tracing::error!(%method, %path, status = status.as_u16(), ?elapsed, error = %format!("{:#}", DisplayChain(&*source.0)), "request failed");
        }
        _ => tracing::debug!(%method, %path, status = status.as_u16(), ?elapsed, "request"),
    }
    response
}

/// Prints an error and its sources, `a: b: c`.
struct DisplayChain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for DisplayChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_histograms() {
        let metrics = Metrics::default();
        metrics.observe("list", "pools", 200, Duration::from_millis(3));
        metrics.observe("list", "pools", 200, Duration::from_millis(300));
        let text = metrics.render();
        assert!(text.contains(
            "battery_apiserver_requests_total{verb=\"list\",resource=\"pools\",code=\"200\"} 2"
        ));
        assert!(text.contains(
            "battery_apiserver_request_duration_seconds_bucket{verb=\"list\",resource=\"pools\",le=\"0.005\"} 1"
        ));
        assert!(text.contains(
            "battery_apiserver_request_duration_seconds_count{verb=\"list\",resource=\"pools\"} 2"
        ));
    }
}
