//! The agent's Host on the Kubernetes API: at start it registers the Host (creates it,
//! or sets only `spec.agentAddress` on one that exists, leaving an admin's fields alone),
//! then reports the [`readiness`](crate::readiness) checks as the Host's `Ready`
//! condition through `hosts/<name>/status`: at once, whenever the answer changes, and
//! every report interval as a heartbeat. A failed call is retried with backoff and logged
//! once per outage; it never stops the agent, which keeps relaying.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use battery_types::conditions::{self, ConditionStatus};
use battery_types::{Host, HostSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

use crate::flintlock::Flintlock;
use crate::readiness::{self, CheckConfig, Report};

/// The field manager of the agent's writes.
const FIELD_MANAGER: &str = "battery-agent";
/// The first retry's wait after a failed call; doubled up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What the agent registers and how it reports.
#[derive(Debug, Clone)]
pub struct Registration {
    /// The Host's name.
    pub host: String,
    /// The Host as the agent creates it; only `agentAddress` is written to one that
    /// exists.
    pub spec: HostSpec,
    /// `None`: found as kubectl finds it.
    pub kubeconfig: Option<PathBuf>,
    pub report_interval: Duration,
    pub checks: CheckConfig,
}

/// A Kubernetes client for the agent's identity.
pub async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(config)?)
}

/// Registers the Host, then reports its readiness until the task is dropped. Never
/// returns an error: every failure is retried.
pub async fn run(registration: Registration, client: kube::Client, flintlock: Flintlock) {
    register(&client, &registration).await;
    report(registration, client, flintlock).await;
}

/// Reports the readiness of a registered Host until the task is dropped.
pub async fn report(registration: Registration, client: kube::Client, flintlock: Flintlock) {
    let hosts: Api<Host> = Api::all(client);
    let host = registration.host.as_str();
    // Checks run more often than the heartbeat, so a change is reported within a probe.
    let probe = registration.report_interval.min(CHANGE_PROBE);
    let mut last: Option<(Report, Instant)> = None;
    loop {
        let report = readiness::check(&registration.checks, &flintlock).await;
        let changed = last.as_ref().is_none_or(|(sent, _)| *sent != report);
        let heartbeat_due = last
            .as_ref()
            .is_some_and(|(_, at)| at.elapsed() >= registration.report_interval);
        if changed {
            if report.ready {
                tracing::info!(host, message = %report.message, "the Host is ready");
            } else {
                tracing::warn!(host, reason = %report.reason, message = %report.message, "the Host is not ready");
            }
        }
        if changed || heartbeat_due {
            retry("reporting the Host's readiness", host, || {
                report_ready(&hosts, host, &report)
            })
            .await;
            last = Some((report, Instant::now()));
        }
        tokio::time::sleep(probe).await;
    }
}

/// How often the checks run between heartbeats, to notice a change.
const CHANGE_PROBE: Duration = Duration::from_secs(1);

/// Registers the Host, retrying until it is done.
pub async fn register(client: &kube::Client, registration: &Registration) {
    let hosts: Api<Host> = Api::all(client.clone());
    let host = registration.host.as_str();
    retry("registering the Host", host, || {
        create_or_point(&hosts, host, &registration.spec)
    })
    .await;
    tracing::info!(host, agent_address = ?registration.spec.agent_address, "registered the Host");
}

/// Creates the Host, or sets only its `agentAddress` if it exists.
async fn create_or_point(
    hosts: &Api<Host>,
    name: &str,
    spec: &HostSpec,
) -> Result<(), kube::Error> {
    let host = Host::new(name, spec.clone());
    match hosts.create(&post_params(), &host).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            // A merge patch without a resourceVersion cannot conflict, and touches no
            // field but the agent's own.
            let patch = json!({"spec": {"agentAddress": spec.agent_address}});
            hosts
                .patch(name, &patch_params(), &Patch::Merge(&patch))
                .await
                .map(drop)
        }
        Err(error) => Err(error),
    }
}

/// Writes the report as the Host's `Ready` condition.
async fn report_ready(hosts: &Api<Host>, name: &str, report: &Report) -> Result<(), kube::Error> {
    let condition = Condition {
        type_: conditions::READY.to_owned(),
        status: ConditionStatus::from(report.ready).as_str().to_owned(),
        reason: report.reason.as_str().to_owned(),
        message: report.message.clone(),
        observed_generation: None,
        last_transition_time: now(),
    };
    let patch = json!({"status": {"conditions": [condition]}});
    hosts
        .patch_status(name, &patch_params(), &Patch::Merge(&patch))
        .await
        .map(drop)
}

fn now() -> Time {
    let now = Timestamp::now();
    Time(Timestamp::from_second(now.as_second()).unwrap_or(now))
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

/// Calls `call` until it succeeds, backing off; warns once when an outage starts and
/// says when it ended.
async fn retry<F, Fut>(what: &str, host: &str, mut call: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), kube::Error>>,
{
    let mut backoff = MIN_BACKOFF;
    let mut failing = false;
    loop {
        match call().await {
            Ok(()) => {
                if failing {
                    tracing::info!(host, "{what}: the Kubernetes API answers again");
                }
                return;
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(host, error = %error, "{what} failed; retrying with backoff");
                    failing = true;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}
