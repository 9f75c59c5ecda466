//! The Host checks behind the agent's `Ready` report (battery-operator EA-030..032): the
//! KVM device, containerd's devmapper thin pool, flintlockd answering, and its exec API
//! enabled. They run in that order and the first that fails gives the reason; a check
//! turned off by `--skip-check` is named in the message as not checked, so a report
//! never claims what it did not look at.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use battery_proto::microvm::services::api::v1alpha1::micro_vm_client::MicroVmClient;
use battery_proto::microvmexec::services::api::v1alpha1::exec_command_request::Payload;
use battery_proto::microvmexec::services::api::v1alpha1::{ExecCommandRequest, ExecStart};
use battery_types::conditions::HostReadyReason;
use clap::ValueEnum;
use tonic::Code;

use crate::flintlock::Flintlock;

/// How long one call to flintlockd may take before it counts as not answering.
const FLINTLOCKD_TIMEOUT: Duration = Duration::from_secs(3);

/// A check `--skip-check` can turn off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Check {
    /// The KVM device.
    Kvm,
    /// containerd's devmapper thin pool.
    ThinPool,
    /// flintlockd answering ServerInfo.
    Flintlockd,
    /// flintlockd's exec API enabled.
    ExecApi,
}

impl Check {
    fn describe(self) -> &'static str {
        match self {
            Self::Kvm => "KVM",
            Self::ThinPool => "the thin pool",
            Self::Flintlockd => "flintlockd",
            Self::ExecApi => "the exec API",
        }
    }
}

/// Which checks run, and on what.
#[derive(Debug, Clone)]
pub struct CheckConfig {
    /// `None`: not checked.
    pub kvm_device: Option<PathBuf>,
    /// `None`: not checked.
    pub thin_pool_device: Option<PathBuf>,
    pub flintlockd: bool,
    pub exec_api: bool,
}

/// One readiness report: the `Ready` condition's status, reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub ready: bool,
    pub reason: HostReadyReason,
    pub message: String,
}

/// Runs the checks that are on, in order, and reports the first failure, or ready.
pub async fn check(config: &CheckConfig, flintlock: &Flintlock) -> Report {
    let mut skipped = Vec::new();
    let mut checked = Vec::new();
    match &config.kvm_device {
        Some(path) => {
            if let Err(message) = check_kvm(path) {
                return not_ready(HostReadyReason::KvmUnavailable, message);
            }
            checked.push(Check::Kvm);
        }
        None => skipped.push(Check::Kvm),
    }
    match &config.thin_pool_device {
        Some(path) => {
            if let Err(message) = check_thin_pool(path) {
                return not_ready(HostReadyReason::ThinPoolMissing, message);
            }
            checked.push(Check::ThinPool);
        }
        None => skipped.push(Check::ThinPool),
    }
    if config.flintlockd {
        if let Err(message) = check_flintlockd(flintlock).await {
            return not_ready(HostReadyReason::FlintlockdNotReady, message);
        }
        checked.push(Check::Flintlockd);
    } else {
        skipped.push(Check::Flintlockd);
    }
    if config.exec_api {
        if let Err((reason, message)) = check_exec_api(flintlock).await {
            return not_ready(reason, message);
        }
        checked.push(Check::ExecApi);
    } else {
        skipped.push(Check::ExecApi);
    }
    let list = |checks: &[Check]| {
        checks
            .iter()
            .map(|c| c.describe())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut message = if checked.is_empty() {
        "no check ran".to_owned()
    } else {
        format!("usable: {}", list(&checked))
    };
    if !skipped.is_empty() {
        message.push_str(&format!("; not checked (turned off): {}", list(&skipped)));
    }
    Report {
        ready: true,
        reason: HostReadyReason::Ready,
        message,
    }
}

fn not_ready(reason: HostReadyReason, message: String) -> Report {
    Report {
        ready: false,
        reason,
        message,
    }
}

/// The KVM device must be a character device the agent can open read-write, as
/// firecracker opens it.
fn check_kvm(path: &Path) -> Result<(), String> {
    let shown = path.display();
    let metadata = std::fs::metadata(path).map_err(|e| format!("KVM device {shown}: {e}"))?;
    if !metadata.file_type().is_char_device() {
        return Err(format!("KVM device {shown} is not a character device"));
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| format!("KVM device {shown} cannot be opened read-write: {e}"))?;
    Ok(())
}

/// The thin pool's device-mapper node (a symlink to a `dm-N` block device) must exist.
fn check_thin_pool(path: &Path) -> Result<(), String> {
    let shown = path.display();
    let metadata = std::fs::metadata(path).map_err(|e| format!("thin pool device {shown}: {e}"))?;
    if !metadata.file_type().is_block_device() {
        return Err(format!("thin pool device {shown} is not a block device"));
    }
    Ok(())
}

/// flintlockd answers `MicroVM.ServerInfo` within the timeout.
async fn check_flintlockd(flintlock: &Flintlock) -> Result<(), String> {
    let mut client = MicroVmClient::new(flintlock.channel());
    match tokio::time::timeout(FLINTLOCKD_TIMEOUT, client.server_info(())).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(status)) => Err(format!(
            "flintlockd ServerInfo failed: {:?}: {}",
            status.code(),
            status.message()
        )),
        Err(_) => Err(format!(
            "flintlockd did not answer ServerInfo within {FLINTLOCKD_TIMEOUT:?}"
        )),
    }
}

