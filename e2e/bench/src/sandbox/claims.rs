//! SandboxClaims and our binds, timed serially and in a burst through the same
//! kube-apiserver.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use http::{Method, StatusCode};
use kube::ResourceExt as _;
use kube::api::{Api, DynamicObject};
use serde_json::json;

use super::kubelet::{Aborting, follow};
use super::peer::{
    BASE_TIMEOUT, GROUP, NAMESPACE, PER_OBJECT_TIMEOUT, VERSION, WARM_POOL, extension,
};
use crate::binds;
use crate::client::Client;

/// How long one serial claim may take to be Ready.
const CLAIM_TIMEOUT: Duration = Duration::from_secs(60);

/// The SandboxClaim `name` on the warm pool, created through kube-apiserver as the
/// kubectl user (who creates our claims too).
pub(super) async fn create_claim(client: &Client, name: &str) -> Result<()> {
    let claim = json!({
        "apiVersion": format!("{GROUP}/{VERSION}"), "kind": "SandboxClaim",
        "metadata": {"name": name},
        "spec": {"warmPoolRef": {"name": WARM_POOL}},
    });
    client
        .json(
            Method::POST,
            &format!("/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/sandboxclaims"),
            Some(&claim),
            StatusCode::CREATED,
        )
        .await
        .with_context(|| format!("creating the SandboxClaim {name}"))?;
    Ok(())
}

/// `count` SandboxClaims one at a time: each one's create alone, and its create to Ready.
pub(super) async fn serial_claims(
    client: &Client,
    ready: &ReadyClaims,
    count: usize,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut created, mut readied) = (Vec::with_capacity(count), Vec::with_capacity(count));
    for i in 0..count {
        let name = format!("serial-{i}");
        let started = Instant::now();
        create_claim(client, &name).await?;
        created.push(started.elapsed());
        let at = ready.wait(&name, started + CLAIM_TIMEOUT).await?;
        readied.push(at.saturating_duration_since(started));
    }
    Ok((created, readied))
}

/// `count` binds of ours on `pool` one at a time, through kube-apiserver.
pub(super) async fn serial_binds(
    client: &Client,
    pool: &str,
    count: usize,
) -> Result<Vec<Duration>> {
    let mut took = Vec::with_capacity(count);
    for i in 0..count {
        took.push(binds::bind(client, &format!("beside-{i}"), pool).await?.0);
    }
    Ok(took)
}

/// `count` SandboxClaims created at once over `clients`: each one's create to Ready, and
/// the first create to the last Ready.
pub(super) async fn burst_claims(
    clients: &[Client],
    ready: &ReadyClaims,
    count: usize,
) -> Result<(Vec<Duration>, Duration)> {
    let started = Instant::now();
    let creates = (0..count).map(|i| async move {
        let name = format!("burst-{i}");
        let sent = Instant::now();
        create_claim(&clients[i % clients.len()], &name).await?;
        Ok::<_, anyhow::Error>((name, sent))
    });
    let created = futures::future::try_join_all(creates).await?;
    let deadline = started + BASE_TIMEOUT + PER_OBJECT_TIMEOUT * u32::try_from(count)?;
    let (mut took, mut last) = (Vec::with_capacity(count), started);
    for (name, sent) in created {
        let at = ready.wait(&name, deadline).await?;
        took.push(at.saturating_duration_since(sent));
        last = last.max(at);
    }
    Ok((took, last - started))
}

/// `count` binds of ours on `pool` at once over `clients`, through kube-apiserver: each
/// one's time, and all of theirs.
pub(super) async fn burst_binds(
    clients: &[Client],
    pool: &str,
    count: usize,
) -> Result<(Vec<Duration>, Duration)> {
    let started = Instant::now();
    let binds = (0..count).map(|i| async move {
        let client = &clients[i % clients.len()];
        Ok::<_, anyhow::Error>(
            binds::bind(client, &format!("beside-burst-{i}"), pool)
                .await?
                .0,
        )
    });
    let took = futures::future::try_join_all(binds).await?;
    Ok((took, started.elapsed()))
}

/// When each SandboxClaim was first seen Ready, from one watch of them all, as a client
/// waiting on its claim watches it.
pub(super) struct ReadyClaims {
    seen: Arc<Mutex<HashMap<String, Instant>>>,
    changed: Arc<tokio::sync::watch::Sender<()>>,
    claims: Api<DynamicObject>,
    _follow: Aborting,
}

impl ReadyClaims {
    /// Returns once the watch is open, so that no claim is seen late.
    pub(super) async fn start(admin: &kube::Client) -> Result<Self> {
        let claims = extension(admin, "SandboxClaim", "sandboxclaims");
        let seen = Arc::new(Mutex::new(HashMap::new()));
        let changed = Arc::new(tokio::sync::watch::Sender::new(()));
        let (recorded, notify) = (seen.clone(), changed.clone());
        let (follow, watching) = follow(
            claims.clone(),
            "SandboxClaims",
            move |claim: DynamicObject| {
                let ready = claim.data["status"]["conditions"]
                    .as_array()
                    .is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    });
                if ready {
                    let mut seen = recorded.lock().unwrap_or_else(|e| e.into_inner());
                    seen.entry(claim.name_any()).or_insert_with(Instant::now);
                    notify.send_replace(());
                }
            },
        );
        tokio::time::timeout(BASE_TIMEOUT, watching)
            .await
            .context("the watch of SandboxClaims did not open in time")?
            .context("the watch of SandboxClaims ended")?;
        Ok(Self {
            seen,
            changed,
            claims,
            _follow: follow,
        })
    }

    /// When the claim `name` was first seen Ready, waiting for it until `deadline`.
    pub(super) async fn wait(&self, name: &str, deadline: Instant) -> Result<Instant> {
        // Subscribed before looking, so a claim seen Ready in between still wakes us.
        let mut changed = self.changed.subscribe();
        loop {
            if let Some(at) = self
                .seen
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(name)
            {
                return Ok(*at);
            }
            match tokio::time::timeout_at(deadline.into(), changed.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => bail!("the watch of SandboxClaims ended"),
                Err(_) => {
                    let status = match self.claims.get(name).await {
                        Ok(claim) => claim.data["status"].to_string(),
                        Err(error) => format!("unreadable ({error})"),
                    };
                    bail!(
                        "the SandboxClaim {NAMESPACE}/{name} was not Ready in time; its \
                         status: {status}"
                    );
                }
            }
        }
    }
}
