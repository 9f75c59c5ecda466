//! The claim request, [`ClaimBuilder`]: what [`Client::claim`] starts and
//! [`ClaimBuilder::send`] binds, retried without a second claim.

use std::collections::BTreeMap;
use std::time::Duration;

use battery_types::{MicroVMClaim, MicroVMClaimSpec, Pool, PoolRef, ServiceAccountToken};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use tokio::time::Instant;

use crate::claim::Claim;
use crate::client::Client;
use crate::error::{self, Error};

/// The label that carries a claim's token, by which a retried create knows its own claim.
pub const TOKEN_LABEL: &str = "battery.liquidmetal-x.dev/sdk-claim-token";

/// How long [`ClaimBuilder::send`] keeps retrying unless told otherwise.
const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);
/// The wait between retries when the server gives no `Retry-After`.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);
/// The characters of a generated name's suffix: apimachinery's, without vowels (no words).
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

impl Client {
    /// A claim on the MicroVMs of `pool`; [`ClaimBuilder::send`] makes it.
    pub fn claim(&self, pool: impl Into<String>) -> ClaimBuilder {
        ClaimBuilder {
            client: self.clone(),
            pool: pool.into(),
            holder: None,
            name: None,
            labels: BTreeMap::new(),
            deadline: DEFAULT_DEADLINE,
            on_wait: None,
            idle_timeout: None,
            max_lifetime: None,
            service_account_token: None,
        }
    }
}

/// A claim being asked for; [`ClaimBuilder::send`] binds it.
#[must_use = "a claim is made only by send()"]
pub struct ClaimBuilder {
    client: Client,
    pool: String,
    holder: Option<String>,
    name: Option<String>,
    labels: BTreeMap<String, String>,
    deadline: Duration,
    on_wait: Option<WaitReport>,
    idle_timeout: Option<battery_types::Duration>,
    max_lifetime: Option<battery_types::Duration>,
    service_account_token: Option<ServiceAccountToken>,
}

/// What [`ClaimBuilder::on_wait`] was given.
type WaitReport = Box<dyn Fn(&Waiting) + Send + Sync>;

/// A wait of [`ClaimBuilder::send`] before it tries again, as [`ClaimBuilder::on_wait`]
/// reports it: for progress while the Pool has no MicroVM.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Waiting {
    /// The Pool claimed from.
    pub pool: String,
    /// Why the server refused this time, in its words.
    pub message: String,
    /// How long until the next attempt.
    pub retry_after: Duration,
    /// How long until the deadline.
    pub remaining: Duration,
}

impl ClaimBuilder {
    /// The ServiceAccount (of the client's namespace) that holds the claim: only it may
    /// renew the lease and exec into the MicroVM. Without one, the client's own
    /// ServiceAccount, if [`Client::from_config`] found that its user is one.
    pub fn holder(mut self, service_account: impl Into<String>) -> Self {
        self.holder = Some(service_account.into());
        self
    }

