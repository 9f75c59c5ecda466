//! The processes one phase of the bench runs against, as a cluster runs them: a real
//! control plane (etcd and kube-apiserver, [`battery_e2e::control_plane`]) with battery-apiserver
//! installed into it, `battery-apiserver embedded-battery` in its own process with its
//! state on disk ([`BatteryStore`]), `battery-apiserver serve` behind the APIService in front of it, and one
//! `battery-agent` per simulated Host. The bench talks to `serve` directly with the
//! kubectl user's client certificate ([`Rig::client`]), for the API server's own
//! figures, and to kube-apiserver as the same user ([`Rig::kube_client`]), for what a
//! user meets through the aggregator.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use http::{Method, StatusCode};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::process::Command;

use super::client::{self, Client, GROUP_VERSION, NAMESPACE};
use super::report::Row;
use battery_e2e::api::PoolRef;
use battery_e2e::api::lease_client::LeaseClient;
use battery_e2e::apiserver::agents::Agents;
use battery_e2e::apiserver::{AgentSpec, Cluster};
use battery_e2e::control_plane::Options;
use battery_e2e::process::Process;
use battery_e2e::{BatteryAccess, BatteryChannel, BatteryPki};
use battery_proto::agent::v1alpha1::relay_client::RelayClient;
use battery_telemetry::free_loopback_address;
use tonic::transport::Channel;

/// `serve`'s stderr, in the rig's directory.
const SERVE_LOG: &str = "server.log";
/// What `battery-apiserver serve` prints once it accepts connections, before the URL.
const SERVE_SERVING_PREFIX: &str = "battery-apiserver serve: serving ";
/// What `battery-apiserver embedded-battery` prints once it serves, before the address.
const BATTERY_SERVING_PREFIX: &str = "embedded battery serving battery's gRPC API on ";
/// How long a Pool may take to fill, a Host to report through its agent, or a CRD to be
/// Established.
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// The most MicroVMs a Pool grows by at once while the bench fills it: thousands of
/// simulated boots at once starve the Hosts (battery's guest-agent probes time out and
/// it deletes the MicroVMs) and the agents' health checks with them, so the Hosts go
/// unready and are cordoned mid-fill.
const FILL_STEP: i32 = 200;
/// The name `serve`'s certificate is for: the Service's, which kube-apiserver verifies.
const SERVING_NAME: &str = "battery-apiserver.battery-system.svc";
/// `serve`'s `--data-dir`, in the rig's directory.
const STORE_DIR: &str = "apiserver";
/// The embedded battery's `--data-dir`, in the rig's directory.
const BATTERY_DIR: &str = "battery";
/// Leases outlive the run: nobody renews the bench's claims, and one that expired would
/// take its MicroVM (and a claim of the scale scenarios) away mid-measurement.
const LEASE: (&str, &str) = ("30m", "1h");

/// Where the embedded battery keeps its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BatteryStore {
    /// On disk, as poolmgrd keeps its SQLite database: a ClaimVM's commits are durable,
    /// so raw ClaimVM and a bind's ClaimVM pay what a deployed battery's do.
    Disk,
    /// In memory, as the bench's runs before 2026-12-07 kept it: ClaimVM pays no fsync.
    Memory,
}

impl BatteryStore {
    /// How the report names it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Disk => "its state on disk",
            Self::Memory => "its state in memory",
        }
    }
}

/// How the bench reaches our API: straight to `serve`, for the API server's own figures,
/// or through kube-apiserver's aggregator, as users do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Direct,
    Kube,
}

impl Route {
    pub const BOTH: [Route; 2] = [Route::Direct, Route::Kube];

    /// What a figure's name says of its route: nothing for the direct one, whose names
    /// the earlier runs' tables used.
    pub fn suffix(self) -> &'static str {
        match self {
            Route::Direct => "",
            Route::Kube => " through kube-apiserver",
        }
    }
}

