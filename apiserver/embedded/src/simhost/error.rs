//! The simulated Host's errors: [`SimHostError`] when it cannot start, and
//! [`RequestError`] for a refused gRPC request, converted to a `Status` in one place.

use std::error::Error;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use battery_telemetry::error_chain;
use tonic::{Code, Status};

/// Why a [`SimulatedHost`](super::SimulatedHost) could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimHostError {
    /// `SimulatedHostConfig::state_dir` was left empty.
    #[error("the simulated host needs a state_dir")]
    StateDirRequired,
    /// The state directory could not be created.
    #[error("creating state directory {path}")]
    CreateStateDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A persisted MicroVM record, or the list of an earlier version, could not be
    /// read.
    #[error("reading {path}")]
    ReadState {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A persisted MicroVM record, or the list of an earlier version, is not valid
    /// JSON of the expected shape.
    #[error("parsing {path}")]
    ParseState {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// A persisted MicroVM's spec is not a valid `flintlock.types.MicroVMSpec`.
    #[error("decoding the spec of microvm {uid} in {path}")]
    DecodeSpec {
        /// The file.
        path: PathBuf,
        /// The MicroVM.
        uid: String,
        /// The cause.
        #[source]
        source: prost::DecodeError,
    },
    /// The MicroVM list of an earlier version could not be moved to records.
    #[error("moving the microvms of {path} to records")]
    Migrate {
        /// The earlier version's list.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Box<PersistError>,
    },
    /// A persisted MicroVM's scratch directory could not be recreated.
    #[error("creating scratch directory {path}")]
    CreateScratchDir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The gRPC listener could not be bound.
    #[error("binding {addr}")]
    Bind {
        /// The requested address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The bound listener could not tell its address.
    #[error("reading the listener's address")]
    LocalAddr(#[source] io::Error),
    /// [`SshProxyConfig::user_ca_public_key`](super::SshProxyConfig::user_ca_public_key)
    /// is not an OpenSSH public key.
    #[error("the ssh proxy's user_ca_public_key is not an OpenSSH public key")]
    UserCaKey(#[source] Box<dyn Error + Send + Sync>),
    /// The SSH proxy's directory, host key, user CA key or sshd configuration could not
    /// be written.
    #[error("preparing the ssh proxy's {path}")]
    SshProxySetup {
        /// The directory or file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Box<dyn Error + Send + Sync>,
    },
}

/// Why a MicroVM's record could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// The record could not be encoded as JSON.
    #[error("encoding a microvm's record")]
    Encode(#[source] serde_json::Error),
    /// A file could not be written, replaced or removed.
    #[error("writing {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// A request the simulated Host refuses or cuts short. Each variant fixes its gRPC
/// code, so the code and the message never disagree.
#[derive(Debug, thiserror::Error)]
pub(super) enum RequestError {
    #[error("microvm spec is required")]
    SpecRequired,
    #[error("uid is required")]
    UidRequired,
    #[error("namespace is required when id is set")]
    NamespaceRequired,
    #[error("network interface {position} has no device_id")]
    DeviceIdRequired { position: usize },
    #[error("network interface device_id {0} is used more than once")]
    DuplicateDeviceId(String),
    #[error("network interface {device_id} has unknown type {value}")]
    UnknownInterfaceType { device_id: String, value: i32 },
    #[error("the host has no free network interface index")]
    InterfacesExhausted,
    #[error("microvm {0} not found")]
    NotFound(String),
    #[error("simulated fault: {0} is failing")]
    Fault(&'static str),
    #[error("creating scratch directory {path}")]
    CreateScratchDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("persisting the microvm")]
    Persist(#[source] PersistError),
    #[error("the first message must be start")]
    StartFirst,
    #[error("start may only be sent once, as the first message")]
    StartRepeated,
    #[error("a request carries no payload")]
    EmptyRequest,
    #[error("cmd is required")]
    CmdRequired,
    #[error("timeout_seconds must not be negative, got {0}")]
    NegativeTimeout(i32),
    #[error("microvm {uid} is {state}, not CREATED")]
    NotCreated { uid: String, state: &'static str },
    #[error("microvm {0} was deleted while the command ran")]
    DeletedDuringExec(String),
    #[error("the host is shutting down")]
    ShuttingDown,
    #[error("waiting for the command")]
    WaitCommand(#[source] io::Error),
    #[error("the first message must be uid")]
    UidFirst,
    #[error("uid may only be sent once, as the first message")]
    UidRepeated,
    #[error(
        "{path} is missing: the simulated host's ssh proxy runs OpenSSH's sshd (apt-get install openssh-server)"
    )]
    SshdMissing { path: PathBuf },
    #[error("creating {path}, sshd's privilege separation directory")]
    SshdPrivsepDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("starting {path}")]
    StartSshd {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("sshd ended ({status}) before it said anything; its log is {log}")]
    SshdFailed { status: String, log: PathBuf },
    #[error("microvm {0} was deleted during the ssh session")]
    DeletedDuringSsh(String),
}

impl RequestError {
    fn code(&self) -> Code {
        match self {
            Self::SpecRequired
            | Self::UidRequired
            | Self::NamespaceRequired
            | Self::DeviceIdRequired { .. }
            | Self::DuplicateDeviceId(_)
            | Self::UnknownInterfaceType { .. }
            | Self::StartFirst
            | Self::StartRepeated
            | Self::EmptyRequest
            | Self::CmdRequired
            | Self::NegativeTimeout(_)
            | Self::UidFirst
            | Self::UidRepeated => Code::InvalidArgument,
            Self::InterfacesExhausted => Code::ResourceExhausted,
            Self::NotFound(_) => Code::NotFound,
            Self::Fault(_) => Code::Unavailable,
            Self::CreateScratchDir { .. }
            | Self::Persist(_)
            | Self::WaitCommand(_)
            | Self::StartSshd { .. }
            | Self::SshdFailed { .. } => Code::Internal,
            // The Host lacks what the proxy needs: fixed on the Host, not by retrying.
            Self::NotCreated { .. } | Self::SshdMissing { .. } | Self::SshdPrivsepDir { .. } => {
                Code::FailedPrecondition
            }
            Self::DeletedDuringExec(_) | Self::DeletedDuringSsh(_) => Code::Aborted,
            Self::ShuttingDown => Code::Unavailable,
        }
    }
}

impl From<RequestError> for Status {
    fn from(error: RequestError) -> Self {
        // A Status carries no source chain, so the causes go into its message.
        Status::new(error.code(), error_chain(&error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_follow_the_contract() {
        let cases = [
            (RequestError::StartFirst, Code::InvalidArgument),
            (RequestError::NotFound("u".into()), Code::NotFound),
            (RequestError::Fault("DeleteMicroVM"), Code::Unavailable),
            (
                RequestError::NotCreated {
                    uid: "u".into(),
                    state: "PENDING",
                },
                Code::FailedPrecondition,
            ),
            (RequestError::InterfacesExhausted, Code::ResourceExhausted),
        ];
        for (error, code) in cases {
            assert_eq!(Status::from(error).code(), code);
        }
    }

    #[test]
    fn status_message_carries_the_cause_chain() {
        let error = RequestError::Persist(PersistError::Write {
            path: "/state/records/u.json".into(),
            source: io::Error::other("disk full"),
        });
        let status = Status::from(error);
        assert_eq!(status.code(), Code::Internal);
        assert_eq!(
            status.message(),
            "persisting the microvm: writing /state/records/u.json: disk full"
        );
    }
}
