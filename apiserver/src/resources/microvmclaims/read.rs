//! Reads: a claim is Expired once battery no longer holds its lease, decided here alone
//! (`reference/battery-operator.md` §1.3), asking battery only about the claims whose
//! record does not tell.

use std::collections::HashSet;

use battery_api_machinery::status::ApiError;

use super::record::{ClaimRecord, Leased, info, request_id};
use super::storage::ClaimStorage;
use crate::battery::objects;

/// Which claims a read asks battery about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ask {
    /// Only those whose record alone cannot tell (lists and exec, ADR 21 and 25).
    Unfollowed,
    /// Every one, as a get does: a lease another client of battery released shows as
    /// gone at once.
    Everyone,
}

impl ClaimStorage {
    /// The request ids of the leases battery still holds, for telling claims of `pools`
    /// (a claim's namespace and Pool) Bound or Expired. battery is asked only of their
    /// Pool when they share one (a get, an exec, a page of one Pool's claims costs what
    /// that Pool holds, not what battery holds), else of every lease; not at all when
    /// `pools` is empty.
    pub(super) async fn live_request_ids<'a>(
        &self,
        mut pools: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> Result<HashSet<String>, ApiError> {
        let Some(first) = pools.next() else {
            return Ok(HashSet::new());
        };
        let pool = pools.all(|pool| pool == first).then_some(first);
        self.battery
            .leased_request_ids(pool)
            .await
            .map_err(|e| e.into_api_error(info(), ""))
    }

    /// The uids of the claims in `leased` whose lease battery no longer holds: the one
    /// place a read decides that a Bound claim has expired (`reference/
    /// battery-operator.md` §1.3: a read that finds the lease gone). With
    /// [`Ask::Unfollowed`], a claim whose record alone tells (`lease_followed`) is taken
    /// as live without asking battery.
    pub(super) async fn released<'a>(
        &self,
        leased: impl IntoIterator<Item = Leased<'a>>,
        ask: Ask,
    ) -> Result<HashSet<String>, ApiError> {
        let asked: Vec<Leased<'a>> = leased
            .into_iter()
            .filter(|claim| ask == Ask::Everyone || !self.lease_followed(claim.expires))
            .collect();
        let live = self
            .live_request_ids(asked.iter().map(|claim| (claim.namespace, claim.pool)))
            .await?;
        Ok(asked
            .into_iter()
            .filter(|claim| !live.contains(&request_id(claim.uid)))
            .map(|claim| claim.uid.to_owned())
            .collect())
    }

    /// Claims as a read sees them: Expired once battery no longer holds their lease
    /// (`released`).
    pub(super) async fn as_read(
        &self,
        records: Vec<ClaimRecord>,
        ask: Ask,
    ) -> Result<Vec<ClaimRecord>, ApiError> {
        let released = self
            .released(records.iter().filter_map(ClaimRecord::leased), ask)
            .await?;
        Ok(records
            .into_iter()
            .map(|record| {
                let uid = record.metadata.uid.as_deref().unwrap_or_default();
                if released.contains(uid) {
                    expire(record)
                } else {
                    record
                }
            })
            .collect())
    }

    /// One claim as a read sees it ([`ClaimStorage::as_read`]).
    pub(super) async fn one_as_read(
        &self,
        record: ClaimRecord,
        ask: Ask,
    ) -> Result<ClaimRecord, ApiError> {
        let released = self.released(record.leased(), ask).await?;
        Ok(if released.is_empty() {
            record
        } else {
            expire(record)
        })
    }
}

/// The record of a claim whose lease is gone.
pub(super) fn expire(mut record: ClaimRecord) -> ClaimRecord {
    record.lease = None;
    objects::expire(&mut record.status, record.metadata.generation);
    record
}
