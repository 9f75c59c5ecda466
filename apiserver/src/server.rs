//! Composes the server: the metadata store, battery's client, one storage per resource,
//! the background work that follows battery, and the HTTP stack in front of them.
//!
//! The request path is one stack in `build`, read top to bottom from the outermost
//! layer; each layer says why it sits where it does, and a refusing layer answers with a
//! `Status`. After it come the routes: non-resource paths, then
//! `/apis/<group>/<version>/...` dispatched by request info to the resource's storage.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use battery_api_machinery::discovery::Discovery;
use battery_api_machinery::openapi::OpenApi;
use battery_types::{
    GROUP, HasResourceInfo, Host, HostCertificateRequest, MicroVMClaim, MicroVMProcess, Pool,
    RESOURCES, VERSION,
};
use kube::CustomResourceExt;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinSet;
use tower::ServiceBuilder;

use crate::api::{Endpoint, Limits, ResourceEndpoint, ScaleEndpoint, resource_router};
use crate::auth::Authorizer;
use crate::battery::BatteryClient;
use crate::cluster::Cluster;
use crate::http::authn::{self, Authentication};
use crate::http::authz;
use crate::http::{NonResource, ServedOpenApi, nonresource_router};
use crate::http::{recover, request_info};
use crate::meta_store::MetaStore;
use crate::metrics::{self, Metrics};
use crate::relay::{AgentRelay, AgentRelayTls};
use crate::resources::follow::Follower;
use crate::resources::hosts::certificate::{AgentSigner, HostCertificates};
use crate::resources::hosts::{HostDirectory, HostStatusWriter, HostStorage};
use crate::resources::microvmclaims::{
    ClaimConfig, ClaimExec, ClaimLeases, ClaimPortForward, ClaimStorage, DEFAULT_MAX_SESSIONS,
    ExecSessions, GuestApiServer, ProcessAttach, ProcessStop, ProcessStorage,
};
use crate::resources::pools::PoolStorage;

/// Events kept for binds waiting on `VM_AVAILABLE`.
const EVENT_FANOUT: usize = 1024;
/// How often battery's Hosts are listed: battery has no host events, so this bounds how
/// long another client's change to a Host, or a deleted Host's progress, takes to show.
const HOST_SYNC_INTERVAL: Duration = Duration::from_secs(2);

/// How long a claim's create waits for a MicroVM, unless told.
pub const DEFAULT_BIND_WAIT: Duration = Duration::from_secs(5);

/// As kube-apiserver's handlers log a create's or an update's trace.
pub const DEFAULT_SLOW_REQUEST_THRESHOLD: Duration = Duration::from_millis(500);

/// How the server behaves, beyond where it listens.
#[derive(Clone)]
pub struct Settings {
    /// How long a claim's create waits for a MicroVM when its pool has none available.
    pub bind_wait: Duration,
    /// A request at least this slow is logged with its steps.
    pub slow_request_threshold: Duration,
    /// The cluster served, for namespace lifecycle and Events; `None` in `dev`.
    pub cluster: Option<Arc<Cluster>>,
    /// Watches, create rate and request deadline.
    pub limits: Limits,
    /// Who requests are trusted to come from.
    pub authentication: Arc<Authentication>,
    /// Who may do what; `None` allows every request (only where nothing else can reach
    /// the server).
    pub authorizer: Option<Arc<dyn Authorizer>>,
    /// The TLS material for the exec agents' relay; `None` answers every exec 503.
    pub agent_relay: Option<AgentRelayTls>,
    /// Exec sessions open at once; more are answered 429.
    pub max_exec_sessions: usize,
    /// The CA that signs exec agents' serving certificates at `hosts/<name>/certificate`;
    /// `None` answers that subresource 503.
    pub agent_signer: Option<Arc<AgentSigner>>,
    /// Where claims' guests with a ServiceAccount token are told kube-apiserver is.
    pub guest_api_server: Option<GuestApiServer>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            bind_wait: DEFAULT_BIND_WAIT,
            slow_request_threshold: DEFAULT_SLOW_REQUEST_THRESHOLD,
            cluster: None,
            limits: Limits::default(),
            authentication: Arc::default(),
            authorizer: None,
            agent_relay: None,
            max_exec_sessions: DEFAULT_MAX_SESSIONS,
            agent_signer: None,
            guest_api_server: None,
        }
    }
}

