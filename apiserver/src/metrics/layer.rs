//! The layer that logs each request once and counts it, whatever answered it: requests
//! in flight until their response's head, and watches for as long as their body streams.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use battery_api_machinery::request_info::RequestInfo;
use battery_api_machinery::status::ErrorSource;
use battery_types::Verb;
use http_body::{Frame, SizeHint};
use prometheus_client::metrics::gauge::Gauge;

use super::registry::{Metrics, RouteLabels};
use crate::trace::{Finished, Trace};

/// What the counting layer holds.
#[derive(Clone)]
pub struct Observer {
    pub metrics: Arc<Metrics>,
    /// A request at least this slow is logged with its trace's steps.
    pub slow_request_threshold: Duration,
}

/// Counts the request, and logs it: an error's internal cause, which the response body
/// never carries, is logged here, and so is a slow request's [`Trace`], which this layer
/// starts and leaves in the request's extensions for the layers and handlers below. Runs
/// inside the request-info layer, whose [`RequestInfo`] names the labels.
pub async fn observe(
    State(Observer {
        metrics,
        slow_request_threshold,
    }): State<Observer>,
    mut request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let trace = Trace::start(started);
    request.extensions_mut().insert(trace.clone());
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let route = request
        .extensions()
        .get::<RequestInfo>()
        .map_or(RouteLabels::UNKNOWN, RouteLabels::of);
    let in_flight = Held::new(&metrics.requests_in_flight);
    let response = next.run(request).await;
    drop(in_flight);
    let elapsed = started.elapsed();
    let status = response.status();
    metrics.record_request(route, status.as_u16(), elapsed);
    trace.log_if_long(
        slow_request_threshold,
        &Finished {
            method: &method,
            path: &path,
            status: status.as_u16(),
            elapsed,
        },
    );
    match response.extensions().get::<ErrorSource>() {
        Some(source) if status.is_server_error() => {
            tracing::error!(%method, %path, status = status.as_u16(), ?elapsed, error = %battery_telemetry::error_chain(&*source.0), "request failed");
        }
        _ => tracing::debug!(%method, %path, status = status.as_u16(), ?elapsed, "request"),
    }
    if route.verb == Verb::Watch.as_str() && status.is_success() {
        let open = Held::new(&metrics.watches_open);
        return response.map(|body| Body::new(Streaming { body, _open: open }));
    }
    response
}

/// One unit of a gauge, given back when dropped: a cancelled request or a closed watch
/// gives it back too.
struct Held(Gauge);

impl Held {
    fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A watch's body, holding its unit of `watches_open` until the server drops it (the
/// watch ended or its client went away).
struct Streaming {
    body: Body,
    _open: Held,
}

impl http_body::Body for Streaming {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
