//! The CRD design made real: agent-sandbox (`sigs.k8s.io/agent-sandbox`, its controller and
//! CRDs built by `e2e/go/build` from its Go module) on the rig's own kube-apiserver, in the
//! same run as binds of ours through it. Its CRDs are installed, its controller runs with
//! its extensions (SandboxTemplate, SandboxWarmPool, SandboxClaim) as the cluster's admin,
//! and a SandboxWarmPool holds a warm Sandbox for every claim before anything is timed, as
//! our Pools hold a MicroVM for every bind. No Pod runs here: the bench's kubelet stand-in
//! binds each of the pool's Pods to a Node and marks it Running and Ready, the writes a
//! scheduler and a kubelet make at the least. SandboxClaims are then timed from their
//! create to their `Ready` condition, serially and in a burst, beside as many binds of ours
//! through the same kube-apiserver; etcd's own counters say what each wrote, less what the
//! cluster writes idle over as long, and etcd's history says to which resources.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt as _;
use kube::api::{Api, ObjectMeta, PostParams};
use serde_json::json;
use tokio::process::Command;

mod claims;
mod etcd;
mod kubelet;
mod peer;

use claims::{ReadyClaims, burst_binds, burst_claims, serial_binds, serial_claims};
use etcd::{Etcd, Window};
use kubelet::Kubelet;
use peer::{
    BASE_TIMEOUT, GROUP, NAMESPACE, PER_OBJECT_TIMEOUT, POLL, VERSION, WARM_POOL, extension,
};

use crate::report::{Row, Unit, millis, percentiles, quantile, rank};
use crate::rig::{READY_TIMEOUT, Rig, ready_within};
use battery_e2e::control_plane::binaries;
use battery_e2e::process::Process;

pub const AGENT_SANDBOX: &str = "agent-sandbox (CRD design)";

/// The SandboxTemplate.
const TEMPLATE: &str = "bench";
/// Our Pool beside it, with a MicroVM for every bind.
const POOL: &str = "beside-agent-sandbox";
/// The controller's binary and its CRDs' directory, as `e2e/go/build` leaves them.
const CONTROLLER: &str = "agent-sandbox-controller";
const CRDS: &str = "agent-sandbox-crds";
/// Connections the burst's creates share, ours and agent-sandbox's alike, as `bind_many`.
const CONNECTIONS: usize = 8;
/// The controller holds refills back this long after claims take Sandboxes from the pool,
/// its own knob for bursts: nothing refills while measured, as our Pools do not
/// ([`Rig::create_pool`]). What a refill writes is measured apart, as the pool fills.
const REPLENISH_DELAY: &str = "1h";
/// The controller's default for the most Sandboxes one pass creates. The pool is filled in
/// one pass, the flag raised to its size: the delay above would hold a second pass back,
/// for while its cache catches up with the first pass's creates it counts fewer members
/// than it made, and takes that for claims taking them.
const MAX_BATCH: usize = 300;
/// The idle baseline's length: the longest window measured, within these.
const IDLE: (Duration, Duration) = (Duration::from_secs(10), Duration::from_secs(60));
/// What kube-apiserver writes to etcd on its own, whatever its clients do: its lease
/// renewals (its identity's, and the peer endpoints').
const KUBE_APISERVER_OWN: [&str; 2] = ["leases", "peerserverleases"];

