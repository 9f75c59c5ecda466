//! The registry and its series: every metric the server exports, their bounded labels and
//! the outcome enums the layers above report with; below the request layer that counts
//! into it.

use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

use battery_api_machinery::request_info::RequestInfo;
use battery_types::{RESOURCES, Verb};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// The media type of the exposition, as `prometheus-client` writes it.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The label value of a name outside the fixed set.
const OTHER: &str = "other";

/// Latency bucket bounds in seconds, as `apiserver_request_duration_seconds`'.
const BUCKETS: &[f64] = &[
    0.005, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// A histogram family whose histograms all have [`BUCKETS`].
type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn histograms<L: Clone + std::hash::Hash + Eq>() -> Histograms<L> {
    Family::new_with_constructor(|| Histogram::new(BUCKETS.iter().copied()))
}

/// What a request asked for, as bounded labels.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RouteLabels {
    pub(super) verb: &'static str,
    resource: &'static str,
    subresource: &'static str,
}

impl RouteLabels {
    /// The labels of a request that could not be read as one.
    pub(super) const UNKNOWN: Self = Self {
        verb: OTHER,
        resource: OTHER,
        subresource: "",
    };

    /// Names from the resource table and the verb set; anything else is `other`. A
    /// subresource is named only on a known resource, and is empty when none was asked.
    pub(super) fn of(info: &RequestInfo) -> Self {
        let verb = Verb::ALL
            .iter()
            .map(|v| v.as_str())
            .find(|v| *v == info.verb)
            .unwrap_or(OTHER);
        let resource = RESOURCES.iter().find(|r| {
            info.is_resource_request
                && r.group == info.api_group
                && r.version == info.api_version
                && r.plural == info.resource
        });
        let subresource = match resource {
            Some(r) if !info.subresource.is_empty() => r
                .subresources
                .iter()
                .find(|s| s.name == info.subresource)
                .map_or(OTHER, |s| s.name),
            _ => "",
        };
        Self {
            verb,
            resource: resource.map_or(OTHER, |r| r.plural),
            subresource,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    #[prometheus(flatten)]
    route: RouteLabels,
    code: u16,
}

/// How a bind (a claim's create) ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum BindOutcome {
    /// battery leased a MicroVM and the claim is Bound.
    Bound,
    /// The pool had no MicroVM available within the bind's wait.
    Exhausted,
    /// Refused for good (the pool is missing or being deleted, battery said no): nothing
    /// was leased.
    Refused,
    /// battery did not answer definitively: whatever it leased is released later.
    Ambiguous,
    /// Anything else (the metadata store failed, …).
    Failed,
}

impl BindOutcome {
    const fn as_str(self) -> &'static str {
        match self {
            Self::Bound => "bound",
            Self::Exhausted => "exhausted",
            Self::Refused => "refused",
            Self::Ambiguous => "ambiguous",
            Self::Failed => "failed",
        }
    }
}

/// How one call to battery ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum BatteryOutcome {
    Ok,
    /// battery does not have the object.
    NotFound,
    /// The pool has no MicroVM to lease.
    Exhausted,
    /// The object exists already, changed meanwhile, or is being deleted.
    Conflict,
    /// battery refused the request as invalid.
    Invalid,
    /// No definitive answer (unavailable, deadline exceeded, cancelled, unknown): battery
    /// may have done it.
    Ambiguous,
    /// Any other failure.
    Failed,
}

impl BatteryOutcome {
    const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::NotFound => "not_found",
            Self::Exhausted => "exhausted",
            Self::Conflict => "conflict",
            Self::Invalid => "invalid",
            Self::Ambiguous => "ambiguous",
            Self::Failed => "failed",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BatteryCallLabels {
    method: &'static str,
    outcome: &'static str,
}

/// A Pool's MicroVMs by state, as battery counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolCounts {
    pub available: i64,
    pub leased: i64,
    pub provisioning: i64,
    pub quarantined: i64,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    namespace: Escaped,
    pool: Escaped,
    state: &'static str,
}

/// A label value written as the text format asks: `prometheus-client` writes values as
/// they are (prometheus/client_rust#151), and an unescaped `"` or line feed would break
/// the whole scrape. Names are validated DNS labels, so this is a guard, not a habit.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Escaped(String);

