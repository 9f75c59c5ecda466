//! The part of kube-apiserver that battery-apiserver itself calls (through the
//! `--kubeconfig` that points at the stand-in): TokenReview and SubjectAccessReview
//! answered from the policy, the ConfigMap `kube-system/extension-apiserver-authentication`
//! (get, list, watch), Namespaces (phases from the policy), Events, ResourceQuotas
//! ([`super::quotas`]), and the Secrets and ConfigMaps a test creates (for claims' `env`
//! and `files`). Only what a kube-apiserver would say, in its shape; nothing is persisted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewStatus, UserInfo};
use k8s_openapi::api::authorization::v1::{SubjectAccessReview, SubjectAccessReviewStatus};
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, Namespace, NamespaceSpec, NamespaceStatus, Secret,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIResource, APIResourceList, APIVersions, ListMeta, ObjectMeta, ServerAddressByClientCIDR,
    StatusDetails, Time,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use axum::response::IntoResponse as _;
use battery_api_machinery::params::{ListOptions, QueryOptions as _};
use battery_api_machinery::request_info::RequestInfo;

use super::policy::{PolicyFile, User};
use super::status;

mod created;

/// The ConfigMap kube-apiserver keeps for aggregated servers.
pub const AUTH_CONFIG_MAP: &str = "extension-apiserver-authentication";
pub const AUTH_NAMESPACE: &str = "kube-system";
/// How long a watch without `timeoutSeconds` stays open (kube-apiserver picks 30–60 min).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// The largest request body read (a TokenReview, an Event).
const BODY_LIMIT: usize = 1 << 20;

/// The kinds of objects that change while the stand-in runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Collection {
    ConfigMaps,
    Events,
    Namespaces,
    Secrets,
}

impl Collection {
    fn kind(self) -> &'static str {
        match self {
            Self::ConfigMaps => "ConfigMap",
            Self::Events => "Event",
            Self::Namespaces => "Namespace",
            Self::Secrets => "Secret",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Self::ConfigMaps => "configmaps",
            Self::Events => "events",
            Self::Namespaces => "namespaces",
            Self::Secrets => "secrets",
        }
    }
}

/// An object as stored: when it was created and last changed (resourceVersions).
#[derive(Debug, Clone)]
struct Stored {
    collection: Collection,
    created: u64,
    modified: u64,
    object: Value,
}

