//! Cordoning in battery the Hosts whose agent reports them not ready (`readiness`).

use battery_api_machinery::status::ApiError;
use k8s_openapi::jiff::Timestamp;

use super::readiness::{not_ready, of_record};
use super::record::{ADMIN_CORDON_REASON, HostRecord, Reporting, info, key};
use super::storage::HostStorage;
use crate::watch::ChangeType;

impl HostStorage {
    /// Cordons in battery the Hosts that are not ready and uncordons those ready again
    /// (unless their admin cordoned them), recording the change. Run on the Host follow
    /// loop. Answers whether a cordon moved.
    pub(super) async fn follow_readiness(&self) -> Result<bool, ApiError> {
        let (records, _) = self.store().list::<HostRecord>(super::RESOURCE, None)?;
        let mut moved = false;
        for record in records {
            let name = record.metadata.name.clone().unwrap_or_default();
            let want = not_ready(&of_record(Some(&record), Timestamp::now()));
            if record.leaving.is_some() || want.is_some() == record.reporting.cordoned_not_ready {
                continue;
            }
            moved |= self.set_readiness_cordon(&name, want).await?;
        }
        Ok(moved)
    }

    /// Turns the not-ready cordon on (`Some(why)`) or off, under the Host's lock.
    async fn set_readiness_cordon(
        &self,
        name: &str,
        why: Option<String>,
    ) -> Result<bool, ApiError> {
        let _guard = self.locks.lock(&key(name)).await;
        let Some(mut record) = self.store().get::<HostRecord>(&key(name))? else {
            return Ok(false);
        };
        if record.leaving.is_some() || why.is_some() == record.reporting.cordoned_not_ready {
            return Ok(false);
        }
        let host = self
            .battery()
            .host(name)
            .await
            .map_err(|e| e.into_api_error(info(), name))?;
        match &why {
            Some(why) => {
                // Recorded before battery cordons, so a read in between (reads take no
                // lock) never shows our cordon as the admin's `spec.unschedulable`.
                let before = record.reporting.clone();
                record.reporting.admin_unschedulable = host.spec.unschedulable;
                record.reporting.cordoned_not_ready = true;
                self.store()
                    .transact(|tx| tx.put(&key(name), &record))
                    .await?;
                if let Err(err) = self.battery().cordon_host(name, why).await {
                    record.reporting = before;
                    self.store()
                        .transact(|tx| tx.put(&key(name), &record))
                        .await?;
                    return Err(err.into_api_error(info(), name));
                }
            }
            None => {
                if record.reporting.admin_unschedulable {
                    self.battery().cordon_host(name, ADMIN_CORDON_REASON).await
                } else {
                    self.battery().uncordon_host(name).await
                }
                .map_err(|e| e.into_api_error(info(), name))?;
                record.reporting = Reporting {
                    reported_at: record.reporting.reported_at,
                    ..Reporting::default()
                };
            }
        }
        tracing::info!(
            host = name,
            cordoned = why.is_some(),
            reason = why.as_deref().unwrap_or("ready"),
            "following the Host's readiness"
        );
        let host = self
            .battery()
            .host(name)
            .await
            .map_err(|e| e.into_api_error(info(), name))?;
        let reporting = record.reporting.clone();
        let leaving = record.leaving.clone();
        let mut object = self.assemble(Some(record), host)?;
        self.commit_reporting(&mut object, ChangeType::Modified, leaving, reporting)
            .await?;
        Ok(true)
    }
}
