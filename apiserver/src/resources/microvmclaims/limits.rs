//! The limits on a claim's life: its idle timeout (no exec, terminal, port-forward or
//! file copy for that long) and its maximum lifetime (that long after its bind, however
//! often renewed). Both are fixed at bind (`status.idleTimeout`, `status.maxLifetime`);
//! the enforcer checks the Bound claims under one every [`CHECK_INTERVAL`] and ends those
//! past it as an unrenewed lease ends: the lease released, the MicroVM back to battery,
//! the claim `Expired` with the limit as the `Bound` condition's reason, and an Event.
//!
//! The limits survive a restart: the lifetime runs from `status.boundTime`, and the idle
//! clock from the activity the enforcer writes beside the record each check
//! (`activity.rs`). A claim in use when the server stopped counts as used at the restart,
//! so a restart never ends a claim early; a crash loses at most one check's activity.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use battery_api_machinery::status::ApiError;
use battery_types::MicroVMClaimStatus;
use battery_types::conditions::ClaimBoundReason;
use k8s_openapi::jiff::Timestamp;

use super::activity::{ActivityRecord, key as activity_key};
use super::lease::release;
use super::limited::Limited;
use super::record::{ClaimRecord, RESOURCE, key, object};
use super::storage::ClaimStorage;
use crate::battery::objects;
use crate::cluster::Cluster;
use crate::watch::ChangeType;

/// How often the limits are checked: a claim ends at most this long after its limit.
const CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// Pause before loading the limits again after the store failed.
const LOAD_RETRY: Duration = Duration::from_secs(1);

/// Where a claim's idle clock starts after a start at `started`: from the activity last
/// recorded (never before its bind), or from `started` if a session held it in use when
/// that was written (the stop ended the session; its length is unknown, so the claim
/// counts as used until the stop, which is never earlier than the truth).
fn idle_since(
    recorded: Option<&ActivityRecord>,
    bound: Timestamp,
    started: Timestamp,
) -> Timestamp {
    match recorded {
        Some(activity) if activity.busy => started,
        Some(activity) => activity.last.0.max(bound),
        None => bound,
    }
}

/// What the `Bound` condition says of a claim a limit ended.
fn ended_message(reason: ClaimBoundReason, status: &MicroVMClaimStatus) -> String {
    let shown = |d: Option<battery_types::Duration>| d.map(|d| d.to_string()).unwrap_or_default();
    if reason == ClaimBoundReason::MaxLifetimeReached {
        format!(
            "the claim reached its maximum lifetime ({}) and its MicroVM went back to battery",
            shown(status.max_lifetime)
        )
    } else {
        format!(
            "the claim had no exec, terminal, port-forward or file copy for its idle timeout \
             ({}) and its MicroVM went back to battery",
            shown(status.idle_timeout)
        )
    }
}

impl ClaimStorage {
    /// Follows the limits of a claim just bound; its idle clock starts at its bind.
    pub(super) fn follow_limits(&self, record: &ClaimRecord) {
        let Some((uid, limited)) = Limited::of(record) else {
            return;
        };
        self.activity.start(&uid, limited.bound);
        self.limited.claims().insert(uid, limited);
    }

    /// How long until the claim `uid` reaches a limit, for the Table's column.
    pub(super) fn time_left(&self, uid: &str) -> Option<Duration> {
        let limited = self.limited.get(uid)?;
        limited.time_left(self.activity.use_of(uid), Timestamp::now())
    }

    /// Ends the Bound claims that reach a limit, until the task is dropped; records an
    /// Event on each in `cluster`, when there is one.
    pub async fn enforce_limits(self: Arc<Self>, cluster: Option<Arc<Cluster>>) {
        while let Err(err) = self.load_limits() {
            tracing::warn!(error = %err, "reading claims' limits; retrying");
            tokio::time::sleep(LOAD_RETRY).await;
        }
        let mut ticks = tokio::time::interval(CHECK_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            self.check_limits(cluster.as_deref()).await;
        }
    }

    /// Follows the limits of every Bound claim recorded, as of a start: the idle clock
    /// runs from the activity recorded, or from now for a claim in use when the last
    /// process stopped.
    fn load_limits(&self) -> Result<(), ApiError> {
        let started = Timestamp::now();
        let (records, _) = self.store.list::<ClaimRecord>(RESOURCE, None)?;
        for record in records {
            let Some((uid, limited)) = Limited::of(&record) else {
                continue;
            };
            let recorded = self
                .store
                .get::<ActivityRecord>(&activity_key(&limited.namespace, &limited.name))?;
            self.activity
                .start(&uid, idle_since(recorded.as_ref(), limited.bound, started));
            self.limited.claims().entry(uid).or_insert(limited);
        }
        Ok(())
    }

