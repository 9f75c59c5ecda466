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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use base64::Engine as _;
use futures::StreamExt as _;
use http::{Method, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Binding, Namespace, ObjectReference, Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, Patch, PatchParams,
    PostParams, WatchEvent, WatchParams,
};
use kube::{Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::process::Command;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::binds;
use super::client::Client;
use super::report::{Row, Unit, millis, percentiles, quantile, rank};
use super::rig::{READY_TIMEOUT, Rig, ready_within};
use battery_e2e::control_plane::binaries;
use battery_e2e::process::Process;

pub const AGENT_SANDBOX: &str = "agent-sandbox (CRD design)";

/// agent-sandbox's objects' namespace: apart from ours, so the kubelet stand-in watches
/// only its Pods.
const NAMESPACE: &str = "agent-sandbox";
const GROUP: &str = "extensions.agents.x-k8s.io";
const VERSION: &str = "v1beta1";
/// The SandboxTemplate and the SandboxWarmPool.
const TEMPLATE: &str = "bench";
const WARM_POOL: &str = "bench";
/// Our Pool beside it, with a MicroVM for every bind.
const POOL: &str = "beside-agent-sandbox";
/// The controller's binary and its CRDs' directory, as `e2e/go/build` leaves them.
const CONTROLLER: &str = "agent-sandbox-controller";
const CRDS: &str = "agent-sandbox-crds";
/// The Node the kubelet stand-in binds every Pod to (there is no Node object: nothing
/// reads it).
const NODE: &str = "bench-node";
/// The first Pod IP the stand-in hands out; a claim adopts only a Sandbox with one.
const POD_IPS: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// How many Pods the stand-in marks at once: kube-rs speaks HTTP/1.1, a connection a
/// request.
const STAND_IN_CONCURRENCY: usize = 16;
/// Connections the burst's creates share, ours and agent-sandbox's alike, as `bind_many`.
const CONNECTIONS: usize = 8;
/// How long one serial claim may take to be Ready.
const CLAIM_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a burst may take to be all Ready, and the pool to fill: a base, and so much
/// a claim or a Sandbox more (a 2-core machine runs kube-apiserver, etcd, the controller
/// and the stand-in at once).
const BASE_TIMEOUT: Duration = Duration::from_secs(120);
const PER_OBJECT_TIMEOUT: Duration = Duration::from_millis(200);
/// The controller holds refills back this long after claims take Sandboxes from the pool,
/// its own knob for bursts: nothing refills while measured, as our Pools do not
/// ([`Rig::create_pool`]). What a refill writes is measured apart, as the pool fills.
const REPLENISH_DELAY: &str = "1h";
/// The controller's default for the most Sandboxes one pass creates. The pool is filled in
/// one pass, the flag raised to its size: the delay above would hold a second pass back,
/// for while its cache catches up with the first pass's creates it counts fewer members
/// than it made, and takes that for claims taking them.
const MAX_BATCH: usize = 300;
/// etcd is quiet once it has taken no write for this long: what a piece of work set off
/// (reconciles, Events) lands after it returns.
const QUIET: Duration = Duration::from_secs(1);
/// How long etcd may take to be quiet after the work.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The idle baseline's length: the longest window measured, within these.
const IDLE: (Duration, Duration) = (Duration::from_secs(10), Duration::from_secs(60));
/// What kube-apiserver writes to etcd on its own, whatever its clients do: its lease
/// renewals (its identity's, and the peer endpoints').
const KUBE_APISERVER_OWN: [&str; 2] = ["leases", "peerserverleases"];
/// How long one request to etcd, or the read of its history, may take.
const ETCD_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(100);
/// How long a failed list or watch waits before it is tried again.
const RETRY: Duration = Duration::from_secs(1);

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

/// An agent-sandbox API of `kind` in its namespace.
fn extension(admin: &kube::Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, kind), plural);
    Api::namespaced_with(admin.clone(), NAMESPACE, &resource)
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

/// The SandboxClaim `name` on the warm pool, created through kube-apiserver as the
/// kubectl user (who creates our claims too).
async fn create_claim(client: &Client, name: &str) -> Result<()> {
    let claim = json!({
        "apiVersion": format!("{GROUP}/{VERSION}"), "kind": "SandboxClaim",
        "metadata": {"name": name},
        "spec": {"warmPoolRef": {"name": WARM_POOL}},
    });
    client
        .json(
            Method::POST,
            &format!("/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/sandboxclaims"),
            Some(&claim),
            StatusCode::CREATED,
        )
        .await
        .with_context(|| format!("creating the SandboxClaim {name}"))?;
    Ok(())
}

