//! `battery-apiserver dev`: the server on loopback with the embedded battery and its
//! simulated Hosts, self-made certificates, a Pool to claim from, and a kubeconfig whose
//! user is the dev ServiceAccount (DESIGN §6), and one exec agent per simulated Host
//! (`agents.rs`). It prints the next command to type, and, on a machine without OpenSSH's
//! sshd, that terminals are off and the command that installs it (`terminals.rs`).

mod agents;
mod kubeconfig;
pub mod pki;
mod terminals;

use std::sync::Arc;

use anyhow::Context;
use axum::body::Body;
use battery_embedded::BatteryConfig;
use battery_embedded::local::{LocalBattery, LocalBatteryConfig};
use battery_embedded::simhost::{SshProxyConfig, find_sshd};
use http::{Request, StatusCode};
use tokio::net::TcpListener;
use tower::ServiceExt;

use crate::auth::UserInfo;
use crate::battery::BatteryClient;
use crate::cli::DevArgs;
use crate::http::authn::{Authentication, Trust, TrustConfig};
use crate::http::authz::LocalPolicy;
use crate::http::serve::{self, TlsFiles};
use crate::relay::AgentRelayTls;
use crate::resources::hosts::certificate::AgentSigner;
use crate::resources::hosts::ssh_certificate::SshUserCa;
use crate::serve_command::{open_store, shutdown_signal};
use crate::server::{self, Settings};

pub use kubeconfig::write_kubeconfig;

/// How long the agents' serving certificates live in `dev`: short, so a session of
/// trying things by hand sees a renewal.
const DEV_AGENT_CERTIFICATE_LIFETIME: std::time::Duration = std::time::Duration::from_secs(3600);

/// The Pool `dev` makes, so a claim works at once.
pub const DEV_POOL: &str = "dev";

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    // First: a port taken stops `dev` before it starts battery or makes its Pool.
    let listener = TcpListener::bind(args.listen).await.with_context(|| {
        format!(
            "binding {} (is another dev server running? try --listen 127.0.0.1:0)",
            args.listen
        )
    })?;
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let dir = args
        .dir
        .canonicalize()
        .with_context(|| format!("resolving {}", args.dir.display()))?;
    // The simulated Hosts' sshd trusts it; the agents log in with its certificates for
    // exec with a terminal.
    let ssh_ca = SshUserCa::generate()?;
    // Missing, it is said at start; the Hosts look for it again at each session.
    let terminals_off = terminals::off(
        args.sshd.as_deref(),
        find_sshd(),
        terminals::running_as_root(),
    );
    let local = LocalBattery::start(LocalBatteryConfig {
        ssh_proxy: Some(SshProxyConfig {
            user_ca_public_key: ssh_ca.public_key(),
            sshd: args.sshd.clone(),
        }),
        data_dir: args.data_dir.as_ref().map(|d| d.join("battery")),
        hosts: args.hosts,
        battery: BatteryConfig {
            sweep_interval: args.sweep_interval,
            // Fast enough to try things by hand, within what the simulation sustains.
            create_poll_interval: std::time::Duration::from_millis(200),
            guest_agent_interval: std::time::Duration::from_millis(200),
            ..BatteryConfig::default()
        },
        ..LocalBatteryConfig::default()
    })
    .await
    .context("starting the embedded battery")?;
    let host_names: Vec<&str> = local.hosts().iter().map(|h| h.name()).collect();
    let pki = pki::write_dev_pki_with_agents(&dir, &host_names)?;
    let battery = BatteryClient::connect_lazy(&format!("http://{}", local.address()))?;
    let store = open_store(
        args.data_dir
            .as_ref()
            .map(|d| d.join("apiserver"))
            .as_deref(),
    )?;
    let app = server::build(
        battery,
        store,
        &Settings {
            bind_wait: args.requests.bind_wait.into(),
            slow_request_threshold: args.requests.slow_request_threshold.into(),
            cluster: None,
            limits: Default::default(),
            authentication: Arc::new(Authentication::new(
                Trust::new(&TrustConfig {
                    client_ca: Some(std::fs::read(&pki.ca_cert)?),
                    request_header: None,
                })?,
                None,
            )),
            authorizer: Some(Arc::new(LocalPolicy {
                user: pki::DEV_USER.to_owned(),
            })),
            agent_relay: Some(AgentRelayTls {
                ca_pem: std::fs::read(&pki.agent_ca_cert)?,
                client_cert_pem: std::fs::read(&pki.relay_client_cert)?,
                client_key_pem: std::fs::read(&pki.relay_client_key)?,
            }),
            agent_signer: Some(Arc::new(
                AgentSigner::from_files(
                    &pki.agent_ca_cert,
                    &pki.agent_ca_key,
                    DEV_AGENT_CERTIFICATE_LIFETIME,
                )?
                .with_ssh_ca(ssh_ca),
            )),
            ..Settings::default()
        },
    )?;
    if args.pool_size > 0 {
        create_dev_pool(&app.router, args.pool_size).await?;
    }
    let (acceptor, _reloader) = serve::acceptor(&TlsFiles {
        cert: pki.serving_cert.clone(),
        key: pki.serving_key.clone(),
    })?;
    let addr = listener.local_addr()?;
    let kubeconfig = dir.join("kubeconfig");
    let server = format!("https://{addr}");
    write_kubeconfig(&kubeconfig, &server, &pki)?;
    let mut agents = agents::start(local.hosts(), &pki, &server).await?;
    let shutdown = shutdown_signal();
    let mut lines = vec![
        format!("battery-apiserver dev: serving https://{addr}"),
        format!(
            "  on the embedded battery (a simulation of poolmgrd; MicroVM commands run as local processes, no isolation) with {} simulated Hosts",
            local.hosts().len()
        ),
        format!(
            "  exec agents: one per simulated Host, registering it and reporting its readiness (checks turned off: {})",
            agents::SKIPPED_CHECKS
        ),
        format!(
            "  policy: you ({}, the kubeconfig's user) may do everything; each agent its own Host; anyone else nothing",
            pki::DEV_USER
        ),
    ];
    lines.extend(terminals_off);
    lines.push(format!(
        "next: kubectl --kubeconfig {} get pools,microvmclaims",
        kubeconfig.display()
    ));
    crate::logging::announce(&lines);
    app.serve(listener, acceptor, shutdown).await;
    agents.shutdown().await;
    local.shutdown().await;
    Ok(())
}

