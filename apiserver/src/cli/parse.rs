//! The flags' value parsers: each refuses a value with what to try instead.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// A leaf's validity: at least a day, so an install does not expire while it is set up;
/// at most five years, well inside the CAs' ten.
pub(super) fn certificate_validity(value: &str) -> Result<Duration, String> {
    const DAY: u64 = 24 * 3600;
    duration_within(value, DAY, 5 * 365 * DAY, "1d..5y (try 365d)")
}

/// `value` as a duration of `min..=max` seconds; otherwise why, with `range` to try.
pub(super) fn duration_within(
    value: &str,
    min: u64,
    max: u64,
    range: &str,
) -> Result<Duration, String> {
    let duration = humantime::parse_duration(value).map_err(|e| e.to_string())?;
    if (Duration::from_secs(min)..=Duration::from_secs(max)).contains(&duration) {
        Ok(duration)
    } else {
        Err(format!("{value} is outside {range}"))
    }
}

/// An agent certificate's lifetime: long enough to be renewed calmly, short enough that
/// an agent whose identity was withdrawn is locked out soon (ADR 0011).
pub(super) fn certificate_lifetime(value: &str) -> Result<Duration, String> {
    duration_within(
        value,
        60,
        30 * 24 * 3600,
        "1m..30d; agents renew at 2/3 of the lifetime (try 24h)",
    )
}

/// A rate must be a positive number: 0 would refuse every create after the burst.
pub(super) fn positive_rate(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err(format!(
            "{value} is not a positive number of creates per second (try 50)"
        )),
    }
}

/// `dev` has no authorization beyond its own certificate: refuse to serve it on a
/// network.
pub(super) fn loopback(value: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = value.parse().map_err(|e| format!("{e}"))?;
    if addr.ip().is_loopback() {
        Ok(addr)
    } else {
        Err(format!(
            "{addr} is not a loopback address; dev serves on loopback only (try 127.0.0.1:8443)"
        ))
    }
}

/// A program given by its path must be given by an absolute one: sshd re-executes itself
/// by the path it was started with.
pub(super) fn absolute(value: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(value);
    if path.is_absolute() {
        Ok(path)
    } else {
        Err(format!(
            "{value} is not an absolute path (try /usr/sbin/sshd)"
        ))
    }
}
