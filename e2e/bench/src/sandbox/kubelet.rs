//! The kubelet stand-in: binds the warm pool's Pods to a Node and marks them Running and
//! Ready, the writes a scheduler and a kubelet make at the least.

use std::collections::HashSet;
use std::fmt::Debug;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{
    Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::peer::NAMESPACE;

/// The Node the kubelet stand-in binds every Pod to (there is no Node object: nothing
/// reads it).
const NODE: &str = "bench-node";
/// The first Pod IP the stand-in hands out; a claim adopts only a Sandbox with one.
const POD_IPS: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// How long a failed list or watch waits before it is tried again.
const RETRY: Duration = Duration::from_secs(1);
/// How many Pods the stand-in marks at once: kube-rs speaks HTTP/1.1, a connection a
/// request.
const STAND_IN_CONCURRENCY: usize = 16;

/// The kubelet stand-in: binds each Pod of agent-sandbox's namespace to [`NODE`], as the
/// scheduler would, and marks it Running and Ready with an IP, as the kubelet would once
/// its containers started. Two writes a Pod: a kubelet alone makes more.
pub(super) struct Kubelet {
    marked: Arc<AtomicUsize>,
    _follow: Aborting,
}

impl Kubelet {
    pub(super) fn start(admin: kube::Client) -> Self {
        let pods: Api<Pod> = Api::namespaced(admin, NAMESPACE);
        let marked = Arc::new(AtomicUsize::new(0));
        let handled = Arc::new(Mutex::new(HashSet::new()));
        let slots = Arc::new(Semaphore::new(STAND_IN_CONCURRENCY));
        let next_ip = Arc::new(AtomicU32::new(u32::from(POD_IPS)));
        // Held by the watch's task, so that dropping it aborts the Pods' tasks too.
        let mut tasks = JoinSet::new();
        let counted = marked.clone();
        let (follow, _) = follow(pods.clone(), "Pods", move |pod: Pod| {
            while tasks.try_join_next().is_some() {}
            let Some(uid) = pod.metadata.uid.clone() else {
                return;
            };
            if pod.metadata.deletion_timestamp.is_some() || running_and_ready(&pod) {
                return;
            }
            if !handled
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(uid.clone())
            {
                return;
            }
            let (pods, slots, handled, marked) = (
                pods.clone(),
                slots.clone(),
                handled.clone(),
                counted.clone(),
            );
            let ip = Ipv4Addr::from(next_ip.fetch_add(1, Ordering::Relaxed));
            tasks.spawn(async move {
                let _slot = slots.acquire().await;
                match start_pod(&pods, &pod, ip).await {
                    Ok(()) => {
                        marked.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(error) => {
                        eprintln!("bench: the kubelet stand-in: {error:#}");
                        // The Pod's next event tries again.
                        handled
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&uid);
                    }
                }
            });
        });
        Self {
            marked,
            _follow: follow,
        }
    }

    /// How many Pods it has marked Running and Ready.
    pub(super) fn marked(&self) -> usize {
        self.marked.load(Ordering::Relaxed)
    }
}

pub(super) fn running_and_ready(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some("Running")
            && s.conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// Binds `pod` to [`NODE`] unless it is bound, then marks it Running and Ready at `ip`.
pub(super) async fn start_pod(pods: &Api<Pod>, pod: &Pod, ip: Ipv4Addr) -> Result<()> {
    let name = pod.name_any();
    let spec = pod.spec.clone().unwrap_or_default();
    if spec.node_name.is_none() {
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(NODE.to_owned()),
                ..ObjectReference::default()
            },
        };
        pods.create_subresource::<_, Value>("binding", &name, &PostParams::default(), &binding)
            .await
            .with_context(|| format!("binding the Pod {name}"))?;
    }
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let conditions: Vec<Value> = [
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "Ready",
        "PodScheduled",
    ]
    .iter()
    .map(|kind| json!({"type": kind, "status": "True", "lastTransitionTime": now}))
    .collect();
    let containers: Vec<Value> = spec
        .containers
        .iter()
        .map(|c| {
            json!({
                "name": c.name, "image": c.image, "imageID": "", "ready": true,
                "started": true, "restartCount": 0, "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    let status = json!({"status": {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}],
        "startTime": now,
        "containerStatuses": containers,
    }});
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("marking the Pod {name} Running and Ready"))?;
    Ok(())
}

/// A background task, aborted when dropped.
pub(super) struct Aborting(tokio::task::JoinHandle<()>);

impl Drop for Aborting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Calls `seen` with every object `api` lists, then with every one a watch from that
/// list adds or modifies, until the returned guard is dropped; the receiver hears when the
/// first watch is open. A watch that ends is resumed from the last version seen; one whose
/// version is gone lists again.
pub(super) fn follow<K>(
    api: Api<K>,
    what: &'static str,
    mut seen: impl FnMut(K) + Send + 'static,
) -> (Aborting, tokio::sync::oneshot::Receiver<()>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let (opened, watching) = tokio::sync::oneshot::channel();
    let mut opened = Some(opened);
    let task = tokio::spawn(async move {
        'list: loop {
            let list = match api.list(&ListParams::default()).await {
                Ok(list) => list,
                Err(error) => {
                    eprintln!("bench: listing {what}: {error}");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            let mut version = list.metadata.resource_version.clone().unwrap_or_default();
            list.items.into_iter().for_each(&mut seen);
            loop {
                let events = match api.watch(&WatchParams::default(), &version).await {
                    Ok(events) => {
                        if let Some(opened) = opened.take() {
                            let _ = opened.send(());
                        }
                        events
                    }
                    Err(error) => {
                        eprintln!("bench: watching {what}: {error}");
                        tokio::time::sleep(RETRY).await;
                        continue;
                    }
                };
                let mut events = std::pin::pin!(events);
                while let Some(event) = events.next().await {
                    match event {
                        Ok(WatchEvent::Added(object) | WatchEvent::Modified(object)) => {
                            version = object.resource_version().unwrap_or(version);
                            seen(object);
                        }
                        Ok(WatchEvent::Deleted(object)) => {
                            version = object.resource_version().unwrap_or(version);
                        }
                        Ok(WatchEvent::Bookmark(bookmark)) => {
                            version = bookmark.metadata.resource_version;
                        }
                        // 410: the version is gone from kube-apiserver's cache.
                        Ok(WatchEvent::Error(status)) => {
                            if status.code != 410 {
                                eprintln!("bench: watching {what}: {status:?}");
                            }
                            continue 'list;
                        }
                        Err(error) => {
                            eprintln!("bench: watching {what}: {error}");
                            tokio::time::sleep(RETRY).await;
                            break;
                        }
                    }
                }
            }
        }
    });
    (Aborting(task), watching)
}
