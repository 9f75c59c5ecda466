//! The client side of flintlock's API, as battery uses it (§2): MicroVM create, get and
//! delete, ServerInfo, and MicroVMExec for hooks and the guest-agent readiness wait.

use std::collections::HashMap;
use std::time::Duration;

use battery_proto::flintlock::types::{MicroVm, MicroVmSpec, NetworkInterfaceStatus};
use battery_proto::microvm::services::api::v1alpha1::micro_vm_client::MicroVmClient;
use battery_proto::microvm::services::api::v1alpha1::{
    CreateMicroVmRequest, DeleteMicroVmRequest, GetMicroVmRequest,
};
use battery_proto::microvmexec::services::api::v1alpha1::micro_vm_exec_client::MicroVmExecClient;
use battery_proto::microvmexec::services::api::v1alpha1::{
    ExecCommandRequest, ExecStart, exec_command_request, exec_command_response,
};
use tokio::time::timeout;
use tonic::Code;
use tonic::transport::Channel;

/// battery requires flintlockd v0.15.2 or newer (§2).
pub(crate) const MIN_VERSION: (u64, u64, u64) = (0, 15, 2);
/// ServerInfo's deadline at AddHost/UpdateHost and before a host's first provision (§4.8).
pub(crate) const SERVER_INFO_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of the GetMicroVM behind ClaimVMResponse.network_interfaces.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Each readiness probe is capped at min(interval, 5 s) (§2.3).
const READY_PROBE_CAP: Duration = Duration::from_secs(5);
/// How much of a hook's stdout/stderr is kept for the log when it fails.
const OUTPUT_TAIL: usize = 2048;

#[derive(Debug, thiserror::Error)]
pub(crate) enum FlintlockError {
    #[error("no flintlock connection for host {0}")]
    NoConnection(String),
    #[error("flintlock {call}: {status}")]
    Rpc {
        call: &'static str,
        status: Box<tonic::Status>,
    },
    #[error("flintlock {call}: no answer within {after:?}")]
    Timeout { call: &'static str, after: Duration },
    #[error("flintlock CreateMicroVM answered without a MicroVM uid")]
    NoUid,
    #[error("flintlock ServerInfo answered without a version")]
    NoVersion,
    #[error("flintlock version {0:?} is older than the required v0.15.2 (or unparseable)")]
    TooOld(String),
    #[error("exec {cmd:?}: {reason}")]
    Exec { cmd: String, reason: String },
}

impl FlintlockError {
    fn rpc(call: &'static str, status: tonic::Status) -> Self {
        Self::Rpc {
            call,
            status: Box::new(status),
        }
    }
}

type Result<T, E = FlintlockError> = std::result::Result<T, E>;

/// Runs `call` with a deadline.
async fn bounded<T>(
    call: &'static str,
    after: Duration,
    fut: impl Future<Output = Result<T>>,
) -> Result<T> {
    timeout(after, fut)
        .await
        .map_err(|_| FlintlockError::Timeout { call, after })?
}

/// One registered host's flintlock API over its (lazily re-dialled) channel.
#[derive(Clone)]
pub(crate) struct Flintlock {
    channel: Channel,
}

impl Flintlock {
    pub(crate) fn new(channel: Channel) -> Self {
        Self { channel }
    }

    fn microvm(&self) -> MicroVmClient<Channel> {
        MicroVmClient::new(self.channel.clone())
    }

    /// The version flintlockd reports through ServerInfo.
    pub(crate) async fn server_info(&self) -> Result<String> {
        bounded("ServerInfo", SERVER_INFO_TIMEOUT, async {
            let info = self
                .microvm()
                .server_info(())
                .await
                .map_err(|status| FlintlockError::rpc("ServerInfo", status))?
                .into_inner();
            info.version
                .map(|v| v.version)
                .filter(|v| !v.is_empty())
                .ok_or(FlintlockError::NoVersion)
        })
        .await
    }

    /// Creates a MicroVM and returns flintlock's uid for it.
    pub(crate) async fn create(&self, spec: MicroVmSpec, deadline: Duration) -> Result<String> {
        bounded("CreateMicroVM", deadline, async {
            let created = self
                .microvm()
                .create_micro_vm(CreateMicroVmRequest {
                    microvm: Some(spec),
                    metadata: HashMap::new(),
                })
                .await
                .map_err(|status| FlintlockError::rpc("CreateMicroVM", status))?
                .into_inner();
            created
                .microvm
                .and_then(|vm| vm.spec)
                .and_then(|spec| spec.uid)
                .filter(|uid| !uid.is_empty())
                .ok_or(FlintlockError::NoUid)
        })
        .await
    }

