//! [`Claim`]: a Bound claim that renews its own lease.

use std::time::Duration;

use battery_telemetry::error_chain;
use battery_types::conditions::{self, ClaimBoundReason};
use battery_types::{LeaseSettings, MicroVMClaim};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, PostParams, Preconditions};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::Client;
use crate::error::{self, Error, LostReason};

/// A Bound claim on a MicroVM. It renews its lease in a task of its own until the lease
/// is lost, [`Claim::release`] ends it, or it is dropped (then battery expires the lease).
pub struct Claim {
    pub(crate) client: Client,
    object: MicroVMClaim,
    pub(crate) pool: String,
    lease: LeaseSettings,
    lost: watch::Receiver<Option<LostReason>>,
    renewal: JoinHandle<()>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        // Never blocks: the task stops at its next await.
        self.renewal.abort();
    }
}

impl Claim {
    pub(crate) fn start(
        client: Client,
        object: MicroVMClaim,
        pool: String,
        lease: LeaseSettings,
    ) -> Self {
        let (report, lost) = watch::channel(None);
        let renewer = Renewer {
            client: client.clone(),
            name: object.metadata.name.clone().unwrap_or_default(),
            uid: object.metadata.uid.clone().unwrap_or_default(),
            interval: lease
                .heartbeat_interval
                .to_std()
                .unwrap_or(Duration::from_secs(10)),
            expiry: lease
                .expiry_threshold
                .to_std()
                .unwrap_or(Duration::from_secs(30)),
        };
        let renewal = tokio::spawn(async move {
            let reason = renewer.run().await;
            tracing::info!(claim = %renewer.name, %reason, "claim lost");
            // No receiver left only when the Claim is gone, and then nobody asks.
            let _ = report.send(Some(reason));
        });
        Self {
            client,
            object,
            pool,
            lease,
            lost,
            renewal,
        }
    }

    /// The claim's name.
    pub fn name(&self) -> &str {
        self.object.metadata.name.as_deref().unwrap_or_default()
    }

    /// The Pool's lease settings the claim renews by: how often, and how long a lease
    /// lasts without renewal (battery's defaults when the Pool could not be read).
    pub fn lease(&self) -> &LeaseSettings {
        &self.lease
    }

    /// The claim as the create answered it: Bound, naming its MicroVM and Host.
    pub fn object(&self) -> &MicroVMClaim {
        &self.object
    }

    /// Resolves once the lease is over: expired, the claim deleted, ended by its idle
    /// timeout or maximum lifetime, or renewal failing until the lease's expiry passed.
    /// Renewal has stopped by then; a limit's end is learned at the next renewal.
    pub async fn lost(&self) -> LostReason {
        let mut lost = self.lost.clone();
        match lost.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or(LostReason::Deleted),
            // The task ends only after reporting, unless it panicked.
            Err(_) => LostReason::RenewalFailing("the renewal task ended".to_owned()),
        }
    }

    /// Stops renewing and deletes the claim, only if it is still this one (a uid
    /// precondition). A claim already gone is released too.
    pub async fn release(self) -> Result<(), Error> {
        self.renewal.abort();
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: self.object.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.client.claims().delete(self.name(), &params).await {
            Ok(_) => Ok(()),
            Err(error) if error::status(&error).is_some_and(|s| s.code == 404) => Ok(()),
            Err(error) => Err(Error::from_claims(error, &self.pool)),
        }
    }
}

/// What the renewal task needs.
struct Renewer {
    client: Client,
    name: String,
    uid: String,
    interval: Duration,
    expiry: Duration,
}

impl Renewer {
    /// Renews until the lease is lost, and says why.
    async fn run(&self) -> LostReason {
        let mut renewed = Instant::now();
        let mut wait = self.interval;
        loop {
            // Early, never late: a fifth of the interval of jitter, so many claims of one
            // Pool do not renew in step.
            tokio::time::sleep(wait.mul_f64(0.8 + 0.2 * fastrand::f64())).await;
            match self.renew().await {
                Ok(()) => {
                    renewed = Instant::now();
                    wait = self.interval;
                }
                Err(Error::LeaseLost(reason)) => return reason,
                Err(error) => {
                    let error = error_chain(&error);
                    if renewed.elapsed() >= self.expiry {
                        return LostReason::RenewalFailing(error);
                    }
                    tracing::warn!(claim = %self.name, %error, "renewal failed; retrying");
                    // Try again well before the lease would expire.
                    wait = (self.interval / 4).max(Duration::from_millis(100));
                }
            }
        }
    }