/// `count` SandboxClaims one at a time: each one's create alone, and its create to Ready.
async fn serial_claims(
    client: &Client,
    ready: &ReadyClaims,
    count: usize,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut created, mut readied) = (Vec::with_capacity(count), Vec::with_capacity(count));
    for i in 0..count {
        let name = format!("serial-{i}");
        let started = Instant::now();
        create_claim(client, &name).await?;
        created.push(started.elapsed());
        let at = ready.wait(&name, started + CLAIM_TIMEOUT).await?;
        readied.push(at.saturating_duration_since(started));
    }
    Ok((created, readied))
}

/// `count` binds of ours on `pool` one at a time, through kube-apiserver.
async fn serial_binds(client: &Client, pool: &str, count: usize) -> Result<Vec<Duration>> {
    let mut took = Vec::with_capacity(count);
    for i in 0..count {
        took.push(binds::bind(client, &format!("beside-{i}"), pool).await?.0);
    }
    Ok(took)
}

/// `count` SandboxClaims created at once over `clients`: each one's create to Ready, and
/// the first create to the last Ready.
async fn burst_claims(
    clients: &[Client],
    ready: &ReadyClaims,
    count: usize,
) -> Result<(Vec<Duration>, Duration)> {
    let started = Instant::now();
    let creates = (0..count).map(|i| async move {
        let name = format!("burst-{i}");
        let sent = Instant::now();
        create_claim(&clients[i % clients.len()], &name).await?;
        Ok::<_, anyhow::Error>((name, sent))
    });
    let created = futures::future::try_join_all(creates).await?;
    let deadline = started + BASE_TIMEOUT + PER_OBJECT_TIMEOUT * u32::try_from(count)?;
    let (mut took, mut last) = (Vec::with_capacity(count), started);
    for (name, sent) in created {
        let at = ready.wait(&name, deadline).await?;
        took.push(at.saturating_duration_since(sent));
        last = last.max(at);
    }
    Ok((took, last - started))
}

/// `count` binds of ours on `pool` at once over `clients`, through kube-apiserver: each
/// one's time, and all of theirs.
async fn burst_binds(
    clients: &[Client],
    pool: &str,
    count: usize,
) -> Result<(Vec<Duration>, Duration)> {
    let started = Instant::now();
    let binds = (0..count).map(|i| async move {
        let client = &clients[i % clients.len()];
        Ok::<_, anyhow::Error>(
            binds::bind(client, &format!("beside-burst-{i}"), pool)
                .await?
                .0,
        )
    });
    let took = futures::future::try_join_all(binds).await?;
    Ok((took, started.elapsed()))
}

/// When each SandboxClaim was first seen Ready, from one watch of them all, as a client
/// waiting on its claim watches it.
struct ReadyClaims {
    seen: Arc<Mutex<HashMap<String, Instant>>>,
    changed: Arc<tokio::sync::watch::Sender<()>>,
    claims: Api<DynamicObject>,
    _follow: Aborting,
}

impl ReadyClaims {
    /// Returns once the watch is open, so that no claim is seen late.
    async fn start(admin: &kube::Client) -> Result<Self> {
        let claims = extension(admin, "SandboxClaim", "sandboxclaims");
        let seen = Arc::new(Mutex::new(HashMap::new()));
        let changed = Arc::new(tokio::sync::watch::Sender::new(()));
        let (recorded, notify) = (seen.clone(), changed.clone());
        let (follow, watching) = follow(
            claims.clone(),
            "SandboxClaims",
            move |claim: DynamicObject| {
                let ready = claim.data["status"]["conditions"]
                    .as_array()
                    .is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    });
                if ready {
                    let mut seen = recorded.lock().unwrap_or_else(|e| e.into_inner());
                    seen.entry(claim.name_any()).or_insert_with(Instant::now);
                    notify.send_replace(());
                }
            },
        );
        tokio::time::timeout(BASE_TIMEOUT, watching)
            .await
            .context("the watch of SandboxClaims did not open in time")?
            .context("the watch of SandboxClaims ended")?;
        Ok(Self {
            seen,
            changed,
            claims,
            _follow: follow,
        })
    }

    /// When the claim `name` was first seen Ready, waiting for it until `deadline`.
    async fn wait(&self, name: &str, deadline: Instant) -> Result<Instant> {
        // Subscribed before looking, so a claim seen Ready in between still wakes us.
        let mut changed = self.changed.subscribe();
        loop {
            if let Some(at) = self
                .seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(name)
            {
                return Ok(*at);
            }
            match tokio::time::timeout_at(deadline.into(), changed.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => bail!("the watch of SandboxClaims ended"),
                Err(_) => {
                    let status = match self.claims.get(name).await {
                        Ok(claim) => claim.data["status"].to_string(),
                        Err(error) => format!("unreadable ({error})"),
                    };
                    bail!(
                        "the SandboxClaim {NAMESPACE}/{name} was not Ready in time; its \
                         status: {status}"
                    );
                }
            }
        }
    }
}

