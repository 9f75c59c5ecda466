//! `pools`: battery holds each Pool's spec and counts; the metadata store holds its
//! Kubernetes metadata, its `placement` (battery knows only the host names it resolves
//! to) and the last conditions written, whose transition times reads reuse. `record`
//! and `storage` hold what the verbs share, below the files split by job; this file
//! holds the `Storage` and `Scalable` verbs.

mod adopt;
mod deletion;
mod record;
mod respec;
mod respecified;
mod storage;
mod update;

use battery_api_machinery::status::ApiError;
use battery_api_machinery::table::TableColumnDefinition;
use battery_types::Pool;
use battery_types::conditions;
use battery_types::validation::FieldError;
use serde_json::Value;

use crate::api::{Deleted, RequestContext, Scalable, Storage};
use crate::battery::objects::{self, PoolMeta};
use crate::watch::ChangeType;
use record::{Kept, PoolRecord, RESOURCE, info, key};

pub use storage::PoolStorage;

impl Storage for PoolStorage {
    type Object = Pool;

    fn table_columns(&self) -> Vec<TableColumnDefinition> {
        vec![
            TableColumnDefinition::new(
                "Size",
                "integer",
                "How many MicroVMs battery keeps in the Pool.",
                0,
            ),
            TableColumnDefinition::new("Available", "integer", "MicroVMs ready to be claimed.", 0),
            TableColumnDefinition::new("Leased", "integer", "MicroVMs bound to a claim.", 0),
            TableColumnDefinition::new("Ready", "string", "The status of the Ready condition.", 0),
        ]
    }

    fn table_cells(&self, pool: &Pool) -> Vec<Value> {
        let status = pool.status.clone().unwrap_or_default();
        let ready = conditions::find_status_condition(&status.conditions, conditions::READY)
            .map_or_else(|| "Unknown".to_owned(), |c| c.status.clone());
        vec![
            pool.spec.size.unwrap_or_default().into(),
            status.available.into(),
            status.leased.into(),
            ready.into(),
        ]
    }

    fn validate(&self, pool: &Pool) -> Vec<FieldError> {
        let mut errors = pool.spec.validate();
        let serves_tokens = self
            .serves_tokens
            .load(std::sync::atomic::Ordering::Relaxed);
        if pool.spec.service_account_token.is_some() && !serves_tokens {
            errors.push(FieldError::forbidden(
                "spec.serviceAccountToken",
                crate::cluster::tokens::NO_CLUSTER_FOR_TOKENS,
            ));
        }
        errors
    }

    async fn get(&self, ctx: &RequestContext, name: &str) -> Result<Pool, ApiError> {
        self.read(ctx.namespace.as_deref().unwrap_or_default(), name)
            .await
    }

    async fn list(&self, ctx: &RequestContext) -> Result<(Vec<Pool>, u64), ApiError> {
        let namespace = ctx.namespace.as_deref();
        let (records, rv) = self.store.list::<PoolRecord>(RESOURCE, namespace)?;
        let pools = self
            .battery
            .pools(namespace)
            .await
            .map_err(|e| e.into_api_error(info(), ""))?;
        let mut by_key: std::collections::HashMap<(String, String), PoolRecord> = records
            .into_iter()
            .map(|r| {
                (
                    (
                        r.metadata.namespace.clone().unwrap_or_default(),
                        r.metadata.name.clone().unwrap_or_default(),
                    ),
                    r,
                )
            })
            .collect();
        let mut items: Vec<Pool> = pools
            .into_iter()
            .map(|p| {
                let record = by_key.remove(&(p.namespace.clone(), p.name.clone()));
                self.assemble(record, p)
            })
            .collect();
        items.sort_by_cached_key(crate::api::list_key);
        Ok((items, rv))
    }

    async fn create(&self, _ctx: &RequestContext, pool: Pool) -> Result<Pool, ApiError> {
        let namespace = pool.metadata.namespace.clone().unwrap_or_default();
        let name = pool.metadata.name.clone().unwrap_or_default();
        let _guard = self.locks.lock(&key(&namespace, &name)).await;
        let hosts = self.resolve_hosts(&pool.spec).await?;
        let created = self
            .battery
            .create_pool(&namespace, &name, &pool.spec, hosts.clone())
            .await
            .map_err(|e| e.into_api_error(info(), &name))?;
        let meta = PoolMeta {
            metadata: pool.metadata,
            placement: pool.spec.placement,
            claim_limits: pool.spec.claim_limits,
            service_account_token: pool.spec.service_account_token,
            previous: &[],
            rejected: None,
        };
        let mut pool = objects::pool(meta, created);
        self.commit(&mut pool, ChangeType::Added, Kept::default())
            .await?;
        Ok(pool)
    }

    async fn update(&self, _ctx: &RequestContext, _old: Pool, new: Pool) -> Result<Pool, ApiError> {
        let namespace = new.metadata.namespace.clone().unwrap_or_default();
        let name = new.metadata.name.clone().unwrap_or_default();
        let (written, telling) = {
            let _guard = self.locks.lock(&key(&namespace, &name)).await;
            match self.write_update(new).await? {
                update::Written::Recorded(pool) => return Ok(pool),
                // Queued under the lock, so the follower sees it pending until it is told.
                update::Written::ToTell { pool, hosts } => {
                    let telling = self.respecify(&namespace, &name, &pool.spec, hosts);
                    (pool, telling)
                }
            }
        };
        self.settle_update(written, telling.await).await
    }

    async fn delete(&self, _ctx: &RequestContext, pool: Pool) -> Result<Deleted<Pool>, ApiError> {
        self.delete_pool(pool).await
    }
}

/// `pools/<name>/scale` (ADR 0019): `spec.replicas` is `spec.size`, `status.replicas` what
/// battery counts towards it, and the selector names the Pool by uid.
impl Scalable for PoolStorage {
    fn spec_replicas(&self, pool: &Pool) -> i32 {
        pool.spec.size.unwrap_or_default()
    }

    fn set_spec_replicas(&self, pool: &mut Pool, replicas: i32) {
        pool.spec.size = Some(replicas);
    }

    fn status_replicas(&self, pool: &Pool) -> i32 {
        pool.replicas()
    }

    fn selector(&self, pool: &Pool) -> String {
        pool.scale_selector()
    }
}
