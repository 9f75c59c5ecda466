//! The harness of the kubectl suite (`tests/kubectl/`): the real `battery-apiserver`
//! binary driven by the real kubectl, by either [`Route`]:
//!
//! - [`Route::Direct`]: one `battery-apiserver dev` (loopback, the embedded battery with
//!   the Pool `default/dev`, self-made certificates, dev's local policy);
//! - [`Route::Aggregated`]: as in a cluster. A real control plane of the test's own
//!   ([`crate::control_plane`]) sits in front, with battery-apiserver installed from
//!   `deploy/`; behind its APIService run `battery-apiserver serve` and, in its own
//!   process, `battery-apiserver embedded-battery`. `serve` reads its CAs from
//!   kube-apiserver's ConfigMap and asks it TokenReviews and SubjectAccessReviews. kubectl
//!   reaches `serve` only through kube-apiserver's aggregator, which adds the front-proxy
//!   certificate and the `X-Remote-*` headers. The same Pool `default/dev` is made through
//!   it.
//!
//! Each [`ApiServer`] is one of these, in its own temporary directory, killed when
//! dropped. Every test starts its own, so tests never see each other's objects.
//! [`Kubectl`] is one installed kubectl release pointed at it;
//! [`ApiServer::kubectls`] gives one per release the suite covers, so a test runs the
//! same steps with each.
//!
//! The binaries are the ones in the target directory. Each is built (once) only when
//! missing, so after changing the server run `cargo build -p battery-apiserver` before
//! the suite.

pub mod agents;
pub mod front;
mod kubectl;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tempfile::TempDir;
use tokio::process::Command;
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::battery_access::{BatteryAccess, BatteryPki};
use crate::control_plane::Options;
use crate::process::Process;
use battery_telemetry::free_loopback_address;
pub use front::Cluster;

pub use crate::binaries::target_binary;
pub use agents::{AgentSpec, SIMULATED_HOST_SKIPS};
pub use kubectl::{Background, Invocation, Kubectl, Output, Stream, kubectl_paths};

/// The binary under test, as cargo names it.
const BINARY: &str = "battery-apiserver";
/// What `battery-apiserver dev` prints once it accepts connections, before the URL.
const DEV_SERVING_PREFIX: &str = "battery-apiserver dev: serving ";
/// What `battery-apiserver serve` prints once it accepts connections, before the URL.
const SERVE_SERVING_PREFIX: &str = "battery-apiserver serve: serving ";
/// What `battery-apiserver embedded-battery` prints once it serves, before the address.
const BATTERY_SERVING_PREFIX: &str = "embedded battery serving battery's gRPC API on ";
/// The dev Pool's size, as `battery-apiserver dev` makes it by default.
const DEV_POOL_SIZE: i32 = 3;
/// How often the embedded battery sweeps expired leases: `dev`'s, so that both routes
/// expire a lease as fast.
const SWEEP_INTERVAL: &str = "2s";
/// How long an agent may take to register its Host and report: a debug build on a loaded
/// 2-core machine.
const AGENT_READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// How many servers run at once. Each test keeps one busy with a stream of kubectl
/// processes, so more than this only makes every test slower on a 2-core CI machine.
const MAX_SERVERS: usize = 2;

static SERVERS: Semaphore = Semaphore::const_new(MAX_SERVERS);

/// How kubectl reaches battery-apiserver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Straight to `battery-apiserver dev`.
    Direct,
    /// Through a real kube-apiserver to `battery-apiserver serve`, as in a cluster.
    Aggregated,
}

/// A running battery-apiserver (and what it needs), reached by one [`Route`], killed when
/// dropped.
pub struct ApiServer {
    /// `dev`; or the embedded battery and `serve` (last). Held so that dropping the
    /// server stops them, and their logs show when a test fails.
    processes: Vec<Process>,
    /// `serve`'s arguments, to start it again ([`Self::start_serve`]).
    serve_args: Vec<std::ffi::OsString>,
    /// `serve`'s environment ([`Options::serve_env`]), for its restarts too.
    serve_env: &'static [(&'static str, &'static str)],
    /// How often `serve` was started again, for its logs' names.
    serve_starts: usize,
    /// The agents, when started with them.
    agents: Option<tokio::sync::Mutex<agents::Agents>>,
    /// The control plane in front of `serve` (nothing is in front of `dev`).
    cluster: Option<Box<Cluster>>,
    /// battery-apiserver's own URL.
    backend: String,
    /// The embedded battery's gRPC address, where it runs in a process of its own, and
    /// the credentials it requires.
    battery: Option<(String, BatteryPki)>,
    kubeconfig: PathBuf,
    dir: TempDir,
    _slot: SemaphorePermit<'static>,
}

