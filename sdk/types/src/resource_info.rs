//! The resource table: one entry per resource, from which the apiserver derives its routes,
//! discovery documents, OpenAPI paths and authorization attributes, so they cannot disagree.
//!
//! Short names resolve across every API group in a cluster, and `pool`, `host` and `claim`
//! are words other APIs use too, so each short name is prefixed to stay unambiguous: `bpool`
//! (battery pool), `mvc` (MicroVMClaim), `mvp` (MicroVMProcess), `bhost` (battery host). None is a built-in resource
//! or short name.

use std::fmt;

use crate::api_group::{GROUP, VERSION};
use crate::hosts::Host;
use crate::microvmclaims::MicroVMClaim;
use crate::microvmprocesses::MicroVMProcess;
use crate::pools::Pool;

/// A Kubernetes API verb, as RBAC and discovery spell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    /// Read one object.
    Get,
    /// Read a collection.
    List,
    /// Stream changes to one object or a collection.
    Watch,
    /// Create an object (also: open a connect subresource such as `exec` by POST).
    Create,
    /// Replace an object.
    Update,
    /// Patch an object.
    Patch,
    /// Delete one object.
    Delete,
    /// Delete the objects of a collection.
    DeleteCollection,
}

impl Verb {
    /// Every verb, in the order Kubernetes lists a full set.
    pub const ALL: [Self; 8] = [
        Self::Get,
        Self::List,
        Self::Watch,
        Self::Create,
        Self::Update,
        Self::Patch,
        Self::Delete,
        Self::DeleteCollection,
    ];

    /// The verb as RBAC and discovery spell it, e.g. `deletecollection`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Get => "get",
            Self::List => "list",
            Self::Watch => "watch",
            Self::Create => "create",
            Self::Update => "update",
            Self::Patch => "patch",
            Self::Delete => "delete",
            Self::DeleteCollection => "deletecollection",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a resource's objects live in a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Objects live in a namespace (`/namespaces/<ns>/<plural>/<name>`).
    Namespaced,
    /// Objects are cluster-wide (`/<plural>/<name>`).
    Cluster,
}

impl Scope {
    /// Whether objects live in a namespace (discovery's `namespaced`).
    pub const fn is_namespaced(self) -> bool {
        matches!(self, Self::Namespaced)
    }
}

/// A subresource (`<plural>/<name>`): what it speaks and which verbs it serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubresourceInfo {
    /// Its name after the slash, e.g. `status`.
    pub name: &'static str,
    /// The API group of the kind it reads and writes.
    pub group: &'static str,
    /// The version of the kind it reads and writes.
    pub version: &'static str,
    /// The kind it reads and writes, e.g. `Lease` for `microvmclaims/lease`.
    pub kind: &'static str,
    /// The verbs it serves, as discovery lists them.
    pub verbs: &'static [Verb],
    /// Whether a PATCH may be a strategic merge patch. Only for a kind whose lists are all
    /// atomic (`autoscaling/v1` `Scale`), where it needs no schema: elsewhere kubectl
    /// would compute one from Go struct tags we do not have.
    pub strategic_merge_patch: bool,
}

impl SubresourceInfo {
    /// Whether the subresource serves `verb`.
    pub fn has_verb(&self, verb: Verb) -> bool {
        self.verbs.contains(&verb)
    }
}

/// A resource: its names, scope, verbs and subresources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResourceInfo {
    /// The API group.
    pub group: &'static str,
    /// The API version.
    pub version: &'static str,
    /// The kind of its objects.
    pub kind: &'static str,
    /// The name in URLs and RBAC rules, e.g. `microvmclaims`.
    pub plural: &'static str,
    /// The lowercase singular name, e.g. `microvmclaim`.
    pub singular: &'static str,
    /// Short names kubectl accepts in place of the plural.
    pub short_names: &'static [&'static str],
    /// Categories kubectl expands, e.g. `kubectl get battery`.
    pub categories: &'static [&'static str],
    /// Whether objects live in a namespace.
    pub scope: Scope,
    /// The verbs the resource itself serves.
    pub verbs: &'static [Verb],
    /// Its subresources.
    pub subresources: &'static [SubresourceInfo],
}

impl ResourceInfo {
    /// `<group>/<version>`, the objects' `apiVersion`.
    pub fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }

    /// Whether the resource serves `verb`.
    pub fn has_verb(&self, verb: Verb) -> bool {
        self.verbs.contains(&verb)
    }

    /// The subresource called `name`, if the resource has one.
    pub fn subresource(&self, name: &str) -> Option<&'static SubresourceInfo> {
        self.subresources
            .iter()
            .find(|subresource| subresource.name == name)
    }
}

/// A kind with an entry in the resource table.
pub trait HasResourceInfo {
    /// The kind's resource.
    const INFO: ResourceInfo;
}

/// Every resource this API serves, in the order discovery lists them.
pub const RESOURCES: &[&ResourceInfo] = &[
    &Pool::INFO,
    &MicroVMClaim::INFO,
    &MicroVMProcess::INFO,
    &Host::INFO,
];

/// The resource called `plural` (`pools`, `microvmclaims`, `hosts`), if this API serves one.
pub fn resource_for_plural(plural: &str) -> Option<&'static ResourceInfo> {
    RESOURCES.iter().copied().find(|info| info.plural == plural)
}

/// Every resource is in the `battery` category, so `kubectl get battery` lists them all.
const CATEGORIES: &[&str] = &["battery"];

