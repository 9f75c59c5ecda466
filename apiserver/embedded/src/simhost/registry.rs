//! The simulated Host's MicroVMs: kept in memory, each persisted as a JSON record in
//! `<state_dir>/records/<uid>.json` before a change to it is answered, and each with a
//! scratch directory `<state_dir>/microvms/<uid>/` that stands in for its root
//! filesystem. A record per MicroVM makes a change cost one small write: the one file
//! of the whole list that earlier versions kept (`microvms.json`, read once and
//! replaced by records) made every change's write grow with the Host's MicroVMs.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use battery_proto::flintlock::types::network_interface::IfaceType;
use battery_proto::flintlock::types::{
    MicroVm, MicroVmSpec, MicroVmStatus, NetworkInterfaceStatus,
};
use battery_telemetry::error_chain;
use prost::Message as _;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tracing::warn;

use super::error::{PersistError, RequestError, SimHostError};
use super::records::{
    StoredInterface, StoredMicroVm, VmState, create_dir, read_legacy_state_file, read_records,
    write_atomically,
};

/// The whole list, as versions before per-MicroVM records kept it.
const LEGACY_STATE_FILE: &str = "microvms.json";
const RECORDS: &str = "records";
const RECORD_EXTENSION: &str = "json";
const SCRATCH_DIRS: &str = "microvms";
/// flintlock puts a MicroVM created without an id in this namespace.
const DEFAULT_NAMESPACE: &str = "default";
/// The first index handed to a host interface; 1 is the loopback's on Linux.
const FIRST_INTERFACE_INDEX: i32 = 2;

/// What ends a MicroVM's background work: its boot timer and running commands.
/// `cancel` fires when the MicroVM is deleted or the Host shuts down; `tasks` lets
/// a delete wait until that work has stopped before removing the scratch directory.
#[derive(Clone)]
pub(super) struct Lifetime {
    pub(super) cancel: CancellationToken,
    pub(super) tasks: TaskTracker,
}

/// What a command needs to run in a CREATED MicroVM. Holding `_task` keeps a
/// delete waiting until the command has been killed and reaped.
pub(super) struct ExecTarget {
    pub(super) scratch_dir: PathBuf,
    /// Fires when the MicroVM is deleted or the Host shuts down.
    pub(super) cancel: CancellationToken,
    /// Fires only when the Host shuts down, to tell the two apart.
    pub(super) host_shutdown: CancellationToken,
    _task: TaskTrackerToken,
}

/// A MicroVM just accepted by [`Registry::create`].
pub(super) struct Created {
    pub(super) uid: String,
    pub(super) microvm: MicroVm,
    pub(super) lifetime: Lifetime,
}

struct Vm {
    spec: MicroVmSpec,
    state: VmState,
    version: i32,
    interfaces: BTreeMap<String, NetworkInterfaceStatus>,
    lifetime: Lifetime,
}

impl Vm {
    fn to_proto(&self) -> MicroVm {
        MicroVm {
            version: self.version,
            spec: Some(self.spec.clone()),
            status: Some(MicroVmStatus {
                state: self.state.to_proto().into(),
                network_interfaces: self
                    .interfaces
                    .iter()
                    .map(|(device, status)| (device.clone(), status.clone()))
                    .collect(),
                ..MicroVmStatus::default()
            }),
        }
    }

    fn to_stored(&self, uid: &str) -> StoredMicroVm {
        StoredMicroVm {
            uid: uid.to_owned(),
            state: self.state,
            version: self.version,
            spec: self.spec.encode_to_vec(),
            network_interfaces: self
                .interfaces
                .iter()
                .map(|(device, status)| (device.clone(), StoredInterface::from(status)))
                .collect(),
        }
    }
}

struct Vms {
    by_uid: BTreeMap<String, Vm>,
    next_interface_index: i32,
}

impl Vms {
    /// One host interface per template interface, keyed by device_id as flintlock
    /// keys `status.network_interfaces`.
    fn allocate_interfaces(
        &mut self,
        spec: &MicroVmSpec,
    ) -> Result<BTreeMap<String, NetworkInterfaceStatus>, RequestError> {
        let mut interfaces = BTreeMap::new();
        let mut next = self.next_interface_index;
        for iface in &spec.interfaces {
            let kind = IfaceType::try_from(iface.r#type).map_err(|_| {
                RequestError::UnknownInterfaceType {
                    device_id: iface.device_id.clone(),
                    value: iface.r#type,
                }
            })?;
            let prefix = match kind {
                IfaceType::Tap => "tap",
                IfaceType::Macvtap => "macvtap",
            };
            let status = NetworkInterfaceStatus {
                host_device_name: format!("{prefix}{next}"),
                index: next,
                mac_address: iface.guest_mac.clone().unwrap_or_else(random_mac),
            };
            interfaces.insert(iface.device_id.clone(), status);
            next = next
                .checked_add(1)
                .ok_or(RequestError::InterfacesExhausted)?;
        }
        self.next_interface_index = next;
        Ok(interfaces)
    }
}