    pub(crate) async fn get(&self, uid: &str, deadline: Duration) -> Result<MicroVm> {
        bounded("GetMicroVM", deadline, async {
            self.microvm()
                .get_micro_vm(GetMicroVmRequest {
                    uid: uid.to_owned(),
                })
                .await
                .map_err(|status| FlintlockError::rpc("GetMicroVM", status))?
                .into_inner()
                .microvm
                .ok_or_else(|| {
                    FlintlockError::rpc("GetMicroVM", tonic::Status::not_found("no microvm"))
                })
        })
        .await
    }

    /// Deletes a MicroVM; NOT_FOUND counts as done (§4.5).
    pub(crate) async fn delete(&self, uid: &str, deadline: Duration) -> Result<()> {
        bounded("DeleteMicroVM", deadline, async {
            match self
                .microvm()
                .delete_micro_vm(DeleteMicroVmRequest {
                    uid: uid.to_owned(),
                })
                .await
            {
                Ok(_) => Ok(()),
                Err(status) if status.code() == Code::NotFound => Ok(()),
                Err(status) => Err(FlintlockError::rpc("DeleteMicroVM", status)),
            }
        })
        .await
    }

    /// ClaimVMResponse.network_interfaces: best effort, an empty map on any failure (§4.3).
    pub(crate) async fn network_interfaces(
        &self,
        uid: &str,
    ) -> HashMap<String, NetworkInterfaceStatus> {
        match self.get(uid, LOOKUP_TIMEOUT).await {
            Ok(vm) => vm
                .status
                .map(|status| status.network_interfaces)
                .unwrap_or_default(),
            Err(err) => {
                tracing::debug!(vm = uid, error = %err, "network interfaces unavailable");
                HashMap::new()
            }
        }
    }

    /// Runs one command as one ExecCommand stream: `start`, then half-close; collects
    /// output until `exit_code` (§2.3). Returns the exit code; an `error` message, a
    /// transport error or EOF before the exit code is an error.
    async fn exec(
        &self,
        uid: &str,
        cmd: &str,
        shell: bool,
        timeout_seconds: i32,
    ) -> Result<(i32, String)> {
        let fail = |reason: String| FlintlockError::Exec {
            cmd: cmd.to_owned(),
            reason,
        };
        let start = ExecCommandRequest {
            payload: Some(exec_command_request::Payload::Start(ExecStart {
                uid: uid.to_owned(),
                cmd: cmd.to_owned(),
                shell,
                has_stdin: false,
                timeout_seconds,
                ..ExecStart::default()
            })),
        };
        let mut responses = MicroVmExecClient::new(self.channel.clone())
            .exec_command(tokio_stream::iter([start]))
            .await
            .map_err(|status| FlintlockError::rpc("ExecCommand", status))?
            .into_inner();
        let mut output = Tail::default();
        loop {
            let message = responses
                .message()
                .await
                .map_err(|status| FlintlockError::rpc("ExecCommand", status))?;
            let Some(message) = message else {
                return Err(fail(format!(
                    "stream ended before an exit code; output: {}",
                    output.text()
                )));
            };
            match message.payload {
                Some(exec_command_response::Payload::Stdout(bytes))
                | Some(exec_command_response::Payload::Stderr(bytes)) => output.push(&bytes),
                Some(exec_command_response::Payload::ExitCode(code)) => {
                    return Ok((code, output.text()));
                }
                Some(exec_command_response::Payload::Error(error)) => {
                    return Err(fail(format!("{error}; output: {}", output.text())));
                }
                None => {}
            }
        }
    }

    /// A create or pre-lease hook command: `sh -c`, no stdin; non-zero exit fails.
    pub(crate) async fn run_hook(
        &self,
        uid: &str,
        cmd: &str,
        exec_timeout: Duration,
    ) -> Result<()> {
        let (code, output) = self
            .exec(uid, cmd, true, timeout_seconds(exec_timeout))
            .await?;
        if code == 0 {
            Ok(())
        } else {
            Err(FlintlockError::Exec {
                cmd: cmd.to_owned(),
                reason: format!("exit code {code}; output: {output}"),
            })
        }
    }