impl ApiServer {
    /// Starts a server reached by `route` and waits until it serves. Panics with the
    /// logs if anything exits or does not announce itself in time.
    pub async fn start(route: Route) -> Self {
        let (dir, slot) = Self::prepare().await;
        let server = match route {
            Route::Direct => Self::start_dev(dir, slot).await,
            Route::Aggregated => {
                Self::start_aggregated(dir, slot, Options::default(), &[], &[], None).await
            }
        };
        assert!(
            server.kubeconfig.is_file(),
            "battery-apiserver serves {} but there is no {}",
            server.backend,
            server.kubeconfig.display()
        );
        server
    }

    async fn start_dev(dir: TempDir, slot: SemaphorePermit<'static>) -> Self {
        let mut command = Command::new(binary());
        command
            .args(["dev", "--listen", "127.0.0.1:0", "--dir"])
            .arg(dir.path().join("dev"));
        let (dev, url) =
            Process::start(command, &dir.path().join("server.log"), DEV_SERVING_PREFIX).await;
        Self {
            processes: vec![dev],
            serve_args: Vec::new(),
            serve_env: &[],
            serve_starts: 0,
            agents: None,
            cluster: None,
            backend: url,
            battery: None,
            kubeconfig: dir.path().join("dev").join("kubeconfig"),
            dir,
            _slot: slot,
        }
    }

    /// [`Route::Aggregated`], with more flags for `battery-apiserver serve` (limits).
    pub async fn aggregated_with(serve_args: &[&str]) -> Self {
        let (dir, slot) = Self::prepare().await;
        Self::start_aggregated(dir, slot, Options::default(), serve_args, &[], None).await
    }

    /// [`Route::Aggregated`] with kube-controller-manager beside kube-apiserver (the
    /// namespace controller, the garbage collector, the quota controller).
    pub async fn aggregated_with_controllers() -> Self {
        let (dir, slot) = Self::prepare().await;
        let options = Options {
            controllers: true,
            ..Options::default()
        };
        Self::start_aggregated(dir, slot, options, &[], &[], None).await
    }

    /// [`Route::Aggregated`] with the exec path of a cluster: `serve` with the relay's
    /// certificates and the agent signer, and one `battery-agent` process per Host, each
    /// reaching the API through kube-apiserver as its Host's identity. Returns once every
    /// Host reports Ready with its agent's address.
    pub async fn aggregated_with_agents() -> Self {
        Self::aggregated_with_agents_and(Options::default()).await
    }

    /// [`Self::aggregated_with_agents`] with `options` for the control plane.
    pub async fn aggregated_with_agents_and(options: Options) -> Self {
        let (dir, slot) = Self::prepare().await;
        let agents = agents::Agents::new(&dir.path().join("agents"));
        let args = agents.serve_args();
        let args: Vec<&str> = args
            .iter()
            .map(|a| a.to_str().expect("UTF-8 paths"))
            .collect();
        let battery_args = agents.battery_args();
        let mut server =
            Self::start_aggregated(dir, slot, options, &args, &battery_args, None).await;
        server.agents = Some(tokio::sync::Mutex::new(agents));
        let hosts: kube::Api<battery_types::Host> =
            kube::Api::all(crate::kube_client(&server.kubeconfig).await);
        let hosts = crate::eventually(AGENT_READY_TIMEOUT, "the Hosts to be listed", async || {
            let list = hosts
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            let hosts: Vec<(String, String)> = list
                .into_iter()
                .map(|h| (h.metadata.name.unwrap_or_default(), h.spec.address))
                .collect();
            if hosts.is_empty() {
                Err("no Hosts yet".to_owned())
            } else {
                Ok(hosts)
            }
        })
        .await;
        for (host, flintlock) in hosts {
            server
                .start_agent(AgentSpec {
                    host,
                    flintlock,
                    listen: free_loopback_address(),
                    extra: Vec::new(),
                })
                .await;
        }
        server
    }

