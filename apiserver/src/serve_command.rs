//! `battery-apiserver serve`: the production server in front of battery.

use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::auth::Authorizer;
use crate::cli::ServeConfig;
use crate::cluster::Cluster;
use crate::http::authn::{Authentication, TokenReviewer, TrustSources};
use crate::http::authz::{AuthenticatedOnly, SubjectAccessReviewer};
use crate::meta_store::MetaStore;
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

/// Serves with `config`, checked whole before (`ServeArgs::into_config`): from here on
/// only the cluster, battery or a port can fail.
pub async fn run(config: ServeConfig) -> anyhow::Result<()> {
    let ServeConfig {
        listen,
        battery,
        tls,
        trust,
        cluster,
        data_dir,
        bind_wait,
        slow_request_threshold,
        guest_api_server,
        limits,
        agent_relay,
        max_exec_sessions,
        agent_signer,
    } = config;
    if cluster.is_none() {
        tracing::warn!(
            "no cluster: every authenticated request is allowed, anonymous ones refused; give --kubeconfig (or run in a pod) to authorize with SubjectAccessReview"
        );
    }
    let (trust, keeper) = TrustSources {
        cluster: cluster.clone(),
        ..trust
    }
    .load()
    .await?;
    let authentication = Arc::new(Authentication::new(
        trust,
        cluster.clone().map(TokenReviewer::new),
    ));
    // The trust follows its sources for as long as the process serves.
    tokio::spawn(keeper.run(authentication.clone()));
    let store = open_store(data_dir.as_deref())?;
    let app = server::build(
        battery,
        store,
        &Settings {
            bind_wait,
            slow_request_threshold,
            authorizer: Some(match cluster.clone() {
                Some(client) => Arc::new(SubjectAccessReviewer::new(client)) as Arc<dyn Authorizer>,
                None => Arc::new(AuthenticatedOnly),
            }),
            cluster: cluster.map(|client| Arc::new(Cluster::watching(client))),
            limits,
            authentication,
            agent_relay,
            max_exec_sessions,
            agent_signer,
            guest_api_server,
        },
    )?;
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding {listen}"))?;
    let shutdown = shutdown_signal();
    // Scripts and tests read this line to learn the port when --listen has port 0.
    crate::logging::announce(&[format!(
        "battery-apiserver serve: serving https://{}",
        listener.local_addr()?
    )]);
    app.serve(listener, tls, shutdown).await;
    Ok(())
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