/// flintlockd serves `MicroVMExec`: an `ExecCommand` naming no MicroVM is refused by the
/// service as an invalid request when it is registered, and with UNIMPLEMENTED by gRPC
/// itself when flintlockd runs without `--enable-exec-api`. Nothing is run either way.
async fn check_exec_api(flintlock: &Flintlock) -> Result<(), (HostReadyReason, String)> {
    let probe = ExecCommandRequest {
        payload: Some(Payload::Start(ExecStart::default())),
    };
    let answer = tokio::time::timeout(
        FLINTLOCKD_TIMEOUT,
        flintlock.exec(tokio_stream::iter([probe])),
    )
    .await;
    match answer {
        Err(_) => Err((
            HostReadyReason::FlintlockdNotReady,
            format!("flintlockd did not answer ExecCommand within {FLINTLOCKD_TIMEOUT:?}"),
        )),
        Ok(Err(status)) if status.code() == Code::Unimplemented => Err((
            HostReadyReason::ExecDisabled,
            "flintlockd does not serve MicroVMExec: start it with --enable-exec-api".to_owned(),
        )),
        Ok(Err(status)) if matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded) => {
            Err((
                HostReadyReason::FlintlockdNotReady,
                format!(
                    "flintlockd ExecCommand failed: {:?}: {}",
                    status.code(),
                    status.message()
                ),
            ))
        }
        // Any other answer comes from the exec service itself.
        Ok(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvm_must_exist_and_be_a_character_device() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("kvm");
        let message = check_kvm(&missing).unwrap_err();
        assert!(
            message.contains(&missing.display().to_string()),
            "{message}"
        );
        assert!(message.contains("No such file"), "{message}");

        std::fs::write(&missing, b"").unwrap();
        let message = check_kvm(&missing).unwrap_err();
        assert!(message.ends_with("is not a character device"), "{message}");

        // /dev/null is a character device anyone can open read-write.
        check_kvm(Path::new("/dev/null")).unwrap();
    }

    #[test]
    fn the_thin_pool_must_exist_and_be_a_block_device() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("flintlock-thinpool");
        let message = check_thin_pool(&missing).unwrap_err();
        assert!(message.starts_with("thin pool device"), "{message}");
        assert!(message.contains("No such file"), "{message}");

        std::fs::write(&missing, b"").unwrap();
        let message = check_thin_pool(&missing).unwrap_err();
        assert!(message.ends_with("is not a block device"), "{message}");

        let message = check_thin_pool(Path::new("/dev/null")).unwrap_err();
        assert!(message.ends_with("is not a block device"), "{message}");
    }
}