    /// The claim's name; without one, a name of the Pool's plus a random suffix.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Labels for the claim, added to those set before.
    pub fn labels<K: Into<String>, V: Into<String>>(
        mut self,
        labels: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.labels
            .extend(labels.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// How long to keep retrying while the Pool has no MicroVM (30s unless set). A bind
    /// the server is waiting on when the deadline passes is let finish.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Ends the claim once it goes this long without an exec, a terminal, a port-forward
    /// or a file copy (renewing is not use); without it, the Pool's default applies. No
    /// more than the Pool's maximum, if it sets one. [`Claim::lost`] then says
    /// [`crate::LostReason::IdleTimeout`].
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = Some(api_duration(timeout));
        self
    }

    /// Ends the claim this long after its bind, however often it is renewed; without it,
    /// the Pool's default applies. No more than the Pool's maximum, if it sets one.
    /// [`Claim::lost`] then says [`crate::LostReason::MaxLifetimeReached`].
    pub fn max_lifetime(mut self, lifetime: Duration) -> Self {
        self.max_lifetime = Some(api_duration(lifetime));
        self
    }

    /// Gives the MicroVM what a Pod gets from its ServiceAccount: a token of the Holder's
    /// ServiceAccount, the cluster's CA and the namespace under
    /// `/var/run/secrets/kubernetes.io/serviceaccount`, the token replaced before it
    /// expires (`spec.serviceAccountToken`). Its Pool's settings apply, else the cluster's
    /// own audiences and an hour. The creating user must be allowed to `create`
    /// `serviceaccounts/token` for the Holder (else a `403`); `battery-apiserver dev`,
    /// which has no cluster, refuses it (a `422`).
    pub fn service_account_token(mut self) -> Self {
        self.service_account_token
            .get_or_insert_with(ServiceAccountToken::default);
        self
    }

    /// The audience of the MicroVM's token, such as `sts.amazonaws.com` for a cloud's
    /// OIDC federation, over its Pool's; implies [`Self::service_account_token`].
    pub fn token_audience(mut self, audience: impl Into<String>) -> Self {
        self.service_account_token
            .get_or_insert_with(ServiceAccountToken::default)
            .audience = Some(audience.into());
        self
    }

    /// How long each of the MicroVM's tokens is valid, over its Pool's: at least 10
    /// minutes, in whole seconds (rounded up); implies [`Self::service_account_token`].
    pub fn token_expiration(mut self, lifetime: Duration) -> Self {
        let seconds = lifetime.as_secs() + u64::from(lifetime.subsec_nanos() > 0);
        self.service_account_token
            .get_or_insert_with(ServiceAccountToken::default)
            .expiration_seconds = Some(i64::try_from(seconds).unwrap_or(i64::MAX));
        self
    }

    /// Calls `report` before each wait for a retry, so that a caller can show progress.
    pub fn on_wait(mut self, report: impl Fn(&Waiting) + Send + Sync + 'static) -> Self {
        self.on_wait = Some(Box::new(report));
        self
    }

    /// Creates the claim, which binds it, and starts renewing its lease.
    pub async fn send(self) -> Result<Claim, Error> {
        let deadline = Instant::now() + self.deadline;
        let holder = self
            .holder
            .or_else(|| self.client.own_service_account())
            .ok_or(Error::HolderUnknown)?;
        // Fixed before the first attempt, so a retry asks for the same claim.
        let name = self.name.unwrap_or_else(|| generated_name(&self.pool));
        let token = random(32, b"0123456789abcdef");
        let mut labels = self.labels;
        labels.insert(TOKEN_LABEL.to_owned(), token.clone());
        let object = MicroVMClaim {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            spec: MicroVMClaimSpec {
                pool_ref: PoolRef {
                    name: self.pool.clone(),
                },
                service_account_name: holder,
                idle_timeout: self.idle_timeout,
                max_lifetime: self.max_lifetime,
                service_account_token: self.service_account_token,
                ..MicroVMClaimSpec::default()
            },
            status: None,
        };
        let claims = self.client.claims();
        let bound = loop {
            let error = match claims.create(&PostParams::default(), &object).await {
                Ok(bound) => break bound,
                Err(error) => error,
            };
            let Some(status) = error::status(&error) else {
                return Err(Error::Api(error));
            };
            match status.code {
                409 if status.reason == "AlreadyExists" => {
                    // Ours if an earlier attempt made it and its answer was lost.
                    let existing = claims.get(&name).await.map_err(Error::Api)?;
                    if existing
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(TOKEN_LABEL))
                        == Some(&token)
                    {
                        break existing;
                    }
                    return Err(Error::NameTaken { name });
                }
                429 | 503 => {
                    let wait = error::retry_after(status).unwrap_or(DEFAULT_RETRY_AFTER);
                    if Instant::now() + wait > deadline {
                        if status.code == 429 {
                            return Err(Error::PoolExhausted {
                                pool: self.pool,
                                retry_after: wait,
                            });
                        }
                        return Err(Error::Api(error));
                    }
                    tracing::debug!(pool = %self.pool, ?wait, "no MicroVM yet; retrying");
                    if let Some(report) = &self.on_wait {
                        report(&Waiting {
                            pool: self.pool.clone(),
                            message: status.message.clone(),
                            retry_after: wait,
                            remaining: deadline.saturating_duration_since(Instant::now()),
                        });
                    }
                    tokio::time::sleep(wait).await;
                }
                _ => return Err(Error::from_claims(error, &self.pool)),
            }
        };
        let pools: Api<Pool> = Api::namespaced(self.client.kube.clone(), &self.client.namespace);
        // Reading the Pool may be forbidden to the Holder: then battery's defaults, which
        // a Pool without lease settings has too.
        let lease = match pools.get(&self.pool).await {
            Ok(pool) => pool.spec.lease,
            Err(error) => {
                tracing::debug!(pool = %self.pool, %error, "cannot read the Pool; renewing at the default interval");
                battery_types::LeaseSettings::default()
            }
        };
        Ok(Claim::start(self.client, bound, self.pool, lease))
    }
}

fn random(len: usize, alphabet: &[u8]) -> String {
    (0..len)
        .map(|_| char::from(alphabet[fastrand::usize(..alphabet.len())]))
        .collect()
}

/// apimachinery's `generateName`: the prefix, cut so the name fits, and five characters.
fn generated_name(pool: &str) -> String {
    let prefix: String = pool.chars().take(63 - 6).collect();
    format!("{prefix}-{}", random(5, NAME_ALPHABET))
}

/// `duration` as the API takes it; one too long for it (centuries) as the longest it takes.
fn api_duration(duration: Duration) -> battery_types::Duration {
    battery_types::Duration::try_from(duration)
        .unwrap_or(battery_types::Duration::from_nanos(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_names_are_valid_and_differ() {
        let long = "p".repeat(80);
        let name = generated_name(&long);
        assert_eq!(name.len(), 63);
        assert!(name.starts_with(&"p".repeat(57)));
        let (a, b) = (generated_name("dev"), generated_name("dev"));
        assert!(a.starts_with("dev-") && a.len() == 9, "{a}");
        assert_ne!(a, b);
        assert!(a[4..].bytes().all(|c| NAME_ALPHABET.contains(&c)), "{a}");
    }
}
