//! The bind: `ClaimVM` with a `request_id` derived from the claim's uid, the claim's
//! files written, the Bound claim recorded: in one durable write after `ClaimVM` when the
//! bind writes into its MicroVM, else pending while battery leases and then without
//! waiting for the disk (ADR 48); a bind that cannot finish releases what battery leased.

use std::task::Poll;
use std::time::{Duration, Instant};

use battery_api_machinery::status::ApiError;
use battery_types::{HasResourceInfo as _, LeaseSettings, MicroVMClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::broadcast;

use super::config;
use super::identity::Minted;
use super::lease::release;
use super::record::{ClaimRecord, LeaseRecord, PendingBind, info, key, pending_key, request_id};
use super::storage::ClaimStorage;
use crate::battery::objects;
use crate::battery::{BatteryEvent, EventKind, Failure, LeaseId};
use crate::meta_store::{Durable, StoreError};
use crate::metrics::BindOutcome;
use crate::resources::hosts::HostDirectory;
use crate::resources::write_object;
use crate::trace::Trace;
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
    /// Why, as the API answers it.
    pub(super) fn error(&self) -> &ApiError {
        &self.error
    }

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
        trace: &Trace,
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
                    trace.step("ClaimVM aborted: its MicroVM was deleted");
                    aborted += 1;
                    tokio::time::sleep(Duration::from_millis(50 << aborted)).await;
                }
                Failure::Exhausted => {
                    trace.step("ClaimVM found no MicroVM available");
                    let available =
                        wait_for_available(&mut events, namespace, pool, deadline).await;
                    trace.step("waited for an available MicroVM");
                    if !available {
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
        trace: Trace,
    ) -> Result<MicroVMClaim, ApiError> {
        let started = Instant::now();
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let token = minted.is_some();
        let bound = self.bind_steps(claim, resolved, minted, trace).await;
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
        trace: Trace,
    ) -> Result<MicroVMClaim, BindFailure> {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let pool = claim.spec.pool_ref.name.clone();
        let key = key(&namespace, &name);
        let _guard = self.locks.lock(&key).await;
        trace.step("claim locked");
        if self.store.get::<ClaimRecord>(&key)?.is_some() {
            return Err(BindFailure::refused(ApiError::already_exists(
                info(),
                &name,
            )));
        }
        // Usually cached; a Pool battery lacks is ClaimVM's to refuse.
        let settings = self.pools.bind_settings(&namespace, &pool).await.ok();
        // Before anything is leased: a claim asking for more than its Pool allows leaves
        // nothing.
        let pool_limits = settings.as_ref().and_then(|s| s.claim_limits.as_ref());
        let (idle_timeout, max_lifetime) = claim
            .spec
            .limits_on(pool_limits)
            .map_err(|errors| BindFailure::refused(ApiError::invalid(info(), &name, &errors)))?;
        // Held until the claim is recorded Bound (or the bind fails), so quotas count it.
        let vm_size = settings.as_ref().map(|s| (s.vcpu, s.memory_in_mb));
        let usage = self.quotas.usage_of(vm_size);
        let _reservation = match usage {
            Some(usage) => self
                .quotas
                .reserve(&namespace, &name, &uid, usage)
                .await
                .map_err(BindFailure::refused)?,
            None => None,
        };
        trace.step("pool's limits and quota checked");
        let request_id = request_id(&uid);
        // Until the claim is recorded: `recover` leaves its lease alone meanwhile.
        let _in_flight = self.binds_in_flight.enter(&request_id);
        let lease_settings = settings.map(|s| s.lease);
        let threshold = lease_settings.as_ref().map(|s| s.expiry_threshold);
        let mut finish = Finish {
            secrets: LeaseRecord {
                lease: None,
                duration_seconds: lease_settings.as_ref().and_then(lease_seconds),
                usage,
                token: None,
            },
            limits: (idle_timeout, max_lifetime),
            files: resolved.files,
            minted,
            recorded: Recorded::Durably,
            trace,
        };
        // A bind that writes nothing into its MicroVM is recorded while battery leases,
        // and its claim answered before its record is durable (ADR 48).
        let pending = finish.files.is_empty() && finish.minted.is_none();
        let claiming = self.claim_vm(
            &namespace,
            &pool,
            &request_id,
            &name,
            threshold,
            &finish.trace,
        );
        let claimed = if pending {
            // ClaimVM goes on the wire first: the thread that writes the pending record
            // may take this CPU when woken, and then delays nothing battery does.
            let mut claiming = std::pin::pin!(claiming);
            let first = futures::poll!(claiming.as_mut());
            // The call's own tasks (the channel's buffer, the connection) send it now.
            tokio::task::yield_now().await;
            finish.trace.step("ClaimVM sent");
            let pending = self.record_pending(&claim, &finish, threshold);
            finish.trace.step("pending record handed to the store");
            finish.recorded = Recorded::Pending(pending);
            crate::failpoint::crash_point("bind:pending");
            match first {
                Poll::Ready(claimed) => claimed,
                Poll::Pending => claiming.await,
            }
        } else {
            claiming.await
        };
        finish.trace.step("ClaimVM answered");
        let lease = match claimed {
            Ok(lease) => lease,
            Err(failure) => {
                if failure.outcome == BindOutcome::Ambiguous {
                    // battery may have leased: the create fails, so whatever it leased is
                    // released, now if battery answers, else at the next start.
                    let this = self.clone();
                    let (namespace, pool, name) = (namespace.clone(), pool, name.clone());
                    tokio::spawn(async move {
                        if let Err(err) = this
                            .release_abandoned(&namespace, &pool, &request_id, &name)
                            .await
                        {
                            tracing::warn!(error = %err, "releasing an abandoned bind; the next start releases it");
                        }
                    });
                }
                // battery said no otherwise: nothing was leased, so nothing is left behind.
                if let Recorded::Pending(written) = finish.recorded {
                    self.drop_pending(&namespace, &name, Some(written)).await;
                }
                return Err(failure);
            }
        };
        crate::failpoint::crash_point("bind:claimed");
        let lease_id = lease.id.clone();
        let token = finish.minted.is_some();
        if let Err(failure) = self.finish_bind(&mut claim, lease, finish).await {
            // Released before the create answers. If battery does not release for
            // certain, the next start releases every lease no claim holds (`recover`),
            // or the lease expires, whichever comes first.
            if let Err(err) = release(&self.battery, &lease_id, &name).await {
                tracing::warn!(error = %err, claim = %name, "releasing an unfinished bind; the next start releases it");
            }
            if pending {
                self.drop_pending(&namespace, &name, None).await;
            }
            return Err(failure);
        }
        self.config.remember(&uid, resolved.env, token);
        Ok(claim)
    }

    /// Records `claim`'s bind pending (ADR 48), on a thread of its own, so that the record
    /// is written and made durable while battery leases.
    fn record_pending(
        &self,
        claim: &MicroVMClaim,
        finish: &Finish,
        threshold: Option<battery_types::Duration>,
    ) -> Durable {
        let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        let mut record = ClaimRecord::of(claim, finish.secrets.clone());
        (record.status.idle_timeout, record.status.max_lifetime) = finish.limits;
        let pending = PendingBind {
            claim: record,
            threshold,
            asked: MicroTime(Timestamp::now()),
        };
        let key = pending_key(namespace, name);
        self.store.transact_beside(move |tx| tx.put(&key, &pending))
    }

    /// Deletes the pending record of a bind that did not bind, durably, after its write
    /// (`written`, when it may still be under way): a restart that found it would look
    /// for its lease.
    pub(super) async fn drop_pending(&self, namespace: &str, name: &str, written: Option<Durable>) {
        if let Some(written) = written {
            // A write that failed left nothing to delete; the delete below says so again.
            let _ = written.wait().await;
        }
        let key = pending_key(namespace, name);
        if let Err(err) = self.store.transact(|tx| tx.delete(&key)).await {
            tracing::warn!(error = %err, claim = %name, "dropping the record of a bind that failed; the next start drops it");
        }
    }

    /// The steps of a bind after battery leased: the bound status, the claim's files,
    /// the record that holds the lease. A pending bind's record is written ahead, in place
    /// of its pending record, once that is durable.
    pub(super) async fn finish_bind(
        &self,
        claim: &mut MicroVMClaim,
        lease: crate::battery::Lease,
        finish: Finish,
    ) -> Result<(), BindFailure> {
        let Finish {
            mut secrets,
            limits: (idle_timeout, max_lifetime),
            files,
            minted,
            recorded,
            trace,
        } = finish;
        // The pending record is on disk before the bind can fail: one that fails drops a
        // record that is there.
        let pending = match recorded {
            Recorded::Durably => false,
            Recorded::Pending(written) => {
                written.wait().await?;
                trace.step("pending record durable");
                true
            }
            Recorded::Recovered => true,
        };
        secrets.lease = Some(bind_status(claim, &self.hosts, lease)?);
        if let Some(status) = &mut claim.status {
            status.idle_timeout = idle_timeout;
            status.max_lifetime = max_lifetime;
        }
        if !files.is_empty() {
            self.config
                .write_files(claim, files)
                .await
                .map_err(BindFailure::refused)?;
            trace.step("files written");
        }
        if let Some(minted) = &minted {
            self.write_identity(claim, minted)
                .await
                .map_err(BindFailure::refused)?;
            secrets.token = Some(minted.settings.clone());
            trace.step("identity written");
        }
        let lease = secrets.lease.clone();
        if pending {
            // Durable in the background; watchers hear of it then.
            let _durable = self.commit_ahead(claim, secrets).await?;
        } else {
            self.commit(claim, secrets, ChangeType::Added).await?;
        }
        trace.step("claim recorded");
        self.follow_limits(&ClaimRecord::of(
            claim,
            LeaseRecord {
                lease,
                ..LeaseRecord::default()
            },
        ));
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

    /// Records a pending bind's claim Bound, in place of its pending record, without
    /// waiting for the disk: a restart rebuilds it from the pending record and battery's
    /// lease (ADR 48).
    async fn commit_ahead(
        &self,
        claim: &mut MicroVMClaim,
        secrets: LeaseRecord,
    ) -> Result<Durable, ApiError> {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let pending = pending_key(&namespace, &name);
        let ((), durable) = self
            .store
            .transact_ahead(write_object(
                &key(&namespace, &name),
                claim,
                ChangeType::Added,
                |claim| ClaimRecord::of(claim, secrets),
                |tx| tx.delete(&pending),
            ))
            .await?;
        Ok(durable)
    }
}

/// What a bind records and writes once battery leased.
pub(super) struct Finish {
    pub(super) secrets: LeaseRecord,
    /// The claim's idle timeout and maximum lifetime.
    pub(super) limits: (
        Option<battery_types::Duration>,
        Option<battery_types::Duration>,
    ),
    pub(super) files: Vec<config::FileContent>,
    pub(super) minted: Option<Minted>,
    pub(super) recorded: Recorded,
    /// The create's, when a request binds.
    pub(super) trace: Trace,
}

/// How a bind's claim is recorded.
pub(super) enum Recorded {
    /// Once, durably, before the create answers.
    Durably,
    /// Pending while battery leased (ADR 48): the pending record's commit, durable before
    /// the create answers; the claim's record replaces it without waiting for the disk.
    Pending(Durable),
    /// Pending by a bind a restart interrupted: the claim's record replaces it, made
    /// durable by the writes after it (recovery's last is durable).
    Recovered,
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
    let (agent_address, readiness) = hosts.agent_and_readiness(&lease.host_name)?;
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
