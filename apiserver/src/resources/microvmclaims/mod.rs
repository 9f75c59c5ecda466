//! `microvmclaims`: a claim is bound inside its create (DESIGN §4): battery's `ClaimVM`
//! is called with a `request_id` derived from the claim's uid, the Bound claim is recorded,
//! and the response is already Bound (ADR 22: a lease no record holds is released at
//! start; ADR 48: a bind is recorded pending while battery leases). The metadata store
//! keeps the claim's metadata, spec and status, and battery's lease id (a secret that
//! never leaves it); battery's lease list says whether the lease still lives.
//!
//! `ClaimStorage`'s work is split by job, as k8s.io's `registry/<kind>/` splits storage
//! from strategy: `record` (what is stored, its key, battery's request id), `storage`
//! (the struct its verbs share), `bind`, `read` (Expired once battery lets the lease
//! go), `follow` (battery's events, the Hosts' readiness), `table`, `lease` (the
//! subresource, and release), `recovery`, `stored`, `access` (the one question exec
//! and port-forward ask), `activity` (what counts as use), `limited` and `limits` (the
//! idle timeout and maximum lifetime, and their enforcer); this file holds the `Storage`
//! verbs. Each file imports those
//! below it and never this one.

use battery_api_machinery::status::ApiError;
use battery_api_machinery::table::TableColumnDefinition;
use battery_types::validation::FieldError;
use battery_types::{MicroVMClaim, MicroVMClaimSpec, ServiceAccountToken};
use serde_json::Value;

use super::check_resource_version;
use crate::api::{Deleted, ListPage, RequestContext, Storage, StoredItem};
use crate::detached::Detachable;
use crate::watch::ChangeType;

mod access;
mod activity;
mod agents;
mod bind;
mod config;
mod exec;
mod follow;
mod identity;
mod lease;
mod limited;
mod limits;
mod processes;
mod quota;
mod read;
mod record;
mod recovery;
mod storage;
mod stored;
mod table;
mod token;

use lease::release;
use read::Ask;
use record::{ClaimRecord, LeaseRecord, RESOURCE, info, key, object};

pub use activity::{ActivityHold, ClaimActivity};
pub use config::{ClaimConfig, GuestApiServer};
pub use exec::{ClaimExec, ClaimPortForward, DEFAULT_MAX_SESSIONS, ExecSessions};
pub use lease::ClaimLeases;
pub use processes::{ProcessAttach, ProcessStop, ProcessStorage};
pub use quota::{ClaimQuotas, QuotaSource};
pub use storage::ClaimStorage;

impl Storage for ClaimStorage {
    type Object = MicroVMClaim;

    fn table_columns(&self) -> Vec<TableColumnDefinition> {
        table::columns()
    }

    fn table_cells(&self, claim: &MicroVMClaim) -> Vec<Value> {
        let uid = claim.metadata.uid.as_deref().unwrap_or_default();
        table::ClaimRow::of(claim).cells(self.time_left(uid))
    }

