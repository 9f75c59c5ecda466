//! The bind: `ClaimVM` with a `request_id` derived from the claim's uid, the claim's
//! files written, the Bound claim recorded in one durable write; a bind that cannot finish
//! releases what battery leased.

use std::time::{Duration, Instant};

use battery_api_machinery::status::ApiError;
use battery_types::{HasResourceInfo as _, LeaseSettings, MicroVMClaim};
use k8s_openapi::jiff::Timestamp;
use tokio::sync::broadcast;

use super::config;
use super::identity::Minted;
use super::lease::release;
use super::record::{ClaimRecord, LeaseRecord, info, key, request_id};
use super::storage::ClaimStorage;
use crate::battery::objects;
use crate::battery::{BatteryEvent, EventKind, Failure, LeaseId};
use crate::meta_store::StoreError;
use crate::metrics::BindOutcome;
use crate::resources::hosts::HostDirectory;
use crate::watch::ChangeType;

/// ABORTED from ClaimVM means the MicroVM was deleted under the claim: battery says
/// retry. We retry this often, with growing pauses, before answering 409.
const ABORTED_RETRIES: u32 = 4;

/// Why a bind did not bind, and how that counts.
pub(super) struct BindFailure {
    error: ApiError,
    /// `Ambiguous` when battery may have leased anyway (the answer was lost).
    outcome: BindOutcome,
}

impl BindFailure {
    /// Refused for good: nothing was leased.
    pub(super) fn refused(error: ApiError) -> Self {
        Self {
            error,
            outcome: BindOutcome::Refused,
        }
    }
}

/// The API server itself failed (its metadata store).
impl From<ApiError> for BindFailure {
    fn from(error: ApiError) -> Self {
        Self {
            error,
            outcome: BindOutcome::Failed,
        }
    }
}

impl From<StoreError> for BindFailure {
    fn from(error: StoreError) -> Self {
        ApiError::from(error).into()
    }
}

impl ClaimStorage {
    /// Calls `ClaimVM`, retrying ABORTED and waiting (bounded) for a MicroVM when the pool
    /// has none available. The lease's expiry is reckoned from the pool's `threshold`:
    /// reading it back from battery would cost a listing of the pool's leases per bind.
    pub(super) async fn claim_vm(
        &self,
        namespace: &str,
        pool: &str,
        request_id: &str,
        name: &str,
        threshold: Option<battery_types::Duration>,
    ) -> Result<crate::battery::Lease, BindFailure> {
        let deadline = tokio::time::Instant::now() + self.bind_wait;
        let mut aborted = 0;
        loop {
            // Subscribe before asking, so a VM_AVAILABLE between the answer and the wait
            // is not missed.
            let mut events = self.events.subscribe();
            let asked = Timestamp::now();
            let err = match self.battery.claim_vm(namespace, pool, request_id).await {
                Ok(lease) => return Ok(lease.asked_at(asked, threshold)),
                Err(err) => err,
            };
            match err.failure() {
                Failure::Aborted if aborted < ABORTED_RETRIES => {
                    aborted += 1;
                    tokio::time::sleep(Duration::from_millis(50 << aborted)).await;
                }
                Failure::Exhausted => {
                    if !wait_for_available(&mut events, namespace, pool, deadline).await {
                        return Err(BindFailure {
                            error: ApiError::too_many_requests(
                                format!(
                                    "pool {namespace}/{pool} has no MicroVM available; retry later"
                                ),
                                crate::battery::RETRY_AFTER_SECONDS,
                            ),
                            outcome: BindOutcome::Exhausted,
                        });
                    }
                }
                Failure::NotFound => {
                    return Err(BindFailure::refused(ApiError::not_found(
                        &battery_types::Pool::INFO,
                        pool,
                    )));
                }
                _ => {
                    return Err(BindFailure {
                        outcome: if err.is_definitive() {
                            BindOutcome::Refused
                        } else {
                            BindOutcome::Ambiguous
                        },
                        error: err.into_api_error(info(), name),
                    });
                }
            }
        }
    }

