//! Logs go to stderr, as text or as one JSON object a line (`--log-format`); `RUST_LOG`
//! picks the level (default `info`). Colour codes are written only to a terminal: in a
//! file, `kubectl logs` or a collector they are noise.

use tracing_subscriber::EnvFilter;

/// The shape of a log line.
#[cfg(feature = "logging")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One readable line per event, coloured only when stderr is a terminal.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the
    /// event's other fields beside it.
    Json,
}

/// Installs the global subscriber once.
#[cfg(feature = "logging")]
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => {
            use std::io::IsTerminal;
            builder.with_ansi(std::io::stderr().is_terminal()).init()
        }
        // Flattened, so `message` sits beside `level` where collectors look for it.
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// The logs of a test run, which libtest captures with the test's output: `filter` is an
/// env-filter such as `debug` or `battery_embedded=debug`. A second call is a no-op, as
/// every test of a binary may make it.
#[cfg(feature = "test-util")]
pub fn init_test_logging(filter: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new(filter))
        .with_test_writer()
        .try_init();
}
