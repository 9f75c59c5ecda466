//! `aggregator-stand-in`: a **test stand-in** for kube-apiserver's aggregator and its
//! authentication/authorization webhooks. It is not a kube-apiserver; it is just enough
//! of one for the e2e suite to drive `battery-apiserver serve` the way a cluster does,
//! from both sides:
//!
//! - **in front** ([`front`]): it terminates kubectl's TLS, authenticates the caller
//!   (client certificate of `client-ca`, a bearer token of the policy, or anonymous),
//!   authorizes it against the policy as kube-apiserver does before proxying, and
//!   forwards to battery-apiserver with the front-proxy client certificate and
//!   `X-Remote-*` headers, streaming both ways and splicing upgrades;
//! - **behind** ([`cluster`]): it is the kube-apiserver that battery-apiserver's
//!   `--kubeconfig` points to: TokenReview, SubjectAccessReview, the ConfigMap
//!   `kube-system/extension-apiserver-authentication` (get, list, watch), Namespaces,
//!   Events, ResourceQuotas, and Secrets and ConfigMaps a test creates.
//!
//! Certificates and kubeconfigs are in [`pki`], the policy file and the authorization
//! decision in [`policy`], and [`StandIn`] starts the binary for tests.

pub mod cluster;
pub mod front;
mod launcher;
pub mod pki;
pub mod policy;
mod quotas;
mod status;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use tokio::io::AsyncBufReadExt as _;

pub use launcher::{StandIn, write_client};

/// What the binary prints once it accepts connections, before its URL.
pub const SERVING_PREFIX: &str = "aggregator-stand-in: serving ";
/// What it prints once it has a backend, before the backend's URL.
pub const FORWARDING_PREFIX: &str = "aggregator-stand-in: forwarding to ";

/// The command line.
#[derive(Debug, clap::Parser)]
#[command(
    name = "aggregator-stand-in",
    about = "A test stand-in for kube-apiserver's aggregator and its authentication/authorization webhooks (not a kube-apiserver).",
    long_about = "A test stand-in for kube-apiserver's aggregator and its authentication/authorization \
webhooks, for battery-apiserver's end-to-end tests. It is not a kube-apiserver.\n\n\
In front, it authenticates and authorizes kubectl's requests from a policy file and forwards \
them to battery-apiserver with the front-proxy client certificate and X-Remote-* headers. \
Behind, it answers what battery-apiserver asks a cluster: TokenReview, SubjectAccessReview, \
the ConfigMap kube-system/extension-apiserver-authentication, Namespaces, Events, \
ResourceQuotas, and Secrets and ConfigMaps created through it.\n\n\
Without --backend, the backend's URL is read from stdin, one line at a time (each line \
replaces the last)."
)]
pub struct Args {
    /// The directory of its certificates, kubeconfigs and default policy (made when
    /// missing, reused when present).
    #[arg(long)]
    pub dir: PathBuf,
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The policy file (tokens, rules, namespaces); default: DIR/policy.json, written
    /// with the default policy when missing. Read again whenever it changes.
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// battery-apiserver's URL (https://127.0.0.1:PORT); default: read from stdin.
    #[arg(long)]
    pub backend: Option<String>,
}

/// Runs the stand-in until the process is killed.
pub async fn run(args: Args) -> Result<()> {
    let layout = pki::Layout::new(&args.dir);
    pki::ensure(&layout)?;
    let policy_path = match &args.policy {
        Some(path) => path.clone(),
        None => {
            let path = layout.policy();
            if !path.is_file() {
                let token = uuid::Uuid::new_v4().simple().to_string();
                let policy = policy::Policy::default_with_token(&token);
                pki::write_file(
                    &path,
                    serde_json::to_string_pretty(&policy)?.as_bytes(),
                    true,
                )?;
            }
            path
        }
    };
    let policy = Arc::new(policy::PolicyFile::open(&policy_path)?);

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let address = listener.local_addr()?;
    let url = format!("https://{address}");
    write_kubeconfigs(&layout, &url, &policy.current())?;

    let read = |path: PathBuf| {
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    };
    let cluster = Arc::new(cluster::Cluster::new(
        policy.clone(),
        address.to_string(),
        &read(layout.client_ca())?,
        &read(layout.front_proxy_ca())?,
    ));
    let front = Arc::new(front::Front::new(layout, policy, cluster)?);
    match &args.backend {
        Some(backend) => {
            front.set_backend(backend)?;
            announce(&format!("{FORWARDING_PREFIX}{backend}"));
        }
        None => {
            let front = front.clone();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let line = line.trim();
                    if line.is_empty() {
                        continue;
                    }
                    match front.set_backend(line) {
                        Ok(()) => announce(&format!("{FORWARDING_PREFIX}{line}")),
                        Err(error) => tracing::error!("ignoring the backend {line:?}: {error:#}"),
                    }
                }
            });
        }
    }
    tracing::info!(%url, "a test stand-in for kube-apiserver's aggregator and its webhooks");
    announce(&format!("{SERVING_PREFIX}{url}"));
    front.serve(listener).await
}

/// One line on stdout, flushed at once: the harness waits for it.
fn announce(line: &str) {
    use std::io::Write as _;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}

/// `kubeconfig` (kubectl's certificate) and `apiserver.kubeconfig` (the bearer token the
/// policy gives battery-apiserver's ServiceAccount), both for the stand-in at `url`.
fn write_kubeconfigs(layout: &pki::Layout, url: &str, policy: &policy::Policy) -> Result<()> {
    let (cert, key) = layout.kubectl();
    pki::write_kubeconfig(
        &layout.kubeconfig(),
        url,
        &layout.serving_ca(),
        serde_json::json!({"client-certificate": cert, "client-key": key}),
    )?;
    let token = policy
        .tokens
        .iter()
        .find(|t| t.user.username == pki::APISERVER_USER)
        .map(|t| t.token.clone());
    let user = match token {
        Some(token) => serde_json::json!({"token": token}),
        None => {
            tracing::warn!(
                "the policy has no token for {}: apiserver.kubeconfig is anonymous",
                pki::APISERVER_USER
            );
            serde_json::json!({})
        }
    };
    pki::write_kubeconfig(
        &layout.apiserver_kubeconfig(),
        url,
        &layout.serving_ca(),
        user,
    )
}
