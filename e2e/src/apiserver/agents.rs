//! The exec path, as a cluster runs it: the relay's two CAs and the
//! `serve` flags for them, and one `battery-agent` process per Host. Each agent is its
//! Host's identity (`system:battery-agent:<host>` in `battery:agents`, a client
//! certificate of the cluster's CA), registers its Host, reports its readiness and
//! gets its relay serving certificate from `hosts/<name>/certificate`, all through
//! kube-apiserver.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use battery_apiserver::resources::hosts::ssh_certificate::SshUserCa;
use battery_types::agent_identity::{AGENT_GROUP, agent_username};
use tokio::process::Command;

use super::Cluster;
use crate::binaries::target_binary;
use crate::pki::{Ca, Validity};
use crate::process::Process;

/// The checks a simulated Host cannot pass: it has no KVM device and no thin pool.
pub const SIMULATED_HOST_SKIPS: &str = "kvm,thin-pool";

/// The relay's certificates, in `dir`.
pub(super) struct RelayPki {
    agent_ca: (PathBuf, PathBuf),
    relay_client_ca: PathBuf,
    relay_client: (PathBuf, PathBuf),
    /// The SSH user CA's private key (for `serve`) and public key (for the simulated
    /// Hosts' sshd): terminals (ADR 33).
    ssh_user_ca: (PathBuf, PathBuf),
}

impl RelayPki {
    /// The CA that signs agents' serving certificates (the API server signs with it),
    /// and the one that signs the API server's relay client certificate (the agents
    /// accept only it): separate, as ADR 13 says.
    pub(super) fn write(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("create the relay's PKI directory");
        let file = |name: &str| dir.join(name);
        let agent_ca = (file("agent-ca.crt"), file("agent-ca.key"));
        Ca::new("e2e agent CA")
            .and_then(|ca| ca.write(&agent_ca.0, &agent_ca.1))
            .expect("write the agent CA");
        let relay_client_ca = file("relay-client-ca.crt");
        let relay_client = (file("relay-client.crt"), file("relay-client.key"));
        let ca = Ca::new("e2e relay client CA").expect("a relay client CA");
        std::fs::write(&relay_client_ca, ca.pem()).expect("write the relay client CA");
        ca.client("battery-apiserver", &[], Validity::Current)
            .and_then(|cert| cert.write(&relay_client.0, &relay_client.1))
            .expect("write the relay client certificate");
        let ssh_user_ca = (file("ssh-user-ca"), file("ssh-user-ca.pub"));
        let ca = SshUserCa::generate().expect("an SSH user CA");
        let key = ca.to_openssh().expect("the SSH CA's key");
        crate::pki::write_file(&ssh_user_ca.0, key.as_bytes(), true)
            .expect("write the SSH user CA's key");
        std::fs::write(&ssh_user_ca.1, ca.public_key()).expect("write the SSH user CA");
        Self {
            agent_ca,
            relay_client_ca,
            relay_client,
            ssh_user_ca,
        }
    }

    /// `battery-apiserver serve`'s flags for the relay and the signer.
    pub fn serve_args(&self) -> Vec<OsString> {
        [
            ("--agent-ca-file", &self.agent_ca.0),
            ("--agent-client-cert-file", &self.relay_client.0),
            ("--agent-client-key-file", &self.relay_client.1),
            ("--agent-signing-cert-file", &self.agent_ca.0),
            ("--agent-signing-key-file", &self.agent_ca.1),
            ("--agent-ssh-ca-key-file", &self.ssh_user_ca.0),
        ]
        .into_iter()
        .flat_map(|(flag, path)| [OsString::from(flag), path.into()])
        .collect()
    }
}

/// How one agent is started, so that it can be started again the same way.
#[derive(Clone, Debug)]
pub struct AgentSpec {
    pub host: String,
    /// flintlockd's address: the simulated Host's.
    pub flintlock: String,
    /// Where it listens and what it advertises.
    pub listen: SocketAddr,
    /// Extra flags (for example a KVM device that is not there).
    pub extra: Vec<String>,
}

/// The agents of one server, by Host.
pub struct Agents {
    pki: RelayPki,
    dir: PathBuf,
    pub(super) running: BTreeMap<String, (AgentSpec, Process)>,
}

impl Agents {
    pub fn new(dir: &Path) -> Self {
        Self {
            pki: RelayPki::write(&dir.join("relay")),
            dir: dir.to_owned(),
            running: BTreeMap::new(),
        }
    }

    pub fn serve_args(&self) -> Vec<OsString> {
        self.pki.serve_args()
    }

    /// `battery-apiserver embedded-battery`'s flags: its Hosts' sshd trusts the SSH CA
    /// `serve` certifies the agents' keys with.
    pub fn battery_args(&self) -> Vec<OsString> {
        vec![
            "--ssh-user-ca-public-key-file".into(),
            self.pki.ssh_user_ca.1.clone().into(),
        ]
    }

    /// What the API server dials the agents' relay with, PEM files: the CA of the agents'
    /// serving certificates, and its relay client certificate and key.
    pub fn relay_client_tls(&self) -> [&Path; 3] {
        [
            &self.pki.agent_ca.0,
            &self.pki.relay_client.0,
            &self.pki.relay_client.1,
        ]
    }

    /// Starts the agent `spec` describes, as its Host's identity (a client certificate
    /// of the cluster's CA, as `deploy/README.md` has a Host's agent get one) through
    /// kube-apiserver. The binding `deploy/` ships for the agents' group lets it in.
    /// The agents running now.
    pub fn processes(&self) -> impl Iterator<Item = &Process> {
        self.running.values().map(|(_, process)| process)
    }

    pub async fn start(&mut self, cluster: &Cluster, spec: AgentSpec) {
        let (cert, key) = cluster.client_certificate(&agent_username(&spec.host), &[AGENT_GROUP]);
        let dir = self.dir.join(format!("agent-{}", spec.host));
        std::fs::create_dir_all(&dir).expect("create the agent's directory");
        let kubeconfig = dir.join("kubeconfig");
        cluster.write_kubeconfig(&kubeconfig, (&cert, &key));
        let listen = spec.listen.to_string();
        let mut command = Command::new(target_binary("battery-agent", "battery-agent"));
        command
            .args(["--listen", &listen, "--advertise-address", &listen])
            .args(["--host-name", &spec.host])
            .arg("--serving-certificate-from-api-server")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--client-ca-file")
            .arg(&self.pki.relay_client_ca)
            .args([
                "--flintlock-address",
                &spec.flintlock,
                "--flintlock-insecure",
            ])
            .arg("--host-tls-insecure")
            // Kept across restarts of the Host's agent, as the DaemonSet's hostPath is.
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(&spec.extra);
        if !spec.extra.iter().any(|flag| flag == "--skip-check") {
            command.args(["--skip-check", SIMULATED_HOST_SKIPS]);
        }
        let log = dir.join(format!("agent-{}.log", self.running.len()));
        let (process, _) =
            Process::start(command, &log, battery_agent::logging::SERVING_PREFIX).await;
        self.running.insert(spec.host.clone(), (spec, process));
    }
}
