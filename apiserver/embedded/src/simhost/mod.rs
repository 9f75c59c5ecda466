//! A simulated flintlock Host: a real gRPC server speaking flintlockd's API, so the
//! embedded battery talks to it exactly as poolmgrd talks to flintlockd.
//!
//! # This is a simulation, with no isolation
//!
//! **A simulated MicroVM is a directory, and its commands are ordinary local
//! processes run as the user who runs this Host, with that user's full rights.**
//! Nothing is virtualized, sandboxed or confined: a command can read and write
//! anything that user can, outside its MicroVM's directory too. Run it only for
//! development and tests, and never expose its port to anyone you would not give a
//! shell as that user.
//!
//! # What it serves
//!
//! On one port, as flintlockd does (`reference/battery-api.md` §2):
//! - `microvm.services.api.v1alpha1.MicroVM`: CreateMicroVM, DeleteMicroVM,
//!   GetMicroVM, ListMicroVMs, ListMicroVMsStream and ServerInfo;
//! - `microvmexec.services.api.v1alpha1.MicroVMExec`: ExecCommand;
//! - `microvmsshproxy.services.api.v1alpha1.MicroVMSSHProxy`: SSHProxy, only with
//!   [`SimulatedHostConfig::ssh_proxy`] (as flintlockd only with
//!   `--enable-ssh-proxy-api`; without, the call is UNIMPLEMENTED);
//! - `grpc.health.v1.Health`, SERVING for "" and each service served.
//!
//! # MicroVMs
//!
//! - CreateMicroVM assigns a uid (a UUID string; flintlock's are ULIDs, and clients
//!   must treat both as opaque), sets `spec.uid` and `spec.created_at`, and answers
//!   state PENDING. After [`SimulatedHostConfig::provisioning_delay`] the MicroVM is
//!   CREATED, or FAILED if [`HostFaults::fail_boot`] was on when it was created. An
//!   empty `spec.id` gets a generated one in namespace `default`, as in flintlock.
//! - `status.network_interfaces` has one entry per template interface, keyed by
//!   `device_id`: `host_device_name` `tap<N>` (`macvtap<N>` for MACVTAP), `index`
//!   N (unique on the Host), and `mac_address` the template's `guest_mac` or a
//!   random locally administered one.
//! - DeleteMicroVM removes the MicroVM at once (no DELETING state is ever shown),
//!   kills the commands running in it and removes its directory. An unknown uid is
//!   NOT_FOUND.
//! - ListMicroVMs with an empty namespace lists every namespace.
//! - Each MicroVM (uid, spec, state, interfaces) is persisted in its record,
//!   `<state_dir>/records/<uid>.json`, before a change to it is answered, so a Host
//!   restarted on the same directory still has its MicroVMs: CREATED ones stay CREATED,
//!   PENDING ones boot again. Each MicroVM's directory is `<state_dir>/microvms/<uid>/`.
//!   The one `<state_dir>/microvms.json` of earlier versions is moved to records at
//!   start.
//!
//! # Exec
//!
//! Where flintlock's guest agent runs a command inside the MicroVM, the simulation
//! runs it as a local process in the MicroVM's directory.
//! - The first request must be `start`, else INVALID_ARGUMENT. An empty `uid` or
//!   `cmd`, or a negative `timeout_seconds`, is INVALID_ARGUMENT; an unknown uid
//!   NOT_FOUND; a MicroVM not CREATED FAILED_PRECONDITION. These end the RPC before
//!   any output.
//! - With `shell`, the command is `sh -c <cmd> sh <args>...`, so `args` are the
//!   script's `$1`, `$2`, ...; without, `cmd` is the program, found on PATH, and
//!   `args` its arguments.
//! - `cwd` is a guest path: the MicroVM's directory stands for the guest's `/`, and
//!   `..` never climbs above it. Empty means `/`.
//! - The environment is PATH (the Host's), HOME (the MicroVM's directory) and the
//!   request's `env`, which wins. Nothing else of the Host's environment leaks in.
//! - `user` is ignored: every command runs as the user running the Host.
//! - With `has_stdin`, `stdin` chunks are written to the command's stdin, and
//!   `stdin_eof` or the client half-closing closes it. Without, the command's stdin
//!   is empty and `stdin` chunks are dropped.
//! - stdout and stderr chunks are sent as they are read. The stream ends with
//!   `exit_code`: the exit status, or 128+n for a command killed by signal n.
//! - Past `timeout_seconds` (0 means none) the command is killed and the stream ends
//!   with `error` "command timed out after Ns" then `exit_code` 124, as timeout(1)
//!   reports.
//! - A command that cannot start ends with `error` saying why, then `exit_code` 127
//!   if the program or cwd does not exist and 126 otherwise, as a shell reports.
//! - The command leads its own process group. When it exits, whatever it left
//!   running in that group is killed, so a background child holding its output open
//!   cannot stall the stream. A process that leaves the group (`setsid`) escapes
//!   this: there is no isolation.
//! - The client cancelling or going away kills the process group. A second `start`
//!   or an empty request kills it and ends the stream with INVALID_ARGUMENT.
//!   Deleting the MicroVM kills it and ends the stream with ABORTED; the Host
//!   shutting down, with UNAVAILABLE.
//!
//! # SSH proxy
//!
//! Where flintlock relays the stream to the guest's sshd, the simulation runs the
//! Host's OpenSSH `sshd -i` per stream ([`SshProxyConfig::sshd`], by default the first in
//! `PATH`, else Debian's `openssh-server`'s `/usr/sbin/sshd`: [`find_sshd`]), logging
//! in **local users of the Host, with no isolation**.
//! - The first request must be `uid`, else INVALID_ARGUMENT; the MicroVM is looked up
//!   as for exec, with the same codes. Without sshd the call is FAILED_PRECONDITION.
//! - Then the stream carries the SSH connection: `data` requests to sshd's stdin, its
//!   stdout in `data` responses. The client half-closing closes sshd's stdin; the
//!   stream ends when sshd has exited and all it wrote is sent. A later `uid` or an
//!   empty request ends it with INVALID_ARGUMENT.
//! - sshd accepts only certificates of [`SshProxyConfig::user_ca_public_key`]'s CA
//!   (as any local user the certificate names, root included), with ptys and TCP
//!   forwarding. Its host key is generated when the Host starts.
//! - Commands and shells start in the MicroVM's directory, but nothing keeps them
//!   there; the environment is what sshd gives a login.
//! - The client going away kills sshd; deleting the MicroVM kills it and ends the
//!   stream with ABORTED; the Host shutting down, with UNAVAILABLE.