    /// The bind of `create`, timed and counted by its outcome.
    pub(super) async fn bind(
        &self,
        claim: MicroVMClaim,
        resolved: config::Resolved,
        minted: Option<Minted>,
    ) -> Result<MicroVMClaim, ApiError> {
        let started = Instant::now();
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let token = minted.is_some();
        let bound = self.bind_steps(claim, resolved, minted).await;
        if bound.is_err() && token {
            // No claim holds the token minted for it: it stops authenticating now.
            self.config.end_token(namespace, uid);
        }
        let outcome = bound
            .as_ref()
            .map_or_else(|f| f.outcome, |_| BindOutcome::Bound);
        self.metrics.record_bind(outcome, started.elapsed());
        bound.map_err(|f| f.error)
    }

    /// Calls `ClaimVM`, writes the claim's files, records the bound claim; a bind that
    /// cannot finish releases what battery leased.
    pub(super) async fn bind_steps(
        &self,
        mut claim: MicroVMClaim,
        resolved: config::Resolved,
        minted: Option<Minted>,
    ) -> Result<MicroVMClaim, BindFailure> {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let pool = claim.spec.pool_ref.name.clone();
        let key = key(&namespace, &name);
        let _guard = self.locks.lock(&key).await;
        if self.store.get::<ClaimRecord>(&key)?.is_some() {
            return Err(BindFailure::refused(ApiError::already_exists(
                info(),
                &name,
            )));
        }
        if self.pools.is_deleting(&namespace, &pool)? {
            return Err(BindFailure::refused(
                ApiError::conflict(
                    info(),
                    &name,
                    format!("pool {namespace}/{pool} is being deleted"),
                )
                .with_specific_reason("PoolDeleting"),
            ));
        }
        // Before anything is leased: a claim asking for more than its Pool allows leaves
        // nothing. A Pool battery lacks is ClaimVM's to refuse.
        let pool_limits = self
            .pools
            .claim_limits(&namespace, &pool)
            .await
            .ok()
            .flatten();
        let (idle_timeout, max_lifetime) = claim
            .spec
            .limits_on(pool_limits.as_ref())
            .map_err(|errors| BindFailure::refused(ApiError::invalid(info(), &name, &errors)))?;
        // Held until the claim is recorded Bound (or the bind fails), so quotas count it.
        let usage = self.quotas.usage_of(&self.pools, &namespace, &pool).await;
        let _reservation = match usage {
            Some(usage) => self
                .quotas
                .reserve(&namespace, &name, &uid, usage)
                .await
                .map_err(BindFailure::refused)?,
            None => None,
        };
        let request_id = request_id(&uid);
        // Until the claim is recorded: `recover` leaves its lease alone meanwhile.
        let _in_flight = self.binds_in_flight.enter(&request_id);
        // Usually cached; a Pool battery lacks is ClaimVM's to refuse.
        let settings = self.pools.lease_settings(&namespace, &pool).await.ok();
        let threshold = settings.as_ref().map(|s| s.expiry_threshold);
        let lease = match self
            .claim_vm(&namespace, &pool, &request_id, &name, threshold)
            .await
        {
            Ok(lease) => lease,
            Err(failure) if failure.outcome == BindOutcome::Ambiguous => {
                // battery may have leased: the create fails, so whatever it leased is
                // released, now if battery answers, else at the next start.
                let this = self.clone();
                tokio::spawn(async move {
                    if let Err(err) = this
                        .release_abandoned(&namespace, &pool, &request_id, &name)
                        .await
                    {
                        tracing::warn!(error = %err, "releasing an abandoned bind; the next start releases it");
                    }
                });
                return Err(failure);
            }
            // battery said no: nothing was leased, so nothing is left behind.
            Err(failure) => return Err(failure),
        };
        crate::failpoint::crash_point("bind:claimed");
        let lease_id = lease.id.clone();
        let secrets = LeaseRecord {
            lease: None,
            duration_seconds: settings.as_ref().and_then(lease_seconds),
            usage,
            token: None,
        };
        let limits = (idle_timeout, max_lifetime);
        let token = minted.is_some();
        if let Err(failure) = self
            .finish_bind(&mut claim, lease, secrets, limits, resolved.files, minted)
            .await
        {
            // Released before the create answers. If battery does not release for
            // certain, the next start releases every lease no claim holds (`recover`),
            // or the lease expires, whichever comes first.
            if let Err(err) = release(&self.battery, &lease_id, &name).await {
                tracing::warn!(error = %err, claim = %name, "releasing an unfinished bind; the next start releases it");
            }
            return Err(failure);
        }
        self.config.remember(&uid, resolved.env, token);
        Ok(claim)
    }

