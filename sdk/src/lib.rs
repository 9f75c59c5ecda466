//! Claim a battery MicroVM, keep its lease renewed, run commands in it, copy files in and
//! out and release it.
//!
//! Built on kube-rs: a [`Client`] wraps a `kube::Client`; [`Client::claim`] binds a
//! MicroVM of a Pool and gives a [`Claim`] that renews its own lease until it is
//! released or dropped; [`Claim::exec`] and [`Claim::run`] run commands in the MicroVM
//! ([`Command::tty`] in a terminal, as `kubectl exec -it`), [`Claim::upload`],
//! [`Claim::download`] and the path copies move files in and out, and
//! [`Claim::port_forward`] (or [`Claim::connect_port`], one connection) reaches a port of
//! the MicroVM, as `kubectl port-forward` does a Pod's. [`Claim::background`] starts a
//! [`BackgroundProcess`], which runs on after the client leaves, to attach to, wait for
//! and stop later.
//! The API types are re-exported as [`types`], so a consumer needs no other crate of ours.
//!
//! ```no_run
//! # async fn example() -> Result<(), battery_sdk::Error> {
//! let kube = kube::Client::try_default().await.map_err(battery_sdk::Error::Api)?;
//! let client = battery_sdk::Client::new(kube);
//! // `Client::from_config` would know its user, and so the Holder.
//! let claim = client.claim("dev").holder("dev").send().await?;
//! let output = claim.run(["uname", "-a"]).await?;
//! println!("{} (exit {})", String::from_utf8_lossy(&output.stdout), output.code);
//! claim.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Rules: a claim's POST binds, so [`ClaimBuilder::send`] returns a Bound claim or an
//! error; it retries `429` and `503` as `Retry-After` says until its deadline, and under
//! a name fixed before the first attempt, so a retry never makes a second claim. A
//! [`Claim`] renews at its Pool's `heartbeatInterval` (a little early, with jitter);
//! [`Claim::lost`] says when that is over. Dropping a [`Claim`] stops renewing without
//! blocking, and battery expires the lease after the Pool's `expiryThreshold`.

#![deny(missing_docs)]

mod background;
mod claim;
mod claim_builder;
mod client;
mod connect;
mod error;
mod exec;
mod host_ready;
mod portforward;
mod transfer;
mod tty;

pub use background::{BackgroundCommand, BackgroundProcess};
pub use battery_types as types;
pub use claim::Claim;
/// The label that carries a claim's token, by which a retried create knows its own claim.
pub use claim_builder::TOKEN_LABEL;
pub use claim_builder::{ClaimBuilder, Waiting};
pub use client::Client;
pub use error::{Error, LostReason};
pub use exec::{Command, Output, OutputStream, Process, Stdin};
pub use host_ready::HostReadiness;
/// The kube-rs this SDK is built on, so a consumer's `kube::Config` and `kube::Client`
/// are of the same version.
pub use kube;
pub use portforward::{ForwardError, PortForward, PortStream};
pub use transfer::{CopyPath, Download, Files, Transferred};
pub use tty::{Resizer, TerminalSize};
