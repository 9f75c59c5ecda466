//! Status-code assertions and timestamp arithmetic.

use std::fmt::Debug;

use tonic::{Code, Status};

/// Asserts that `result` failed with `code` and returns the status.
#[track_caller]
pub fn expect_code<T: Debug>(result: Result<T, Status>, code: Code, what: &str) -> Status {
    match result {
        Ok(value) => panic!("{what}: expected {code:?}, got OK: {value:?}"),
        Err(status) if status.code() == code => status,
        Err(status) => panic!(
            "{what}: expected {code:?}, got {:?}: {}",
            status.code(),
            status.message()
        ),
    }
}

/// Asserts that `result` succeeded and returns its value.
#[track_caller]
pub fn expect_ok<T>(result: Result<T, Status>, what: &str) -> T {
    match result {
        Ok(value) => value,
        Err(status) => panic!(
            "{what}: expected OK, got {:?}: {}",
            status.code(),
            status.message()
        ),
    }
}

/// A timestamp as nanoseconds since the epoch; panics when it is unset.
#[track_caller]
pub fn ts_nanos(ts: &Option<prost_types::Timestamp>) -> i128 {
    let ts = ts.as_ref().expect("timestamp is set");
    i128::from(ts.seconds) * 1_000_000_000 + i128::from(ts.nanos)
}

/// A duration as nanoseconds.
pub fn nanos(d: std::time::Duration) -> i128 {
    i128::try_from(d.as_nanos()).expect("duration fits")
}