impl Stored {
    fn namespace(&self) -> &str {
        self.object["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
    }
}

struct State {
    /// The last resourceVersion given out; one counter for every object, as etcd's.
    revision: u64,
    config_map: ConfigMap,
    config_map_created: u64,
    events: Vec<Stored>,
    /// The Secrets and ConfigMaps tests created.
    created: Vec<Stored>,
}

/// The kube API the stand-in serves itself.
pub struct Cluster {
    policy: Arc<PolicyFile>,
    state: Mutex<State>,
    changes: broadcast::Sender<Stored>,
    quotas: super::quotas::Quotas,
    /// `host:port` of the stand-in, for `/api`'s `serverAddressByClientCIDRs`.
    address: String,
}

impl Cluster {
    pub fn new(
        policy: Arc<PolicyFile>,
        address: String,
        client_ca: &str,
        front_proxy_ca: &str,
    ) -> Self {
        let strings = |v: &[&str]| serde_json::to_string(v).expect("strings serialize");
        let data = BTreeMap::from([
            ("client-ca-file".to_owned(), client_ca.to_owned()),
            (
                "requestheader-client-ca-file".to_owned(),
                front_proxy_ca.to_owned(),
            ),
            (
                "requestheader-allowed-names".to_owned(),
                strings(&[super::pki::FRONT_PROXY_CN]),
            ),
            (
                "requestheader-username-headers".to_owned(),
                strings(&["X-Remote-User"]),
            ),
            (
                "requestheader-group-headers".to_owned(),
                strings(&["X-Remote-Group"]),
            ),
            (
                "requestheader-extra-headers-prefix".to_owned(),
                strings(&["X-Remote-Extra-"]),
            ),
            (
                "requestheader-uid-headers".to_owned(),
                strings(&["X-Remote-Uid"]),
            ),
        ]);
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(AUTH_CONFIG_MAP.to_owned()),
                namespace: Some(AUTH_NAMESPACE.to_owned()),
                uid: Some(uuid::Uuid::new_v4().to_string()),
                resource_version: Some("1".to_owned()),
                creation_timestamp: Some(now()),
                ..ObjectMeta::default()
            },
            data: Some(data),
            ..ConfigMap::default()
        };
        Self {
            policy,
            state: Mutex::new(State {
                revision: 1,
                config_map,
                config_map_created: 1,
                events: Vec::new(),
                created: Vec::new(),
            }),
            changes: broadcast::channel(256).0,
            quotas: super::quotas::Quotas::default(),
            address,
        }
    }

    /// Whether the stand-in answers `path` itself rather than forwarding it: all of
    /// `/api` (the core group is kube-apiserver's own) and the two review APIs.
    pub fn serves(path: &str) -> bool {
        path == "/api"
            || path.starts_with("/api/")
            || path.starts_with("/apis/authentication.k8s.io/")
            || path.starts_with("/apis/authorization.k8s.io/")
    }

    /// The ConfigMap as it is now.
    pub fn config_map(&self) -> ConfigMap {
        self.state.lock().expect("state lock").config_map.clone()
    }

    /// Puts `pem` (only it) into `requestheader-client-ca-file`, as kube-apiserver does
    /// after its front-proxy CA file changes, and tells open watches.
    pub fn set_front_proxy_ca(&self, pem: &str) -> ConfigMap {
        let mut state = self.state.lock().expect("state lock");
        state.revision += 1;
        let revision = state.revision;
        let config_map = &mut state.config_map;
        config_map
            .data
            .get_or_insert_default()
            .insert("requestheader-client-ca-file".to_owned(), pem.to_owned());
        config_map.metadata.resource_version = Some(revision.to_string());
        let config_map = config_map.clone();
        let change = Stored {
            collection: Collection::ConfigMaps,
            created: state.config_map_created,
            modified: revision,
            object: to_value(&config_map),
        };
        // No receiver is fine: nobody watches.
        let _ = self.changes.send(change);
        config_map
    }

    /// Answers a request the front side has authenticated and authorized.
    pub async fn handle(&self, request: Request<Body>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let path = parts.uri.path();
        let query = match ListOptions::from_request(
            parts.uri.query().unwrap_or_default(),
            &parts.headers,
        ) {
            Ok(options) => options,
            Err(error) => return error.into_response(),
        };
        let method = &parts.method;
        match path {
            "/api" => return self.api_versions(),
            "/api/v1" => return api_resources(),
            "/apis/authentication.k8s.io/v1/tokenreviews" if method == Method::POST => {
                return match read::<TokenReview>(body).await {
                    Ok(review) => self.token_review(review),
                    Err(response) => response,
                };
            }
            "/apis/authorization.k8s.io/v1/subjectaccessreviews" if method == Method::POST => {
                return match read::<SubjectAccessReview>(body).await {
                    Ok(review) => self.subject_access_review(review),
                    Err(response) => response,
                };
            }
            _ => {}
        }
        let Some(rest) = path.strip_prefix("/api/v1/") else {
            return status::no_such_path();
        };
        let segments: Vec<&str> = rest.split('/').collect();
        let get = method == Method::GET;
        if let ["namespaces", ns, "resourcequotas", rest @ ..] = segments.as_slice() {
            let exists = self.policy.current().namespace_phase(ns).is_some();
            return self
                .quotas
                .handle(ns, exists, rest, method, &parts.headers, body)
                .await;
        }
        match (segments.as_slice(), method) {
            (["namespaces"], _) if get => self.collection(Collection::Namespaces, None, &query),
            (["namespaces", name], _) if get => self.get(Collection::Namespaces, "", name),
            (["configmaps"], _) if get => self.collection(Collection::ConfigMaps, None, &query),
            (["namespaces", ns, "configmaps"], _) if get => {
                self.collection(Collection::ConfigMaps, Some(ns), &query)
            }
            (["namespaces", ns, "configmaps", name], _) if get => {
                self.get(Collection::ConfigMaps, ns, name)
            }
            (["namespaces", ns, "configmaps"], &Method::POST) => {
                match read::<ConfigMap>(body).await {
                    Ok(config_map) => {
                        self.create(Collection::ConfigMaps, ns, to_value(&config_map))
                    }
                    Err(response) => response,
                }
            }
            (["secrets"], _) if get => self.collection(Collection::Secrets, None, &query),
            (["namespaces", ns, "secrets"], _) if get => {
                self.collection(Collection::Secrets, Some(ns), &query)
            }
            (["namespaces", ns, "secrets", name], _) if get => {
                self.get(Collection::Secrets, ns, name)
            }
            (["namespaces", ns, "secrets"], &Method::POST) => match read::<Secret>(body).await {
                Ok(secret) => self.create(
                    Collection::Secrets,
                    ns,
                    to_value(&created::stored_secret(secret)),
                ),
                Err(response) => response,
            },
            (["events"], _) if get => self.collection(Collection::Events, None, &query),
            (["namespaces", ns, "events"], _) if get => {
                self.collection(Collection::Events, Some(ns), &query)
            }
            (["namespaces", ns, "events"], &Method::POST) => match read::<Event>(body).await {
                Ok(event) => self.create_event(ns, event),
                Err(response) => response,
            },
            (["namespaces", ns, "events", name], _) if get => {
                self.get(Collection::Events, ns, name)
            }
            (
                ["namespaces"]
                | ["namespaces", _]
                | ["configmaps" | "secrets" | "events"]
                | ["namespaces", _, "configmaps" | "secrets" | "events"]
                | ["namespaces", _, "configmaps" | "secrets" | "events", _],
                _,
            ) => status::method_not_allowed(method),
            _ => status::no_such_path(),
        }
    }

    fn api_versions(&self) -> Response<Body> {
        status::json(
            StatusCode::OK,
            &APIVersions {
                versions: vec!["v1".to_owned()],
                server_address_by_client_cidrs: vec![ServerAddressByClientCIDR {
                    client_cidr: "0.0.0.0/0".to_owned(),
                    server_address: self.address.clone(),
                }],
            },
        )
    }

    fn token_review(&self, mut review: TokenReview) -> Response<Body> {
        let policy = self.policy.current();
        let token = review.spec.token.as_deref().unwrap_or_default();
        review.status = Some(match policy.token_user(token) {
            Some(user) => TokenReviewStatus {
                authenticated: Some(true),
                audiences: review.spec.audiences.clone(),
                user: Some(UserInfo {
                    username: Some(user.username.clone()),
                    uid: Some(user.uid.clone()).filter(|uid| !uid.is_empty()),
                    groups: Some(user.groups.clone()),
                    extra: Some(user.extra.clone()).filter(|extra| !extra.is_empty()),
                }),
                error: None,
            },
            None => TokenReviewStatus {
                authenticated: Some(false),
                error: Some("invalid bearer token".to_owned()),
                ..TokenReviewStatus::default()
            },
        });
        status::json(StatusCode::CREATED, &review)
    }

    fn subject_access_review(&self, mut review: SubjectAccessReview) -> Response<Body> {
        let spec = &review.spec;
        let user = User {
            username: spec.user.clone().unwrap_or_default(),
            uid: spec.uid.clone().unwrap_or_default(),
            groups: spec.groups.clone().unwrap_or_default(),
            extra: spec.extra.clone().unwrap_or_default(),
        };
        let request = match (&spec.resource_attributes, &spec.non_resource_attributes) {
            (Some(r), _) => RequestInfo {
                is_resource_request: true,
                verb: r.verb.clone().unwrap_or_default(),
                namespace: r.namespace.clone().unwrap_or_default(),
                api_group: r.group.clone().unwrap_or_default(),
                api_version: r.version.clone().unwrap_or_default(),
                resource: r.resource.clone().unwrap_or_default(),
                subresource: r.subresource.clone().unwrap_or_default(),
                name: r.name.clone().unwrap_or_default(),
                ..RequestInfo::default()
            },
            (None, Some(n)) => RequestInfo {
                verb: n.verb.clone().unwrap_or_default(),
                path: n.path.clone().unwrap_or_default(),
                ..RequestInfo::default()
            },
            (None, None) => {
                return status::failure(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "SubjectAccessReview.authorization.k8s.io \"\" is invalid: spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or resourceAttributes must be specified",
                );
            }
        };
        let decision = self.policy.current().authorize(&user, &request);
        tracing::debug!(user = %user.username, ?request, allowed = decision.allowed, "SubjectAccessReview");
        review.status = Some(SubjectAccessReviewStatus {
            allowed: decision.allowed,
            reason: Some(decision.reason).filter(|r| !r.is_empty()),
            ..SubjectAccessReviewStatus::default()
        });
        status::json(StatusCode::CREATED, &review)
    }

    fn create_event(&self, namespace: &str, mut event: Event) -> Response<Body> {
        if self.policy.current().namespace_phase(namespace).is_none() {
            return namespace_not_found(namespace);
        }
        let metadata = &mut event.metadata;
        if metadata
            .namespace
            .as_deref()
            .is_some_and(|ns| ns != namespace)
        {
            return status::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            );
        }
        let name = match (&metadata.name, &metadata.generate_name) {
            (Some(name), _) if !name.is_empty() => name.clone(),
            (_, Some(prefix)) if !prefix.is_empty() => {
                format!(
                    "{prefix}{}",
                    &uuid::Uuid::new_v4().simple().to_string()[..5]
                )
            }
            _ => {
                return status::failure(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Invalid",
                    "Event \"\" is invalid: metadata.name: Required value: name or generateName is required",
                );
            }
        };
        let mut state = self.state.lock().expect("state lock");
        if state
            .events
            .iter()
            .any(|e| e.namespace() == namespace && e.object["metadata"]["name"] == name.as_str())
        {
            return status::failure_with(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("events \"{name}\" already exists"),
                Some(StatusDetails {
                    name: Some(name),
                    kind: Some("events".to_owned()),
                    ..StatusDetails::default()
                }),
            );
        }
        state.revision += 1;
        metadata.name = Some(name);
        metadata.namespace = Some(namespace.to_owned());
        metadata.uid = Some(uuid::Uuid::new_v4().to_string());
        metadata.resource_version = Some(state.revision.to_string());
        metadata.creation_timestamp = Some(now());
        let stored = Stored {
            collection: Collection::Events,
            created: state.revision,
            modified: state.revision,
            object: to_value(&event),
        };
        state.events.push(stored.clone());
        let _ = self.changes.send(stored);
        status::json(StatusCode::CREATED, &event)
    }

    /// Every object of `collection` (in `namespace`, when given), and the current
    /// resourceVersion.
    fn objects(&self, collection: Collection, namespace: Option<&str>) -> (Vec<Stored>, u64) {
        let state = self.state.lock().expect("state lock");
        let created = state
            .created
            .iter()
            .filter(|o| o.collection == collection)
            .cloned();
        let objects = match collection {
            Collection::ConfigMaps => std::iter::once(Stored {
                collection,
                created: state.config_map_created,
                modified: state
                    .config_map
                    .metadata
                    .resource_version
                    .as_deref()
                    .and_then(|rv| rv.parse().ok())
                    .unwrap_or(1),
                object: to_value(&state.config_map),
            })
            .chain(created)
            .collect(),
            Collection::Secrets => created.collect(),
            Collection::Events => state.events.clone(),
            Collection::Namespaces => self
                .policy
                .current()
                .namespaces
                .iter()
                .map(|entry| Stored {
                    collection,
                    created: 1,
                    modified: 1,
                    object: to_value(&namespace_object(
                        &entry.name,
                        entry.phase.as_deref().unwrap_or("Active"),
                    )),
                })
                .collect(),
        };
        let objects = objects
            .into_iter()
            .filter(|o| namespace.is_none_or(|ns| o.namespace() == ns))
            .collect();
        (objects, state.revision)
    }

    fn get(&self, collection: Collection, namespace: &str, name: &str) -> Response<Body> {
        let (objects, _) = self.objects(collection, Some(namespace));
        match objects
            .into_iter()
            .find(|o| o.object["metadata"]["name"] == name)
        {
            Some(found) => status::json(StatusCode::OK, &found.object),
            None => {
                let plural = collection.plural();
                status::failure_with(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("{plural} \"{name}\" not found"),
                    Some(StatusDetails {
                        name: Some(name.to_owned()),
                        kind: Some(plural.to_owned()),
                        ..StatusDetails::default()
                    }),
                )
            }
        }
    }

    /// LIST or WATCH, with `fieldSelector` (equality terms on any field path).
    fn collection(
        &self,
        collection: Collection,
        namespace: Option<&str>,
        query: &ListOptions,
    ) -> Response<Body> {
        let selector = query.field_selector.clone();
        let selected = move |o: &Stored| selector.matches(|field| field_value(&o.object, field));
        if query.watch {
            // Subscribe before reading, so that nothing changes unseen in between.
            let changes = self.changes.subscribe();
            let (objects, revision) = self.objects(collection, namespace);
            let namespace = namespace.map(str::to_owned);
            let live = move |o: &Stored| {
                o.collection == collection
                    && namespace.as_deref().is_none_or(|ns| o.namespace() == ns)
                    && selected(o)
            };
            let initial: Vec<Stored> = objects.into_iter().filter(&live).collect();
            return watch(collection, initial, revision, changes, live, query);
        }
        let (objects, revision) = self.objects(collection, namespace);
        let items: Vec<Value> = objects
            .into_iter()
            .filter(selected)
            .map(|o| o.object)
            .collect();
        let list = json!({
            "apiVersion": "v1",
            "kind": format!("{}List", collection.kind()),
            "metadata": ListMeta { resource_version: Some(revision.to_string()), ..ListMeta::default() },
            "items": items,
        });
        status::json(StatusCode::OK, &list)
    }
}

