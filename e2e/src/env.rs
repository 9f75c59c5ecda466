//! Settings read from the environment (documented in `e2e/README.md`).

use std::time::Duration;

/// battery's gRPC address (`host:port`). Unset: the suite starts
/// the embedded battery in-process, one per test.
pub const ADDRESS_VAR: &str = "BATTERY_CONFORMANCE_ADDRESS";
/// For an external battery served over TLS (poolmgrd's default): the CA bundle its
/// serving certificate chains to. Unset: plaintext.
pub const CA_FILE_VAR: &str = "BATTERY_CONFORMANCE_CA_FILE";
/// For an external battery that validates clients: the client certificate and its key.
pub const CLIENT_CERT_FILE_VAR: &str = "BATTERY_CONFORMANCE_CLIENT_CERT_FILE";
pub const CLIENT_KEY_FILE_VAR: &str = "BATTERY_CONFORMANCE_CLIENT_KEY_FILE";
/// For an external battery: the name its certificate carries, when not the address's host.
pub const SERVER_NAME_VAR: &str = "BATTERY_CONFORMANCE_SERVER_NAME";
/// For an external battery with a `basic_auth_token`: a file holding it.
pub const TOKEN_FILE_VAR: &str = "BATTERY_CONFORMANCE_TOKEN_FILE";
/// For an external battery: the flintlock Hosts it already has registered, as
/// `name=host:port,...`. The suite reaches them directly (plaintext) to look at MicroVMs.
pub const HOSTS_VAR: &str = "BATTERY_CONFORMANCE_HOSTS";
/// For an external battery: its `sweep_interval` (default `10s`, poolmgrd's default).
pub const SWEEP_VAR: &str = "BATTERY_CONFORMANCE_SWEEP_INTERVAL";
/// For an external battery: its `warning_window` (default `30s`).
pub const WARNING_WINDOW_VAR: &str = "BATTERY_CONFORMANCE_WARNING_WINDOW";
/// How long any single wait may take (default 20 s embedded, 120 s external).
pub const TIMEOUT_VAR: &str = "BATTERY_CONFORMANCE_TIMEOUT";
/// An env-filter (e.g. `debug`) for the embedded battery's logs, printed with the test's
/// output.
pub const LOG_VAR: &str = "BATTERY_CONFORMANCE_LOG";
/// Kernel image put in the pool template (a simulated Host ignores it).
pub const KERNEL_IMAGE_VAR: &str = "BATTERY_CONFORMANCE_KERNEL_IMAGE";
/// Root volume image put in the pool template (a simulated Host ignores it).
pub const ROOT_IMAGE_VAR: &str = "BATTERY_CONFORMANCE_ROOT_IMAGE";

pub(crate) const DEFAULT_KERNEL_IMAGE: &str = "ghcr.io/liquidmetal-dev/flintlock-kernel:5.10.77";
pub(crate) const DEFAULT_ROOT_IMAGE: &str = "ghcr.io/liquidmetal-dev/capmvm-kubernetes:1.23.5";

/// A set, non-empty variable.
pub(crate) fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// A duration variable; panics on a malformed value so a typo is not silently ignored.
pub(crate) fn duration_var(name: &str) -> Option<Duration> {
    var(name).map(|v| parse_duration(&v).unwrap_or_else(|e| panic!("{name}: {e}")))
}

/// Parses `250ms`, `10s`, `1.5s`, `2m` (a number with unit `ms`, `s` or `m`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60.0)
    } else {
        return Err(format!("{text:?}: expected a unit (ms, s or m)"));
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{text:?}: not a number"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("{text:?}: must be a non-negative number"));
    }
    Ok(Duration::from_secs_f64(value * scale))
}

/// Parses `BATTERY_CONFORMANCE_HOSTS`: `name=host:port,...`.
pub(crate) fn parse_hosts(text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| match entry.split_once('=') {
            Some((name, addr)) if !name.trim().is_empty() && !addr.trim().is_empty() => {
                Ok((name.trim().to_owned(), addr.trim().to_owned()))
            }
            _ => Err(format!("{entry:?}: expected name=host:port")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn hosts() {
        assert_eq!(
            parse_hosts("a=1.2.3.4:9090, b=h:1"),
            Ok(vec![
                ("a".into(), "1.2.3.4:9090".into()),
                ("b".into(), "h:1".into())
            ])
        );
        assert!(parse_hosts("a").is_err());
        assert!(parse_hosts("=x").is_err());
    }
}
