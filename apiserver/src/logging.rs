//! Logs go to stderr, as text or as one JSON object a line (`--log-format`); `RUST_LOG`
//! picks the level (default `info`). Colour codes are written only to a terminal: in a
//! file, `kubectl logs` or a collector they are noise.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// Installs the global subscriber once.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        // Flattened, so `message` sits beside `level` where collectors look for it.
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// Reports the error that ends the process: one plain line for a person, or one more
/// JSON line when a collector reads stderr, so its last line parses too.
pub fn fatal(format: LogFormat, err: &anyhow::Error) {
    match format {
        LogFormat::Text => eprintln!("battery-apiserver: {err:#}"),
        LogFormat::Json => tracing::error!(error = %format!("{err:#}"), "battery-apiserver failed"),
    }
}

/// Prints what a person (or a script) starting the server needs: where it serves and
/// what to type next. A closed stdout must not take the server down, so write errors
/// are ignored: the logs on stderr carry the same.
pub fn announce(lines: &[String]) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    for line in lines {
        if writeln!(out, "{line}").is_err() {
            return;
        }
    }
    let _ = out.flush();
}

/// An error and its causes on one line, `a: b: c`. A cause whose text its error already
/// shows is left out: tonic's and hyper's errors often repeat their source.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let next = cause.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = cause.source();
    }
    text
}