/// A running set of processes, stopped by [`Rig::stop`] (or killed when dropped).
pub struct Rig {
    // Declared first so that it drops, and kills, before the directory goes.
    processes: Processes,
    /// `serve`'s URL.
    pub url: String,
    /// The embedded battery's gRPC address and the credentials it requires.
    pub battery: BatteryAccess,
    ca: PathBuf,
    identity: (PathBuf, PathBuf),
    dir: TempDir,
}

struct Processes {
    agents: Agents,
    serve: Process,
    battery: Process,
    cluster: Box<Cluster>,
}

impl Rig {
    /// Starts everything, with `serve` run from `binary` and given `serve_args` on top,
    /// and the embedded battery `battery_args`, its state kept as `store` says, and
    /// returns once every Host reports through its agent.
    pub async fn start(
        binary: &Path,
        serve_args: &[String],
        (battery_args, store): (&[String], BatteryStore),
    ) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("battery-bench-")
            .tempdir()
            .context("a temporary directory")?;
        let options = Options {
            durable_etcd: true,
            ..Options::default()
        };
        let cluster = Box::new(Cluster::start(dir.path(), binary, options).await);
        let agents = Agents::new(&dir.path().join("agents"));
        // battery's port secured as deployed: TLS, a client certificate and a token.
        let pki = BatteryPki::write(&dir.path().join("battery-pki"))?;
        let mut command = Command::new(binary);
        // The Hosts' sshd trusts the agents' SSH CA, for terminals and ports.
        command
            .args(["embedded-battery", "--listen", "127.0.0.1:0"])
            .args(pki.battery_args())
            .args(agents.battery_args())
            .args(battery_args);
        if store == BatteryStore::Disk {
            command.arg("--data-dir").arg(dir.path().join(BATTERY_DIR));
        }
        let (battery_process, battery) = Process::start(
            command,
            &dir.path().join("battery.log"),
            BATTERY_SERVING_PREFIX,
        )
        .await;
        let mut command = battery_e2e::apiserver::serve_command(binary, &battery, &pki, &cluster);
        // On disk, as deployed (`deploy/base/apiserver.yaml`): each commit is durable, so
        // a bind's figures include its store's fsyncs.
        command
            .arg("--data-dir")
            .arg(dir.path().join(STORE_DIR))
            .args(agents.serve_args())
            .args(serve_args);
        let (serve, url) =
            Process::start(command, &dir.path().join(SERVE_LOG), SERVE_SERVING_PREFIX).await;
        cluster.wait_serving().await;
        // The kubectl user's ServiceAccount, as a client certificate: `serve` verifies it
        // itself, with no TokenReview per connection.
        let (namespace, account) = battery_e2e::apiserver::front::DEV_ACCOUNT;
        let identity = cluster.service_account_certificate(namespace, account);
        let mut rig = Self {
            url,
            battery: pki.access(&battery),
            ca: cluster.installation.serving_ca.clone(),
            identity,
            processes: Processes {
                agents,
                serve,
                battery: battery_process,
                cluster,
            },
            dir,
        };
        rig.start_agents().await?;
        Ok(rig)
    }

    /// One agent per Host battery lists, each waited for until its Host reports Ready.
    async fn start_agents(&mut self) -> Result<()> {
        let client = self.client().await?;
        let hosts_path = format!("{GROUP_VERSION}/hosts");
        let hosts = ready_within(READY_TIMEOUT, "the Hosts to be listed", || async {
            let list = client
                .json(Method::GET, &hosts_path, None, StatusCode::OK)
                .await?;
            let hosts: Vec<(String, String)> = list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|h| {
                    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                    (text(&h["metadata"]["name"]), text(&h["spec"]["address"]))
                })
                .collect();
            if hosts.is_empty() {
                bail!("no Hosts yet");
            }
            Ok(hosts)
        })
        .await?;
        for (host, flintlock) in hosts {
            let listen = free_loopback_address();
            self.processes
                .agents
                .start(
                    &self.processes.cluster,
                    AgentSpec {
                        host: host.clone(),
                        flintlock,
                        listen,
                        extra: Vec::new(),
                    },
                )
                .await;
            let path = format!("{hosts_path}/{host}");
            let listen = listen.to_string();
            ready_within(
                READY_TIMEOUT,
                &format!("Host {host} to report through its agent"),
                || async {
                    let object = client
                        .json(Method::GET, &path, None, StatusCode::OK)
                        .await?;
                    let ready = object["status"]["conditions"].as_array().is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == battery_types::conditions::READY)
                    });
                    if object["spec"]["agentAddress"] == json!(listen) && ready {
                        Ok(())
                    } else {
                        bail!("{}", object["status"])
                    }
                },
            )
            .await?;
        }
        Ok(())
    }
}