/// Runs agent-sandbox on the rig's cluster and times `serial` SandboxClaims one at a time
/// and `burst` at once, each beside as many binds of ours through the same kube-apiserver.
pub async fn run(rig: &Rig, serial: usize, burst: usize) -> Result<Vec<Row>> {
    if serial == 0 || burst == 0 {
        bail!("agent-sandbox: {serial} serial and {burst} burst claims; both must be some");
    }
    let claims = serial + burst;
    eprintln!("bench: agent-sandbox: booting {claims} MicroVMs for our binds beside it");
    let pool = rig.create_pool(POOL, i32::try_from(claims)?).await?;
    let plane = &rig.cluster().plane;
    let admin = plane.admin().await;
    let etcd = Etcd::new(plane.etcd_url())?;
    install_crds(&admin).await?;
    make_namespace(&admin).await?;
    let kubelet = Kubelet::start(admin.clone());
    let mut controller = start_controller(rig, claims);
    eprintln!("bench: agent-sandbox: filling a SandboxWarmPool of {claims}");
    let ((), filling) = etcd
        .around(fill(&admin, &mut controller, &kubelet, claims))
        .await?;
    let ready = ReadyClaims::start(&admin).await?;

    let client = rig.kube_client().await?;
    eprintln!("bench: agent-sandbox: {serial} serial binds, then as many SandboxClaims");
    // Every claim should adopt a warm Sandbox: a Pod the stand-in starts meanwhile is one
    // made for a claim (agent-sandbox's cold path), which would have waited for a boot.
    // Ours first, each time: agent-sandbox's claims leave the machine busy for a while
    // (its controller's reconciles, cold Sandboxes' Pods), and ours leave nothing.
    let (ours, our_serial) = etcd
        .around(serial_binds(&client, &pool.name, serial))
        .await?;
    let warm = kubelet.marked();
    let ((created, theirs), their_serial) =
        etcd.around(serial_claims(&client, &ready, serial)).await?;
    let cold_serial = kubelet.marked() - warm;
    let mut clients = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        clients.push(rig.kube_client().await?);
    }
    eprintln!("bench: agent-sandbox: {burst} binds at once, then as many SandboxClaims");
    let ((our_burst, our_all), our_burst_writes) = etcd
        .around(burst_binds(&clients, &pool.name, burst))
        .await?;
    let before = kubelet.marked();
    let ((their_burst, their_all), their_burst_writes) =
        etcd.around(burst_claims(&clients, &ready, burst)).await?;
    let cold_burst = kubelet.marked() - before;
    let longest = [
        &filling,
        &their_serial,
        &our_serial,
        &their_burst_writes,
        &our_burst_writes,
    ]
    .iter()
    .map(|w| w.took)
    .max()
    .unwrap_or_default()
    .clamp(IDLE.0, IDLE.1);
    eprintln!("bench: agent-sandbox: {longest:?} idle, for etcd's baseline");
    let ((), idle) = etcd
        .around(async {
            tokio::time::sleep(longest).await;
            Ok(())
        })
        .await?;
    controller.assert_running();
    controller.kill().await;

    let mut rows = vec![Row::new(
        AGENT_SANDBOX,
        "Pods bound to a Node and marked Running and Ready by the bench's kubelet stand-in \
         (no scheduler or kubelet runs here)",
        kubelet.marked() as f64,
        Unit::Count,
    )];
    for (timed, cold) in [
        (format!("{serial} serial"), cold_serial),
        (format!("burst of {burst}"), cold_burst),
    ] {
        rows.push(Row::new(
            AGENT_SANDBOX,
            format!(
                "Sandboxes made for claims, not adopted warm, in the {timed} (their Pods \
                 started at once by the stand-in; a kubelet would boot them)"
            ),
            cold as f64,
            Unit::Count,
        ));
    }
    rows.extend(percentiles(
        AGENT_SANDBOX,
        "SandboxClaim create -> Ready, serial",
        &theirs,
    ));
    rows.push(Row::millis(
        AGENT_SANDBOX,
        "SandboxClaim create -> 201 alone, serial p50",
        quantile(&created, 0.5),
    ));
    rows.extend(percentiles(
        AGENT_SANDBOX,
        "our bind through kube-apiserver, POST -> 201 Bound, serial",
        &ours,
    ));
    for p in [0.5, 0.99] {
        rows.push(ratio(
            &format!("serial {}", rank(p)),
            quantile(&theirs, p),
            quantile(&ours, p),
        ));
    }
    rows.extend([
        Row::millis(
            AGENT_SANDBOX,
            format!("{burst} SandboxClaims at once: all Ready"),
            their_all,
        ),
        Row::millis(
            AGENT_SANDBOX,
            format!("{burst} binds of ours at once through kube-apiserver: all Bound"),
            our_all,
        ),
        ratio(&format!("burst of {burst}, all"), their_all, our_all),
    ]);
    for p in [0.5, 0.99] {
        let name = rank(p);
        let (theirs, ours) = (quantile(&their_burst, p), quantile(&our_burst, p));
        rows.push(Row::millis(
            AGENT_SANDBOX,
            format!("SandboxClaim create -> Ready in the burst {name}"),
            theirs,
        ));
        rows.push(Row::millis(
            AGENT_SANDBOX,
            format!("our bind in the burst {name}"),
            ours,
        ));
        rows.push(ratio(&format!("burst {name}"), theirs, ours));
    }

    rows.push(Row::new(
        AGENT_SANDBOX,
        format!(
            "etcd writes a second, idle over {:.0} s (kube-apiserver's own; subtracted below)",
            idle.took.as_secs_f64()
        ),
        idle.writes / idle.took.as_secs_f64(),
        Unit::PerSecond,
    ));
    let per = |window: &Window, count: usize| (window.net(&idle) / count as f64).max(0.0);
    rows.extend([
        Row::new(
            AGENT_SANDBOX,
            "etcd writes per SandboxClaim, serial",
            per(&their_serial, serial),
            Unit::Count,
        ),
        Row::new(
            AGENT_SANDBOX,
            format!("etcd writes per SandboxClaim, burst of {burst}"),
            per(&their_burst_writes, burst),
            Unit::Count,
        ),
        Row::new(
            AGENT_SANDBOX,
            "etcd writes per warm Sandbox made (its Pod's binding and status by the stand-in \
             included): a refill's cost per claim",
            per(&filling, claims),
            Unit::Count,
        ),
    ]);
    // Ours from etcd's history, without kube-apiserver's own lease renewals, which an
    // idle baseline subtracts only on average.
    for (timed, window, count) in [
        ("serial".to_owned(), &our_serial, serial),
        (format!("burst of {burst}"), &our_burst_writes, burst),
    ] {
        let writes: u64 = etcd
            .by_resource(window)
            .await?
            .into_iter()
            .filter(|(resource, _)| !KUBE_APISERVER_OWN.contains(&resource.as_str()))
            .map(|(_, writes)| writes)
            .sum();
        rows.push(
            Row::new(
                AGENT_SANDBOX,
                format!(
                    "etcd writes per bind of ours through kube-apiserver, {timed} (from \
                     etcd's history, kube-apiserver's own leases left out)"
                ),
                writes as f64 / count as f64,
                Unit::Count,
            )
            .at_most(0.0),
        );
    }
    for (what, window, count) in [
        ("SandboxClaim, serial", &their_serial, serial),
        ("warm Sandbox made", &filling, claims),
    ] {
        for (resource, writes) in etcd.by_resource(window).await? {
            rows.push(Row::new(
                AGENT_SANDBOX,
                format!("etcd writes per {what}, to {resource} (from etcd's history, idle's not subtracted)"),
                writes as f64 / count as f64,
                Unit::Count,
            ));
        }
    }
    Ok(rows)
}

