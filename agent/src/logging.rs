//! Logs go to stderr, as text or as one JSON object a line (`--log-format`); `RUST_LOG`
//! picks the level (default `info`). Colour codes only on a terminal: in `kubectl logs`
//! or a collector they are noise.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber once.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// What the agent prints on stdout once it listens, before the address: scripts and
/// tests read it to learn the port.
pub const SERVING_PREFIX: &str = "battery-agent: serving the exec relay on ";

/// Prints `line` on stdout. A closed stdout must not stop the agent: the logs on stderr
/// carry the same.
pub fn announce(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}