    /// The steps of a bind after battery leased: the bound status, the claim's files,
    /// the record that holds the lease.
    pub(super) async fn finish_bind(
        &self,
        claim: &mut MicroVMClaim,
        lease: crate::battery::Lease,
        mut secrets: LeaseRecord,
        (idle_timeout, max_lifetime): (
            Option<battery_types::Duration>,
            Option<battery_types::Duration>,
        ),
        files: Vec<config::FileContent>,
        minted: Option<Minted>,
    ) -> Result<(), BindFailure> {
        secrets.lease = Some(bind_status(claim, self.pools.hosts(), lease)?);
        if let Some(status) = &mut claim.status {
            status.idle_timeout = idle_timeout;
            status.max_lifetime = max_lifetime;
        }
        self.config
            .write_files(claim, files)
            .await
            .map_err(BindFailure::refused)?;
        if let Some(minted) = &minted {
            self.write_identity(claim, minted)
                .await
                .map_err(BindFailure::refused)?;
            secrets.token = Some(minted.settings.clone());
        }
        let lease = secrets.lease.clone();
        self.commit(claim, secrets, ChangeType::Added).await?;
        self.follow_limits(&ClaimRecord {
            metadata: claim.metadata.clone(),
            spec: claim.spec.clone(),
            status: claim.status.clone().unwrap_or_default(),
            lease,
            ..ClaimRecord::default()
        });
        if let Some(minted) = &minted {
            self.rotate_token(
                claim,
                minted.settings.clone(),
                Some(minted),
                Timestamp::now(),
            );
        }
        Ok(())
    }
}

/// A lease's lifetime in whole seconds, as `coordination.k8s.io` Leases give it.
fn lease_seconds(settings: &LeaseSettings) -> Option<i32> {
    i32::try_from(settings.expiry_threshold.as_nanos() / 1_000_000_000).ok()
}

/// Fills a claim's status from battery's answer and what `hosts` says of its Host's exec
/// agent (its address and readiness), returning the lease id to keep.
fn bind_status(
    claim: &mut MicroVMClaim,
    hosts: &HostDirectory,
    lease: crate::battery::Lease,
) -> Result<LeaseId, ApiError> {
    let agent_address = hosts.agent_address(&lease.host_name)?;
    let readiness = hosts.readiness(&lease.host_name)?;
    let (status, id) =
        objects::bound_status(lease, agent_address, &readiness, claim.metadata.generation);
    claim.status = Some(status);
    Ok(id)
}

async fn wait_for_available(
    events: &mut broadcast::Receiver<BatteryEvent>,
    namespace: &str,
    pool: &str,
    deadline: tokio::time::Instant,
) -> bool {
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Err(_) => return false,
            Ok(Ok(e))
                if e.kind == EventKind::VmAvailable
                    && e.namespace == namespace
                    && e.pool == pool =>
            {
                return true;
            }
            Ok(Ok(_)) => {}
            // Missed events: one of them may have been ours, so try again.
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => return true,
            Ok(Err(broadcast::error::RecvError::Closed)) => return false,
        }
    }
}