/// The MicroVMs of one simulated Host.
pub(super) struct Registry {
    records: PathBuf,
    scratch_root: PathBuf,
    vms: Mutex<Vms>,
    /// Held across a write of a record, so that writes of one MicroVM's never cross.
    writes: tokio::sync::Mutex<()>,
    host_shutdown: CancellationToken,
}

impl Registry {
    /// Loads the MicroVMs persisted in `state_dir` (none if it is new). Returns the
    /// uids of those still PENDING, whose boot must be resumed, with their lifetimes.
    pub(super) async fn open(
        state_dir: &Path,
        host_shutdown: CancellationToken,
    ) -> Result<(Self, Vec<(String, Lifetime)>), SimHostError> {
        let scratch_root = create_dir(state_dir.join(SCRATCH_DIRS)).await?;
        let records = create_dir(state_dir.join(RECORDS)).await?;
        let legacy = read_legacy_state_file(&state_dir.join(LEGACY_STATE_FILE)).await?;
        let migrating = legacy.is_some();
        // A crash while migrating leaves both; the records are the newer.
        let stored: BTreeMap<String, (PathBuf, StoredMicroVm)> = legacy
            .unwrap_or_default()
            .into_iter()
            .chain(read_records(&records).await?)
            .map(|(path, record)| (record.uid.clone(), (path, record)))
            .collect();

        let mut by_uid = BTreeMap::new();
        let mut pending = Vec::new();
        let mut next_interface_index = FIRST_INTERFACE_INDEX;
        for (path, record) in stored.into_values() {
            let spec = MicroVmSpec::decode(record.spec.as_slice()).map_err(|source| {
                SimHostError::DecodeSpec {
                    path,
                    uid: record.uid.clone(),
                    source,
                }
            })?;
            // The records are the truth: a MicroVM whose directory was lost gets an
            // empty one back.
            let scratch_dir = scratch_root.join(&record.uid);
            tokio::fs::create_dir_all(&scratch_dir)
                .await
                .map_err(|source| SimHostError::CreateScratchDir {
                    path: scratch_dir,
                    source,
                })?;
            let interfaces: BTreeMap<_, _> = record
                .network_interfaces
                .into_iter()
                .map(|(device, stored)| (device, NetworkInterfaceStatus::from(stored)))
                .collect();
            if let Some(highest) = interfaces.values().map(|status| status.index).max() {
                next_interface_index = next_interface_index.max(highest.saturating_add(1));
            }
            let lifetime = Lifetime {
                cancel: host_shutdown.child_token(),
                tasks: TaskTracker::new(),
            };
            if record.state == VmState::Pending {
                pending.push((record.uid.clone(), lifetime.clone()));
            }
            by_uid.insert(
                record.uid,
                Vm {
                    spec,
                    state: record.state,
                    version: record.version,
                    interfaces,
                    lifetime,
                },
            );
        }
        remove_unlisted_scratch_dirs(&scratch_root, &by_uid).await?;

        let registry = Self {
            records,
            scratch_root,
            vms: Mutex::new(Vms {
                by_uid,
                next_interface_index,
            }),
            writes: tokio::sync::Mutex::new(()),
            host_shutdown,
        };
        if migrating {
            registry.migrate(&state_dir.join(LEGACY_STATE_FILE)).await?;
        }
        Ok((registry, pending))
    }