/// The kind's schema as its CRD carries it, for OpenAPI.
fn schema<K: CustomResourceExt>() -> serde_json::Value {
    let crd = K::crd();
    crd.spec
        .versions
        .first()
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .map(|s| serde_json::to_value(s).unwrap_or_default())
        .map(unwrap_descriptions)
        .unwrap_or_default()
}

/// Doc comments wrap at our line width; `kubectl explain` wraps again itself, so a
/// single line break becomes a space and only paragraph breaks stay.
fn unwrap_descriptions(mut value: serde_json::Value) -> serde_json::Value {
    match &mut value {
        serde_json::Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if key == "description"
                    && let serde_json::Value::String(text) = child
                {
                    *text = text
                        .split("\n\n")
                        .map(|paragraph| {
                            paragraph
                                .split('\n')
                                .map(str::trim)
                                .collect::<Vec<_>>()
                                .join(" ")
                        })
                        .collect::<Vec<_>>()
                        .join("\n\n");
                } else {
                    *child = unwrap_descriptions(std::mem::take(child));
                }
            }
        }
        serde_json::Value::Array(items) => {
            for item in items.iter_mut() {
                *item = unwrap_descriptions(std::mem::take(item));
            }
        }
        _ => {}
    }
    value
}

/// The built server: its router and the background tasks it needs.
pub struct App {
    pub router: Router,
    pub tasks: JoinSet<()>,
    exec_sessions: Arc<ExecSessions>,
    /// For the claims' activity, written once the sessions have ended.
    claims: Arc<ClaimStorage>,
}

/// How often the cluster's OpenAPI definitions are read again (an upgraded kube-apiserver
/// serves new ones); and again after a failed read.
const CLUSTER_OPENAPI_INTERVAL: Duration = Duration::from_secs(600);
const CLUSTER_OPENAPI_RETRY: Duration = Duration::from_secs(10);

