//! battery's store (§5) on redb: the tables `pools`, `vms`, `leases` (with a global unique
//! request_id index), `events` (one global increasing id, never pruned), `hosts` and
//! `placements`. Rows are the API's own protobuf messages (`VmRecord` is battery's VM row),
//! encoded with prost.
//!
//! Every operation is one short synchronous redb transaction that never spans an await;
//! redb serializes writers, so, as with battery's single SQLite connection, commit order is
//! event-id order. Each multi-row change (a VM with its lease, the DeletePool tombstone, a
//! finished deletion) commits in one transaction.

mod db;
mod events;
mod hosts;
mod leases;
mod open;
mod pool_vms;
mod pools;
mod vms;

pub(crate) use db::{Store, StoreError};
pub(crate) use hosts::HostRemoval;
pub(crate) use leases::{Heartbeat, LeaseCommit};
pub(crate) use pools::Tombstone;
pub(crate) use vms::{Placement, Transition};

#[cfg(test)]
mod tests;