/// A watch: the events `resourceVersion` asks for, then every change as it happens,
/// one JSON object a line, until `timeoutSeconds` or the client goes.
fn watch(
    collection: Collection,
    initial: Vec<Stored>,
    revision: u64,
    mut changes: broadcast::Receiver<Stored>,
    live: impl Fn(&Stored) -> bool + Send + 'static,
    query: &ListOptions,
) -> Response<Body> {
    let since = query
        .resource_version
        .as_deref()
        .filter(|rv| !rv.is_empty() && *rv != "0")
        .and_then(|rv| rv.parse::<u64>().ok());
    let initial_events = query.send_initial_events == Some(true);
    let bookmarks = query.allow_watch_bookmarks;
    let timeout = query.timeout.unwrap_or(DEFAULT_WATCH_TIMEOUT);
    let mut first: Vec<Value> = Vec::new();
    for object in initial {
        match since {
            // "Start at N": what changed after N.
            Some(n) if !initial_events => {
                if object.modified > n {
                    let kind = if object.created > n {
                        "ADDED"
                    } else {
                        "MODIFIED"
                    };
                    first.push(json!({"type": kind, "object": object.object}));
                }
            }
            // "Any" / "most recent" / initial events: the state as it is, as ADDED.
            _ => first.push(json!({"type": "ADDED", "object": object.object})),
        }
    }
    if initial_events && bookmarks {
        first.push(bookmark(
            collection,
            revision,
            [("k8s.io/initial-events-end", "true")],
        ));
    }
    let (sender, receiver) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(16);
    tokio::spawn(async move {
        let line = |event: &Value| {
            let mut bytes = serde_json::to_vec(event).expect("events serialize");
            bytes.push(b'\n');
            Ok(bytes)
        };
        for event in &first {
            if sender.send(line(event)).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut sent = revision;
        loop {
            let change = tokio::select! {
                () = &mut deadline => return,
                () = sender.closed() => return,
                change = changes.recv() => change,
            };
            let change = match change {
                Ok(change) => change,
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // A watcher this slow is told to start again, as etcd's compaction would.
                    let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                        "metadata": {}, "status": "Failure", "reason": "Expired", "code": 410,
                        "message": "too old resource version"}});
                    let _ = sender.send(line(&gone)).await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            };
            if change.modified <= sent || !live(&change) {
                continue;
            }
            sent = change.modified;
            let kind = if change.created == change.modified {
                "ADDED"
            } else {
                "MODIFIED"
            };
            let event = json!({"type": kind, "object": change.object});
            if sender.send(line(&event)).await.is_err() {
                return;
            }
        }
    });
    let mut response = Response::new(Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(receiver),
    ));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// A BOOKMARK event: only the kind, the resourceVersion and annotations.