    /// Starts (or starts again) an agent behind kube-apiserver and waits until its Host
    /// points at it and reports whatever it reports.
    pub async fn start_agent(&self, spec: AgentSpec) {
        let agents = self.agents.as_ref().expect("started with agents");
        let cluster = self.cluster.as_deref().expect("aggregated");
        let (host, listen) = (spec.host.clone(), spec.listen.to_string());
        agents.lock().await.start(cluster, spec).await;
        let hosts: kube::Api<battery_types::Host> =
            kube::Api::all(crate::kube_client(&self.kubeconfig).await);
        let what = format!("Host {host} to report through its agent at {listen}");
        crate::eventually(AGENT_READY_TIMEOUT, &what, async || {
            let object = hosts.get(&host).await.map_err(|e| e.to_string())?;
            let reported = object.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == battery_types::conditions::READY)
            });
            if object.spec.agent_address.as_deref() == Some(listen.as_str()) && reported {
                Ok(())
            } else {
                Err(format!("{:?}", object.status))
            }
        })
        .await;
    }

    /// Kills the agent of `host` (SIGKILL, as a crash) and says how it was started.
    pub async fn kill_agent(&self, host: &str) -> AgentSpec {
        let agents = self.agents.as_ref().expect("started with agents");
        let (spec, process) = agents
            .lock()
            .await
            .running
            .remove(host)
            .unwrap_or_else(|| panic!("no agent runs for {host}"));
        process.kill().await;
        spec
    }

    /// The peak resident memory of the agent of `host`.
    pub async fn agent_peak_rss_bytes(&self, host: &str) -> u64 {
        let agents = self.agents.as_ref().expect("started with agents");
        agents.lock().await.running[host].1.peak_rss_bytes()
    }

    /// The peak resident memory of battery-apiserver (`dev` or `serve`).
    pub fn server_peak_rss_bytes(&self) -> u64 {
        self.processes
            .last()
            .expect("a server process")
            .peak_rss_bytes()
    }

    /// Runs `command` in the claim `namespace/claim` as the kubectl user, in `/`, with
    /// the session's own `env` (`NAME=value`); returns its stdout and its Status.
    pub async fn exec_in_root(
        &self,
        namespace: &str,
        claim: &str,
        command: &[&str],
        env: &[&str],
    ) -> (String, serde_json::Value) {
        use crate::channel_exec;
        let mut query = format!("{}&workingDir=%2F", channel_exec::query(command, false));
        for pair in env {
            query.push_str(&format!("&env={}", pair.replace('=', "%3D")));
        }
        let path = format!("{}?{query}", channel_exec::exec_path(namespace, claim));
        let session = self
            .exec_client(None)
            .open(&path, "v5.channel.k8s.io")
            .await
            .unwrap();
        let outcome = session.finish().await;
        (
            String::from_utf8_lossy(&outcome.stdout).into_owned(),
            outcome.status,
        )
    }

    /// A hand-written exec client ([`channel_exec`](crate::channel_exec)) for the
    /// kubectl user, or for the user of `identity` (certificate and key of a client CA
    /// the cluster accepts: [`Self::client_certificate`]).
    pub fn exec_client(&self, identity: Option<(PathBuf, PathBuf)>) -> crate::channel_exec::Client {
        let (url, ca, identity) = match &self.cluster {
            Some(cluster) => (
                cluster.url().to_owned(),
                cluster.ca(),
                identity.map_or_else(
                    || cluster.kubectl_identity(),
                    |(cert, key)| crate::https::Identity::Cert(cert, key),
                ),
            ),
            None => {
                let dev = self.dir.path().join("dev");
                let (cert, key) = identity.unwrap_or((dev.join("dev.crt"), dev.join("dev.key")));
                (
                    self.backend.clone(),
                    dev.join("ca.crt"),
                    crate::https::Identity::Cert(cert, key),
                )
            }
        };
        crate::channel_exec::Client {
            https: crate::https::Client::new(&url, &ca, identity),
        }
    }

    /// A client certificate for the user `cn` in `groups` that the cluster accepts, and a
    /// kubeconfig for it: (certificate, key, kubeconfig). Only in front of `serve`.
    pub fn client_certificate(&self, cn: &str, groups: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
        let cluster = self.cluster.as_deref().expect("aggregated");
        let (cert, key) = cluster.client_certificate(cn, groups);
        let kubeconfig = cert.with_extension("kubeconfig");
        cluster.write_kubeconfig(&kubeconfig, (&cert, &key));
        (cert, key, kubeconfig)
    }

    /// The kubeconfig of the kubectl user (`system:serviceaccount:default:dev`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    async fn prepare() -> (TempDir, SemaphorePermit<'static>) {
        let slot = SERVERS
            .acquire()
            .await
            .expect("the server semaphore is never closed");
        let dir = tempfile::Builder::new()
            .prefix("battery-apiserver-e2e-")
            .tempdir()
            .expect("create the server's temporary directory");
        (dir, slot)
    }

    /// [`Route::Aggregated`] keeping the state in `data`: the embedded battery's in
    /// `data/battery`, the server's in `data/apiserver`. The Pool `dev` is made only when
    /// there was no state yet, so a server started on a restored backup finds its own.
    pub async fn aggregated_on(data: &Path) -> Self {
        let (dir, slot) = Self::prepare().await;
        Self::start_aggregated(dir, slot, Options::default(), &[], &[], Some(data)).await
    }

    /// Stops `serve` (SIGKILL, as a crash or a lost node ends it), leaving battery and the
    /// control plane running.
    pub async fn stop_serve(&mut self) {
        assert_eq!(self.processes.len(), 2, "`serve` runs");
        let serve = self.processes.pop().expect("`serve` runs");
        serve.kill().await;
    }

    /// Starts `serve` again as it was started, on the same store, and waits until it
    /// serves (not until the aggregator calls it Available: a test waits for what it
    /// checks).
    pub async fn start_serve(&mut self) {
        assert_eq!(self.processes.len(), 1, "`serve` is stopped");
        self.serve_starts += 1;
        let log = self
            .dir
            .path()
            .join(format!("server-{}.log", self.serve_starts));
        let (serve, _) = start_serve(&self.serve_args, self.serve_env, &log).await;
        self.processes.push(serve);
    }

    /// The process ids of the embedded battery and of `serve`, on [`Route::Aggregated`].
    pub fn battery_and_serve_pids(&self) -> (u32, u32) {
        let [battery, serve] = self.processes.as_slice() else {
            panic!(
                "not the aggregated route: {} processes",
                self.processes.len()
            )
        };
        (battery.pid(), serve.pid())
    }

    async fn start_aggregated(
        dir: TempDir,
        slot: SemaphorePermit<'static>,
        options: Options,
        serve_args: &[&str],
        battery_args: &[std::ffi::OsString],
        data: Option<&Path>,
    ) -> Self {
        let fresh = data.is_none_or(|data| !data.join("apiserver").exists());
        let cluster = Box::new(Cluster::start(dir.path(), binary(), options).await);
        // Secured as poolmgrd is in production: TLS, a client certificate and a token.
        let pki = BatteryPki::write(&dir.path().join("battery-pki"))
            .expect("write battery's credentials");
        let mut command = Command::new(binary());
        command.args([
            "embedded-battery",
            "--listen",
            "127.0.0.1:0",
            "--sweep-interval",
            SWEEP_INTERVAL,
        ]);
        command.args(pki.battery_args());
        command.args(battery_args);
        if let Some(data) = data {
            command.arg("--data-dir").arg(data.join("battery"));
        }
        let (battery, battery_address) = Process::start(
            command,
            &dir.path().join("battery.log"),
            BATTERY_SERVING_PREFIX,
        )
        .await;
        let mut command = serve_command(binary(), &battery_address, &pki, &cluster);
        command.args(serve_args);
        // On disk, as on its volume in a cluster: a test may stop `serve` and start it again.
        let store = data.map_or_else(|| dir.path().join("apiserver"), |d| d.join("apiserver"));
        command.arg("--data-dir").arg(store);
        let serve_args: Vec<std::ffi::OsString> =
            command.as_std().get_args().map(ToOwned::to_owned).collect();
        let serve_env = options.serve_env;
        let (serve, url) =
            start_serve(&serve_args, serve_env, &dir.path().join("server.log")).await;
        cluster.wait_serving().await;
        let server = Self {
            processes: vec![battery, serve],
            serve_args,
            serve_env,
            serve_starts: 0,
            agents: None,
            kubeconfig: cluster.kubeconfig().to_owned(),
            cluster: Some(cluster),
            backend: url,
            battery: Some((battery_address, pki)),
            dir,
            _slot: slot,
        };
        if fresh {
            server.create_dev_pool().await;
        }
        server
    }

    /// Makes the Pool `default/dev` through kube-apiserver, as `dev` makes it at start.
    async fn create_dev_pool(&self) {
        let kubectl = self.kubectls_quietly().next().expect("a kubectl release");
        kubectl
            .cmd(&["create", "-f", "-"])
            .stdin(battery_apiserver::dev::dev_pool(DEV_POOL_SIZE).to_string())
            .ok()
            .await;
    }

    /// One [`Kubectl`] per kubectl release the suite covers, oldest first, each with its
    /// own discovery cache so that one release never reads what the other wrote. Each
    /// says which release it is on the test's output when it is taken, so that a
    /// failure's output names the release it happened with.
    pub fn kubectls(&self) -> impl Iterator<Item = Kubectl> + '_ {
        self.kubectls_quietly()
            .inspect(|kubectl| eprintln!("--- with {kubectl}"))
    }

    fn kubectls_quietly(&self) -> impl Iterator<Item = Kubectl> + '_ {
        kubectl::releases().iter().map(|release| {
            Kubectl::new(
                release,
                self.kubeconfig.clone(),
                self.dir.path().join(format!("kubectl-{}", release.tag())),
            )
        })
    }

    /// The real control plane in front of `serve`, on [`Route::Aggregated`].
    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_deref()
    }

    /// How a test reaches the embedded battery on [`Route::Aggregated`] with every
    /// credential it requires, to act on battery as another client of it would.
    pub fn battery_access(&self) -> Option<BatteryAccess> {
        self.battery
            .as_ref()
            .map(|(address, pki)| pki.access(address))
    }

    /// The file `serve` reads battery's token from, on [`Route::Aggregated`].
    pub fn battery_token_file(&self) -> Option<PathBuf> {
        self.battery.as_ref().map(|(_, pki)| pki.token_file())
    }

    /// Every lease the embedded battery holds now, asked of battery itself (on
    /// [`Route::Aggregated`]; panics on another route).
    pub async fn battery_leases(&self) -> Vec<crate::api::LeaseRecord> {
        let access = self.battery_access().expect("a route with its own battery");
        let mut leases = crate::api::lease_client::LeaseClient::new(access.channel());
        leases
            .list_leases(crate::api::ListLeasesRequest { pool_ref: None })
            .await
            .expect("ListLeases")
            .into_inner()
            .leases
    }

    /// battery-apiserver's own URL, not kube-apiserver's.
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// A scratch directory for files a test hands to kubectl (manifests, editor scripts).
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    /// Every log file of the run (`serve`'s, battery's, the agents', the control
    /// plane's), for tests that check what never reaches a log.
    pub fn logs(&self) -> Vec<PathBuf> {
        fn under(dir: &Path, found: &mut Vec<PathBuf>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    under(&path, found);
                } else if path.extension().is_some_and(|e| e == "log") {
                    found.push(path);
                }
            }
        }
        let mut logs = Vec::new();
        under(self.dir.path(), &mut logs);
        assert!(
            logs.iter().any(|p| p.ends_with("server.log")),
            "no server.log among {logs:?}"
        );
        logs
    }
}