    /// Waits for the guest agent as poolmgrd's WaitReady: runs `true` (shell) until any
    /// exit code comes back, each attempt capped at min(interval, 5 s), waiting `interval`
    /// after each failed one, for at most `total` (§2.3).
    pub(crate) async fn wait_ready(
        &self,
        uid: &str,
        interval: Duration,
        total: Duration,
    ) -> Result<()> {
        let cap = interval.min(READY_PROBE_CAP);
        let mut last_error = String::from("no attempt finished");
        let probing = async {
            loop {
                last_error = match timeout(cap, self.exec(uid, "true", true, 0)).await {
                    Ok(Ok(_)) => return,
                    Ok(Err(err)) => err.to_string(),
                    Err(_) => format!("probe took longer than {cap:?}"),
                };
                tokio::time::sleep(interval).await;
            }
        };
        timeout(total, probing)
            .await
            .map_err(|_| FlintlockError::Exec {
                cmd: "true".to_owned(),
                reason: format!("guest agent not ready within {total:?}: {last_error}"),
            })
    }
}

/// ExecStart.timeout_seconds: whole seconds, rounded up; 0 means no timeout.
fn timeout_seconds(limit: Duration) -> i32 {
    let secs = limit.as_secs() + u64::from(limit.subsec_nanos() > 0);
    i32::try_from(secs).unwrap_or(i32::MAX)
}

/// The last few KiB of a command's output, for logs.
#[derive(Default)]
struct Tail(Vec<u8>);

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
        if self.0.len() > OUTPUT_TAIL {
            self.0.drain(..self.0.len() - OUTPUT_TAIL);
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0).trim().to_owned()
    }
}

/// Accepts flintlock versions >= v0.15.2. As poolmgrd does, everything from the first
/// `-` or `+` is dropped first, so a pre-release or a `git describe` build counts as the
/// release it is built on; a version that does not parse is refused.
pub(crate) fn check_version(version: &str) -> Result<()> {
    match parse_version(version) {
        Some(parsed) if parsed >= MIN_VERSION => Ok(()),
        _ => Err(FlintlockError::TooOld(version.to_owned())),
    }
}

/// (major, minor, patch) of the version's core. "v" prefix optional, missing minor/patch
/// read as 0.
fn parse_version(version: &str) -> Option<(u64, u64, u64)> {
    let version = version.strip_prefix('v').unwrap_or(version);
    let core = version.split(['-', '+']).next()?;
    let mut parts = core.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    let patch = parts.next().map_or(Some(0), |p| p.parse().ok())?;
    if parts.next().is_some() {
        return None;
    }
    Some((major, minor, patch))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_as_semver() {
        for ok in [
            "v0.15.2",
            "0.15.2",
            "v0.15.3",
            "v0.16.0",
            "v1.0.0",
            "v0.15.2+build.1",
            "v0.16.0-rc.1",
            // poolmgrd compares the core only: a pre-release or a build past the tag.
            "v0.15.2-rc.1",
            "v0.15.2-3-gabc1234",
        ] {
            assert!(check_version(ok).is_ok(), "{ok}");
        }
        for old in [
            "v0.15.1",
            "v0.15.1-9-gabc1234",
            "v0.14.9",
            "",
            "dev",
            "v0.15.2.1",
            "vx.1.2",
        ] {
            assert!(check_version(old).is_err(), "{old}");
        }
        assert_eq!(parse_version("v1"), Some((1, 0, 0)));
    }

    #[test]
    fn exec_timeout_rounds_up_to_seconds() {
        assert_eq!(timeout_seconds(Duration::ZERO), 0);
        assert_eq!(timeout_seconds(Duration::from_millis(1)), 1);
        assert_eq!(timeout_seconds(Duration::from_secs(30)), 30);
    }

    #[test]
    fn tail_keeps_the_end() {
        let mut tail = Tail::default();
        tail.push(&[b'a'; OUTPUT_TAIL]);
        tail.push(b"xyz");
        assert_eq!(tail.0.len(), OUTPUT_TAIL);
        assert!(tail.text().ends_with("xyz"));
    }
}
