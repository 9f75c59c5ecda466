//! The one question exec and port-forward ask of the claims before a session opens: may
//! this user act on this claim (only its Holder may, as for renewing its lease), and
//! where is its MicroVM.

use battery_api_machinery::status::ApiError;
use battery_types::MicroVMClaimStatus;
use battery_types::conditions::{self, ClaimHostReadyReason, ConditionStatus};
use futures::future::BoxFuture;

use super::exec::{ClaimSessions, Target};
use super::read::Ask;
use super::record::{ClaimRecord, info, key, object};
use super::storage::ClaimStorage;
use crate::api::RequestContext;
use crate::relay::ClaimRef;

impl ClaimSessions for ClaimStorage {
    fn target<'a>(
        &'a self,
        ctx: &'a RequestContext,
        name: &'a str,
        act: &'a str,
    ) -> BoxFuture<'a, Result<Target, ApiError>> {
        Box::pin(self.session_target(ctx, name, act))
    }

    fn expired_or<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        error: ApiError,
    ) -> BoxFuture<'a, ApiError> {
        Box::pin(self.session_refused(namespace, name, error))
    }
}

/// Only the claim's Holder may renew its lease (or exec into its MicroVM): being allowed
/// to write `microvmclaims/lease` is not enough.
pub(super) fn check_holder(
    ctx: &RequestContext,
    record: &ClaimRecord,
    action: &str,
) -> Result<(), ApiError> {
    let namespace = record.metadata.namespace.as_deref().unwrap_or_default();
    let holder =
        battery_types::service_account_username(namespace, &record.spec.service_account_name);
    if ctx.user.name == holder {
        return Ok(());
    }
    let name = record.metadata.name.as_deref().unwrap_or_default();
    Err(ApiError::forbidden_object(
        info(),
        name,
        format_args!(
            "User \"{}\" cannot {action} this claim: only its Holder {holder} may",
            ctx.user.name
        ),
    ))
}

/// Why the claim's Host cannot run an exec, when its agent said so (`HostReady` False).
/// Without a report yet the agent is asked anyway: its answer says what is wrong.
fn host_not_ready(status: &MicroVMClaimStatus) -> Option<String> {
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::HOST_READY)?;
    let unreported = condition.reason == ClaimHostReadyReason::NoHostReport.as_str();
    (condition.status == ConditionStatus::False.as_str() && !unreported)
        .then(|| format!("{}: {}", condition.reason, condition.message))
}

/// A claim with no lease has no MicroVM.
fn no_microvm(name: &str) -> ApiError {
    ApiError::conflict(
        info(),
        name,
        "the claim has expired or was never bound, so it has no MicroVM to exec into",
    )
}

impl ClaimStorage {
    /// What to answer when the agent could not open a session for a claim whose lease was
    /// taken as live from its record: the claim's expiry if battery no longer has the
    /// lease (its MicroVM is gone), else the agent's own `error`.
    async fn session_refused(&self, namespace: &str, name: &str, error: ApiError) -> ApiError {
        let record = match self.store.get::<ClaimRecord>(&key(namespace, name)) {
            Ok(Some(record)) => record,
            Ok(None) => return ApiError::not_found(info(), name),
            Err(_) => return error,
        };
        match self.one_as_read(record, Ask::Everyone).await {
            Ok(record) if record.lease.is_none() => no_microvm(name),
            _ => error,
        }
    }

    /// The claim's MicroVM and its Host's agent, if `ctx` may `act` on it ("exec into").
    async fn session_target(
        &self,
        ctx: &RequestContext,
        name: &str,
        act: &str,
    ) -> Result<Target, ApiError> {
        let namespace = ctx.namespace.as_deref().unwrap_or_default();
        let record = self
            .store
            .get::<ClaimRecord>(&key(namespace, name))?
            .ok_or_else(|| ApiError::not_found(info(), name))?;
        check_holder(ctx, &record, act)?;
        let followed = record
            .leased()
            .is_some_and(|leased| self.lease_followed(leased.expires));
        // Else as a get sees it: Expired as soon as battery no longer has the lease, even
        // before the follower records it.
        let record = if followed {
            record
        } else {
            self.one_as_read(record, Ask::Everyone).await?
        };
        let (Some(_), Some(microvm), Some(host)) =
            (&record.lease, &record.status.micro_vm, &record.status.host)
        else {
            return Err(no_microvm(name));
        };
        if let Some(why) = host_not_ready(&record.status) {
            return Err(ApiError::service_unavailable(format!(
                "cannot {act} microvmclaim {namespace}/{name}: its Host {} is not ready: {why}",
                host.node_name
            )));
        }
        // The Host's current address: its agent may have registered after the bind.
        let agent_address = self
            .hosts
            .agent_address(&host.node_name)?
            .or_else(|| host.agent_address.clone())
            .ok_or_else(|| {
                ApiError::service_unavailable(format!(
                    "cannot {act} microvmclaim {namespace}/{name}: its Host {} has no \
                     exec agent registered (the Host's spec.agentAddress is empty)",
                    host.node_name
                ))
            })?;
        let token = record.token.is_some();
        let env = self.config.env(&object(record.clone()), token).await?;
        Ok(Target {
            followed,
            env,
            claim: ClaimRef {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                uid: record.metadata.uid.clone().unwrap_or_default(),
            },
            host: host.node_name.clone(),
            agent_address,
            microvm_uid: microvm.uid.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_its_agent_reports_not_ready_refuses_and_an_unreported_one_is_tried() {
        let with = |status: &str, reason: &str| {
            let condition = k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: conditions::HOST_READY.to_owned(),
                status: status.to_owned(),
                reason: reason.to_owned(),
                message: "flintlockd's exec API is disabled".to_owned(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ),
                observed_generation: None,
            };
            MicroVMClaimStatus {
                conditions: vec![condition],
                ..Default::default()
            }
        };
        assert_eq!(
            host_not_ready(&with("False", "ExecDisabled")).as_deref(),
            Some("ExecDisabled: flintlockd's exec API is disabled")
        );
        assert_eq!(host_not_ready(&with("False", "NoHostReport")), None);
        assert_eq!(host_not_ready(&with("True", "Ready")), None);
        assert_eq!(host_not_ready(&MicroVMClaimStatus::default()), None);
    }
}