/// The Pool `default/dev` of `size` MicroVMs, as a manifest: `dev` makes it at start, and
/// the e2e suite makes the same one through a real kube-apiserver.
pub fn dev_pool(size: i32) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": battery_types::API_VERSION,
        "kind": "Pool",
        "metadata": {"name": DEV_POOL, "namespace": "default"},
        "spec": {
            "size": size,
            "template": {
                "vcpu": 1,
                "memoryInMb": 1024,
                "kernel": {"image": "ghcr.io/liquidmetal-dev/flintlock-kernel:6.1.55"},
                "rootVolume": {"id": "root", "containerSource": "ghcr.io/liquidmetal-dev/capmvm-kubernetes:1.30.0"},
                "interfaces": [{"deviceId": "eth1", "type": "Tap"}]
            }
        }
    })
}

/// Creates the Pool `default/dev` through the API itself, as the dev user.
async fn create_dev_pool(router: &axum::Router, size: i32) -> anyhow::Result<()> {
    let pool = dev_pool(size);
    let mut request = Request::post(format!(
        "/apis/{}/namespaces/default/pools?fieldManager=battery-apiserver-dev",
        battery_types::API_VERSION
    ))
    .header(http::header::CONTENT_TYPE, "application/json")
    .body(Body::from(pool.to_string()))?;
    request.extensions_mut().insert(UserInfo {
        name: pki::DEV_USER.to_owned(),
        groups: pki::DEV_GROUPS.iter().map(|g| (*g).to_owned()).collect(),
        ..UserInfo::default()
    });
    let response = router.clone().oneshot(request).await?;
    let status = response.status();
    // A persisted dev environment already has its Pool.
    if status == StatusCode::CREATED || status == StatusCode::CONFLICT {
        return Ok(());
    }
    let body = axum::body::to_bytes(response.into_body(), 64 * 1024).await?;
    anyhow::bail!(
        "creating the dev Pool: {status}: {}",
        String::from_utf8_lossy(&body)
    )
}
