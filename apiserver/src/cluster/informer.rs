//! Cluster-wide caches of namespaces and ResourceQuotas, each kept by one list and watch,
//! as kube-apiserver's NamespaceLifecycle and ResourceQuota admission plugins read
//! informers: a create reads memory, not kube-apiserver, and sees a change as soon as
//! the watch delivers it. Until a cache has listed once (or while our RBAC lacks `list`
//! and `watch`), [`super::Cluster`] asks kube-apiserver instead.

use std::sync::Arc;

use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::core::v1::{Namespace, ResourceQuota};
use kube::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};

/// A cache of every `K` in the cluster; its watch stops when the cache is dropped.
pub struct Informer<K: kube::Resource<DynamicType = ()> + 'static> {
    store: Store<K>,
    watch: tokio::task::AbortHandle,
}

impl<K> Informer<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    /// Starts listing and watching every `K` through `client`. The watch retries with
    /// kube's default backoff; each failure is logged, as client-go's reflector logs them.
    pub fn start(client: kube::Client) -> Self {
        let (store, writer) = reflector::store();
        let kind = K::kind(&());
        // As client-go's informers list: from kube-apiserver's watch cache, which the
        // watch then brings up to date.
        let config = watcher::Config::default().any_semantic();
        let events =
            reflector::reflector(writer, watcher(Api::<K>::all(client), config)).default_backoff();
        let watch = tokio::spawn(async move {
            events
                .for_each(|event| async {
                    if let Err(err) = event {
                        tracing::warn!(error = %err, kind = %kind, "watching the cluster; retrying");
                    }
                })
                .await;
        })
        .abort_handle();
        Self { store, watch }
    }

    /// The cache, once it has listed everything once.
    fn synced(&self) -> Option<&Store<K>> {
        self.store
            .wait_until_ready()
            .now_or_never()
            .and_then(Result::ok)
            .map(|()| &self.store)
    }
}

impl<K: kube::Resource<DynamicType = ()> + 'static> Drop for Informer<K> {
    fn drop(&mut self) {
        self.watch.abort();
    }
}

impl Informer<Namespace> {
    /// The namespace `name` as last watched, if the cache has synced and holds it. A
    /// namespace created an instant ago may not be here yet.
    pub fn namespace(&self, name: &str) -> Option<Arc<Namespace>> {
        self.synced()?.get(&ObjectRef::new(name))
    }
}

impl Informer<ResourceQuota> {
    /// The ResourceQuotas of `namespace` as last watched, once the cache has synced. It
    /// scans every quota of the cluster: a few per namespace, each compared by reference.
    pub fn quotas(&self, namespace: &str) -> Option<Vec<ResourceQuota>> {
        let store = self.synced()?;
        Some(
            store
                .state_filter(|q| q.metadata.namespace.as_deref() == Some(namespace))
                .into_iter()
                .map(Arc::unwrap_or_clone)
                .collect(),
        )
    }
}
