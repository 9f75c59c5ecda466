//! `serve`'s own histograms, read from its `/metrics`: where a bind's time goes inside
//! `serve`, without the bench's client or the connection.

use anyhow::{Context as _, Result, bail};
use http::{Method, StatusCode};

use super::client::Client;

/// A histogram of `serve`'s `/metrics`: what it times, its name and its labels.
pub type Series = (&'static str, &'static str, &'static str);

/// The histograms a bind passes through, outermost first: the request (after TLS and
/// HTTP/2: authentication, authorization, the body, the bind, the answer), the storage's
/// bind inside it, and inside that `serve`'s `ClaimVM` and the metadata store's durable
/// write of the Bound claim. Each observes every bind; the store's also any other write.
pub const SERIES: [Series; 4] = [
    (
        "serve's whole request",
        "battery_apiserver_request_duration_seconds",
        r#"verb="create",resource="microvmclaims",subresource="""#,
    ),
    (
        "serve's bind, inside it",
        "battery_apiserver_bind_duration_seconds",
        r#"outcome="bound""#,
    ),
    (
        "serve's ClaimVM, inside the bind",
        "battery_apiserver_battery_call_duration_seconds",
        r#"method="ClaimVM",outcome="ok""#,
    ),
    (
        "serve's metadata store write",
        "battery_apiserver_store_write_duration_seconds",
        "",
    ),
];

/// The `GetPool`s the follower asks after battery's events: none, or fewer than one a
/// bind, when it batches them.
pub const FOLLOWER: Series = (
    "serve's GetPool (the follower's)",
    "battery_apiserver_battery_call_duration_seconds",
    r#"method="GetPool",outcome="ok""#,
);

/// A histogram's `(sum in seconds, count)` so far.
pub type Observed = (f64, f64);

/// Each of [`SERIES`]'s histograms, then [`FOLLOWER`]'s, read from `/metrics`.
pub async fn read(client: &Client) -> Result<Vec<Observed>> {
    let (status, body) = client
        .send(Method::GET, "/metrics", "text/plain", None)
        .await?;
    if status != StatusCode::OK {
        bail!("/metrics: {status}");
    }
    let text = std::str::from_utf8(&body).context("/metrics is not UTF-8")?;
    let value = |series: String| -> Result<f64> {
        // A series nothing has observed yet is absent.
        let Some(line) = text.lines().find(|l| l.starts_with(&series)) else {
            return Ok(0.0);
        };
        line[series.len()..]
            .trim()
            .parse()
            .with_context(|| format!("/metrics: {line}"))
    };
    SERIES
        .iter()
        .chain([&FOLLOWER])
        .map(|(_, name, labels)| {
            let labels = if labels.is_empty() {
                String::new()
            } else {
                format!("{{{labels}}}")
            };
            Ok((
                value(format!("{name}_sum{labels} "))?,
                value(format!("{name}_count{labels} "))?,
            ))
        })
        .collect()
}

/// The mean in milliseconds of what a histogram observed between `before` and `after`,
/// if it observed anything.
pub fn mean((sum0, count0): Observed, (sum1, count1): Observed) -> Option<f64> {
    let count = count1 - count0;
    (count >= 1.0).then(|| (sum1 - sum0) / count * 1000.0)
}

/// How many observations a histogram made between `before` and `after`.
pub fn count((_, count0): Observed, (_, count1): Observed) -> f64 {
    count1 - count0
}