    /// One check: writes the activity not yet written, then ends the claims past a limit.
    async fn check_limits(&self, cluster: Option<&Cluster>) {
        let now = Timestamp::now();
        let due: Vec<_> = self
            .limited
            .claims()
            .iter()
            .filter_map(|(uid, limited)| {
                let reason = limited.reached(self.activity.use_of(uid), now)?;
                Some((uid.clone(), reason))
            })
            .collect();
        self.save_activity().await;
        for (uid, reason) in due {
            if let Err(err) = self.end_for_limit(&uid, reason, cluster).await {
                tracing::warn!(error = %err, claim = %uid, %reason, "ending a claim at its limit; retrying");
            }
        }
    }

    /// Writes the activity of the claims under an idle timeout not yet written, in one
    /// commit. Also run as the server stops, once its sessions have ended, so a clean
    /// restart loses none.
    pub async fn save_activity(&self) {
        let claims: Vec<(String, crate::meta_store::Key)> = self
            .limited
            .claims()
            .iter()
            .filter(|(_, l)| l.idle_timeout.is_some())
            .map(|(uid, l)| (uid.clone(), activity_key(&l.namespace, &l.name)))
            .collect();
        let unsaved = self
            .activity
            .unsaved(claims.iter().map(|(uid, _)| uid.as_str()));
        if unsaved.is_empty() {
            return;
        }
        let keys: HashMap<&str, &crate::meta_store::Key> = claims
            .iter()
            .map(|(uid, key)| (uid.as_str(), key))
            .collect();
        let written = self
            .store
            .transact(|tx| {
                for (uid, record) in &unsaved {
                    tx.put(keys[uid.as_str()], record)?;
                }
                Ok::<_, crate::meta_store::StoreError>(())
            })
            .await;
        if let Err(err) = written {
            tracing::warn!(error = %err, "recording claims' activity; retrying");
            for (uid, _) in &unsaved {
                self.activity.unsave(uid);
            }
        }
    }

    /// Ends the claim `uid` for `reason`, if it still holds its lease and still has
    /// reached the limit under its lock: records it Expired, releases the lease (battery
    /// deletes the MicroVM), and tells the cluster with an Event.
    async fn end_for_limit(
        &self,
        uid: &str,
        reason: ClaimBoundReason,
        cluster: Option<&Cluster>,
    ) -> Result<(), ApiError> {
        let Some(limited) = self.limited.get(uid) else {
            return Ok(());
        };
        let key = key(&limited.namespace, &limited.name);
        let _guard = self.locks.lock(&key).await;
        let record = self
            .store
            .get::<ClaimRecord>(&key)?
            .filter(|r| r.metadata.uid.as_deref() == Some(uid));
        let (Some(record), Some(lease)) = (
            record.clone(),
            record.as_ref().and_then(|r| r.lease.clone()),
        ) else {
            // Released, expired or made again meanwhile: nothing of this claim to end.
            self.limited.forget(uid);
            return Ok(());
        };
        // A session may have opened since the check.
        if limited.reached(self.activity.use_of(uid), Timestamp::now()) != Some(reason) {
            return Ok(());
        }
        // Recorded ended before the release: a read in between, finding the lease gone,
        // would otherwise say the lease expired. Recording it leaseless ends its sessions.
        let mut ended = record;
        ended.lease = None;
        let message = ended_message(reason, &ended.status);
        objects::end(
            &mut ended.status,
            ended.metadata.generation,
            reason,
            message.clone(),
        );
        let secrets = ended.lease_record();
        let mut claim = object(ended);
        self.commit(&mut claim, secrets, ChangeType::Modified)
            .await?;
        if let Err(err) = release(&self.battery, &lease, &limited.name).await {
            // Nothing renews it any more: battery expires it within the Pool's
            // expiryThreshold, and the next start releases every lease no claim holds.
            tracing::warn!(error = %err, claim = %limited.name, "releasing the lease of a claim that reached its limit");
        }
        tracing::info!(claim = %limited.name, namespace = %limited.namespace, %reason, "a claim reached its limit and ended");
        if let Some(cluster) = cluster
            && let Err(err) = cluster
                .claim_event(&claim.metadata, "Normal", reason.as_str(), message)
                .await
        {
            tracing::warn!(error = %err, %reason, "recording a MicroVMClaim Event");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;

    #[test]
    fn after_a_restart_the_idle_clock_never_starts_before_the_truth() {
        let bound = Timestamp::now() - Duration::from_secs(600);
        let used = bound + Duration::from_secs(300);
        let started = Timestamp::now();
        let record = |busy| ActivityRecord {
            last: MicroTime(used),
            busy,
        };
        assert_eq!(
            idle_since(None, bound, started),
            bound,
            "never used: from the bind"
        );
        assert_eq!(idle_since(Some(&record(false)), bound, started), used);
        assert_eq!(
            idle_since(Some(&record(true)), bound, started),
            started,
            "in use when the last process stopped: used until the restart"
        );
    }
}