/// The `battery-apiserver` binary of this build (see [`target_binary`]).
fn binary() -> &'static Path {
    static BINARY_PATH: OnceLock<PathBuf> = OnceLock::new();
    BINARY_PATH.get_or_init(|| target_binary(BINARY, BINARY))
}

/// Starts `battery-apiserver` with `args` (`serve ...`) logging to `log`, and returns it
/// with its URL once it serves.
async fn start_serve(
    args: &[std::ffi::OsString],
    env: &[(&str, &str)],
    log: &Path,
) -> (Process, String) {
    let mut command = Command::new(binary());
    command.args(args);
    command.envs(env.iter().copied());
    // mimalloc keeps what was freed for 10 ms before it returns it to the system, so
    // at a GB/s of exec the RSS holds tens of MB freed moments ago, more the faster the
    // machine: the tests' bounds on RSS are bounds on what the server still holds.
    command.env("MIMALLOC_PURGE_DELAY", "0");
    Process::start(command, log, SERVE_SERVING_PREFIX).await
}

/// `binary serve` in front of the battery at `battery` (`host:port`) that requires the
/// credentials of `pki`, behind `cluster`: where it listens, its serving certificate, and
/// the cluster it asks.
pub fn serve_command(binary: &Path, battery: &str, pki: &BatteryPki, cluster: &Cluster) -> Command {
    let mut command = Command::new(binary);
    command
        .args(["serve", "--battery-address", battery])
        .args(pki.serve_args())
        .args(cluster.serve_args());
    command
}
