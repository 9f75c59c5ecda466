//! battery's event stream in our terms. battery replays its whole history on every
//! subscription (`reference/battery-api.md` §4.6), so followers dedupe by id.

use battery_proto::poolmgr::v1alpha1 as pb;
use std::time::SystemTime;

use futures::{Stream, StreamExt};

use super::BatteryClient;
use super::errors::{BatteryError, Rpc};

/// What happened, for the events we act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    VmProvisioned,
    VmAvailable,
    VmClaimed,
    VmExpiringSoon,
    VmDeletedDueToExpiry,
    VmDeletedOnRelease,
    VmHookFailed,
    VmDeletedOnPoolDelete,
    /// A type battery declares but does not emit, or one newer than us.
    Other,
}

impl EventKind {
    fn from_pb(value: i32) -> Self {
        match pb::EventType::try_from(value) {
            Ok(pb::EventType::VmProvisioned) => Self::VmProvisioned,
            Ok(pb::EventType::VmAvailable) => Self::VmAvailable,
            Ok(pb::EventType::VmClaimed) => Self::VmClaimed,
            Ok(pb::EventType::VmExpiringSoon) => Self::VmExpiringSoon,
            Ok(pb::EventType::VmDeletedDueToExpiry) => Self::VmDeletedDueToExpiry,
            Ok(pb::EventType::VmDeletedOnRelease) => Self::VmDeletedOnRelease,
            Ok(pb::EventType::VmHookFailed) => Self::VmHookFailed,
            Ok(pb::EventType::VmDeletedOnPoolDelete) => Self::VmDeletedOnPoolDelete,
            _ => Self::Other,
        }
    }

    /// Whether the event ends a MicroVM (and with it any lease on it).
    pub fn deletes_vm(self) -> bool {
        matches!(
            self,
            Self::VmDeletedDueToExpiry | Self::VmDeletedOnRelease | Self::VmDeletedOnPoolDelete
        )
    }
}

/// One battery event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatteryEvent {
    /// battery's global, increasing event id.
    pub id: u64,
    pub namespace: String,
    pub pool: String,
    pub vm_uid: String,
    pub kind: EventKind,
    /// When battery recorded it, if it said.
    pub created_at: Option<SystemTime>,
}

impl BatteryClient {
    /// battery's events from the start of its history, then live ones.
    pub async fn events(
        &self,
    ) -> Result<impl Stream<Item = Result<BatteryEvent, BatteryError>> + Send + use<>, BatteryError>
    {
        let stream = self.subscribe().await?;
        Ok(stream.map(|event| {
            event
                .map_err(|status| BatteryError::from_status(Rpc::Subscribe, status))
                .map(|e| BatteryEvent {
                    // Ids start at 1; a negative one would be a battery bug, read as 0 and so
                    // skipped as already seen.
                    id: u64::try_from(e.id).unwrap_or_default(),
                    namespace: e.pool_namespace,
                    pool: e.pool_name,
                    vm_uid: e.vm_uid,
                    kind: EventKind::from_pb(e.r#type),
                    created_at: e.created_at.and_then(|t| SystemTime::try_from(t).ok()),
                })
        }))
    }
}