mod error;
mod exec;
mod host;
mod microvm;
mod records;
mod registry;
mod ssh;
#[cfg(feature = "test-util")]
pub mod testing;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use battery_proto::microvm::services::api::v1alpha1::micro_vm_server::MicroVmServer;
use battery_proto::microvmexec::services::api::v1alpha1::micro_vm_exec_server::MicroVmExecServer;
use battery_proto::microvmsshproxy::services::api::v1alpha1::micro_vmssh_proxy_server::MicroVmsshProxyServer;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tracing::{info, warn};

pub use error::{PersistError, SimHostError};
pub use host::HostFaults;
pub use ssh::{SSHD_MAX_SESSIONS, SshProxyConfig, find_sshd};

use exec::ExecService;
use host::Host;
use microvm::MicroVmService;
use registry::Registry;
use ssh::{SshProxy, SshProxyService};

/// How long [`SimulatedHost::shutdown`] lets open connections finish before it
/// drops them, as flintlockd and poolmgrd force a stop after a grace period.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How to run a [`SimulatedHost`].
#[derive(Clone, Debug)]
pub struct SimulatedHostConfig {
    /// The Host's name, as it is registered with battery.
    pub name: String,
    /// Where to serve gRPC; port 0 picks a free port.
    pub listen: SocketAddr,
    /// The MicroVMs' directories and the persisted MicroVM list. Required: the
    /// default is empty and [`SimulatedHost::start`] refuses it.
    pub state_dir: PathBuf,
    /// How long a new MicroVM stays PENDING before it is CREATED.
    pub provisioning_delay: Duration,
    /// The version ServerInfo reports; battery requires v0.15.2 or newer.
    pub version: String,
    /// Serve MicroVMSSHProxy, with a local sshd; `None` (the default) leaves it
    /// unimplemented.
    pub ssh_proxy: Option<SshProxyConfig>,
}

impl Default for SimulatedHostConfig {
    fn default() -> Self {
        Self {
            name: "host-0".to_owned(),
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            state_dir: PathBuf::new(),
            provisioning_delay: Duration::ZERO,
            version: "v0.15.2".to_owned(),
            ssh_proxy: None,
        }
    }
}

