//! The servers' own histograms, read from their `/metrics`: where a bind's time goes
//! inside `serve`, without the bench's client or the connection, and a create's inside
//! kube-apiserver.

use anyhow::{Context as _, Result, bail};
use http::{Method, StatusCode};

use super::client::Client;

/// A histogram of `serve`'s `/metrics`: what it times, its name and its labels.
pub type Series = (&'static str, &'static str, &'static str);

/// The histograms a bind passes through, outermost first: the request (after TLS and
/// HTTP/2: authentication, authorization, the body, the bind, the answer), the storage's
/// bind inside it, and inside that `serve`'s `ClaimVM`; then the metadata store's durable
/// writes, each timed until it is durable: a bind's two (its pending record, made durable
/// beside `ClaimVM`, and its Bound claim's, after the answer, ADR 48) and any other.
pub const SERIES: [Series; 4] = [
    // In this order: REQUEST, BIND, CLAIM_VM, WRITES.
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

/// Where each of [`SERIES`] is in what [`read`] returns.
pub const REQUEST: usize = 0;
pub const BIND: usize = 1;
pub const CLAIM_VM: usize = 2;
pub const WRITES: usize = 3;

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
    SERIES
        .iter()
        .chain([&FOLLOWER])
        .map(|(_, name, labels)| {
            let labels: Vec<&str> = labels.split(',').filter(|l| !l.is_empty()).collect();
            observed_in(text, name, &labels)
        })
        .collect()
}

/// The `(sum, count)` of the histogram `name` in the Prometheus text `text`: of every
/// series whose labels include each of `labels` (`key="value"`), added up. A histogram
/// nothing has observed yet is absent, and reads as nothing observed.
pub fn observed_in(text: &str, name: &str, labels: &[&str]) -> Result<Observed> {
    let mut total = (0.0, 0.0);
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (rest, is_sum) = match (rest.strip_prefix("_sum"), rest.strip_prefix("_count")) {
            (Some(rest), _) => (rest, true),
            (_, Some(rest)) => (rest, false),
            _ => continue,
        };
        let (series, value) = match rest.strip_prefix('{') {
            Some(rest) => match rest.split_once('}') {
                Some(split) => split,
                None => continue,
            },
            None if rest.starts_with(' ') => ("", rest),
            None => continue,
        };
        if !labels.iter().all(|l| series.split(',').any(|s| s == *l)) {
            continue;
        }
        let value: f64 = value
            .trim()
            .parse()
            .with_context(|| format!("/metrics: {line}"))?;
        if is_sum {
            total.0 += value;
        } else {
            total.1 += value;
        }
    }
    Ok(total)
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

/// `serve`'s own part of the binds between `before` and `after`, as a mean in
/// milliseconds: its request less battery's `ClaimVM`.
pub fn own_part(before: &[Observed], after: &[Observed]) -> Option<f64> {
    let serve = |i: usize| mean(before[i], after[i]);
    Some(serve(REQUEST)? - serve(CLAIM_VM)?)
}

/// kube-apiserver's histograms the quiet split reads: what each times, its name and the
/// labels its series must carry. It keeps none for the requests its aggregator proxies,
/// so a bind's part there is what its client saw less `serve`'s request.
const KUBE_SERIES: [(&str, &str, &[&str]); 2] = [
    (
        "kube-apiserver's whole request, for a create",
        "apiserver_request_duration_seconds",
        &[
            r#"verb="POST""#,
            r#"resource="configmaps""#,
            r#"subresource="""#,
        ],
    ),
    (
        "etcd's create, for a create",
        "etcd_request_duration_seconds",
        &[
            r#"operation="create""#,
            r#"group="""#,
            r#"resource="configmaps""#,
        ],
    ),
];

/// Each of [`KUBE_SERIES`], read from kube-apiserver's `/metrics` as the cluster admin.
pub async fn kube_read(admin: &kube::Client) -> Result<Vec<Observed>> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = admin
        .request_text(request)
        .await
        .context("kube-apiserver's /metrics")?;
    KUBE_SERIES
        .iter()
        .map(|(_, name, labels)| observed_in(&text, name, labels))
        .collect()
}
