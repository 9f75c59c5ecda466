//! Timestamp arithmetic on protobuf well-known types, in nanoseconds since the epoch.

use std::time::{Duration, SystemTime};

use prost_types::Timestamp;

const NANOS_PER_SECOND: i128 = 1_000_000_000;

/// The current wall-clock time as a protobuf timestamp.
pub(crate) fn now() -> Timestamp {
    Timestamp::from(SystemTime::now())
}

/// Nanoseconds since the epoch; an unset timestamp counts as the epoch.
pub(crate) fn nanos(ts: Option<&Timestamp>) -> i128 {
    ts.map_or(0, |ts| {
        i128::from(ts.seconds) * NANOS_PER_SECOND + i128::from(ts.nanos)
    })
}

fn from_nanos(nanos: i128) -> Timestamp {
    let seconds = nanos.div_euclid(NANOS_PER_SECOND);
    let sub = nanos.rem_euclid(NANOS_PER_SECOND);
    Timestamp {
        seconds: i64::try_from(seconds).unwrap_or(if seconds < 0 { i64::MIN } else { i64::MAX }),
        // rem_euclid keeps this in 0..1e9, which always fits.
        nanos: i32::try_from(sub).unwrap_or_default(),
    }
}

/// `ts + duration` for a protobuf duration, which may be negative or unset (zero): battery
/// never validates `heartbeat_expiry_threshold` (§4.4).
pub(crate) fn add_proto(ts: &Timestamp, duration: Option<&prost_types::Duration>) -> Timestamp {
    let delta = duration.map_or(0, |d| {
        i128::from(d.seconds) * NANOS_PER_SECOND + i128::from(d.nanos)
    });
    from_nanos(nanos(Some(ts)) + delta)
}

/// `ts + duration`.
pub(crate) fn add(ts: &Timestamp, duration: Duration) -> Timestamp {
    from_nanos(nanos(Some(ts)) + i128::try_from(duration.as_nanos()).unwrap_or(i128::MAX / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_negative_and_unset_durations() {
        let ts = Timestamp {
            seconds: 10,
            nanos: 500,
        };
        let minus = prost_types::Duration {
            seconds: -1,
            nanos: -600,
        };
        assert_eq!(
            add_proto(&ts, Some(&minus)),
            Timestamp {
                seconds: 8,
                nanos: 999_999_900
            }
        );
        assert_eq!(add_proto(&ts, None), ts);
        assert_eq!(
            add(&ts, Duration::from_millis(1500)),
            Timestamp {
                seconds: 11,
                nanos: 500_000_500
            }
        );
        assert!(nanos(Some(&ts)) > nanos(None));
    }
}