    /// Accepts a MicroVM as flintlock does: a new uid, state PENDING, `created_at`
    /// now. An empty id gets a generated name in namespace `default`.
    pub(super) async fn create(&self, mut spec: MicroVmSpec) -> Result<Created, RequestError> {
        validate_interfaces(&spec)?;
        let uid = uuid::Uuid::new_v4().to_string();
        if spec.id.is_empty() {
            let short = uid.split('-').next().unwrap_or(&uid);
            spec.id = format!("microvm-{short}");
            spec.namespace = DEFAULT_NAMESPACE.to_owned();
        } else if spec.namespace.is_empty() {
            return Err(RequestError::NamespaceRequired);
        }
        spec.uid = Some(uid.clone());
        spec.created_at = Some(SystemTime::now().into());

        let scratch_dir = self.scratch_dir(&uid);
        tokio::fs::create_dir_all(&scratch_dir)
            .await
            .map_err(|source| RequestError::CreateScratchDir {
                path: scratch_dir.clone(),
                source,
            })?;

        let inserted = {
            let mut vms = self.lock();
            vms.allocate_interfaces(&spec).map(|interfaces| {
                let vm = Vm {
                    spec,
                    state: VmState::Pending,
                    version: 1,
                    interfaces,
                    lifetime: Lifetime {
                        cancel: self.host_shutdown.child_token(),
                        tasks: TaskTracker::new(),
                    },
                };
                let created = Created {
                    uid: uid.clone(),
                    microvm: vm.to_proto(),
                    lifetime: vm.lifetime.clone(),
                };
                vms.by_uid.insert(uid.clone(), vm);
                created
            })
        };
        let created = match inserted {
            Ok(inserted) => inserted,
            Err(error) => {
                remove_scratch_dir(&scratch_dir).await;
                return Err(error);
            }
        };
        if let Err(error) = self.persist(&uid).await {
            self.lock().by_uid.remove(&uid);
            // A record half written is litter; one written whole must go with it.
            if let Err(error) = self.persist(&uid).await {
                warn!(uid, error = %error_chain(&error), "removing the record of a failed create");
            }
            remove_scratch_dir(&scratch_dir).await;
            return Err(RequestError::Persist(error));
        }
        Ok(created)
    }

    pub(super) fn get(&self, uid: &str) -> Result<MicroVm, RequestError> {
        if uid.is_empty() {
            return Err(RequestError::UidRequired);
        }
        self.lock()
            .by_uid
            .get(uid)
            .map(Vm::to_proto)
            .ok_or_else(|| RequestError::NotFound(uid.to_owned()))
    }

    /// The MicroVMs in `namespace` (all of them when it is empty), optionally only
    /// those whose id is `name`.
    pub(super) fn list(&self, namespace: &str, name: Option<&str>) -> Vec<MicroVm> {
        self.lock()
            .by_uid
            .values()
            .filter(|vm| namespace.is_empty() || vm.spec.namespace == namespace)
            .filter(|vm| name.is_none_or(|name| vm.spec.id == name))
            .map(Vm::to_proto)
            .collect()
    }

    pub(super) fn uids(&self) -> Vec<String> {
        self.lock().by_uid.keys().cloned().collect()
    }

    /// Removes a MicroVM, then kills whatever still runs in it and removes its
    /// scratch directory.
    pub(super) async fn delete(&self, uid: &str) -> Result<(), RequestError> {
        if uid.is_empty() {
            return Err(RequestError::UidRequired);
        }
        let vm = self
            .lock()
            .by_uid
            .remove(uid)
            .ok_or_else(|| RequestError::NotFound(uid.to_owned()))?;
        if let Err(error) = self.persist(uid).await {
            // The record was not removed: the MicroVM stays, as it was.
            self.lock().by_uid.insert(uid.to_owned(), vm);
            return Err(RequestError::Persist(error));
        }

        vm.lifetime.cancel.cancel();
        vm.lifetime.tasks.close();
        vm.lifetime.tasks.wait().await;
        // The MicroVM is gone either way: a directory left behind is only litter.
        remove_scratch_dir(&self.scratch_dir(uid)).await;
        Ok(())
    }

    /// Ends a PENDING MicroVM's boot in `state`. A MicroVM deleted meanwhile stays
    /// deleted.
    pub(super) async fn finish_boot(&self, uid: &str, state: VmState) {
        {
            let mut vms = self.lock();
            let Some(vm) = vms.by_uid.get_mut(uid) else {
                return;
            };
            if vm.state != VmState::Pending {
                return;
            }
            vm.state = state;
            vm.version = vm.version.saturating_add(1);
        }
        // Nobody waits on a boot to report to; a restart boots it again.
        if let Err(error) = self.persist(uid).await {
            warn!(uid, error = %error_chain(&error), "persisting a finished boot failed");
        }
    }

    pub(super) fn exec_target(&self, uid: &str) -> Result<ExecTarget, RequestError> {
        if uid.is_empty() {
            return Err(RequestError::UidRequired);
        }
        let vms = self.lock();
        let vm = vms
            .by_uid
            .get(uid)
            .ok_or_else(|| RequestError::NotFound(uid.to_owned()))?;
        if vm.state != VmState::Created {
            return Err(RequestError::NotCreated {
                uid: uid.to_owned(),
                state: vm.state.to_proto().as_str_name(),
            });
        }
        // Taken under the lock, so a delete that removes the MicroVM after this
        // point waits for the command.
        Ok(ExecTarget {
            scratch_dir: self.scratch_dir(uid),
            cancel: vm.lifetime.cancel.clone(),
            host_shutdown: self.host_shutdown.clone(),
            _task: vm.lifetime.tasks.token(),
        })
    }

