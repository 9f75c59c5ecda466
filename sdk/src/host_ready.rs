//! [`Claim::host_ready`]: the readiness of the claim's Host, as the claim reports it.

use std::time::Duration;

use battery_types::MicroVMClaim;
use battery_types::conditions::{ConditionStatus, HOST_READY};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _};
use kube::api::{Api, WatchEvent, WatchParams};

use crate::claim::Claim;
use crate::error::Error;

/// The wait before looking again after a failed read, so a server that is down is not
/// asked in a tight loop.
const RETRY: Duration = Duration::from_secs(1);

/// Whether the claim's Host can run its MicroVM's commands now, from the claim's
/// `HostReady` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostReadiness {
    /// The Host reports itself ready.
    pub ready: bool,
    /// Why, in one word (`Ready`, `KVMUnavailable`, `AgentNotReporting`, ...).
    pub reason: String,
    /// Why, for people.
    pub message: String,
}

impl HostReadiness {
    fn of(claim: &MicroVMClaim) -> Option<Self> {
        let condition = claim
            .status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == HOST_READY)?;
        Some(Self {
            ready: condition.status == ConditionStatus::True.as_str(),
            reason: condition.reason.clone(),
            message: condition.message.clone(),
        })
    }
}

impl Claim {
    /// The readiness of the claim's Host: first as it is now, then each time it changes.
    /// A failed read is yielded as an error and retried a second later; the stream ends
    /// when the claim is deleted.
    pub fn host_ready(&self) -> impl Stream<Item = Result<HostReadiness, Error>> + Send + use<> {
        let watcher = Watcher {
            claims: self.client.claims(),
            name: self.name().to_owned(),
            uid: self.object().metadata.uid.clone(),
            last: None,
            events: None,
            failed: false,
        };
        futures::stream::unfold(watcher, |mut watcher| async move {
            let item = watcher.next().await?;
            Some((item, watcher))
        })
    }
}

/// A GET, then a watch of the one claim from where the GET left off; a GET again
/// whenever the watch ends.
struct Watcher {
    claims: Api<MicroVMClaim>,
    name: String,
    uid: Option<String>,
    last: Option<HostReadiness>,
    events: Option<BoxStream<'static, kube::Result<WatchEvent<MicroVMClaim>>>>,
    failed: bool,
}

impl Watcher {
    /// The next change, an error, or `None` once the claim is gone.
    async fn next(&mut self) -> Option<Result<HostReadiness, Error>> {
        loop {
            let Some(events) = &mut self.events else {
                if std::mem::take(&mut self.failed) {
                    tokio::time::sleep(RETRY).await;
                }
                match self.start().await {
                    Ok(Some(changed)) => return Some(Ok(changed)),
                    Ok(None) if self.events.is_none() => return None,
                    Ok(None) => continue,
                    Err(error) => {
                        self.failed = true;
                        return Some(Err(error));
                    }
                }
            };
            match events.next().await {
                Some(Ok(WatchEvent::Added(claim) | WatchEvent::Modified(claim))) => {
                    // Another claim made under the name: ours is gone.
                    if claim.metadata.uid != self.uid {
                        return None;
                    }
                    if let Some(changed) = self.observe(&claim) {
                        return Some(Ok(changed));
                    }
                }
                Some(Ok(WatchEvent::Deleted(_))) => return None,
                Some(Ok(WatchEvent::Bookmark(_))) => {}
                // Expired (410) or cut: read the claim again and watch anew.
                Some(Ok(WatchEvent::Error(_)) | Err(_)) | None => self.events = None,
            }
        }
    }

    /// Reads the claim and starts watching it; `Ok(None)` with no watch when it is gone.
    async fn start(&mut self) -> Result<Option<HostReadiness>, Error> {
        let claim = self
            .claims
            .get_opt(&self.name)
            .await
            .map_err(|e| Error::from_claims(e, ""))?;
        let Some(claim) = claim.filter(|c| c.metadata.uid == self.uid) else {
            return Ok(None);
        };
        let version = claim.metadata.resource_version.clone().unwrap_or_default();
        let params = WatchParams::default().fields(&format!("metadata.name={}", self.name));
        let events = self
            .claims
            .watch(&params, &version)
            .await
            .map_err(|e| Error::from_claims(e, ""))?;
        self.events = Some(events.boxed());
        Ok(self.observe(&claim))
    }

    /// The claim's readiness if it differs from the last one yielded.
    fn observe(&mut self, claim: &MicroVMClaim) -> Option<HostReadiness> {
        let now = HostReadiness::of(claim)?;
        (self.last.as_ref() != Some(&now)).then(|| {
            self.last = Some(now.clone());
            now
        })
    }
}
