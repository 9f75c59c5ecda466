//! What the binaries say about themselves: an error and its causes on one line
//! ([`error_chain`]), and the one logging setup (`init`, feature `logging`). Behind
//! `test-util`, the one way tests wait for a condition (`eventually`) and the loopback
//! ports they tell a child process to listen on (`free_loopback_address`).
//!
//! Every binary (the agent, the apiserver, e2e's) and the libraries under them format
//! errors and logs alike, so this crate sits below all of them: without features it is
//! std only, and the SDK and the embedded battery depend on it at no cost.

#![deny(missing_docs)]

mod chain;
#[cfg(any(feature = "logging", feature = "test-util"))]
mod logging;
#[cfg(feature = "test-util")]
mod ports;
#[cfg(feature = "test-util")]
mod wait;

pub use chain::error_chain;
#[cfg(feature = "test-util")]
pub use logging::init_test_logging;
#[cfg(feature = "logging")]
pub use logging::{LogFormat, init};
#[cfg(feature = "test-util")]
pub use ports::free_loopback_address;
#[cfg(feature = "test-util")]
pub use wait::{Check, consistently, eventually, retry};
