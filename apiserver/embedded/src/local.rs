//! A battery with its simulated Hosts on this machine: what `battery-apiserver
//! embedded-battery` serves and what tests run against. It starts the Hosts, then the
//! battery, then registers each Host through battery's own HostAdmin handlers, as an
//! operator would with `poolmgrctl host add` (in-process, so whatever the port's TLS
//! and token).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use battery_proto::poolmgr::v1alpha1::{Host, HostTls};
use tokio::net::TcpListener;

use crate::simhost::{SimHostError, SimulatedHost, SimulatedHostConfig, SshProxyConfig};
use crate::{BatteryConfig, BatteryError, EmbeddedBattery};

/// What to start.
#[derive(Debug, Clone)]
pub struct LocalBatteryConfig {
    /// battery's gRPC address; port 0 picks a free one.
    pub listen: SocketAddr,
    /// battery's store and the Hosts' state live under it; `None` keeps all in memory
    /// (the Hosts' scratch directories then go in a temporary directory).
    pub data_dir: Option<PathBuf>,
    /// How many simulated Hosts, named `host-0`, `host-1`, ...
    pub hosts: usize,
    /// How long a simulated MicroVM takes to boot.
    pub provisioning_delay: Duration,
    /// The battery's own settings; its `data_dir` is taken from above.
    pub battery: BatteryConfig,
    /// Whether the Hosts serve flintlock's SSH proxy, and whom their sshd trusts.
    pub ssh_proxy: Option<SshProxyConfig>,
}

impl Default for LocalBatteryConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: None,
            hosts: 2,
            provisioning_delay: Duration::from_millis(200),
            battery: BatteryConfig::default(),
            ssh_proxy: None,
        }
    }
}

/// Why the local battery could not start.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("creating the state directory {path}")]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("starting simulated host {name}")]
    HostStart {
        name: String,
        #[source]
        source: SimHostError,
    },
    #[error("binding battery's gRPC address {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("starting the embedded battery")]
    BatteryStart(#[source] BatteryError),
    #[error("registering simulated host {name} with battery")]
    RegisterHost {
        name: String,
        #[source]
        source: tonic::Status,
    },
}

/// A running embedded battery and its simulated Hosts.
pub struct LocalBattery {
    config: LocalBatteryConfig,
    battery: Option<EmbeddedBattery>,
    address: SocketAddr,
    hosts: Vec<SimulatedHost>,
    // Held so the Hosts' scratch directories live as long as they do.
    _scratch: Option<tempfile::TempDir>,
}

impl LocalBattery {
    /// Starts the simulated Hosts and the battery, and registers every Host (`AddHost`,
    /// or `UpdateHost` when the data directory already knows it under an old address).
    pub async fn start(config: LocalBatteryConfig) -> Result<Self, LocalError> {
        let (host_root, scratch) = match &config.data_dir {
            Some(dir) => (dir.join("hosts"), None),
            None => {
                let tmp = tempfile::Builder::new()
                    .prefix("battery-hosts-")
                    .tempdir()
                    .map_err(|source| LocalError::StateDir {
                        path: std::env::temp_dir(),
                        source,
                    })?;
                (tmp.path().to_path_buf(), Some(tmp))
            }
        };
        let mut hosts = Vec::with_capacity(config.hosts);
        for i in 0..config.hosts {
            let name = format!("host-{i}");
            let state_dir = host_root.join(&name);
            std::fs::create_dir_all(&state_dir).map_err(|source| LocalError::StateDir {
                path: state_dir.clone(),
                source,
            })?;
            let host = SimulatedHost::start(SimulatedHostConfig {
                name: name.clone(),
                state_dir,
                provisioning_delay: config.provisioning_delay,
                ssh_proxy: config.ssh_proxy.clone(),
                ..SimulatedHostConfig::default()
            })
            .await
            .map_err(|source| LocalError::HostStart { name, source })?;
            hosts.push(host);
        }
        let battery = start_battery(&config, config.listen).await?;
        let address = battery.address();
        let local = Self {
            config,
            battery: Some(battery),
            address,
            hosts,
            _scratch: scratch,
        };
        local.register_hosts().await?;
        Ok(local)
    }

    /// battery's gRPC address.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The simulated Hosts, in name order.
    pub fn hosts(&self) -> &[SimulatedHost] {
        &self.hosts
    }

    /// The simulated Host called `name`.
    pub fn host(&self, name: &str) -> Option<&SimulatedHost> {
        self.hosts.iter().find(|h| h.name() == name)
    }

    /// Stops only the battery and starts it again on the same data directory and
    /// address while the Hosts keep running, as when poolmgrd's pod restarts.
    pub async fn restart_battery(&mut self) -> Result<(), LocalError> {
        self.stop_battery().await;
        let battery = start_battery(&self.config, self.address).await?;
        self.battery = Some(battery);
        Ok(())
    }

    /// Stops only the battery, as when poolmgrd is down; [`Self::restart_battery`]
    /// brings it back.
    pub async fn stop_battery(&mut self) {
        if let Some(battery) = self.battery.take() {
            battery.shutdown().await;
        }
    }

    /// Stops the battery, then the Hosts.
    pub async fn shutdown(mut self) {
        self.stop_battery().await;
        for host in self.hosts.drain(..) {
            host.shutdown().await;
        }
    }

    async fn register_hosts(&self) -> Result<(), LocalError> {
        let battery = self.battery.as_ref().expect("started");
        for host in &self.hosts {
            let spec = insecure_host(host.name(), &host.address().to_string());
            battery
                .register_host(spec)
                .await
                .map_err(|source| LocalError::RegisterHost {
                    name: host.name().to_owned(),
                    source,
                })?;
        }
        Ok(())
    }
}

async fn start_battery(
    config: &LocalBatteryConfig,
    addr: SocketAddr,
) -> Result<EmbeddedBattery, LocalError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| LocalError::Bind { addr, source })?;
    let battery_config = BatteryConfig {
        data_dir: config.data_dir.clone(),
        ..config.battery.clone()
    };
    EmbeddedBattery::start(battery_config, listener)
        .await
        .map_err(LocalError::BatteryStart)
}

/// A Host spec for AddHost/UpdateHost reached in plaintext (`tls.insecure`), as the
/// simulated Hosts are.
pub fn insecure_host(name: &str, address: &str) -> Host {
    Host {
        name: name.to_owned(),
        address: address.to_owned(),
        tls: Some(HostTls {
            insecure: true,
            ..HostTls::default()
        }),
        ..Host::default()
    }
}