/// The kubelet stand-in: binds each Pod of agent-sandbox's namespace to [`NODE`], as the
/// scheduler would, and marks it Running and Ready with an IP, as the kubelet would once
/// its containers started. Two writes a Pod: a kubelet alone makes more.
struct Kubelet {
    marked: Arc<AtomicUsize>,
    _follow: Aborting,
}

impl Kubelet {
    fn start(admin: kube::Client) -> Self {
        let pods: Api<Pod> = Api::namespaced(admin, NAMESPACE);
        let marked = Arc::new(AtomicUsize::new(0));
        let handled = Arc::new(Mutex::new(HashSet::new()));
        let slots = Arc::new(Semaphore::new(STAND_IN_CONCURRENCY));
        let next_ip = Arc::new(AtomicU32::new(u32::from(POD_IPS)));
        // Held by the watch's task, so that dropping it aborts the Pods' tasks too.
        let mut tasks = JoinSet::new();
        let counted = marked.clone();
        let (follow, _) = follow(pods.clone(), "Pods", move |pod: Pod| {
            while tasks.try_join_next().is_some() {}
            let Some(uid) = pod.metadata.uid.clone() else {
                return;
            };
            if pod.metadata.deletion_timestamp.is_some() || running_and_ready(&pod) {
                return;
            }
            if !handled
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(uid.clone())
            {
                return;
            }
            let (pods, slots, handled, marked) = (
                pods.clone(),
                slots.clone(),
                handled.clone(),
                counted.clone(),
            );
            let ip = Ipv4Addr::from(next_ip.fetch_add(1, Ordering::Relaxed));
            tasks.spawn(async move {
                let _slot = slots.acquire().await;
                match start_pod(&pods, &pod, ip).await {
                    Ok(()) => {
                        marked.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error) => {
                        eprintln!("bench: the kubelet stand-in: {error:#}");
                        // The Pod's next event tries again.
                        handled
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&uid);
                    }
                }
            });
        });
        Self {
            marked,
            _follow: follow,
        }
    }

    /// How many Pods it has marked Running and Ready.
    fn marked(&self) -> usize {
        self.marked.load(Ordering::Relaxed)
    }
}

fn running_and_ready(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some("Running")
            && s.conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// Binds `pod` to [`NODE`] unless it is bound, then marks it Running and Ready at `ip`.
async fn start_pod(pods: &Api<Pod>, pod: &Pod, ip: Ipv4Addr) -> Result<()> {
    let name = pod.name_any();
    let spec = pod.spec.clone().unwrap_or_default();
    if spec.node_name.is_none() {
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(NODE.to_owned()),
                ..ObjectReference::default()
            },
        };
        pods.create_subresource::<_, Value>("binding", &name, &PostParams::default(), &binding)
            .await
            .with_context(|| format!("binding the Pod {name}"))?;
    }
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let conditions: Vec<Value> = [
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "Ready",
        "PodScheduled",
    ]
    .iter()
    .map(|kind| json!({"type": kind, "status": "True", "lastTransitionTime": now}))
    .collect();
    let containers: Vec<Value> = spec
        .containers
        .iter()
        .map(|c| {
            json!({
                "name": c.name, "image": c.image, "imageID": "", "ready": true,
                "started": true, "restartCount": 0, "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    let status = json!({"status": {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}],
        "startTime": now,
        "containerStatuses": containers,
    }});
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("marking the Pod {name} Running and Ready"))?;
    Ok(())
}

/// A background task, aborted when dropped.
struct Aborting(tokio::task::JoinHandle<()>);

