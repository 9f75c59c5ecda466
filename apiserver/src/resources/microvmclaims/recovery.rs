//! Recovery: the binds a restart interrupted, and the leases binds left without a claim
//! (ADR 0022, ADR 48). A bind that writes nothing into its MicroVM records itself pending
//! while battery leases; with battery's lease for its request id, a restart records its
//! claim Bound, and without one drops it. Otherwise the claim's record, written after
//! `ClaimVM`, is what holds the lease. So a lease claimed with a claim's request id that
//! no record holds, and no bind in flight, was left by a create that never answered `201`
//! (a crash, a lost answer, a failed write of its files), and is released.

use std::collections::HashSet;

use battery_api_machinery::status::ApiError;

use super::bind::{Finish, Recorded};
use super::lease::release;
use super::record::{
    ClaimRecord, PENDING_RESOURCE, PendingBind, REQUEST_ID_PREFIX, RESOURCE, info, key, object,
    pending_key, request_id,
};
use super::storage::ClaimStorage;
use crate::battery::LeaseInfo;
use crate::trace::Trace;

impl ClaimStorage {
    /// Finishes or drops the binds a restart interrupted, then releases every lease a bind
    /// left without its claim; answers how many. Run at start, and safe beside binds in
    /// flight.
    pub async fn recover(&self) -> Result<usize, ApiError> {
        let leases = self
            .battery
            .leases()
            .await
            .map_err(|e| e.into_api_error(info(), ""))?;
        let (pending, _) = self.store.list::<PendingBind>(PENDING_RESOURCE, None)?;
        for bind in pending {
            let (namespace, _) = bind.claim.pool();
            let name = bind.claim.metadata.name.as_deref().unwrap_or_default();
            self.finish_interrupted(namespace, name, &leases).await?;
        }
        let candidates: Vec<_> = {
            let in_flight = self.binds_in_flight.lock();
            leases
                .into_iter()
                .filter(|l| l.request_id.starts_with(REQUEST_ID_PREFIX))
                .filter(|l| !in_flight.contains(&l.request_id))
                .collect()
        };
        // Read after the binds in flight: a bind leaves them only once its claim is
        // recorded (or its lease released), so every lease a bind holds is seen here.
        let (records, _) = self.store.list::<ClaimRecord>(RESOURCE, None)?;
        let held: HashSet<String> = records
            .iter()
            .filter(|r| r.lease.is_some())
            .filter_map(|r| r.metadata.uid.as_deref().map(request_id))
            .collect();
        let mut released = 0;
        for lease in candidates {
            if held.contains(&lease.request_id) {
                continue;
            }
            release(&self.battery, &lease.id, &lease.request_id).await?;
            released += 1;
            tracing::info!(request_id = %lease.request_id, "released a lease a bind left without its claim");
        }
        // What versions before ADR 0022 recorded before `ClaimVM`: their leases, if any,
        // were among those above.
        self.store.transact(|tx| tx.clear_intents()).await?;
        Ok(released)
    }

    /// Records the claim of the bind a restart interrupted, pending as `namespace/name`,
    /// Bound if battery holds its lease (`leases`), else drops its pending record: its
    /// create never answered.
    async fn finish_interrupted(
        &self,
        namespace: &str,
        name: &str,
        leases: &[LeaseInfo],
    ) -> Result<(), ApiError> {
        // A bind holds its claim's lock from before its pending record until after it
        // is replaced or dropped: the record read under the lock is no bind's in flight.
        let _guard = self.locks.lock(&key(namespace, name)).await;
        let Some(bind) = self
            .store
            .get::<PendingBind>(&pending_key(namespace, name))?
        else {
            return Ok(());
        };
        let pool = bind.claim.spec.pool_ref.name.clone();
        let request_id = request_id(bind.claim.metadata.uid.as_deref().unwrap_or_default());
        let Some(listed) = leases.iter().find(|l| l.request_id == request_id) else {
            self.drop_pending(namespace, name, None).await;
            return Ok(());
        };
        // battery answers a live lease's request id with that lease.
        let lease = match self.battery.claim_vm(namespace, &pool, &request_id).await {
            Ok(lease) => lease,
            Err(err) if !err.is_definitive() => return Err(err.into_api_error(info(), name)),
            Err(_) => {
                self.drop_pending(namespace, name, None).await;
                return Ok(());
            }
        };
        let lease_id = lease.id.clone();
        let finished = if lease_id == listed.id {
            let finish = Finish {
                secrets: bind.claim.lease_record(),
                limits: (
                    bind.claim.status.idle_timeout,
                    bind.claim.status.max_lifetime,
                ),
                files: Vec::new(),
                minted: None,
                recorded: Recorded::Recovered,
                trace: Trace::default(),
            };
            let lease = lease.asked_at(bind.asked.0, bind.threshold);
            let mut claim = object(bind.claim);
            self.finish_bind(&mut claim, lease, finish)
                .await
                .map_err(|failure| {
                    tracing::warn!(error = %failure.error(), claim = %name, namespace = %namespace, "recording Bound a claim whose bind a restart interrupted; releasing its lease");
                })
                .is_ok()
        } else {
            // The lease ended after the listing, and the replay leased anew.
            false
        };
        if finished {
            tracing::info!(claim = %name, namespace = %namespace, "recorded Bound a claim whose bind a restart interrupted");
        } else {
            release(&self.battery, &lease_id, name).await?;
            self.drop_pending(namespace, name, None).await;
        }
        Ok(())
    }

    /// Releases whatever battery leased for `request_id` after a `ClaimVM` whose answer was
    /// lost, by replaying it: battery answers the lease it made for that request id, or
    /// leases one then, which is released as well.
    pub(super) async fn release_abandoned(
        &self,
        namespace: &str,
        pool: &str,
        request_id: &str,
        name: &str,
    ) -> Result<(), ApiError> {
        match self.battery.claim_vm(namespace, pool, request_id).await {
            Ok(lease) => release(&self.battery, &lease.id, name).await,
            Err(err) if !err.is_definitive() => Err(err.into_api_error(info(), name)),
            // battery looked the request id up and leased nothing for it.
            Err(_) => Ok(()),
        }
    }
}
