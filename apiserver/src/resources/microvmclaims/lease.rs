//! `microvmclaims/<name>/lease`: the claim's battery lease as a `coordination.k8s.io/v1`
//! Lease. Reading it shows the Holder and times; any write renews it through battery's
//! `Heartbeat`, and only the Holder may write (DESIGN §4, the Holder rule).

use std::sync::Arc;
use std::time::Duration;

use battery_api_machinery::status::ApiError;
use battery_types::conditions::ClaimBoundReason;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

use super::access::check_holder;
use super::read::expire;
use super::record::{ClaimRecord, info, key, object};
use super::storage::ClaimStorage;
use crate::api::{RequestContext, Subresource};
use crate::battery::{BatteryClient, Failure, LeaseId};
use crate::watch::ChangeType;

/// Now, with the microseconds a `MicroTime` carries.
fn micro_now() -> MicroTime {
    let now = k8s_openapi::jiff::Timestamp::now();
    let micros = now.as_microsecond();
    MicroTime(k8s_openapi::jiff::Timestamp::from_microsecond(micros).unwrap_or(now))
}

/// The `lease` subresource of claims.
pub struct ClaimLeases(pub Arc<ClaimStorage>);

fn as_lease(record: &ClaimRecord) -> Lease {
    let namespace = record.metadata.namespace.clone().unwrap_or_default();
    Lease {
        metadata: ObjectMeta {
            name: record.metadata.name.clone(),
            namespace: Some(namespace.clone()),
            uid: record.metadata.uid.clone(),
            resource_version: record.metadata.resource_version.clone(),
            creation_timestamp: record.metadata.creation_timestamp.clone(),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(battery_types::service_account_username(
                &namespace,
                &record.spec.service_account_name,
            )),
            acquire_time: record.status.bound_time.as_ref().map(|t| MicroTime(t.0)),
            renew_time: record.status.renew_time.clone(),
            lease_duration_seconds: record.lease_duration_seconds,
            ..LeaseSpec::default()
        }),
    }
}

impl ClaimLeases {
    fn record(&self, ctx: &RequestContext, name: &str) -> Result<ClaimRecord, ApiError> {
        let namespace = ctx.namespace.as_deref().unwrap_or_default();
        self.0
            .store
            .get::<ClaimRecord>(&key(namespace, name))?
            .ok_or_else(|| ApiError::not_found(info(), name))
    }
}

/// A renewal of a lease battery no longer has (410 Gone): the claim is over.
fn lease_expired(namespace: &str, name: &str) -> ApiError {
    ApiError::gone(format!(
        "the lease of microvmclaim {namespace}/{name} has expired; delete the claim and create a new one"
    ))
}

/// A renewal of a claim that has ended (410 Gone), saying why when a limit on its life
/// ended it rather than its lease running out.
fn ended(record: &ClaimRecord) -> ApiError {
    let namespace = record.metadata.namespace.as_deref().unwrap_or_default();
    let name = record.metadata.name.as_deref().unwrap_or_default();
    let bound = battery_types::conditions::find_status_condition(
        &record.status.conditions,
        battery_types::conditions::BOUND,
    );
    match bound {
        Some(c) if c.reason != ClaimBoundReason::LeaseExpired.as_str() && c.status == "False" => {
            ApiError::gone(format!(
                "microvmclaim {namespace}/{name} has ended ({}): {}; delete the claim and create a new one",
                c.reason, c.message
            ))
        }
        _ => lease_expired(namespace, name),
    }
}

impl Subresource for ClaimLeases {
    type Object = Lease;

    async fn get(&self, ctx: &RequestContext, name: &str) -> Result<Lease, ApiError> {
        Ok(as_lease(&self.record(ctx, name)?))
    }

    /// Any write renews: the body's content is not ours to set (battery decides the
    /// expiry), so only its resourceVersion, if given, is checked.
    async fn update(
        &self,
        ctx: &RequestContext,
        name: &str,
        new: Lease,
        dry_run: bool,
        _field_manager: &str,
    ) -> Result<Lease, ApiError> {
        let namespace = ctx.namespace.as_deref().unwrap_or_default();
        let key = key(namespace, name);
        let _guard = self.0.locks.lock(&key).await;
        let record = self.record(ctx, name)?;
        check_holder(ctx, &record, "renew the lease of")?;
        if let Some(rv) = new
            .metadata
            .resource_version
            .as_deref()
            .filter(|rv| !rv.is_empty())
            && Some(rv) != record.metadata.resource_version.as_deref()
        {
            return Err(ApiError::optimistic_lock(info(), name));
        }
        let Some(lease) = record.lease.clone() else {
            return Err(ended(&record));
        };
        if dry_run {
            return Ok(as_lease(&record));
        }
        let expires_at = match self.0.battery.heartbeat(&lease).await {
            Ok(expires_at) => expires_at,
            Err(err) if err.failure() == Failure::NotFound => {
                // battery already expired it: say so on the claim too.
                let expired = expire(record);
                let secrets = expired.lease_record();
                let mut claim = object(expired);
                self.0
                    .commit(&mut claim, secrets, ChangeType::Modified)
                    .await?;
                return Err(lease_expired(namespace, name));
            }
            Err(err) => return Err(err.into_api_error(info(), name)),
        };
        let mut renewed = record;
        renewed.status.renew_time = Some(micro_now());
        renewed.status.lease_expires_at = Some(expires_at);
        let secrets = renewed.lease_record();
        let mut claim = object(renewed.clone());
        self.0
            .commit(&mut claim, secrets, ChangeType::Modified)
            .await?;
        // The new resourceVersion.
        renewed.metadata = claim.metadata;
        Ok(as_lease(&renewed))
    }
}

/// ReleaseVM answers UNAVAILABLE while the Host cannot delete the MicroVM yet.
const RELEASE_RETRIES: u32 = 5;

/// `ReleaseVM`, retrying while battery has not released for certain; NotFound means
/// battery already let it go (expiry, a forced pool deletion, an earlier release).
pub(super) async fn release(
    battery: &BatteryClient,
    lease: &LeaseId,
    name: &str,
) -> Result<(), ApiError> {
    let mut attempt = 0;
    loop {
        match battery.release_vm(lease).await {
            Ok(()) => return Ok(()),
            Err(err) if err.failure() == Failure::NotFound => return Ok(()),
            // Not released for certain (the Host cannot delete the MicroVM yet, or no
            // answer): the claim keeps its lease and asks again.
            Err(err) if !err.is_definitive() && attempt < RELEASE_RETRIES => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
            }
            Err(err) => return Err(err.into_api_error(info(), name)),
        }
    }
}
