//! The claim's ServiceAccount inside its guest (issue 42; ADR 43): what a Pod gets, a
//! token of `serviceAccountName` from TokenRequest, the cluster's CA and the namespace,
//! under `/var/run/secrets/kubernetes.io/serviceaccount`.
//!
//! At create, before anything is leased: the requester must be allowed to request that
//! token themself, the claim's binding Secret is created and the token requested. At
//! bind the files are written, and a task replaces the token before it expires, each
//! time renamed over the old one. When the claim ends its binding Secret is deleted, and
//! with it every token bound to it stops authenticating.

use std::time::Duration;

use battery_api_machinery::status::{ApiError, Reason};
use battery_types::validation::{FieldError, FieldPath};
use battery_types::{MicroVMClaim, TokenSettings};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use secrecy::ExposeSecret as _;

use super::config::FileContent;
use super::record::{ClaimRecord, RESOURCE, info, key, object};
use super::storage::ClaimStorage;
use super::token::{self, RotationFailure};
use crate::auth::UserInfo;
use crate::cluster::tokens::IssuedToken;

/// The files' mode: a Pod's ServiceAccount volume's (`defaultMode: 0644`).
const MODE: i32 = 0o644;
/// The pause after a first try at replacing a token fails, doubled at each failure after.
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(500);
/// The longest pause between two tries at replacing a token that could not be.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(30);
/// Between the first replacements of the claims' tokens after a start, so a server with
/// many claims does not ask for all at once.
const RESUME_SPREAD: Duration = Duration::from_millis(50);

/// What a create made for its claim's token before anything was leased.
pub(super) struct Minted {
    pub(super) settings: TokenSettings,
    ca: Vec<u8>,
    issued: IssuedToken,
}

impl ClaimStorage {
    /// The token `claim`'s guest gets, as its Pool or it asks (`settings`): authorized
    /// as `user` (a `403` naming the ServiceAccount), its binding Secret created, the
    /// token requested. A failure deletes the binding, so it leaves nothing.
    pub(super) async fn mint_token(
        &self,
        user: &UserInfo,
        claim: &MicroVMClaim,
        settings: TokenSettings,
    ) -> Result<Minted, ApiError> {
        let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        let uid = claim.metadata.uid.as_deref().unwrap_or_default();
        let cluster = self.config.cluster_for_tokens()?.clone();
        let account = claim.spec.service_account_name.as_str();
        self.config
            .authorize_token(user, namespace, account)
            .await?;
        let binding = cluster
            .create_token_binding(&claim.metadata)
            .await
            .map_err(|err| unavailable("create the Secret its token is bound to", &err))?;
        let minted = async {
            let ca = cluster
                .root_ca(namespace)
                .await
                .map_err(|err| unavailable("read the cluster's CA", &err))?
                .ok_or_else(|| {
                    ApiError::service_unavailable(format!(
                        "namespace {namespace} has no ConfigMap kube-root-ca.crt with the \
                         cluster's CA (kube-controller-manager's root-ca-cert-publisher \
                         publishes it), which a MicroVM's ServiceAccount needs"
                    ))
                })?;
            let issued = cluster
                .request_token(namespace, account, &settings, &binding)
                .await
                .map_err(|err| match err {
                    kube::Error::Api(status) if status.code == 404 => {
                        let at = FieldPath::new("spec").child("serviceAccountName");
                        let error = FieldError::invalid(
                            at,
                            account,
                            format!("ServiceAccount {namespace}/{account} not found"),
                        );
                        ApiError::invalid(info(), name, &[error])
                    }
                    err => unavailable("request its ServiceAccount's token", &err),
                })?;
            Ok(Minted {
                settings,
                ca,
                issued,
            })
        }
        .await;
        if minted.is_err() {
            self.config.end_token(namespace.to_owned(), uid.to_owned());
        }
        minted
    }

