//! A process as the API serves it: the object its create carried, which its agent keeps
//! opaque, with the status the agent reports (ADR 44).

use battery_api_machinery::status::ApiError;
use battery_types::{MicroVMProcess, MicroVMProcessStatus, ProcessPhase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::relay::{AgentProcess, ProcessRun};

/// Seconds since the Unix epoch as a `Time`.
fn time(seconds: i64) -> Option<Time> {
    Timestamp::from_second(seconds).ok().map(Time)
}

/// The object `process` carries, with its status from the agent of `host`.
pub(super) fn served(process: &AgentProcess, host: &str) -> Result<MicroVMProcess, ApiError> {
    let mut object: MicroVMProcess =
        serde_json::from_str(&process.object).map_err(ApiError::internal)?;
    let (phase, exit_code, signal, message) = match &process.run {
        ProcessRun::Running => (ProcessPhase::Running, None, None, None),
        ProcessRun::Exited { code, signal } => {
            let phase = if *code == 0 {
                ProcessPhase::Succeeded
            } else {
                ProcessPhase::Failed
            };
            (phase, Some(*code), signal.clone(), None)
        }
        ProcessRun::Failed(message) => (ProcessPhase::Failed, None, None, Some(message.clone())),
        ProcessRun::Lost(message) => (ProcessPhase::Lost, None, None, Some(message.clone())),
    };
    object.status = Some(MicroVMProcessStatus {
        phase: Some(phase),
        exit_code,
        signal,
        message,
        node_name: Some(host.to_owned()),
        start_time: time(process.start_time),
        finish_time: process.end_time.and_then(time),
    });
    if let Some(asked) = process.deletion_time {
        object.metadata.deletion_timestamp = time(asked);
        object.metadata.deletion_grace_period_seconds = Some(object.spec.grace_period_seconds());
    }
    Ok(object)
}

/// The object as its agent keeps it: metadata and spec, no status.
pub(super) fn kept(process: &MicroVMProcess) -> Result<String, ApiError> {
    let mut kept = process.clone();
    kept.status = None;
    kept.metadata.resource_version = None;
    serde_json::to_string(&kept).map_err(ApiError::internal)
}

/// Whether it still runs.
pub(super) fn running(process: &MicroVMProcess) -> bool {
    process
        .status
        .as_ref()
        .and_then(|status| status.phase.as_ref())
        .is_some_and(|phase| *phase == ProcessPhase::Running)
}

#[cfg(test)]
mod tests {
    use super::*;
    use battery_types::MicroVMProcessSpec;

    fn agent_process(run: ProcessRun) -> AgentProcess {
        let mut object = MicroVMProcess::new(
            "p",
            MicroVMProcessSpec {
                claim_name: "c".into(),
                command: vec!["sleep".into(), "9".into()],
                ..MicroVMProcessSpec::default()
            },
        );
        object.metadata.namespace = Some("ns".into());
        AgentProcess {
            name: "p".into(),
            object: kept(&object).expect("kept"),
            claim_uid: "u".into(),
            run,
            start_time: 1_700_000_000,
            end_time: Some(1_700_000_010),
            deletion_time: None,
        }
    }

    #[test]
    fn the_agents_report_becomes_the_status() {
        let exited = |code, signal: Option<&str>| ProcessRun::Exited {
            code,
            signal: signal.map(str::to_owned),
        };
        for (run, phase, code, signal) in [
            (exited(0, None), ProcessPhase::Succeeded, Some(0), None),
            (
                exited(143, Some("SIGTERM")),
                ProcessPhase::Failed,
                Some(143),
                Some("SIGTERM"),
            ),
            (
                ProcessRun::Lost("restarted".into()),
                ProcessPhase::Lost,
                None,
                None,
            ),
        ] {
            let object = served(&agent_process(run), "host-0").expect("served");
            assert_eq!(object.spec.command, ["sleep", "9"]);
            assert!(!running(&object));
            let status = object.status.expect("a status");
            assert_eq!(status.phase, Some(phase));
            assert_eq!((status.exit_code, status.signal.as_deref()), (code, signal));
            assert_eq!(status.node_name.as_deref(), Some("host-0"));
            assert!(status.finish_time.is_some());
        }
    }
}