impl EncodeLabelValue for Escaped {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        use std::fmt::Write as _;
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

/// The server's metrics, and the calls that record them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    request_duration: Histograms<RouteLabels>,
    pub(super) requests_in_flight: Gauge,
    pub(super) watches_open: Gauge,
    exec_sessions: Gauge,
    bind_duration: Histograms<OutcomeLabels>,
    battery_call_duration: Histograms<BatteryCallLabels>,
    pool_microvms: Family<PoolLabels, Gauge>,
    battery_events: Counter,
    battery_event_lag: Gauge<f64, AtomicU64>,
    battery_events_following: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("battery_apiserver");
        let requests = Family::default();
        registry.register(
            "requests",
            "Requests answered, by verb, resource, subresource and HTTP code",
            requests.clone(),
        );
        let request_duration = histograms();
        registry.register_with_unit(
            "request_duration",
            "Time to the response's head, by verb, resource and subresource",
            Unit::Seconds,
            request_duration.clone(),
        );
        let requests_in_flight = Gauge::default();
        registry.register(
            "requests_in_flight",
            "Requests being handled, up to their response's head",
            requests_in_flight.clone(),
        );
        let watches_open = Gauge::default();
        registry.register(
            "watches_open",
            "Watches streaming now",
            watches_open.clone(),
        );
        let exec_sessions = Gauge::default();
        registry.register(
            "exec_sessions",
            "Exec sessions open now, from the upgrade to their end",
            exec_sessions.clone(),
        );
        let bind_duration = histograms();
        registry.register_with_unit(
            "bind_duration",
            "Claim binds, by outcome, and how long each took",
            Unit::Seconds,
            bind_duration.clone(),
        );
        let battery_call_duration = histograms();
        registry.register_with_unit(
            "battery_call_duration",
            "Calls to battery, by method and outcome, and how long each took",
            Unit::Seconds,
            battery_call_duration.clone(),
        );
        let pool_microvms = Family::default();
        registry.register(
            "pool_microvms",
            "Each Pool's MicroVMs by state, as battery last reported them",
            pool_microvms.clone(),
        );
        let battery_events = Counter::default();
        registry.register(
            "battery_events",
            "battery events the follower applied",
            battery_events.clone(),
        );
        let battery_event_lag = Gauge::default();
        registry.register_with_unit(
            "battery_event_lag",
            "How long after battery created it the newest event was applied",
            Unit::Seconds,
            battery_event_lag.clone(),
        );
        let battery_events_following = Gauge::default();
        registry.register(
            "battery_events_following",
            "1 once battery's event stream has reached events recorded after it was \
             subscribed to (its replay is over), 0 before",
            battery_events_following.clone(),
        );
        Self {
            registry,
            requests,
            request_duration,
            requests_in_flight,
            watches_open,
            exec_sessions,
            bind_duration,
            battery_call_duration,
            pool_microvms,
            battery_events,
            battery_event_lag,
            battery_events_following,
        }
    }
}

impl Metrics {
    /// Also serves `write_duration`, the metadata store's own histogram of its writes.
    pub fn with_store_writes(mut self, write_duration: Histogram) -> Self {
        self.registry.register_with_unit(
            "store_write_duration",
            "Metadata store writes, from the transaction's start until its commit is durable",
            Unit::Seconds,
            write_duration,
        );
        self
    }

    pub(super) fn record_request(&self, route: RouteLabels, code: u16, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels { route, code })
            .inc();
        self.request_duration
            .get_or_create(&route)
            .observe(elapsed.as_secs_f64());
    }

    /// The gauge of open exec sessions, for the session registry to move.
    pub fn exec_sessions(&self) -> Gauge {
        self.exec_sessions.clone()
    }

    /// Records a claim's bind, from its start to its answer.
    pub fn record_bind(&self, outcome: BindOutcome, elapsed: Duration) {
        self.bind_duration
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Records one call to battery: `method` is the RPC's name (`ClaimVM`).
    pub fn record_battery_call(
        &self,
        method: &'static str,
        outcome: BatteryOutcome,
        elapsed: Duration,
    ) {
        self.battery_call_duration
            .get_or_create(&BatteryCallLabels {
                method,
                outcome: outcome.as_str(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Sets a Pool's MicroVM counts, as battery reported them.
    pub fn set_pool_counts(&self, namespace: &str, name: &str, counts: PoolCounts) {
        for (state, count) in Self::pool_states(counts) {
            self.pool_microvms
                .get_or_create(&Self::pool_labels(namespace, name, state))
                .set(count);
        }
    }

    /// Drops a deleted Pool's series.
    pub fn forget_pool(&self, namespace: &str, name: &str) {
        for (state, _) in Self::pool_states(PoolCounts::default()) {
            self.pool_microvms
                .remove(&Self::pool_labels(namespace, name, state));
        }
    }

    fn pool_states(counts: PoolCounts) -> [(&'static str, i64); 4] {
        [
            ("available", counts.available),
            ("leased", counts.leased),
            ("provisioning", counts.provisioning),
            ("quarantined", counts.quarantined),
        ]
    }

    fn pool_labels(namespace: &str, name: &str, state: &'static str) -> PoolLabels {
        PoolLabels {
            namespace: Escaped(namespace.to_owned()),
            pool: Escaped(name.to_owned()),
            state,
        }
    }

    /// Records a battery event the follower applied, created by battery at `created_at`.
    /// The lag is measured against this host's clock; battery's running behind it counts
    /// as no lag.
    /// An event without a creation time counts, and leaves the lag as it was.
    /// Whether the follower has caught up with battery's event stream.
    pub fn set_following(&self, following: bool) {
        self.battery_events_following.set(i64::from(following));
    }

    pub fn record_event(&self, created_at: Option<SystemTime>) {
        self.battery_events.inc();
        if let Some(created_at) = created_at {
            let lag = SystemTime::now()
                .duration_since(created_at)
                .unwrap_or_default();
            self.battery_event_lag.set(lag.as_secs_f64());
        }
    }

    /// The exposition, in OpenMetrics text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String fails only if an encoder does, and ours do not.
        if let Err(error) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(%error, "encoding the metrics");
        }
        out
    }
}

#[cfg(test)]
mod tests;
