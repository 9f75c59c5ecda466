//! Recovery: the leases binds left without a claim (ADR 0022). A bind writes nothing
//! before `ClaimVM`; the claim's record, written after it, is what holds the lease. So a
//! lease claimed with a claim's request id that no record holds, and no bind in flight,
//! was left by a create that never answered `201` (a crash, a lost answer, a failed write
//! of its files), and is released.

use std::collections::HashSet;

use battery_api_machinery::status::ApiError;

use super::lease::release;
use super::record::{ClaimRecord, REQUEST_ID_PREFIX, RESOURCE, info, request_id};
use super::storage::ClaimStorage;

impl ClaimStorage {
    /// Releases every lease a bind left without its claim; answers how many. Run at start,
    /// and safe beside binds in flight.
    pub async fn recover(&self) -> Result<usize, ApiError> {
        let leases = self
            .battery
            .leases()
            .await
            .map_err(|e| e.into_api_error(info(), ""))?;
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