/// How many times agent-sandbox's `theirs` is ours, against the 20x.
fn ratio(what: &str, theirs: Duration, ours: Duration) -> Row {
    Row::new(
        AGENT_SANDBOX,
        format!("ratio SandboxClaim / our bind, {what}"),
        millis(theirs) / millis(ours),
        Unit::Times,
    )
    .at_least(20.0)
}

/// Creates agent-sandbox's CRDs, as its release ships them, and waits until each is
/// Established.
async fn install_crds(admin: &kube::Client) -> Result<()> {
    let dir = binaries().join(CRDS);
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let crd: CustomResourceDefinition = serde_norway::from_str(&text)
            .with_context(|| format!("{} is not a CRD", path.display()))?;
        crds.create(&PostParams::default(), &crd)
            .await
            .with_context(|| format!("creating the CRD {}", crd.name_any()))?;
        names.push(crd.name_any());
    }
    if names.is_empty() {
        bail!("{} holds no CRDs: run e2e/go/build", dir.display());
    }
    for name in names {
        let crds = &crds;
        ready_within(
            READY_TIMEOUT,
            &format!("the CRD {name} to be Established"),
            || async {
                let crd = crds.get(&name).await?;
                let established = crd
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| {
                        c.iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    });
                if established {
                    Ok(())
                } else {
                    bail!("{:?}", crd.status)
                }
            },
        )
        .await?;
    }
    Ok(())
}

