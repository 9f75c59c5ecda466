//! Every failure as one line that says what to do.

use std::fmt;

use battery_sdk::Error;

/// A failure of a command, already worded for the terminal.
#[derive(Debug)]
pub struct Failure(String);

impl Failure {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }

    /// `error`, worded for someone talking to the API server at `server`.
    pub fn of(error: &Error, server: &str) -> Self {
        Self(match error {
            Error::Api(error) => api(error, server),
            Error::PoolExhausted { pool, .. } => format!(
                "pool {pool} has no free MicroVM before the deadline; retry, pass a longer \
                 --deadline, or grow the pool"
            ),
            Error::HolderUnknown => "no Holder: your kubeconfig's user is not a ServiceAccount \
                                     of this namespace; pass --holder SERVICEACCOUNT"
                .to_owned(),
            Error::NotHolder { message } => {
                format!("{message}; run it as the claim's Holder (its ServiceAccount)")
            }
            Error::GuestFailed { .. } => format!(
                "{error}; check the path exists (and is writable, with space left, for a copy \
                 into the MicroVM)"
            ),
            Error::Local { .. } => format!("{}; check the local path", chain(error)),
            other => chain(other),
        })
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn api(error: &kube::Error, server: &str) -> String {
    match error {
        kube::Error::Api(status) if status.code == 401 => format!(
            "{server} does not accept your credentials ({}); check the user of your kubeconfig \
             context",
            status.message
        ),
        kube::Error::Api(status) if status.code == 403 => format!(
            "{}; ask an admin for a role that allows it (deploy/README.md lists them)",
            status.message
        ),
        kube::Error::Api(status) => status.message.clone(),
        kube::Error::HyperError(_) | kube::Error::Service(_) => format!(
            "cannot reach the API server at {server}: {}; is it running, and are --kubeconfig \
             and --context right?",
            chain(error)
        ),
        other => chain(other),
    }
}

/// An error and its causes on one line, each cause said once: a terminal's one line, so
/// a multi-line message is folded too.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    battery_telemetry::error_chain(error).replace('\n', " ")
}