/// Serves `built` with its v2 document's Kubernetes definitions taken from the cluster's
/// (`OpenApi::with_cluster_definitions`), read now and every
/// [`CLUSTER_OPENAPI_INTERVAL`]. Until the first read answers, ours are served.
async fn follow_cluster_openapi(
    cluster: Arc<Cluster>,
    built: OpenApi,
    served: watch::Sender<ServedOpenApi>,
) {
    loop {
        let wait = match cluster.openapi_v2_definitions().await {
            Ok(definitions) => {
                let (documents, adopted) = built.with_cluster_definitions(&definitions);
                tracing::debug!(adopted, "took the cluster's OpenAPI v2 definitions");
                served.send_if_modified(|current| {
                    let changed =
                        current.documents.v2_document().hash() != documents.v2_document().hash();
                    if changed {
                        current.documents = Arc::new(documents);
                    }
                    let settling = !current.settled;
                    current.settled = true;
                    changed || settling
                });
                CLUSTER_OPENAPI_INTERVAL
            }
            Err(err) => {
                tracing::warn!(error = %err, "reading the cluster's OpenAPI v2 definitions; serving ours meanwhile");
                served.send_if_modified(|current| !std::mem::replace(&mut current.settled, true));
                CLUSTER_OPENAPI_RETRY
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// How long exec sessions get, once told the server shuts down, to pass that on.
const EXEC_DRAIN: Duration = Duration::from_secs(5);

impl App {
    /// Serves over TLS on `listener` until `shutdown`, then ends every exec session with
    /// a Status saying so, and lets them send it.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        tls: tokio_rustls::TlsAcceptor,
        shutdown: impl Future<Output = ()>,
    ) {
        let sessions = &self.exec_sessions;
        let shutdown = async {
            shutdown.await;
            // Upgraded connections are outside the HTTP server's drain: they end now,
            // while it drains the others.
            sessions.end_all();
        };
        crate::http::serve::serve(listener, tls, self.router, shutdown).await;
        sessions.drained(EXEC_DRAIN).await;
        // The sessions' ends are the claims' last activity: kept, so idle timeouts run on
        // from them after the restart.
        self.claims.save_activity().await;
    }
}

/// Builds the server over `battery` and `store`, and starts its background work.
pub fn build(
    battery: BatteryClient,
    store: Arc<MetaStore>,
    settings: &Settings,
) -> anyhow::Result<App> {
    let (events, _) = broadcast::channel(EVENT_FANOUT);
    // One registry per server: `/metrics` serves it, and whatever records into it (the
    // observing layer, the battery client, the storages, the follower) holds a clone.
    let metrics = Arc::new(Metrics::default().with_store_writes(store.write_duration()));
    let battery = battery.with_metrics(metrics.clone());
    let directory = Arc::new(HostDirectory::new(battery.clone(), store.clone()));
    let pools = PoolStorage::new(
        battery.clone(),
        store.clone(),
        directory.clone(),
        metrics.clone(),
    );
    let hosts = Arc::new(HostStorage::new(directory.clone()));
    let exec_sessions = Arc::new(ExecSessions::new(
        settings.max_exec_sessions,
        metrics.exec_sessions(),
    ));
    let relay = Arc::new(AgentRelay::new(settings.agent_relay.as_ref()));
    let mut claims = ClaimStorage::new(
        battery.clone(),
        store.clone(),
        pools.clone(),
        events.clone(),
        settings.bind_wait,
        metrics.clone(),
        exec_sessions.clone(),
    )
    .with_config(
        ClaimConfig::new(
            settings.cluster.clone(),
            settings.authorizer.clone(),
            relay.clone(),
        )
        .with_guest_api_server(settings.guest_api_server.clone()),
    )
    .with_relay(relay.clone());
    // ResourceQuotas and ServiceAccount tokens live in the cluster; `dev` has none.
    if let Some(cluster) = &settings.cluster {
        claims = claims.with_quotas(cluster.clone());
        pools.serve_tokens();
    }
    let claims = Arc::new(claims);
    let exec = Arc::new(ClaimExec {
        claims: claims.clone(),
        sessions: exec_sessions.clone(),
        relay: relay.clone(),
    });
    let port_forward = Arc::new(ClaimPortForward {
        claims: claims.clone(),
        sessions: exec_sessions.clone(),
        relay,
    });
    let processes = Arc::new(ProcessStorage::new(claims.clone()));
    let attach = Arc::new(ProcessAttach {
        processes: processes.clone(),
        sessions: exec_sessions.clone(),
    });

    let endpoints: Vec<Arc<dyn Endpoint>> = vec![
        Arc::new(
            ResourceEndpoint::new(pools.clone(), store.clone())
                .with_subresource("scale", Arc::new(Arc::new(ScaleEndpoint(pools.clone())))),
        ),
        Arc::new(
            ResourceEndpoint::new(claims.clone(), store.clone())
                .with_subresource("lease", Arc::new(Arc::new(ClaimLeases(claims.clone()))))
                .with_connect("portforward", Arc::new(port_forward))
                .with_connect("exec", Arc::new(exec)),
        ),
        Arc::new(
            ResourceEndpoint::new(processes.clone(), store.clone())
                .with_subresource("stop", Arc::new(Arc::new(ProcessStop(processes.clone()))))
                .with_connect("attach", Arc::new(attach)),
        ),
        Arc::new(
            ResourceEndpoint::new(hosts.clone(), store.clone())
                .with_subresource(
                    "status",
                    Arc::new(Arc::new(HostStatusWriter(hosts.clone()))),
                )
                .with_subresource(
                    "certificate",
                    Arc::new(Arc::new(HostCertificates {
                        hosts: hosts.clone(),
                        signer: settings.agent_signer.clone(),
                    })),
                ),
        ),
    ];
    let kinds = [
        (&Pool::INFO, schema::<Pool>()),
        (&MicroVMClaim::INFO, schema::<MicroVMClaim>()),
        (&MicroVMProcess::INFO, schema::<MicroVMProcess>()),
        (&Host::INFO, schema::<Host>()),
    ];
    let started = Arc::new(AtomicBool::new(false));
    let openapi = OpenApi::with_subresource_kinds(
        GROUP,
        VERSION,
        &kinds,
        &[("HostCertificateRequest", schema::<HostCertificateRequest>())],
    )?;
    let (openapi_sender, served_openapi) = watch::channel(ServedOpenApi {
        documents: Arc::new(openapi.clone()),
        settled: settings.cluster.is_none(),
    });
    let nonresource = Arc::new(NonResource {
        discovery: Discovery::new(GROUP, VERSION, RESOURCES),
        openapi: served_openapi,
        battery_serving: {
            let battery = battery.clone();
            Box::new(move || {
                let battery = battery.clone();
                Box::pin(async move { battery.readiness().await })
            })
        },
        metrics: metrics.clone(),
        started: started.clone(),
    });
    let lifecycle = settings
        .cluster
        .clone()
        .map(|c| c as Arc<dyn crate::api::NamespaceLifecycle>);
    let stack =
        ServiceBuilder::new()
            // What the request asks for, parsed once: every layer below and the dispatch
            // read it. A path that does not parse is answered 400 before anything acts on it.
            .layer(axum::middleware::from_fn(request_info::parse))
            // Logs and counts every request once, whoever answers it below, with labels
            // from the request info.
            .layer(axum::middleware::from_fn_with_state(
                metrics::Observer {
                    metrics: metrics.clone(),
                    slow_request_threshold: settings.slow_request_threshold,
                },
                metrics::observe,
            ))
            // A panic below becomes a 500 `Status`, logged and counted above.
            .layer(axum::middleware::from_fn(recover::recover_panics))
            // Who is asking: front-proxy headers vouched for by the requestheader CA, a
            // client certificate, a bearer token, or anonymous; identity headers stripped.
            .layer(axum::middleware::from_fn_with_state(
                settings.authentication.clone(),
                authn::authenticate,
            ))
            // Whether they may: the cluster's SubjectAccessReview, or `dev`'s or `serve`'s
            // local policy; health, discovery and OpenAPI always. None where nothing else
            // can reach the server.
            .option_layer(settings.authorizer.clone().map(|authorizer| {
                axum::middleware::from_fn_with_state(authorizer, authz::authorize)
            }));
    let router = resource_router(endpoints, lifecycle, settings.limits.clone())
        .merge(nonresource_router(nonresource, GROUP, VERSION))
        .layer(stack);

    let mut tasks = JoinSet::new();
    if let Some(cluster) = settings.cluster.clone() {
        tasks.spawn(follow_cluster_openapi(cluster, openapi, openapi_sender));
    }
    tasks.spawn(claims.quotas().write_status());
    tasks.spawn(processes.follow());
    tasks.spawn(claims.clone().enforce_limits(settings.cluster.clone()));
    let limits_claims = claims.clone();
    tasks.spawn(
        Follower {
            battery,
            store,
            pools: pools.clone(),
            claims: claims.clone(),
            events,
            cluster: settings.cluster.clone(),
            metrics: metrics.clone(),
        }
        .run(),
    );
    let adopt_pools = pools.clone();
    let followed_hosts = hosts.clone();
    let host_ready_claims = claims.clone();
    tasks.spawn(async move {
        loop {
            tokio::time::sleep(HOST_SYNC_INTERVAL).await;
            if let Err(err) = followed_hosts.sync().await {
                tracing::warn!(error = %err, "following battery's hosts");
            }
            if let Err(err) = host_ready_claims.refresh_host_ready().await {
                tracing::warn!(error = %err, "following Hosts' readiness on their claims");
            }
        }
    });
    tasks.spawn(async move {
        loop {
            directory.changed().await;
            if let Err(err) = pools.reresolve_all().await {
                tracing::warn!(error = %err, "re-resolving pools after a Host changed");
            }
        }
    });
    tasks.spawn(async move {
        // battery may still be starting: retry until its objects are adopted and every
        // lease an interrupted bind left is released.
        loop {
            match (hosts.sync().await, adopt_pools.adopt_all().await) {
                (Ok(()), Ok(())) => break,
                (Err(err), _) | (_, Err(err)) => {
                    tracing::warn!(error = %err, "adopting battery's hosts and pools; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        loop {
            match claims.recover().await {
                Ok(n) => {
                    if n > 0 {
                        tracing::info!(leases = n, "released leases that binds left without their claims");
                    }
                    break;
                }
                Err(err) => {
                    tracing::warn!(error = %err, "releasing leases binds left without their claims; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        // The claims' ServiceAccount tokens, replaced and followed on again (ADR 43).
        if let Err(err) = claims.resume_tokens().await {
            tracing::warn!(error = %err, "resuming the claims' ServiceAccount tokens");
        }
        started.store(true, Ordering::Release);
    });
    Ok(App {
        router,
        tasks,
        exec_sessions,
        claims: limits_claims,
    })
}
