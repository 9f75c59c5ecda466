//! agent-sandbox as the bench installs it, named by every part that drives it: its
//! namespace, API group and version, the SandboxWarmPool, its APIs, and how long its
//! objects may take.

use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};

/// agent-sandbox's objects' namespace: apart from ours, so the kubelet stand-in watches
/// only its Pods.
pub(super) const NAMESPACE: &str = "agent-sandbox";
pub(super) const GROUP: &str = "extensions.agents.x-k8s.io";
pub(super) const VERSION: &str = "v1beta1";
/// The SandboxWarmPool.
pub(super) const WARM_POOL: &str = "bench";
/// How long a burst may take to be all Ready, and the pool to fill: a base, and so much
/// a claim or a Sandbox more (a 2-core machine runs kube-apiserver, etcd, the controller
/// and the stand-in at once).
pub(super) const BASE_TIMEOUT: Duration = Duration::from_secs(120);
pub(super) const PER_OBJECT_TIMEOUT: Duration = Duration::from_millis(200);
/// How often a wait reads again.
pub(super) const POLL: Duration = Duration::from_millis(100);

/// An agent-sandbox API of `kind` in its namespace.
pub(super) fn extension(admin: &kube::Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, kind), plural);
    Api::namespaced_with(admin.clone(), NAMESPACE, &resource)
}