fn bookmark<const N: usize>(
    collection: Collection,
    revision: u64,
    annotations: [(&str, &str); N],
) -> Value {
    json!({"type": "BOOKMARK", "object": {
        "kind": collection.kind(), "apiVersion": "v1",
        "metadata": {"resourceVersion": revision.to_string(), "annotations": BTreeMap::from(annotations)},
    }})
}

/// The value at a dotted field path (`involvedObject.name`), as a selector compares it.
/// The string at `field` (`metadata.name`) of `object`, for a field selector.
fn field_value<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    field
        .split('.')
        .try_fold(object, |value, key| value.get(key))?
        .as_str()
}

fn namespace_object(name: &str, phase: &str) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            uid: Some(uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).to_string()),
            resource_version: Some("1".to_owned()),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/metadata.name".to_owned(),
                name.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(NamespaceSpec {
            finalizers: Some(vec!["kubernetes".to_owned()]),
        }),
        status: Some(NamespaceStatus {
            phase: Some(phase.to_owned()),
            ..NamespaceStatus::default()
        }),
    }
}

pub(super) fn namespace_not_found(name: &str) -> Response<Body> {
    status::failure_with(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("namespaces \"{name}\" not found"),
        Some(StatusDetails {
            name: Some(name.to_owned()),
            kind: Some("namespaces".to_owned()),
            ..StatusDetails::default()
        }),
    )
}

