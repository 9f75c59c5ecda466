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