impl Drop for Aborting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Calls `seen` with every object `api` lists, then with every one a watch from that
/// list adds or modifies, until the returned guard is dropped; the receiver hears when the
/// first watch is open. A watch that ends is resumed from the last version seen; one whose
/// version is gone lists again.
fn follow<K>(
    api: Api<K>,
    what: &'static str,
    mut seen: impl FnMut(K) + Send + 'static,
) -> (Aborting, tokio::sync::oneshot::Receiver<()>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let (opened, watching) = tokio::sync::oneshot::channel();
    let mut opened = Some(opened);
    let task = tokio::spawn(async move {
        'list: loop {
            let list = match api.list(&ListParams::default()).await {
                Ok(list) => list,
                Err(error) => {
                    eprintln!("bench: listing {what}: {error}");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            let mut version = list.metadata.resource_version.clone().unwrap_or_default();
            list.items.into_iter().for_each(&mut seen);
            loop {
                let events = match api.watch(&WatchParams::default(), &version).await {
                    Ok(events) => {
                        if let Some(opened) = opened.take() {
                            let _ = opened.send(());
                        }
                        events
                    }
                    Err(error) => {
                        eprintln!("bench: watching {what}: {error}");
                        tokio::time::sleep(RETRY).await;
                        continue;
                    }
                };
                let mut events = std::pin::pin!(events);
                while let Some(event) = events.next().await {
                    match event {
                        Ok(WatchEvent::Added(object) | WatchEvent::Modified(object)) => {
                            version = object.resource_version().unwrap_or(version);
                            seen(object);
                        }
                        Ok(WatchEvent::Deleted(object)) => {
                            version = object.resource_version().unwrap_or(version);
                        }
                        Ok(WatchEvent::Bookmark(bookmark)) => {
                            version = bookmark.metadata.resource_version;
                        }
                        // 410: the version is gone from kube-apiserver's cache.
                        Ok(WatchEvent::Error(status)) => {
                            if status.code != 410 {
                                eprintln!("bench: watching {what}: {status:?}");
                            }
                            continue 'list;
                        }
                        Err(error) => {
                            eprintln!("bench: watching {what}: {error}");
                            tokio::time::sleep(RETRY).await;
                            break;
                        }
                    }
                }
            }
        }
    });
    (Aborting(task), watching)
}

/// etcd's own account of what it was asked to write: its counters (`/metrics`) and its
/// history (a watch from a past revision), read on its client URL.
pub struct Etcd {
    /// `127.0.0.1:PORT`.
    address: String,
}

/// What etcd wrote while a piece of work ran and until it was quiet again.
pub struct Window {
    /// Puts and deletes, from etcd's counters.
    pub writes: f64,
    /// From the work's start until etcd was quiet.
    pub took: Duration,
    /// etcd's revision before and after.
    revisions: (u64, u64),
}

impl Window {
    /// The writes less what `idle` writes over as long: the work's own.
    pub fn net(&self, idle: &Window) -> f64 {
        self.writes - idle.writes * self.took.as_secs_f64() / idle.took.as_secs_f64()
    }
}

/// etcd's counters at one moment.
struct Counters {
    writes: f64,
    revision: u64,
}

impl Etcd {
    /// The etcd at `url` (`http://127.0.0.1:PORT`).
    pub fn new(url: &str) -> Result<Self> {
        let address = url
            .strip_prefix("http://")
            .with_context(|| format!("etcd's URL {url} is not http://"))?;
        Ok(Self {
            address: address.to_owned(),
        })
    }

    /// Runs `work` and returns what it gave, and what etcd wrote from its start until
    /// etcd took no write for [`QUIET`] after it: the writes it set off land after it
    /// returns (reconciles, Events). Whatever else writes meanwhile is counted too;
    /// [`Window::net`] takes off an idle cluster's share.
    pub async fn around<T>(&self, work: impl Future<Output = Result<T>>) -> Result<(T, Window)> {
        let before = self.counters().await?;
        let started = Instant::now();
        let value = work.await?;
        let after = self.quiet().await?;
        Ok((
            value,
            Window {
                writes: after.writes - before.writes,
                took: started.elapsed(),
                revisions: (before.revision, after.revision),
            },
        ))
    }

    /// The counters once etcd has taken no write for [`QUIET`].
    async fn quiet(&self) -> Result<Counters> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        let mut last = self.counters().await?;
        let mut since = Instant::now();
        loop {
            tokio::time::sleep(POLL).await;
            let now = self.counters().await?;
            if now.writes != last.writes {
                (last, since) = (now, Instant::now());
            } else if since.elapsed() >= QUIET {
                return Ok(last);
            }
            if Instant::now() > deadline {
                bail!(
                    "etcd was still taking writes {SETTLE_TIMEOUT:?} after the work ended \
                     (waiting for none in {QUIET:?}; revision {})",
                    last.revision
                );
            }
        }
    }

    /// Puts and deletes so far, and the revision, from etcd's `/metrics`.
    async fn counters(&self) -> Result<Counters> {
        let request = http::Request::get("/metrics")
            .header(http::header::HOST, &self.address)
            .body(Full::new(Bytes::new()))?;
        let response = self.send(request).await?;
        let text = tokio::time::timeout(ETCD_TIMEOUT, response.into_body().collect())
            .await
            .context("etcd's /metrics did not end in time")??
            .to_bytes();
        let text = std::str::from_utf8(&text).context("etcd's /metrics is not UTF-8")?;
        let value = |name: &str| -> Result<f64> {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                .with_context(|| format!("no {name} in etcd's /metrics"))?
                .trim()
                .parse()
                .with_context(|| format!("etcd's {name}"))
        };
        Ok(Counters {
            writes: value("etcd_mvcc_put_total")? + value("etcd_mvcc_delete_total")?,
            revision: value("etcd_debugging_mvcc_current_revision")? as u64,
        })
    }

    /// How many of the window's writes went to each resource (`pods`,
    /// `extensions.agents.x-k8s.io/sandboxclaims`), from etcd's history: a watch of every
    /// key from the window's first revision, read up to its last.
    pub async fn by_resource(&self, window: &Window) -> Result<BTreeMap<String, u64>> {
        let (from, to) = window.revisions;
        let mut writes = BTreeMap::new();
        if to <= from {
            return Ok(writes);
        }
        // "\0" to "\0": every key.
        let every = base64::engine::general_purpose::STANDARD.encode([0]);
        let watch = json!({"create_request": {
            "key": every, "range_end": every, "start_revision": (from + 1).to_string(),
        }});
        let request = http::Request::post("/v3/watch")
            .header(http::header::HOST, &self.address)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(watch.to_string())))?;
        let mut body = self.send(request).await?.into_body();
        let deadline = tokio::time::Instant::now() + ETCD_TIMEOUT;
        let (mut pending, mut read) = (Vec::new(), from);
        while read < to {
            let frame = tokio::time::timeout_at(deadline, body.frame())
                .await
                .with_context(|| {
                    format!("etcd's history from {from} to {to} was not read in time (at {read})")
                })?
                .context("etcd ended its watch")??;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            // One watch response a line.
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let message: Value = serde_json::from_slice(&line)
                    .with_context(|| format!("etcd's watch: {}", String::from_utf8_lossy(&line)))?;
                let result = &message["result"];
                if result["canceled"] == true {
                    bail!("etcd cancelled the watch of its history from {from}: {result}");
                }
                for event in result["events"].as_array().into_iter().flatten() {
                    let kv = &event["kv"];
                    let revision: u64 = kv["mod_revision"]
                        .as_str()
                        .and_then(|r| r.parse().ok())
                        .with_context(|| format!("an event of etcd's watch: {event}"))?;
                    if revision > to {
                        continue;
                    }
                    read = read.max(revision);
                    let key = base64::engine::general_purpose::STANDARD
                        .decode(kv["key"].as_str().unwrap_or_default())
                        .context("a key of etcd's watch")?;
                    *writes.entry(resource(&key)).or_default() += 1;
                }
            }
        }
        Ok(writes)
    }

    /// Sends `request` on a new connection, answered in [`ETCD_TIMEOUT`] with a success.
    async fn send(
        &self,
        request: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<hyper::body::Incoming>> {
        let path = request.uri().path().to_owned();
        let exchange = async {
            let tcp = tokio::net::TcpStream::connect(&self.address).await?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
            tokio::spawn(connection);
            anyhow::Ok(sender.send_request(request).await?)
        };
        let response = tokio::time::timeout(ETCD_TIMEOUT, exchange)
            .await
            .with_context(|| format!("etcd did not answer {path} in time"))?
            .with_context(|| format!("etcd at {}: {path}", self.address))?;
        if !response.status().is_success() {
            bail!("etcd at {}: {path}: {}", self.address, response.status());
        }
        Ok(response)
    }
}

/// The resource a key of kube-apiserver's holds: `/registry/pods/NS/NAME` is `pods`,
/// `/registry/GROUP/RESOURCE/...` is `GROUP/RESOURCE`; a key of its own is itself.
fn resource(key: &[u8]) -> String {
    let key = String::from_utf8_lossy(key);
    let Some(path) = key.strip_prefix("/registry/") else {
        return key.into_owned();
    };
    let mut parts = path.split('/');
    let first = parts.next().unwrap_or_default();
    if first.contains('.') {
        format!("{first}/{}", parts.next().unwrap_or_default())
    } else {
        first.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_resources() {
        assert_eq!(resource(b"/registry/pods/agent-sandbox/a"), "pods");
        assert_eq!(
            resource(b"/registry/extensions.agents.x-k8s.io/sandboxclaims/agent-sandbox/a"),
            "extensions.agents.x-k8s.io/sandboxclaims"
        );
        assert_eq!(resource(b"compact_rev_key"), "compact_rev_key");
    }
}