    /// Writes a minted token, the CA and the namespace into the bound claim's guest.
    pub(super) async fn write_identity(
        &self,
        claim: &MicroVMClaim,
        minted: &Minted,
    ) -> Result<(), ApiError> {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let files = vec![
            FileContent::new("ca.crt".to_owned(), MODE, minted.ca.clone().into()),
            FileContent::new(
                "namespace".to_owned(),
                MODE,
                namespace.clone().into_bytes().into(),
            ),
            token_file(&minted.issued),
        ];
        self.config
            .write_service_account(claim, files)
            .await
            .map_err(|why| {
                let name = claim.metadata.name.as_deref().unwrap_or_default();
                ApiError::new(
                    Reason::InternalError,
                    format!(
                        "cannot write the ServiceAccount token into the MicroVM of \
                         microvmclaim {namespace}/{name}; the MicroVM was released: {why}"
                    ),
                )
            })
    }

    /// Replaces the bound claim's token before it expires, from `minted` (just written)
    /// or, without it, at once, until the claim ends.
    pub(super) fn rotate_token(
        &self,
        claim: &MicroVMClaim,
        settings: TokenSettings,
        minted: Option<&Minted>,
        first: Timestamp,
    ) {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let next = minted.map_or(first, |m| {
            token::refresh_time(m.issued.expires, m.issued.lifetime_seconds)
        });
        // After a restart, when the guest's token expires is not known.
        let expires = minted.map(|m| m.issued.expires);
        let this = self.clone();
        let rotation_uid = uid.clone();
        let task = tokio::spawn(async move {
            let claim = (namespace.as_str(), name.as_str(), rotation_uid.as_str());
            this.rotation(claim, &settings, next, expires).await;
        });
        self.rotations.insert(&uid, task.abort_handle());
    }

    /// The claim's (namespace, name, uid) token replaced from `next` on; the guest's
    /// present token `expires` then, if known. Failures are retried with backoff, and a
    /// streak of them is told on the claim as an Event (and its end, once told).
    async fn rotation(
        &self,
        (namespace, name, uid): (&str, &str, &str),
        settings: &TokenSettings,
        mut next: Timestamp,
        mut expires: Option<Timestamp>,
    ) {
        let mut pause = FIRST_RETRY_PAUSE;
        let mut failures = 0;
        loop {
            let wait = next.duration_since(Timestamp::now());
            if let Ok(wait) = Duration::try_from(wait) {
                tokio::time::sleep(wait).await;
            }
            match self.replace_token(namespace, name, uid, settings).await {
                Ok(Some(issued)) => {
                    if failures >= token::FAILURES_BEFORE_EVENT {
                        let message = format!(
                            "replaced the ServiceAccount token in the MicroVM after {failures} \
                             failed tries"
                        );
                        self.token_event((namespace, name, uid), "Normal", token::ROTATED, message)
                            .await;
                    }
                    failures = 0;
                    pause = FIRST_RETRY_PAUSE;
                    next = token::refresh_time(issued.expires, issued.lifetime_seconds);
                    expires = Some(issued.expires);
                    tracing::debug!(claim = %format!("{namespace}/{name}"), expires = %issued.expires, "replaced a claim's ServiceAccount token");
                }
                Ok(None) => return,
                Err(failure) => {
                    failures += 1;
                    tracing::warn!(claim = %format!("{namespace}/{name}"), error = %failure, failures, "replacing a claim's ServiceAccount token; retrying");
                    if failures == token::FAILURES_BEFORE_EVENT {
                        let message =
                            token::failing_message(namespace, &failure, failures, expires);
                        let reason = token::ROTATION_FAILING;
                        self.token_event((namespace, name, uid), "Warning", reason, message)
                            .await;
                    }
                    next = Timestamp::now()
                        .checked_add(pause)
                        .unwrap_or_else(|_| Timestamp::now());
                    pause = (pause * 2).min(MAX_RETRY_PAUSE);
                }
            }
        }
    }