impl HasResourceInfo for Pool {
    const INFO: ResourceInfo = ResourceInfo {
        group: GROUP,
        version: VERSION,
        kind: "Pool",
        plural: "pools",
        singular: "pool",
        short_names: &["bpool"],
        categories: CATEGORIES,
        scope: Scope::Namespaced,
        verbs: &Verb::ALL,
        subresources: &[
            SubresourceInfo {
                name: "status",
                group: GROUP,
                version: VERSION,
                kind: "Pool",
                // Read-only: a Pool's status is read from battery, never written.
                verbs: &[Verb::Get],
                strategic_merge_patch: false,
            },
            SubresourceInfo {
                name: "scale",
                group: "autoscaling",
                version: "v1",
                kind: "Scale",
                // As `deployments/scale`: `kubectl scale`, HPA and KEDA read it and write
                // `spec.replicas`, which is the Pool's `spec.size` (ADR 0019).
                verbs: &[Verb::Get, Verb::Update, Verb::Patch],
                // `kubectl patch --subresource=scale` sends one by default, as for a
                // Deployment; Scale has no lists, so it needs no schema.
                strategic_merge_patch: true,
            },
        ],
    };
}

impl HasResourceInfo for MicroVMClaim {
    const INFO: ResourceInfo = ResourceInfo {
        group: GROUP,
        version: VERSION,
        kind: "MicroVMClaim",
        plural: "microvmclaims",
        singular: "microvmclaim",
        short_names: &["mvc"],
        categories: CATEGORIES,
        scope: Scope::Namespaced,
        verbs: &Verb::ALL,
        subresources: &[
            SubresourceInfo {
                name: "status",
                group: GROUP,
                version: VERSION,
                kind: "MicroVMClaim",
                // Read-only: binding, renewal and expiry set it, never a client.
                verbs: &[Verb::Get],
                strategic_merge_patch: false,
            },
            SubresourceInfo {
                name: "lease",
                group: "coordination.k8s.io",
                version: "v1",
                kind: "Lease",
                // Any write renews the lease (battery's Heartbeat): PUT, PATCH, or a POST
                // with a Lease body, as a client that only knows "renew" sends it.
                verbs: &[Verb::Get, Verb::Create, Verb::Update, Verb::Patch],
                strategic_merge_patch: false,
            },
            SubresourceInfo {
                name: "exec",
                group: GROUP,
                version: VERSION,
                // Named after `pods/exec`'s `PodExecOptions`: the connect subresource's
                // options (command, stdin, stdout, stderr, tty) arrive as query parameters.
                kind: "MicroVMClaimExecOptions",
                // As `pods/exec` lists them: a WebSocket upgrade is a GET, a SPDY one a POST,
                // and RBAC authorizes either as `create`.
                verbs: &[Verb::Create, Verb::Get],
                strategic_merge_patch: false,
            },
            SubresourceInfo {
                name: "portforward",
                group: GROUP,
                version: VERSION,
                // Named after `pods/portforward`'s `PodPortForwardOptions` (`ports`).
                kind: "MicroVMClaimPortForwardOptions",
                verbs: &[Verb::Create, Verb::Get],
                strategic_merge_patch: false,
            },
        ],
    };
}

impl HasResourceInfo for MicroVMProcess {
    const INFO: ResourceInfo = ResourceInfo {
        group: GROUP,
        version: VERSION,
        kind: "MicroVMProcess",
        plural: "microvmprocesses",
        singular: "microvmprocess",
        short_names: &["mvp"],
        categories: CATEGORIES,
        scope: Scope::Namespaced,
        // Its spec is fixed and its status the agent's: an update changes metadata only,
        // as a claim's does (ADR 44).
        verbs: &[
            Verb::Get,
            Verb::List,
            Verb::Watch,
            Verb::Create,
            Verb::Update,
            Verb::Patch,
            Verb::Delete,
        ],
        subresources: &[
            SubresourceInfo {
                name: "attach",
                group: GROUP,
                version: VERSION,
                // Named after `pods/attach`'s `PodAttachOptions` (stdin, stdout, stderr).
                kind: "MicroVMProcessAttachOptions",
                verbs: &[Verb::Create, Verb::Get],
                strategic_merge_patch: false,
            },
            SubresourceInfo {
                name: "stop",
                group: GROUP,
                version: VERSION,
                // A POST that stops the process and answers it, keeping it to be read.
                kind: "MicroVMProcess",
                verbs: &[Verb::Create],
                strategic_merge_patch: false,
            },
        ],
    };
}

impl HasResourceInfo for Host {
    const INFO: ResourceInfo = ResourceInfo {
        group: GROUP,
        version: VERSION,
        kind: "Host",
        plural: "hosts",
        singular: "host",
        short_names: &["bhost"],
        categories: CATEGORIES,
        scope: Scope::Cluster,
        // No deletecollection: removing a Host is a deliberate, one-at-a-time act (battery
        // refuses while it has MicroVMs or a Pool names it).
        verbs: &[
            Verb::Get,
            Verb::List,
            Verb::Watch,
            Verb::Create,
            Verb::Update,
            Verb::Patch,
            Verb::Delete,
        ],
        subresources: &[
            SubresourceInfo {
                name: "status",
                group: GROUP,
                version: VERSION,
                kind: "Host",
                // The exec agent writes its readiness report here.
                verbs: &[Verb::Get, Verb::Update, Verb::Patch],
                strategic_merge_patch: false,
            },
            SubresourceInfo {
                name: "certificate",
                group: GROUP,
                version: VERSION,
                kind: "HostCertificateRequest",
                // The exec agent's serving certificate is signed here (ADR 0011); like
                // `serviceaccounts/token`, a create that answers and keeps nothing.
                verbs: &[Verb::Create],
                strategic_merge_patch: false,
            },
        ],
    };
}

#[cfg(test)]
mod tests;
