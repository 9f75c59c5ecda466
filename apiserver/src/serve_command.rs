//! `battery-apiserver serve`: the production server in front of battery.

use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::api::{CreateRate, Limits};
use crate::battery::BatteryClient;
use crate::cluster::Cluster;
use crate::config::ServeArgs;
use crate::http::authn::{
    Authentication, RequestHeaderFlags, RequestHeaderNames, TokenReviewer, TrustSources,
};
use crate::http::authz::{AuthenticatedOnly, Authorizer, SubjectAccessReviewer};
use crate::http::serve::{self, TlsFiles};
use crate::meta_store::MetaStore;
use crate::relay::AgentRelayTls;
use crate::resources::hosts::certificate::AgentSigner;
use crate::resources::hosts::ssh_certificate::SshUserCa;
use crate::server::{self, Settings};

/// Opens the metadata store (in `dir`, or in memory).
pub fn open_store(dir: Option<&std::path::Path>) -> anyhow::Result<Arc<MetaStore>> {
    let store = match dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            MetaStore::open(&dir.join("apiserver.redb"))?
        }
        None => MetaStore::in_memory()?,
    };
    Ok(Arc::new(store))
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let agent_relay = agent_relay(&args)?;
    let cluster_client = cluster(args.kubeconfig.as_deref()).await?;
    if cluster_client.is_none() {
        tracing::warn!(
            "no cluster: every authenticated request is allowed, anonymous ones refused; give --kubeconfig (or run in a pod) to authorize with SubjectAccessReview"
        );
    }
    let (trust, keeper) = TrustSources {
        client_ca_file: args.client_ca_file.clone(),
        request_header: args.requestheader_client_ca_file.clone().map(|ca_file| {
            RequestHeaderFlags {
                ca_file,
                names: RequestHeaderNames {
                    allowed_names: args.requestheader_allowed_names.clone(),
                    username_headers: args.requestheader_username_headers.clone(),
                    uid_headers: args.requestheader_uid_headers.clone(),
                    group_headers: args.requestheader_group_headers.clone(),
                    extra_prefixes: args.requestheader_extra_headers_prefix.clone(),
                },
            }
        }),
        cluster: cluster_client.clone(),
        tolerate_lookup_failure: args.authentication_tolerate_lookup_failure,
    }
    .load()
    .await?;
    let authentication = Arc::new(Authentication::new(
        trust,
        cluster_client.clone().map(TokenReviewer::new),
    ));
    // The trust follows its sources for as long as the process serves.
    tokio::spawn(keeper.run(authentication.clone()));
    let tls = TlsFiles {
        cert: args.tls_cert_file,
        key: args.tls_private_key_file,
    };
    let (acceptor, _reloader) = serve::acceptor(&tls)?;
    let battery = BatteryClient::connect_lazy(&args.battery_address)
        .with_context(|| format!("--battery-address {}", args.battery_address))?;
    let store = open_store(args.data_dir.as_deref())?;
    let agent_signer = match (&args.agent_signing_cert_file, &args.agent_signing_key_file) {
        (Some(cert), Some(key)) => {
            let signer = AgentSigner::from_files(cert, key, args.agent_certificate_lifetime)?;
            Some(Arc::new(match &args.agent_ssh_ca_key_file {
                Some(path) => signer.with_ssh_ca(SshUserCa::from_file(path)?),
                None => signer,
            }))
        }
        _ => None,
    };
    let app = server::build(
        battery,
        store,
        &Settings {
            bind_wait: args.bind_wait,
            authorizer: Some(match cluster_client.clone() {
                Some(client) => Arc::new(SubjectAccessReviewer::new(client)) as Arc<dyn Authorizer>,
                None => Arc::new(AuthenticatedOnly),
            }),
            cluster: cluster_client.map(|client| Arc::new(Cluster::watching(client))),
            limits: Limits {
                max_watches: args.max_watches,
                creates: args.creates_per_second.map(|per_second| CreateRate {
                    per_second,
                    burst: args.create_burst,
                }),
                request_timeout: args.request_timeout,
            },
            authentication,
            agent_relay,
            max_exec_sessions: args.max_exec_sessions,
            agent_signer,
        },
    )?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let shutdown = shutdown_signal();
    // Scripts and tests read this line to learn the port when --listen has port 0.
    crate::logging::announce(&[format!(
        "battery-apiserver serve: serving https://{}",
        listener.local_addr()?
    )]);
    app.serve(listener, acceptor, shutdown).await;
    Ok(())
}

/// The exec relay's TLS material, read before any port is bound; clap ensures the three
/// files come together.
fn agent_relay(args: &ServeArgs) -> anyhow::Result<Option<AgentRelayTls>> {
    let (Some(ca), Some(cert), Some(key)) = (
        &args.agent_ca_file,
        &args.agent_client_cert_file,
        &args.agent_client_key_file,
    ) else {
        return Ok(None);
    };
    let read = |flag: &str, path: &std::path::Path| {
        std::fs::read(path).with_context(|| format!("reading --{flag} {}", path.display()))
    };
    Ok(Some(AgentRelayTls {
        ca_pem: read("agent-ca-file", ca)?,
        client_cert_pem: read("agent-client-cert-file", cert)?,
        client_key_pem: read("agent-client-key-file", key)?,
    }))
}

/// A client of the cluster served: from `kubeconfig` when given, else the in-cluster
/// config of the pod; without either, authorization, namespace lifecycle checks and
/// Events are off.
async fn cluster(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Option<kube::Client>> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading --kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        None => match kube::Config::incluster() {
            Ok(config) => config,
            Err(err) => {
                tracing::debug!(error = %err, "no in-cluster config");
                return Ok(None);
            }
        },
    };
    Ok(Some(
        crate::cluster::client(config).context("building the cluster client")?,
    ))
}

/// Resolves on Ctrl-C or SIGTERM. Both are listened for from this call on, not from the
/// first poll: a signal sent right after the server says it is serving must stop it
/// gracefully, not kill it.
pub fn shutdown_signal() -> impl Future<Output = ()> {
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    let interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt());
    async move {
        let (mut term, mut interrupt) = match (term, interrupt) {
            (Ok(term), Ok(interrupt)) => (term, interrupt),
            (Err(err), _) | (_, Err(err)) => {
                tracing::warn!(error = %err, "cannot listen for SIGTERM and SIGINT");
                return std::future::pending().await;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
    }
}
