//! The flags `serve` and `dev` share.

use clap::Args;

use crate::server::{DEFAULT_BIND_WAIT, DEFAULT_SLOW_REQUEST_THRESHOLD};

/// How long a claim's create waits, and which requests are logged with their steps.
/// The defaults are the server's own ([`crate::server::Settings`]).
#[derive(Debug, Clone, Copy, Args)]
pub struct RequestArgs {
    /// How long creating a claim waits for a MicroVM when the pool has none available,
    /// before answering 429.
    #[arg(long, env = "BATTERY_APISERVER_BIND_WAIT", default_value_t = DEFAULT_BIND_WAIT.into())]
    pub bind_wait: humantime::Duration,

    /// A request that takes at least this long is logged, at info, with its steps and
    /// the time each took (authenticated, authorized, ClaimVM answered, ...), as
    /// kube-apiserver logs its slow requests' traces; 0s logs every request.
    #[arg(long, env = "BATTERY_APISERVER_SLOW_REQUEST_THRESHOLD", default_value_t = DEFAULT_SLOW_REQUEST_THRESHOLD.into())]
    pub slow_request_threshold: humantime::Duration,
}