impl Rig {
    /// A new HTTP/2 connection to `serve` as the kubectl user.
    pub async fn client(&self) -> Result<Client> {
        self.client_on(Route::Direct).await
    }

    /// A new HTTP/2 connection to kube-apiserver as the kubectl user: our resources
    /// through its aggregator, and its own.
    pub async fn kube_client(&self) -> Result<Client> {
        self.client_on(Route::Kube).await
    }

    /// A new HTTP/2 connection as the kubectl user, by `route`.
    pub async fn client_on(&self, route: Route) -> Result<Client> {
        let (url, ca, server_name) = self.endpoint(route);
        Client::connect(url, &ca, server_name, (&self.identity.0, &self.identity.1)).await
    }

    /// Where `route` leads: its URL, the CA that signed its certificate and the name on it.
    fn endpoint(&self, route: Route) -> (&str, PathBuf, &'static str) {
        match route {
            Route::Direct => (&self.url, self.ca.clone(), SERVING_NAME),
            Route::Kube => {
                let cluster = &self.processes.cluster;
                (cluster.url(), cluster.ca(), "127.0.0.1")
            }
        }
    }

    /// A Rust SDK client of kube-apiserver as the kubectl user, as a user's program holds
    /// one: claims and exec through the aggregator.
    pub async fn sdk_client(&self) -> Result<battery_sdk::Client> {
        let path = self.dir.path().join("sdk-kubeconfig");
        self.processes
            .cluster
            .write_kubeconfig(&path, (&self.identity.0, &self.identity.1));
        let kubeconfig = kube::config::Kubeconfig::read_from(&path)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        Ok(battery_sdk::Client::from_config(config)?)
    }

    /// An exec client as the kubectl user, by `route`.
    pub fn exec_client(&self, route: Route) -> battery_e2e::channel_exec::Client {
        let (url, ca, server_name) = self.endpoint(route);
        battery_e2e::channel_exec::Client {
            https: battery_e2e::https::Client::new(
                url,
                &ca,
                battery_e2e::https::Identity::Cert(
                    self.identity.0.clone(),
                    self.identity.1.clone(),
                ),
            )
            .with_server_name(server_name),
        }
    }

