//! The simulated Host's records on disk: one JSON file per MicroVM, written atomically
//! (a temporary file renamed over it), and the one list earlier versions kept.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use battery_proto::flintlock::types::NetworkInterfaceStatus;
use battery_proto::flintlock::types::micro_vm_status::MicroVmState;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::error::{PersistError, SimHostError};

/// A MicroVM's state as the simulation knows it. flintlock's DELETING never shows:
/// a simulated delete completes at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub(super) enum VmState {
    Pending,
    Created,
    Failed,
}

impl VmState {
    pub(super) fn to_proto(self) -> MicroVmState {
        match self {
            Self::Pending => MicroVmState::Pending,
            Self::Created => MicroVmState::Created,
            Self::Failed => MicroVmState::Failed,
        }
    }
}

/// Creates the directory `path` if it is missing; returns it.
pub(super) async fn create_dir(path: PathBuf) -> Result<PathBuf, SimHostError> {
    match tokio::fs::create_dir_all(&path).await {
        Ok(()) => Ok(path),
        Err(source) => Err(SimHostError::CreateStateDir { path, source }),
    }
}

/// Replaces `path` atomically: a crash leaves the old content or the new.
pub(super) async fn write_atomically(path: &Path, bytes: Vec<u8>) -> Result<(), PersistError> {
    let temporary = path.with_extension(TEMPORARY_EXTENSION);
    tokio::fs::write(&temporary, bytes)
        .await
        .map_err(|source| PersistError::Write {
            path: temporary.clone(),
            source,
        })?;
    tokio::fs::rename(&temporary, path)
        .await
        .map_err(|source| PersistError::Write {
            path: path.to_owned(),
            source,
        })
}

/// What a write in progress is named until it replaces its record.
pub(super) const TEMPORARY_EXTENSION: &str = "json.tmp";

/// The JSON file `path` read as a `T`, or `None` if there is no such file.
pub(super) async fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, SimHostError> {
    let bytes = match tokio::fs::read(path).await {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(SimHostError::ReadState {
                path: path.to_owned(),
                source,
            });
        }
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|source| SimHostError::ParseState {
            path: path.to_owned(),
            source,
        })
}

/// Every record in `dir`, with the path it was read from; a write a crash cut short
/// (a temporary file) is removed.
pub(super) async fn read_records(
    dir: &Path,
) -> Result<Vec<(PathBuf, StoredMicroVm)>, SimHostError> {
    let read_error = |source| SimHostError::ReadState {
        path: dir.to_owned(),
        source,
    };
    let mut entries = tokio::fs::read_dir(dir).await.map_err(read_error)?;
    let mut records = Vec::new();
    while let Some(entry) = entries.next_entry().await.map_err(read_error)? {
        let path = entry.path();
        if entry
            .file_name()
            .to_string_lossy()
            .ends_with(TEMPORARY_EXTENSION)
        {
            if let Err(error) = tokio::fs::remove_file(&path).await {
                warn!(path = %path.display(), %error, "removing an unfinished record failed");
            }
            continue;
        }
        if let Some(record) = read_json(&path).await? {
            records.push((path, record));
        }
    }
    Ok(records)
}

/// The MicroVMs of the whole-list state file of earlier versions, if there is one.
pub(super) async fn read_legacy_state_file(
    path: &Path,
) -> Result<Option<Vec<(PathBuf, StoredMicroVm)>>, SimHostError> {
    Ok(read_json::<StateFile>(path).await?.map(|file| {
        file.microvms
            .into_iter()
            .map(|record| (path.to_owned(), record))
            .collect()
    }))
}

/// `microvms.json`, the whole list, as earlier versions kept it.
#[derive(Default, Serialize, Deserialize)]
pub(super) struct StateFile {
    pub(super) microvms: Vec<StoredMicroVm>,
}

/// A MicroVM's record. The spec is kept as base64 protobuf: the generated types have no
/// serde, and protobuf keeps every field, including ones added later.
#[derive(Serialize, Deserialize)]
pub(super) struct StoredMicroVm {
    pub(super) uid: String,
    pub(super) state: VmState,
    pub(super) version: i32,
    #[serde(with = "base64_bytes")]
    pub(super) spec: Vec<u8>,
    pub(super) network_interfaces: BTreeMap<String, StoredInterface>,
}

#[derive(Serialize, Deserialize)]
pub(super) struct StoredInterface {
    pub(super) host_device_name: String,
    pub(super) index: i32,
    pub(super) mac_address: String,
}

impl From<&NetworkInterfaceStatus> for StoredInterface {
    fn from(status: &NetworkInterfaceStatus) -> Self {
        Self {
            host_device_name: status.host_device_name.clone(),
            index: status.index,
            mac_address: status.mac_address.clone(),
        }
    }
}

impl From<StoredInterface> for NetworkInterfaceStatus {
    fn from(stored: StoredInterface) -> Self {
        Self {
            host_device_name: stored.host_device_name,
            index: stored.index,
            mac_address: stored.mac_address,
        }
    }
}

pub(super) mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD as BASE64;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&BASE64.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        BASE64.decode(text).map_err(serde::de::Error::custom)
    }
}
