//! What the server tells a person beside its logs: the error that ends it, and where it
//! serves. The logging setup and error chains are `battery_telemetry`'s, shared by every
//! binary.

use battery_telemetry::LogFormat;

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