    /// Creates the Secret `name` holding `key: value` in the bench's namespace, in the
    /// cluster, as the kubectl user.
    pub async fn create_secret(&self, name: &str, key: &str, value: &str) -> Result<()> {
        let cluster = self.kube_client().await?;
        let secret = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name}, "stringData": {key: value}
        });
        cluster
            .json(
                Method::POST,
                &format!("/api/v1/namespaces/{NAMESPACE}/secrets"),
                Some(&secret),
                StatusCode::CREATED,
            )
            .await
            .with_context(|| format!("creating the Secret {name}"))?;
        Ok(())
    }

    /// A client of the relay of `host`'s agent at `address`, dialled as the API server
    /// dials it (its relay client certificate, the agent verified for `host`).
    pub async fn relay_client(&self, host: &str, address: &str) -> Result<RelayClient<Channel>> {
        let [ca, cert, key] =
            self.processes.agents.relay_client_tls().map(|path| {
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))
            });
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(ca?))
            .identity(tonic::transport::Identity::from_pem(cert?, key?))
            .domain_name(host);
        let channel = tonic::transport::Endpoint::from_shared(format!("https://{address}"))?
            .tls_config(tls)?
            .tcp_nodelay(true)
            .connect()
            .await
            .with_context(|| format!("connecting to the agent of Host {host} at {address}"))?;
        Ok(RelayClient::new(channel))
    }

    /// A gRPC client of the embedded battery's Lease service, with the credentials
    /// `serve` has, so a raw ClaimVM pays what a bind's does.
    pub fn lease_client(&self) -> LeaseClient<BatteryChannel> {
        LeaseClient::new(self.battery.channel())
    }

    /// `serve`'s log.
    pub fn serve_log(&self) -> PathBuf {
        self.dir.path().join(SERVE_LOG)
    }

    /// Where `serve` keeps its metadata store.
    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join(STORE_DIR)
    }

    /// The CPU time every process of the rig has used so far, the bench's own clients
    /// included.
    pub fn cpu_use(&self) -> Result<CpuUse> {
        let Processes {
            agents,
            serve,
            battery,
            cluster,
        } = &self.processes;
        let bench = battery_e2e::process::cpu_time(std::process::id())
            .context("reading the bench's own CPU time")?;
        let [(etcd, etcd_process), (apiserver, apiserver_process)] = cluster.plane.processes();
        Ok(CpuUse(vec![
            ("the bench's clients", bench),
            (etcd, etcd_process.cpu_time()),
            (apiserver, apiserver_process.cpu_time()),
            ("serve", serve.cpu_time()),
            (
                "the embedded battery, its Hosts and their commands",
                battery.cpu_time(),
            ),
            (
                "the agents",
                agents.processes().map(Process::cpu_time).sum(),
            ),
        ]))
    }

    /// `serve`'s resident memory now, in MB.
    pub fn serve_memory(&self) -> Result<Memory> {
        let pid = self.processes.serve.pid();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("reading the status of serve ({pid})"))?;
        let field = |name: &str| -> Result<f64> {
            let kb = battery_e2e::process::status_kb(&status, name)
                .with_context(|| format!("no {name} in the status of serve"))?;
            Ok(kb as f64 / 1024.0)
        };
        Ok(Memory {
            resident: field("VmRSS")?,
            peak: field("VmHWM")?,
            anonymous: field("RssAnon")?,
            mapped_files: field("RssFile")?,
        })
    }

    /// Makes the Pool `name` of `size` MicroVMs and waits until all are available, so no
    /// bind waits for a boot. It grows by `FILL_STEP` at a time, then provisions no more
    /// until it is empty (`MinSizeThreshold`, `minSize` 1): the embedded battery's
    /// simulated boots run on this machine, unlike a real battery's, and replacing each
    /// claimed MicroVM at once kept it busy (more than a core) while the scenarios
    /// measured.
    pub async fn create_pool(&self, name: &str, size: i32) -> Result<PoolRef> {
        let client = self.client().await?;
        let mut target = size.min(FILL_STEP);
        let mut pool = battery_apiserver::dev::dev_pool(target);
        pool["metadata"]["name"] = json!(name);
        pool["spec"]["lease"] = json!({"heartbeatInterval": LEASE.0, "expiryThreshold": LEASE.1});
        client
            .json(
                Method::POST,
                &client::pools_path(),
                Some(&pool),
                StatusCode::CREATED,
            )
            .await
            .with_context(|| format!("creating the Pool {name}"))?;
        let path = format!("{}/{name}", client::pools_path());
        loop {
            // The embedded battery boots a few dozen simulated MicroVMs a second.
            let timeout = READY_TIMEOUT.max(Duration::from_millis(100) * FILL_STEP.unsigned_abs());
            ready_within(timeout, &format!("the Pool {name} to fill"), || async {
                let pool = client
                    .json(Method::GET, &path, None, StatusCode::OK)
                    .await?;
                if pool["status"]["available"].as_i64() >= Some(target.into()) {
                    Ok(())
                } else {
                    bail!("{}", pool["status"])
                }
            })
            .await?;
            if target == size {
                break;
            }
            target = (target + FILL_STEP).min(size);
            update_spec(&client, &path, |spec| spec["size"] = json!(target)).await?;
        }
        update_spec(&client, &path, |spec| {
            spec["replenishment"] = json!({"type": "MinSizeThreshold", "minSize": 1});
        })
        .await?;
        Ok(PoolRef {
            name: name.to_owned(),
            namespace: NAMESPACE.to_owned(),
        })
    }

    /// Stops every process: agents, `serve`, battery, the control plane.
    pub async fn stop(self) {
        let Processes {
            agents,
            serve,
            battery,
            cluster,
        } = self.processes;
        // Agents and the control plane are killed when dropped; serve and battery are waited
        // for.
        drop(agents);
        serve.kill().await;
        battery.kill().await;
        drop(cluster);
    }
}