    fn selectable_fields(&self) -> &'static [&'static str] {
        &["spec.poolRef.name", "status.phase"]
    }

    fn field_value(&self, claim: &MicroVMClaim, field: &str) -> Option<String> {
        table::ClaimRow::of(claim).field(field)
    }

    fn validate(&self, claim: &MicroVMClaim) -> Vec<FieldError> {
        let mut errors = claim.spec.validate();
        if claim.spec.service_account_token.is_some() && !self.config.serves_tokens() {
            errors.push(FieldError::forbidden(
                "spec.serviceAccountToken",
                crate::cluster::tokens::NO_CLUSTER_FOR_TOKENS,
            ));
        }
        errors
    }

    fn validate_update(&self, old: &MicroVMClaim, new: &MicroVMClaim) -> Vec<FieldError> {
        MicroVMClaimSpec::validate_update(&old.spec, &new.spec)
    }

    async fn get(&self, ctx: &RequestContext, name: &str) -> Result<MicroVMClaim, ApiError> {
        let namespace = ctx.namespace.as_deref().unwrap_or_default();
        let record = self
            .store
            .get::<ClaimRecord>(&key(namespace, name))?
            .ok_or_else(|| ApiError::not_found(info(), name))?;
        // battery is asked, even of a followed record (ADR 25).
        Ok(object(self.one_as_read(record, Ask::Everyone).await?))
    }

    async fn list(&self, ctx: &RequestContext) -> Result<(Vec<MicroVMClaim>, u64), ApiError> {
        let page = self.list_page(ctx, None, usize::MAX).await?;
        Ok((page.items, page.resource_version))
    }

    /// Reads only the page's claims, and asks battery only about their leases.
    async fn list_page(
        &self,
        ctx: &RequestContext,
        after: Option<&str>,
        limit: usize,
    ) -> Result<ListPage<MicroVMClaim>, ApiError> {
        let page =
            self.store
                .page::<ClaimRecord>(RESOURCE, ctx.namespace.as_deref(), after, limit)?;
        let items = self
            .as_read(page.records, Ask::Unfollowed)
            .await?
            .into_iter()
            .map(object)
            .collect();
        Ok(ListPage {
            items,
            resource_version: page.resource_version,
            rest: page.rest,
        })
    }

    async fn list_page_stored(
        &self,
        ctx: &RequestContext,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Option<ListPage<StoredItem>>, ApiError> {
        self.stored_page(ctx, after, limit).await.map(Some)
    }

    async fn create(
        &self,
        ctx: &RequestContext,
        mut claim: MicroVMClaim,
    ) -> Result<MicroVMClaim, ApiError> {
        claim.status = None;
        let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
        let pool_name = claim.spec.pool_ref.name.as_str();
        let pool = self.pools.claim_terms(namespace, pool_name)?;
        if pool.deleting {
            return Err(ApiError::conflict(
                info(),
                claim.metadata.name.as_deref().unwrap_or_default(),
                format!("pool {namespace}/{pool_name} is being deleted"),
            )
            .with_specific_reason("PoolDeleting"));
        }
        // As the requesting user and before anything is leased: a refusal leaves nothing.
        let resolved = self.config.resolve(&ctx.user, &claim).await?;
        let token = ServiceAccountToken::resolve(
            pool.service_account_token.as_ref(),
            claim.spec.service_account_token.as_ref(),
        );
        let minted = match token {
            Some(settings) => Some(self.mint_token(&ctx.user, &claim, settings).await?),
            None => None,
        };
        ctx.trace.step("claim's configuration resolved");
        let this = self.clone();
        let trace = ctx.trace.clone();
        // Detachable, so a client that disconnects mid-bind (kube-apiserver gives up after
        // 60 s) leaves no bind half done: it completes and the claim exists.
        Detachable::new(async move { this.bind(claim, resolved, minted, trace).await }).await
    }

    async fn update(
        &self,
        _ctx: &RequestContext,
        _old: MicroVMClaim,
        mut new: MicroVMClaim,
    ) -> Result<MicroVMClaim, ApiError> {
        let namespace = new.metadata.namespace.clone().unwrap_or_default();
        let name = new.metadata.name.clone().unwrap_or_default();
        let key = key(&namespace, &name);
        let _guard = self.locks.lock(&key).await;
        let record = self
            .store
            .get::<ClaimRecord>(&key)?
            .ok_or_else(|| ApiError::not_found(info(), &name))?;
        check_resource_version(info(), &record.metadata, &new.metadata)?;
        // Only metadata changes through the main resource; status is battery's.
        let secrets = record.lease_record();
        new.status = Some(record.status);
        self.commit(&mut new, secrets, ChangeType::Modified).await?;
        Ok(new)
    }

    async fn delete(
        &self,
        _ctx: &RequestContext,
        claim: MicroVMClaim,
    ) -> Result<Deleted<MicroVMClaim>, ApiError> {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let key = key(&namespace, &name);
        let _guard = self.locks.lock(&key).await;
        let record = self
            .store
            .get::<ClaimRecord>(&key)?
            .ok_or_else(|| ApiError::not_found(info(), &name))?;
        if record.token.is_some()
            && let Some(uid) = &record.metadata.uid
        {
            // Its tokens stop authenticating before anything else goes: a failure here
            // leaves the claim whole, to be deleted again.
            self.config.delete_token(&namespace, uid).await?;
        }
        if let Some(lease) = &record.lease {
            // Before the release, whose deleting the MicroVM would end them less clearly.
            if let Some(uid) = &record.metadata.uid {
                self.exec_sessions.end_claim(uid);
            }
            release(&self.battery, lease, &name).await?;
            crate::failpoint::crash_point("release:released");
        }
        let mut claim = object(record);
        self.commit(&mut claim, LeaseRecord::default(), ChangeType::Deleted)
            .await?;
        Ok(Deleted::Gone(claim))
    }
}