/// `/api/v1`: what the stand-in serves of the core group.
fn api_resources() -> Response<Body> {
    let resource =
        |name: &str, singular: &str, kind: &str, namespaced: bool, verbs: &[&str]| APIResource {
            name: name.to_owned(),
            singular_name: singular.to_owned(),
            kind: kind.to_owned(),
            namespaced,
            verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
            ..APIResource::default()
        };
    status::json(
        StatusCode::OK,
        &APIResourceList {
            group_version: "v1".to_owned(),
            resources: vec![
                resource(
                    "configmaps",
                    "configmap",
                    "ConfigMap",
                    true,
                    &["create", "get", "list", "watch"],
                ),
                resource(
                    "secrets",
                    "secret",
                    "Secret",
                    true,
                    &["create", "get", "list"],
                ),
                resource(
                    "events",
                    "event",
                    "Event",
                    true,
                    &["create", "get", "list", "watch"],
                ),
                resource(
                    "namespaces",
                    "namespace",
                    "Namespace",
                    false,
                    &["get", "list", "watch"],
                ),
                resource(
                    "resourcequotas",
                    "resourcequota",
                    "ResourceQuota",
                    true,
                    &["create", "get", "list"],
                ),
                resource(
                    "resourcequotas/status",
                    "",
                    "ResourceQuota",
                    true,
                    &["get", "patch", "update"],
                ),
            ],
        },
    )
}

/// The request body as `T`, or the 400 Status kube-apiserver would answer.
pub(super) async fn read<T: DeserializeOwned>(body: Body) -> Result<T, Response<Body>> {
    let bytes = axum::body::to_bytes(body, BODY_LIMIT)
        .await
        .map_err(|e| status::bad_request(format!("reading the request body: {e}")))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| status::bad_request(format!("the request body is not a valid object: {e}")))
}

fn to_value(object: &impl Serialize) -> Value {
    serde_json::to_value(object).expect("API objects serialize")
}

pub(super) fn now() -> Time {
    // k8s-openapi's jiff is built without `std`, so it has no clock of its own.
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Time(
        k8s_openapi::jiff::Timestamp::from_second(seconds.try_into().unwrap_or(0))
            .unwrap_or_default(),
    )
}