/// agent-sandbox's namespace, and its `default` ServiceAccount, which Pods need and which
/// nothing else makes here (no kube-controller-manager runs).
async fn make_namespace(admin: &kube::Client) -> Result<()> {
    let named = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    };
    let namespace = Namespace {
        metadata: named(NAMESPACE),
        ..Namespace::default()
    };
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .with_context(|| format!("creating the namespace {NAMESPACE}"))?;
    let account = ServiceAccount {
        metadata: named("default"),
        ..ServiceAccount::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &account)
        .await
        .with_context(|| format!("creating the ServiceAccount {NAMESPACE}/default"))?;
    Ok(())
}

/// agent-sandbox-controller with its extensions, as the cluster's admin, for a warm pool
/// of `replicas`; its log is in the rig's directory.
fn start_controller(rig: &Rig, replicas: usize) -> Process {
    let mut command = Command::new(binaries().join(CONTROLLER));
    command
        .arg("--kubeconfig")
        .arg(rig.cluster().plane.admin_kubeconfig())
        // One replica: no leader election, and no Lease renewals in etcd's counts. Nothing
        // reads its metrics or probes, whose default ports are fixed.
        .args([
            "--extensions",
            "--leader-elect=false",
            "--metrics-bind-address=0",
            "--health-probe-bind-address=0",
        ])
        .arg(format!(
            "--sandbox-warm-pool-replenish-delay={REPLENISH_DELAY}"
        ))
        .arg(format!(
            "--sandbox-warm-pool-max-batch-size={}",
            replicas.max(MAX_BATCH)
        ));
    Process::spawn(command, &rig.dir().join("agent-sandbox-controller.log"))
}

/// Creates the SandboxTemplate and a SandboxWarmPool of `replicas`, and waits until all
/// its Sandboxes are Ready.
async fn fill(
    admin: &kube::Client,
    controller: &mut Process,
    kubelet: &Kubelet,
    replicas: usize,
) -> Result<()> {
    let api_version = format!("{GROUP}/{VERSION}");
    // The image is never pulled: no kubelet runs.
    let template = json!({
        "apiVersion": api_version, "kind": "SandboxTemplate",
        "metadata": {"name": TEMPLATE},
        "spec": {"podTemplate": {"metadata": {}, "spec": {
            "automountServiceAccountToken": false,
            "containers": [{"name": "agent", "image": "registry.invalid/bench/agent:1"}],
        }}},
    });
    let pool = json!({
        "apiVersion": api_version, "kind": "SandboxWarmPool",
        "metadata": {"name": WARM_POOL},
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": TEMPLATE}},
    });
    extension(admin, "SandboxTemplate", "sandboxtemplates")
        .create(&PostParams::default(), &serde_json::from_value(template)?)
        .await
        .context("creating the SandboxTemplate")?;
    let pools = extension(admin, "SandboxWarmPool", "sandboxwarmpools");
    pools
        .create(&PostParams::default(), &serde_json::from_value(pool)?)
        .await
        .context("creating the SandboxWarmPool")?;
    let timeout = BASE_TIMEOUT + PER_OBJECT_TIMEOUT * u32::try_from(replicas)?;
    let deadline = Instant::now() + timeout;
    loop {
        controller.assert_running();
        let status = pools.get(WARM_POOL).await?.data["status"].take();
        if status["readyReplicas"].as_u64() >= Some(replicas as u64) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "waited {timeout:?} for the SandboxWarmPool to hold {replicas} Ready \
                 Sandboxes: its status is {status}, the kubelet stand-in marked {} Pods \
                 Ready (the controller's log is agent-sandbox-controller.log in the rig's \
                 directory)",
                kubelet.marked()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}
