//! What the server needs from the Kubernetes cluster it serves, when there is one
//! (`serve`; `dev` runs without): kube-apiserver does not run its admission chain on
//! requests it proxies to us (`reference/aggregated-apiserver.md` §8.3), so we refuse
//! creates in missing or terminating namespaces ourselves; battery's hook failures
//! become Warning Events on the Pool, so `kubectl describe pool` shows them (and a claim
//! ended by its idle timeout or maximum lifetime an Event on the claim); a claim's
//! `env` and `files` read the Secrets and ConfigMaps they name (after the requesting
//! user's SubjectAccessReview, which is the claim storage's to make); and claims' quotas
//! are the namespace's ResourceQuotas, read here, and their status written here.
//! Namespaces and quotas are read from caches kept by a watch ([`informer`]). A claim's
//! ServiceAccount token is requested, and bound to a Secret of its own, in [`tokens`].

mod informer;
pub mod tokens;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use battery_api_machinery::status::ApiError;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, EventSource, Namespace, ObjectReference, ResourceQuota, Secret,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use moka::sync::Cache;
use secrecy::SecretSlice;

/// How long a namespace's phase, asked of kube-apiserver because the watched cache lacks
/// it (not yet synced, or the namespace was created an instant ago), is trusted.
const NAMESPACE_TTL: Duration = Duration::from_secs(2);
/// Phases kept at most, so creates naming many namespaces cannot grow memory without
/// bound; past it the least used go first.
const NAMESPACE_CACHE_ENTRIES: u64 = 4096;
/// How long a namespace's ResourceQuotas, asked of kube-apiserver before the watched
/// cache has synced, are trusted.
const QUOTA_TTL: Duration = Duration::from_secs(2);
/// Namespaces whose quotas are kept at most, as for phases.
const QUOTA_CACHE_ENTRIES: u64 = 4096;
/// The field manager `managedFields` record our writes of a quota's status under; without
/// one kube-apiserver takes it from the User-Agent, which kube's client does not send, and
/// records `unknown`.
const QUOTA_FIELD_MANAGER: &str = "battery-apiserver";
/// The `source.component` of our Events.
const COMPONENT: &str = "battery-apiserver";
/// Idle connections to kube-apiserver kept for reuse. kube's default client keeps every
/// connection a burst opened (HTTP/1.1, one request at a time each: a burst of
/// uncached SubjectAccessReviews opens one apiece) for 90 s, without a bound; past
/// this many, a connection closes once its request is answered.
const IDLE_CONNECTIONS: usize = 8;
/// How long an idle connection is kept, as client-go's transport keeps one.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Active,
    Terminating,
    Missing,
}

/// The keys of a Secret or ConfigMap and their values, which stay secret in memory.
pub type KeyValues = BTreeMap<String, SecretSlice<u8>>;

/// A client of the cluster `config` names: kube's own stack (its base URI, retries,
/// credentials, impersonation headers and timeouts, without its debug spans) on a
/// connection pool that keeps at most [`IDLE_CONNECTIONS`] idle.
pub fn client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    use kube::client::ConfigExt as _;
    use kube::client::retry::RetryPolicy;

    if config.proxy_url.is_some() {
        // kube's own stack answers a proxy as it always did: this build enables none.
        return kube::Client::try_from(config);
    }
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(config.connect_timeout);
    let mut connector =
        hyper_timeout::TimeoutConnector::new(config.rustls_https_connector_with_connector(http)?);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let pool = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_timer(hyper_util::rt::TokioTimer::new())
        .pool_max_idle_per_host(IDLE_CONNECTIONS)
        .pool_idle_timeout(IDLE_TIMEOUT)
        .build(connector);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| tower::retry::RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        // What the retry policy reads.
        .map_err(tower::BoxError::from)
        .service(pool);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// A client of the cluster's kube-apiserver.
pub struct Cluster {
    client: kube::Client,
    /// The watched caches, when started ([`Cluster::watching`]).
    namespaces: Option<informer::Informer<Namespace>>,
    watched_quotas: Option<informer::Informer<ResourceQuota>>,
    /// What was asked of kube-apiserver while a watched cache could not answer.
    phases: Cache<String, Phase>,
    quotas: Cache<String, Arc<Vec<ResourceQuota>>>,
}

