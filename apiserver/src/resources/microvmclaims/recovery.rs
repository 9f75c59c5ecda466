//! Recovery at start: the binds a crash or a lost answer left as intents (ADR 0005).

use battery_api_machinery::status::ApiError;

use super::{BindIntent, ClaimStorage, LeaseRecord, bind_status, info, lease_seconds, release};
use crate::watch::ChangeType;

impl ClaimStorage {
    /// Settles every bind a crash or a lost answer interrupted, by replaying `ClaimVM`
    /// with the recorded request id (battery answers a live lease with that same lease):
    /// a bind whose create never answered is finished and its claim recorded; one whose
    /// create answered an error has its lease released. Where battery made no lease, the
    /// intent is simply forgotten.
    pub async fn recover(&self) -> Result<usize, ApiError> {
        let intents = self.store.intents::<BindIntent>()?;
        let count = intents.len();
        for (uid, intent) in intents {
            self.settle(&uid, intent).await?;
        }
        Ok(count)
    }

    pub(super) async fn settle(&self, uid: &str, intent: BindIntent) -> Result<(), ApiError> {
        let mut claim = intent.claim;
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let pool = claim.spec.pool_ref.name.clone();
        let mut lease = match self
            .battery
            .claim_vm(&namespace, &pool, &intent.request_id)
            .await
        {
            Ok(lease) => lease,
            Err(err) if !err.is_definitive() => {
                // battery may hold a lease for this request id: keep the intent, so the
                // next attempt replays it.
                return Err(err.into_api_error(info(), &name));
            }
            Err(_) => {
                // battery looked the request id up and leased nothing for it (no pool, no
                // MicroVM, a lease already being released, a failed hook).
                self.store.transact(|tx| tx.delete_intent(uid))?;
                return Ok(());
            }
        };
        // A bind with files cannot be finished: their contents were never kept, and its
        // create never answered, so it is undone.
        if intent.abandoned || !claim.spec.files.is_empty() {
            release(&self.battery, &lease.id, &name).await?;
            self.store.transact(|tx| tx.delete_intent(uid))?;
            tracing::info!(claim = %name, %namespace, "released the lease of a bind whose create failed");
            return Ok(());
        }
        // A replayed ClaimVM answers a lease granted earlier: its times are battery's.
        (lease.claimed_at, lease.expires_at) = self
            .battery
            .lease_times(&namespace, &pool, &intent.request_id)
            .await
            .map_err(|e| e.into_api_error(info(), &name))?;
        let settings = self.pools.lease_settings(&namespace, &pool).await.ok();
        let secrets = LeaseRecord {
            lease: Some(bind_status(&mut claim, self.pools.hosts(), lease)?),
            duration_seconds: settings.as_ref().and_then(lease_seconds),
            usage: self.quotas.usage_of(&self.pools, &namespace, &pool).await,
        };
        self.commit(&mut claim, secrets, ChangeType::Added, Some(uid))?;
        tracing::info!(claim = %name, %namespace, "finished a bind interrupted by a restart");
        Ok(())
    }
}