    /// Waits until every MicroVM's background work has stopped; called once the
    /// Host's shutdown token has fired.
    pub(super) async fn wait_idle(&self) {
        let trackers: Vec<TaskTracker> = self
            .lock()
            .by_uid
            .values()
            .map(|vm| vm.lifetime.tasks.clone())
            .collect();
        for tasks in trackers {
            tasks.close();
            tasks.wait().await;
        }
    }

    fn scratch_dir(&self, uid: &str) -> PathBuf {
        self.scratch_root.join(uid)
    }

    fn lock(&self) -> MutexGuard<'_, Vms> {
        // No code panics while holding the lock, and the map stays consistent
        // between statements, so a poisoned lock's data is still good.
        self.vms.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, uid: &str) -> PathBuf {
        self.records.join(format!("{uid}.{RECORD_EXTENSION}"))
    }

    /// Makes `uid`'s record say what memory says now: written while the MicroVM
    /// exists, removed once it does not. Writes run one at a time and each reads memory
    /// when its turn comes, so the last to run holds the newest state, whatever order
    /// the changes made their writes in.
    async fn persist(&self, uid: &str) -> Result<(), PersistError> {
        let _writing = self.writes.lock().await;
        let stored = self.lock().by_uid.get(uid).map(|vm| vm.to_stored(uid));
        let path = self.record(uid);
        match stored {
            Some(stored) => {
                let bytes = serde_json::to_vec(&stored).map_err(PersistError::Encode)?;
                write_atomically(&path, bytes).await
            }
            None => match tokio::fs::remove_file(&path).await {
                Err(error) if error.kind() != io::ErrorKind::NotFound => Err(PersistError::Write {
                    path,
                    source: error,
                }),
                _ => Ok(()),
            },
        }
    }

    /// Writes a record for every MicroVM the legacy state file listed, then removes
    /// it: a crash in between reads both again, which agree.
    async fn migrate(&self, legacy: &Path) -> Result<(), SimHostError> {
        let uids = self.uids();
        for uid in &uids {
            self.persist(uid)
                .await
                .map_err(|source| SimHostError::Migrate {
                    path: legacy.to_owned(),
                    source: Box::new(source),
                })?;
        }
        tokio::fs::remove_file(legacy)
            .await
            .map_err(|source| SimHostError::Migrate {
                path: legacy.to_owned(),
                source: Box::new(PersistError::Write {
                    path: legacy.to_owned(),
                    source,
                }),
            })?;
        tracing::info!(microvms = uids.len(), path = %legacy.display(), "moved the simulated host's microvm list to one record per microvm");
        Ok(())
    }
}

fn validate_interfaces(spec: &MicroVmSpec) -> Result<(), RequestError> {
    let mut seen = HashSet::new();
    for (position, iface) in spec.interfaces.iter().enumerate() {
        if iface.device_id.is_empty() {
            return Err(RequestError::DeviceIdRequired { position });
        }
        if !seen.insert(iface.device_id.as_str()) {
            return Err(RequestError::DuplicateDeviceId(iface.device_id.clone()));
        }
    }
    Ok(())
}

/// A random locally administered unicast MAC, as a TAP device without a
/// `guest_mac` gets.
fn random_mac() -> String {
    // A v4 UUID's first six bytes are all random.
    let bytes = uuid::Uuid::new_v4().into_bytes();
    format!(
        "02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        bytes[0], bytes[1], bytes[2], bytes[3], bytes[4]
    )
}

/// Removes the directories of MicroVMs without a record: a crash after a create made
/// its directory but before its record was written, or after a delete removed the
/// record but before it removed the directory, leaves one behind.
async fn remove_unlisted_scratch_dirs(
    scratch_root: &Path,
    listed: &BTreeMap<String, Vm>,
) -> Result<(), SimHostError> {
    let read_error = |source| SimHostError::ReadState {
        path: scratch_root.to_owned(),
        source,
    };
    let mut entries = tokio::fs::read_dir(scratch_root)
        .await
        .map_err(read_error)?;
    while let Some(entry) = entries.next_entry().await.map_err(read_error)? {
        let listed = entry
            .file_name()
            .to_str()
            .is_some_and(|uid| listed.contains_key(uid));
        if !listed {
            remove_scratch_dir(&entry.path()).await;
        }
    }
    Ok(())
}

async fn remove_scratch_dir(path: &Path) {
    match tokio::fs::remove_dir_all(path).await {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => warn!(path = %path.display(), %error, "removing a scratch directory failed"),
    }
}

#[cfg(test)]
mod tests;
