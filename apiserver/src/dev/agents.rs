//! `dev`'s exec agents: one `battery-agent` per simulated Host, in this process, as a
//! DaemonSet runs one per Host. Each registers its Host and reports its readiness to the
//! dev server with its own identity (`system:battery-agent:<host>`), and relays exec
//! sessions to its simulated Host's `MicroVMExec` in plain gRPC, serving the relay with a
//! certificate the dev server signs for its Host (`hosts/<name>/certificate`). The simulated Hosts have
//! no KVM device and no thin pool, so those two checks are turned off, and every Ready
//! message says so.

use std::path::Path;

use anyhow::Context;
use battery_embedded::simhost::SimulatedHost;
use clap::Parser;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::kubeconfig::write_kubeconfig_for;
use super::pki::DevPki;

/// The checks a simulated Host cannot pass, turned off by name.
pub const SKIPPED_CHECKS: &str = "kvm,thin-pool";

/// Starts one agent per Host in `hosts`, reporting to the server at `server`; they stop
/// when the returned set is dropped or shut down.
pub async fn start(
    hosts: &[SimulatedHost],
    pki: &DevPki,
    server: &str,
) -> anyhow::Result<JoinSet<()>> {
    let mut agents = JoinSet::new();
    for host in hosts {
        let files = pki
            .agents
            .iter()
            .find(|a| a.host == host.name())
            .with_context(|| format!("no certificates were made for Host {}", host.name()))?;
        let kubeconfig = files
            .client_cert
            .parent()
            .unwrap_or(Path::new("."))
            .join("kubeconfig");
        write_kubeconfig_for(
            &kubeconfig,
            server,
            &pki.ca_cert,
            &files.client_cert,
            &files.client_key,
        )?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding an agent's relay")?;
        let address = listener.local_addr()?.to_string();
        let path = |p: &Path| p.display().to_string();
        let cli = battery_agent::Cli::try_parse_from([
            "battery-agent".to_owned(),
            "--listen".to_owned(),
            address.clone(),
            "--serving-certificate-from-api-server".to_owned(),
            "--client-ca-file".to_owned(),
            path(&pki.relay_client_ca_cert),
            "--flintlock-address".to_owned(),
            host.address().to_string(),
            "--flintlock-insecure".to_owned(),
            "--host-name".to_owned(),
            host.name().to_owned(),
            "--advertise-address".to_owned(),
            address,
            "--kubeconfig".to_owned(),
            path(&kubeconfig),
            "--host-tls-insecure".to_owned(),
            "--skip-check".to_owned(),
            SKIPPED_CHECKS.to_owned(),
            // Its own process table, beside its kubeconfig.
            "--state-dir".to_owned(),
            path(&kubeconfig.with_file_name("state")),
        ])
        .context("the dev agent's flags")?;
        let config = cli.into_config().context("the dev agent's configuration")?;
        let name = host.name().to_owned();
        // Spawned whole: the agent registers and gets its certificate from the server,
        // which serves only once every agent is started.
        agents.spawn(async move {
            let served = match battery_agent::start(config).await {
                Ok(agent) => agent.serve(listener, std::future::pending()).await,
                Err(error) => Err(error),
            };
            if let Err(error) = served {
                tracing::error!(host = %name, error = %anyhow::Error::from(error), "a dev agent stopped");
            }
        });
    }
    Ok(agents)
}
