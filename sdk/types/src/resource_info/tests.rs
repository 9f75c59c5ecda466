use kube::{CustomResourceExt, Resource};

use super::*;

fn verbs(verbs: &[Verb]) -> Vec<&'static str> {
    verbs.iter().map(|verb| verb.as_str()).collect()
}

#[test]
fn pools() {
    let info = Pool::INFO;
    assert_eq!(
        (info.group, info.version, info.kind),
        (GROUP, VERSION, "Pool")
    );
    assert_eq!((info.plural, info.singular), ("pools", "pool"));
    assert_eq!(info.short_names, ["bpool"]);
    assert_eq!(info.categories, ["battery"]);
    assert_eq!(info.scope, Scope::Namespaced);
    assert_eq!(
        verbs(info.verbs),
        [
            "get",
            "list",
            "watch",
            "create",
            "update",
            "patch",
            "delete",
            "deletecollection"
        ]
    );
    assert_eq!(info.subresources.len(), 2);
    let status = info.subresource("status").unwrap();
    assert_eq!(
        (status.group, status.version, status.kind),
        (GROUP, VERSION, "Pool")
    );
    assert_eq!(verbs(status.verbs), ["get"]);
    assert!(!status.strategic_merge_patch);
    // `deployments/scale`'s kind and verbs, so `kubectl scale` and HPA find it.
    let scale = info.subresource("scale").unwrap();
    assert_eq!(
        (scale.group, scale.version, scale.kind),
        ("autoscaling", "v1", "Scale")
    );
    assert_eq!(verbs(scale.verbs), ["get", "update", "patch"]);
    assert!(scale.strategic_merge_patch);
}

#[test]
fn microvmclaims() {
    let info = MicroVMClaim::INFO;
    assert_eq!(
        (info.plural, info.singular, info.kind),
        ("microvmclaims", "microvmclaim", "MicroVMClaim")
    );
    assert_eq!(info.short_names, ["mvc"]);
    assert_eq!(info.scope, Scope::Namespaced);
    assert_eq!(verbs(info.verbs).len(), 8);
    let names: Vec<&str> = info.subresources.iter().map(|s| s.name).collect();
    assert_eq!(names, ["status", "lease", "exec", "portforward"]);

    let status = info.subresource("status").unwrap();
    assert_eq!(
        (status.kind, verbs(status.verbs)),
        ("MicroVMClaim", vec!["get"])
    );
    let lease = info.subresource("lease").unwrap();
    assert_eq!(
        (lease.group, lease.version, lease.kind),
        ("coordination.k8s.io", "v1", "Lease")
    );
    assert_eq!(verbs(lease.verbs), ["get", "create", "update", "patch"]);
    let exec = info.subresource("exec").unwrap();
    assert_eq!(verbs(exec.verbs), ["create", "get"]);
    assert!(exec.has_verb(Verb::Create) && !exec.has_verb(Verb::Delete));
    let portforward = info.subresource("portforward").unwrap();
    assert_eq!(
        (portforward.kind, verbs(portforward.verbs)),
        ("MicroVMClaimPortForwardOptions", vec!["create", "get"])
    );
}

#[test]
fn hosts() {
    let info = Host::INFO;
    assert_eq!(
        (info.plural, info.singular, info.kind),
        ("hosts", "host", "Host")
    );
    assert_eq!(info.short_names, ["bhost"]);
    assert_eq!(info.scope, Scope::Cluster);
    assert!(!info.scope.is_namespaced());
    assert_eq!(
        verbs(info.verbs),
        [
            "get", "list", "watch", "create", "update", "patch", "delete"
        ]
    );
    assert!(!info.has_verb(Verb::DeleteCollection));
    let status = info.subresource("status").unwrap();
    assert_eq!(verbs(status.verbs), ["get", "update", "patch"]);
    let certificate = info.subresource("certificate").unwrap();
    assert_eq!(certificate.kind, "HostCertificateRequest");
    assert_eq!(verbs(certificate.verbs), ["create"]);
    assert_eq!(info.subresource("exec"), None);
}

#[test]
fn the_table_lists_every_kind_once() {
    let plurals: Vec<&str> = RESOURCES.iter().map(|info| info.plural).collect();
    assert_eq!(
        plurals,
        ["pools", "microvmclaims", "microvmprocesses", "hosts"]
    );
    assert_eq!(resource_for_plural("hosts"), Some(&Host::INFO));
    assert_eq!(resource_for_plural("pods"), None);
    assert_eq!(Pool::INFO.api_version(), crate::API_VERSION);
}

/// The table and the derived kube resources (`kube::Api`, `crd()`) must name things alike.
fn agrees_with_kube<K>()
where
    K: HasResourceInfo + Resource<DynamicType = ()> + CustomResourceExt,
{
    let info = K::INFO;
    assert_eq!(K::group(&()), info.group);
    assert_eq!(K::version(&()), info.version);
    assert_eq!(K::kind(&()), info.kind);
    assert_eq!(K::plural(&()), info.plural);
    assert_eq!(K::api_version(&()), info.api_version());
    let crd = K::crd();
    assert_eq!(crd.spec.names.singular.as_deref(), Some(info.singular));
    assert_eq!(
        crd.spec.names.short_names.as_deref().unwrap_or_default(),
        info.short_names
    );
    assert_eq!(
        crd.spec.names.categories.as_deref().unwrap_or_default(),
        info.categories
    );
    let scope = if info.scope.is_namespaced() {
        "Namespaced"
    } else {
        "Cluster"
    };
    assert_eq!(crd.spec.scope, scope);
}

#[test]
fn the_table_agrees_with_the_kube_derives() {
    agrees_with_kube::<Pool>();
    agrees_with_kube::<MicroVMClaim>();
    agrees_with_kube::<crate::MicroVMProcess>();
    agrees_with_kube::<Host>();
}