impl Cluster {
    /// A client that asks kube-apiserver for namespaces and quotas, caching each answer
    /// briefly.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            namespaces: None,
            watched_quotas: None,
            phases: crate::cache::bounded(NAMESPACE_TTL, NAMESPACE_CACHE_ENTRIES),
            quotas: crate::cache::bounded(QUOTA_TTL, QUOTA_CACHE_ENTRIES),
        }
    }

    /// A client that also watches every namespace and ResourceQuota of the cluster, so a
    /// create reads them from memory; the watches stop when it is dropped.
    pub fn watching(client: kube::Client) -> Self {
        Self {
            namespaces: Some(informer::Informer::start(client.clone())),
            watched_quotas: Some(informer::Informer::start(client.clone())),
            ..Self::new(client)
        }
    }

    async fn phase(&self, namespace: &str) -> Result<Phase, ApiError> {
        let watched = self
            .namespaces
            .as_ref()
            .and_then(|n| n.namespace(namespace));
        if let Some(ns) = watched {
            return Ok(phase_of(&ns));
        }
        if let Some(phase) = self.phases.get(namespace) {
            return Ok(phase);
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        let phase = match api.get_opt(namespace).await {
            Ok(None) => Phase::Missing,
            Ok(Some(ns)) => phase_of(&ns),
            Err(err) => {
                return Err(ApiError::service_unavailable(format!(
                    "cannot check namespace {namespace}: {err}"
                )));
            }
        };
        self.phases.insert(namespace.to_owned(), phase);
        Ok(phase)
    }

    /// The `definitions` of kube-apiserver's own `/openapi/v2` (which the
    /// `system:discovery` role lets every authenticated user read).
    pub async fn openapi_v2_definitions(
        &self,
    ) -> Result<serde_json::Map<String, serde_json::Value>, kube::Error> {
        let request = http::Request::get("/openapi/v2")
            .header(http::header::ACCEPT, "application/json")
            .body(Vec::new())
            .map_err(kube::Error::HttpError)?;
        let mut document: serde_json::Value = self.client.request(request).await?;
        Ok(
            match document.get_mut("definitions").map(serde_json::Value::take) {
                Some(serde_json::Value::Object(definitions)) => definitions,
                _ => serde_json::Map::new(),
            },
        )
    }

    /// Go's NamespaceLifecycle admission: a create needs an existing namespace that is not
    /// being deleted (the namespace controller races against creates).
    pub async fn admit_create(&self, namespace: &str) -> Result<(), ApiError> {
        match self.phase(namespace).await? {
            Phase::Active => Ok(()),
            Phase::Missing => Err(ApiError::namespace_not_found(namespace)),
            Phase::Terminating => Err(ApiError::namespace_terminating(namespace)),
        }
    }

    /// A Secret's `data`, or `None` when there is no such Secret. Never cached: a claim
    /// bound later sees the Secret as it is then.
    pub async fn secret_data(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<KeyValues>, ApiError> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let secret = api
            .get_opt(name)
            .await
            .map_err(|err| read_failed("Secret", namespace, name, &err))?;
        Ok(secret.map(|secret| {
            secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(key, value)| (key, value.0.into()))
                .collect()
        }))
    }

    /// A ConfigMap's `data` and `binaryData` as one map (the API keeps their keys
    /// apart), or `None` when there is no such ConfigMap.
    pub async fn config_map_data(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<KeyValues>, ApiError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        let config_map = api
            .get_opt(name)
            .await
            .map_err(|err| read_failed("ConfigMap", namespace, name, &err))?;
        Ok(config_map.map(|config_map| {
            let text = config_map
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(key, value)| (key, value.into_bytes().into()));
            let binary = config_map
                .binary_data
                .unwrap_or_default()
                .into_iter()
                .map(|(key, value)| (key, value.0.into()));
            text.chain(binary).collect()
        }))
    }

    /// Records an Event of `event_type` (`Normal` or `Warning`) on a Pool. The Event's
    /// name carries battery's event id, so replays of battery's history create each Event
    /// once.
    pub async fn pool_event(
        &self,
        pool: &ObjectMeta,
        battery_event_id: u64,
        event_type: &str,
        reason: &str,
        message: String,
    ) -> Result<(), kube::Error> {
        let name = format!(
            "{}.battery-{battery_event_id}",
            pool.name.as_deref().unwrap_or_default()
        );
        self.event("Pool", pool, name, event_type, reason, message)
            .await
    }

    /// Records an Event of `event_type` on a MicroVMClaim, named as client-go's recorder
    /// names one (`<object>.<time in hex nanoseconds>`): each is a thing that happened once.
    pub async fn claim_event(
        &self,
        claim: &ObjectMeta,
        event_type: &str,
        reason: &str,
        message: String,
    ) -> Result<(), kube::Error> {
        let nanos = k8s_openapi::jiff::Timestamp::now().as_nanosecond();
        let name = format!("{}.{nanos:x}", claim.name.as_deref().unwrap_or_default());
        self.event("MicroVMClaim", claim, name, event_type, reason, message)
            .await
    }

    /// Creates the Event `name` on the object `kind` of `meta`; one that exists is kept.
    async fn event(
        &self,
        kind: &str,
        meta: &ObjectMeta,
        name: String,
        event_type: &str,
        reason: &str,
        message: String,
    ) -> Result<(), kube::Error> {
        let namespace = meta.namespace.clone().unwrap_or_default();
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some(battery_types::API_VERSION.to_owned()),
                kind: Some(kind.to_owned()),
                name: meta.name.clone(),
                namespace: Some(namespace.clone()),
                uid: meta.uid.clone(),
                ..ObjectReference::default()
            },
            reason: Some(reason.to_owned()),
            message: Some(message),
            type_: Some(event_type.to_owned()),
            source: Some(EventSource {
                component: Some(COMPONENT.to_owned()),
                ..EventSource::default()
            }),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            ..Event::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(err) => Err(err),
        }
    }
}

