//! What the agent prints on stdout beside its logs (whose setup is `battery_telemetry`'s,
//! shared by every binary): the address it serves on, for scripts and tests.

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