    /// One renewal, which must renew this claim and not another made under its name.
    async fn renew(&self) -> Result<(), Error> {
        match self.client.renew(&self.name).await {
            // Same name, another claim: ours was deleted and made again by someone else.
            Ok(lease) if lease.metadata.uid.as_deref() != Some(self.uid.as_str()) => {
                Err(Error::LeaseLost(LostReason::Deleted))
            }
            Ok(_) => Ok(()),
            Err(Error::ClaimNotFound { .. }) => Err(Error::LeaseLost(LostReason::Deleted)),
            Err(Error::LeaseLost(LostReason::Expired(message))) => {
                Err(Error::LeaseLost(self.why_ended(message).await))
            }
            Err(error) => Err(error),
        }
    }

    /// Why the claim ended, once its renewal was refused as expired: the claim's `Bound`
    /// condition says whether a limit on its life ended it. `message` (the refusal's) is
    /// the answer when the claim cannot be read or its lease simply ran out.
    async fn why_ended(&self, message: String) -> LostReason {
        let Ok(claim) = self.client.claims().get(&self.name).await else {
            return LostReason::Expired(message);
        };
        if claim.metadata.uid.as_deref() != Some(self.uid.as_str()) {
            return LostReason::Deleted;
        }
        let conditions = claim.status.map(|s| s.conditions).unwrap_or_default();
        let bound = conditions::find_status_condition(&conditions, conditions::BOUND);
        match bound.map(|c| (c.reason.as_str(), c.message.clone())) {
            Some((reason, why)) if reason == ClaimBoundReason::IdleTimeout.as_str() => {
                LostReason::IdleTimeout(why)
            }
            Some((reason, why)) if reason == ClaimBoundReason::MaxLifetimeReached.as_str() => {
                LostReason::MaxLifetimeReached(why)
            }
            _ => LostReason::Expired(message),
        }
    }
}

impl Client {
    /// Renews the lease of the claim `claim` once, through its `lease` subresource, and
    /// gives the renewed Lease (`spec.renewTime`, `spec.leaseDurationSeconds`). Only its
    /// Holder may ([`Error::NotHolder`]). A [`Claim`] renews itself; this is for a claim
    /// held elsewhere, as `kubectl microvm renew` does.
    pub async fn renew(&self, claim: &str) -> Result<Lease, Error> {
        let body = Lease {
            metadata: ObjectMeta {
                name: Some(claim.to_owned()),
                ..ObjectMeta::default()
            },
            spec: None,
        };
        let request = kube::core::Request::new(self.claims().resource_url())
            .replace_subresource(
                "lease",
                claim,
                &PostParams::default(),
                serde_json::to_vec(&body).map_err(|e| Error::Api(kube::Error::SerdeError(e)))?,
            )
            .map_err(|e| Error::Api(kube::Error::BuildRequest(e)))?;
        self.kube()
            .request::<Lease>(request)
            .await
            .map_err(|e| Error::from_claims(e, ""))
    }

    /// Deletes the claim `claim`, which releases its MicroVM; [`Error::ClaimNotFound`]
    /// if there is none. A [`Claim`] has its own [`Claim::release`].
    pub async fn release(&self, claim: &str) -> Result<(), Error> {
        self.claims()
            .delete(claim, &DeleteParams::default())
            .await
            .map(drop)
            .map_err(|e| Error::from_claims(e, ""))
    }

    /// The claims of this client's namespace.
    pub async fn list(&self) -> Result<Vec<MicroVMClaim>, Error> {
        self.claims()
            .list(&Default::default())
            .await
            .map(|list| list.items)
            .map_err(|e| Error::from_claims(e, ""))
    }
}