fn phase_of(namespace: &Namespace) -> Phase {
    let phase = namespace.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase == Some("Terminating") {
        Phase::Terminating
    } else {
        Phase::Active
    }
}

/// A read the cluster did not answer: ours to retry, not the user's fault (a 403 here is
/// the API server's own RBAC lacking `get` on the kind, which the message shows).
fn read_failed(kind: &str, namespace: &str, name: &str, err: &kube::Error) -> ApiError {
    ApiError::service_unavailable(format!(
        "cannot read {kind} {namespace}/{name} from the cluster: {err}"
    ))
}

impl Cluster {
    /// The namespace's ResourceQuotas: as watched, or else read when not read lately. A
    /// read that fails refuses the create, as the quota plugin fails closed.
    pub async fn resource_quotas(
        &self,
        namespace: &str,
    ) -> Result<Arc<Vec<ResourceQuota>>, ApiError> {
        let watched = self
            .watched_quotas
            .as_ref()
            .and_then(|q| q.quotas(namespace));
        if let Some(quotas) = watched {
            return Ok(Arc::new(quotas));
        }
        if let Some(quotas) = self.quotas.get(namespace) {
            return Ok(quotas);
        }
        let api: Api<ResourceQuota> = Api::namespaced(self.client.clone(), namespace);
        let list = api.list(&ListParams::default()).await.map_err(|err| {
            ApiError::service_unavailable(format!(
                "cannot read the resource quotas of namespace {namespace}: {err}"
            ))
        })?;
        let quotas = Arc::new(list.items);
        self.quotas.insert(namespace.to_owned(), quotas.clone());
        Ok(quotas)
    }

    /// Merges `patch` into a ResourceQuota's status subresource, as the field manager
    /// [`QUOTA_FIELD_MANAGER`]; the cached quotas of its namespace are read again next
    /// time, so they show the write.
    pub async fn patch_resource_quota_status(
        &self,
        namespace: &str,
        name: &str,
        patch: serde_json::Value,
    ) -> Result<(), ApiError> {
        let api: Api<ResourceQuota> = Api::namespaced(self.client.clone(), namespace);
        let params = PatchParams {
            field_manager: Some(QUOTA_FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        api.patch_status(name, &params, &Patch::Merge(&patch))
            .await
            .map_err(|err| {
                ApiError::service_unavailable(format!(
                    "cannot write the status of resource quota {namespace}/{name}: {err}"
                ))
            })?;
        self.quotas.invalidate(namespace);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A burst of concurrent requests opens a connection each; once answered, no more
    /// than `IDLE_CONNECTIONS` of them stay open.
    #[tokio::test]
    async fn a_burst_leaves_a_bounded_number_of_idle_connections() {
        const BURST: usize = 40;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let open = Arc::new(AtomicUsize::new(0));
        let accepting = open.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                accepting.fetch_add(1, Ordering::SeqCst);
                let open = accepting.clone();
                tokio::spawn(async move {
                    // Slow enough that the burst's requests overlap.
                    let answer = hyper::service::service_fn(|_| async {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok::<_, std::convert::Infallible>(http::Response::new(
                            http_body_util::Full::new(hyper::body::Bytes::from_static(b"{}")),
                        ))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), answer)
                        .await;
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        let client = client(kube::Config::new(url.parse().unwrap())).unwrap();
        let requests = (0..BURST).map(|_| {
            let client = client.clone();
            async move {
                let request = http::Request::get("/version").body(Vec::new()).unwrap();
                client.request_text(request).await.unwrap()
            }
        });
        futures::future::join_all(requests).await;
        assert!(
            open.load(Ordering::SeqCst) > IDLE_CONNECTIONS,
            "the burst did not open more connections than are kept"
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while open.load(Ordering::SeqCst) > IDLE_CONNECTIONS {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} connections still open",
                open.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The kept ones serve the next requests.
        let request = http::Request::get("/version").body(Vec::new()).unwrap();
        assert_eq!(client.request_text(request).await.unwrap(), "{}");
    }
}
