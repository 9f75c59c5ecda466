//! Logs go to stderr as text; `RUST_LOG` picks the level (default `info`).

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
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