    /// An Event on the claim (namespace, name, uid) about its token; one that cannot be
    /// recorded is logged, and the rotation goes on.
    async fn token_event(
        &self,
        (namespace, name, uid): (&str, &str, &str),
        event_type: &str,
        reason: &str,
        message: String,
    ) {
        let Ok(cluster) = self.config.cluster_for_tokens() else {
            return;
        };
        let claim = ObjectMeta {
            namespace: Some(namespace.to_owned()),
            name: Some(name.to_owned()),
            uid: Some(uid.to_owned()),
            ..ObjectMeta::default()
        };
        if let Err(err) = cluster
            .claim_event(&claim, event_type, reason, message)
            .await
        {
            tracing::warn!(error = %err, reason, "recording a MicroVMClaim Event");
        }
    }

    /// Requests a new token and renames it over the guest's; `None` once the claim ended
    /// or its binding is gone (its tokens no longer authenticate: nothing to replace).
    async fn replace_token(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        settings: &TokenSettings,
    ) -> Result<Option<IssuedToken>, RotationFailure> {
        let record = self
            .store
            .get::<ClaimRecord>(&key(namespace, name))
            .map_err(|err| RotationFailure::Record(err.to_string()))?
            .filter(|r| r.lease.is_some() && r.metadata.uid.as_deref() == Some(uid));
        let Some(record) = record else {
            return Ok(None);
        };
        let claim = object(record);
        let account = &claim.spec.service_account_name;
        let refused = |why: String| RotationFailure::Request {
            account: account.clone(),
            why,
        };
        let cluster = self
            .config
            .cluster_for_tokens()
            .map_err(|err| refused(err.message().to_owned()))?;
        let Some(binding) = cluster
            .token_binding(namespace, uid)
            .await
            .map_err(|err| refused(kube_said(&err)))?
        else {
            tracing::warn!(claim = %format!("{namespace}/{name}"), "the Secret a claim's tokens are bound to was deleted: its guest's token no longer authenticates and is not replaced");
            return Ok(None);
        };
        let issued = cluster
            .request_token(namespace, account, settings, &binding)
            .await
            .map_err(|err| refused(kube_said(&err)))?;
        self.config
            .write_service_account(&claim, vec![token_file(&issued)])
            .await
            .map_err(|why| {
                // The guest's words, which a guest could make carry what it was sent.
                let written = issued.token.expose_secret();
                RotationFailure::Write(token::without(&why, written))
            })?;
        Ok(Some(issued))
    }

    /// At start: the token of every Bound claim that has one is replaced at once (when
    /// its old one is due is not kept) and followed on; the binding of every ended claim
    /// that had one is deleted again, in case the server stopped before it was.
    pub async fn resume_tokens(&self) -> Result<(), ApiError> {
        if !self.config.serves_tokens() {
            return Ok(());
        }
        let (records, _) = self.store.list::<ClaimRecord>(RESOURCE, None)?;
        let mut first = Timestamp::now();
        for record in records {
            let Some(settings) = record.token.clone() else {
                continue;
            };
            if record.lease.is_some() {
                self.rotate_token(&object(record), settings, None, first);
                first = first.checked_add(RESUME_SPREAD).unwrap_or(first);
            } else {
                self.config.end_token(
                    record.metadata.namespace.clone().unwrap_or_default(),
                    record.metadata.uid.clone().unwrap_or_default(),
                );
            }
        }
        Ok(())
    }
}

/// The token's file, its copy zeroed when dropped.
fn token_file(issued: &IssuedToken) -> FileContent {
    let token = issued.token.expose_secret().as_bytes().to_vec();
    FileContent::new("token".to_owned(), MODE, token.into())
}

/// What kube-apiserver said of a failed call: its Status's message, else the error.
fn kube_said(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

/// The cluster did not do what a claim's token needs: ours to retry, not the user's fault
/// (a 403 here is the API server's own RBAC, which the message shows).
fn unavailable(what: &str, err: &kube::Error) -> ApiError {
    ApiError::service_unavailable(format!("cannot {what} in the cluster: {err}"))
}