/// Changes the spec of the Pool at `path` with `change` (a read, then an update, again
/// when the Pool's status moved its resourceVersion in between).
async fn update_spec(client: &Client, path: &str, change: impl Fn(&mut Value)) -> Result<()> {
    ready_within(READY_TIMEOUT, &format!("updating {path}"), || async {
        let mut pool = client.json(Method::GET, path, None, StatusCode::OK).await?;
        change(&mut pool["spec"]);
        client
            .json(Method::PUT, path, Some(&pool), StatusCode::OK)
            .await?;
        Ok(())
    })
    .await
}

/// Retries `attempt` until it succeeds; after `timeout`, its last error, saying what was
/// awaited (the bench reports a setup that never became ready, rather than panic).
pub async fn ready_within<T>(
    timeout: Duration,
    what: &str,
    attempt: impl AsyncFnMut() -> Result<T>,
) -> Result<T> {
    battery_telemetry::retry(timeout, attempt)
        .await
        .with_context(|| format!("waiting {timeout:?} for {what}"))
}

/// A process's resident memory, in MB (from `/proc/PID/status`).
pub struct Memory {
    /// `VmRSS`: all of it.
    pub resident: f64,
    /// `VmHWM`: the most it has been.
    pub peak: f64,
    /// `RssAnon`: its own memory (heap, stacks).
    pub anonymous: f64,
    /// `RssFile`: pages of files it maps, mostly its binary's code, which the kernel
    /// shares with every process of the same binary and may drop and read again.
    pub mapped_files: f64,
}

/// The CPU time of each process of a rig: used so far ([`Rig::cpu_use`]), or used
/// between two moments ([`CpuUse::since`]).
#[derive(Clone, Default)]
pub struct CpuUse(Vec<(&'static str, Duration)>);

impl CpuUse {
    /// What each process used since `earlier`.
    pub fn since(&self, earlier: &CpuUse) -> CpuUse {
        let spent = self.0.iter().zip(&earlier.0);
        CpuUse(
            spent
                .map(|((who, now), (_, then))| (*who, now.saturating_sub(*then)))
                .collect(),
        )
    }

    /// Each process's time divided by `per` (claims, rounds, megabytes), as rows of
    /// `group` named "CPU `what`: WHO".
    pub fn rows(&self, group: &'static str, what: &str, per: f64) -> Vec<Row> {
        self.0
            .iter()
            .map(|(who, used)| {
                Row::millis(
                    group,
                    format!("CPU {what}: {who}"),
                    used.div_f64(per.max(f64::MIN_POSITIVE)),
                )
            })
            .collect()
    }
}

impl std::iter::Sum for CpuUse {
    fn sum<I: Iterator<Item = CpuUse>>(uses: I) -> CpuUse {
        uses.reduce(|mut total, used| {
            for ((_, sum), (_, more)) in total.0.iter_mut().zip(used.0) {
                *sum += more;
            }
            total
        })
        .unwrap_or_default()
    }
}

impl Rig {
    /// The control plane `serve` is installed into, for a scenario that runs something of
    /// its own beside it in the same cluster.
    pub fn cluster(&self) -> &Cluster {
        &self.processes.cluster
    }

    /// The rig's directory, where a scenario's own processes keep their logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
