//! What the simulated Host's gRPC services share: its name and version, the faults
//! tests inject, its MicroVMs' registry and its shutdown; below the services and the
//! server that owns it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::records::VmState;
use super::registry::Registry;

/// Faults to inject, for tests. All are off by default and can be toggled at any
/// time.
#[derive(Debug, Default)]
pub struct HostFaults {
    deletes: AtomicBool,
    creates: AtomicBool,
    boot: AtomicBool,
    deletes_held: tokio::sync::watch::Sender<bool>,
}

impl HostFaults {
    /// While on, DeleteMicroVM answers UNAVAILABLE and deletes nothing.
    pub fn fail_deletes(&self, on: bool) {
        self.deletes.store(on, Ordering::Relaxed);
    }

    /// While on, CreateMicroVM answers UNAVAILABLE and creates nothing.
    pub fn fail_creates(&self, on: bool) {
        self.creates.store(on, Ordering::Relaxed);
    }

    /// While on, MicroVMs created from then on go to FAILED instead of CREATED when
    /// their provisioning delay ends.
    pub fn fail_boot(&self, on: bool) {
        self.boot.store(on, Ordering::Relaxed);
    }

    /// While on, DeleteMicroVM waits, deleting nothing, until it is turned off: a
    /// flintlockd slow to delete, which makes battery's DeletePool slow.
    pub fn hold_deletes(&self, on: bool) {
        self.deletes_held.send_replace(on);
    }

    /// Returns once deletes are not held.
    pub(super) async fn deletes_released(&self) {
        // The sender lives as long as these faults: the wait ends only by release.
        let _ = self.deletes_held.subscribe().wait_for(|held| !held).await;
    }

    pub(super) fn deletes_fail(&self) -> bool {
        self.deletes.load(Ordering::Relaxed)
    }

    pub(super) fn creates_fail(&self) -> bool {
        self.creates.load(Ordering::Relaxed)
    }

    pub(super) fn boot_outcome(&self) -> VmState {
        if self.boot.load(Ordering::Relaxed) {
            VmState::Failed
        } else {
            VmState::Created
        }
    }
}

/// What the gRPC services share.
pub(super) struct Host {
    pub(super) name: String,
    pub(super) version: String,
    pub(super) provisioning_delay: Duration,
    pub(super) faults: HostFaults,
    pub(super) registry: Registry,
    /// Stops the server, every boot timer and every running command.
    pub(super) shutdown: CancellationToken,
}