/// A running simulated flintlock Host. Dropping it stops it without waiting;
/// [`shutdown`](Self::shutdown) waits until everything it ran has stopped.
pub struct SimulatedHost {
    host: Arc<Host>,
    address: SocketAddr,
    ssh_proxy: Option<Arc<SshProxy>>,
    server: Option<JoinHandle<()>>,
}

impl SimulatedHost {
    /// Loads the MicroVMs persisted in `config.state_dir`, binds `config.listen` and
    /// starts serving. Returns once the port is bound, so the Host is reachable.
    ///
    /// # Errors
    ///
    /// When `state_dir` is empty, cannot be created, or holds a state file that
    /// cannot be read; when `listen` cannot be bound; or when `ssh_proxy`'s CA key is
    /// not an OpenSSH public key or sshd's files cannot be written.
    pub async fn start(config: SimulatedHostConfig) -> Result<SimulatedHost, SimHostError> {
        if config.state_dir.as_os_str().is_empty() {
            return Err(SimHostError::StateDirRequired);
        }
        let ssh_proxy = config
            .ssh_proxy
            .as_ref()
            .map(SshProxy::prepare)
            .transpose()?
            .map(Arc::new);
        let shutdown = CancellationToken::new();
        let (registry, pending) = Registry::open(&config.state_dir, shutdown.clone()).await?;
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| SimHostError::Bind {
                    addr: config.listen,
                    source,
                })?;
        let address = listener.local_addr().map_err(SimHostError::LocalAddr)?;

        let host = Arc::new(Host {
            name: config.name,
            version: config.version,
            provisioning_delay: config.provisioning_delay,
            faults: HostFaults::default(),
            registry,
            shutdown: shutdown.clone(),
        });
        for (uid, lifetime) in pending {
            microvm::schedule_boot(&host, uid, &lifetime, host.faults.boot_outcome());
        }

        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<MicroVmServer<MicroVmService>>().await;
        health.set_serving::<MicroVmExecServer<ExecService>>().await;
        if ssh_proxy.is_some() {
            health
                .set_serving::<MicroVmsshProxyServer<SshProxyService>>()
                .await;
        }
        let router = tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(MicroVmServer::new(MicroVmService::new(Arc::clone(&host))))
            .add_service(MicroVmExecServer::new(ExecService::new(Arc::clone(&host))))
            .add_optional_service(ssh_proxy.clone().map(|proxy| {
                MicroVmsshProxyServer::new(SshProxyService::new(Arc::clone(&host), proxy))
            }));
        let name = host.name.clone();
        let server = tokio::spawn(async move {
            // As flintlockd's Go server does: small HTTP/2 frames must not wait for an ACK.
            let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
            if let Err(error) = router
                .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
                .await
            {
                warn!(host = %name, %error, "simulated host server failed");
            }
        });
        info!(host = %host.name, %address, "simulated flintlock host started");
        Ok(SimulatedHost {
            host,
            address,
            ssh_proxy,
            server: Some(server),
        })
    }

    /// The Host's name.
    pub fn name(&self) -> &str {
        &self.host.name
    }

    /// Where the Host serves gRPC (with the real port when 0 was asked for).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Fault injection, for tests.
    pub fn faults(&self) -> &HostFaults {
        &self.host.faults
    }

    /// How many SSH sessions (logins, one sshd each) its SSH proxy has started.
    pub fn ssh_logins(&self) -> u64 {
        self.ssh_proxy
            .as_ref()
            .map_or(0, |proxy| proxy.sessions_started())
    }

    /// The uids of the MicroVMs that exist (not deleted), in order.
    pub fn microvm_uids(&self) -> Vec<String> {
        self.host.registry.uids()
    }

    /// Stops serving, kills every running command and waits until all of it has
    /// stopped. The persisted MicroVMs stay for a Host started on the same directory.
    pub async fn shutdown(mut self) {
        self.host.shutdown.cancel();
        self.host.registry.wait_idle().await;
        if let Some(mut server) = self.server.take() {
            match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    warn!(host = %self.host.name, %error, "simulated host server task failed")
                }
                Err(_) => {
                    warn!(host = %self.host.name, "connections still open after the grace period; dropping them");
                    server.abort();
                }
            }
        }
        info!(host = %self.host.name, "simulated flintlock host stopped");
    }
}

impl Drop for SimulatedHost {
    fn drop(&mut self) {
        // Without this a dropped Host would keep serving and running commands.
        self.host.shutdown.cancel();
    }
}

impl std::fmt::Debug for SimulatedHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedHost")
            .field("name", &self.host.name)
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}
