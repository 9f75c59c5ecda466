//! What stands in front of `battery-apiserver serve` on [`Route::Aggregated`](super::Route):
//! a real control plane of the test's own ([`Cluster`]) with battery-apiserver installed
//! into it, and the RBAC a test grants there.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, RoleBinding, RoleRef, Subject,
};
use kube::api::{Api, ObjectMeta, PostParams};

use crate::control_plane::install::{self, Installation};
use crate::control_plane::{ControlPlane, Options};

/// How long kube-apiserver's authorizer may take to see a new binding: its informer
/// hears of it through a watch, on a loaded 2-core machine.
const GRANT_TIMEOUT: Duration = Duration::from_secs(30);

/// The ServiceAccount the kubectl user is, as `dev`'s user is: claims name it as their
/// Holder, so the same person may claim and then exec.
pub const DEV_ACCOUNT: (&str, &str) = ("default", "dev");

/// A real control plane with battery-apiserver installed into it from `deploy/`.
pub struct Cluster {
    pub plane: ControlPlane,
    pub installation: Installation,
    /// The kubectl user's kubeconfig: a token of [`DEV_ACCOUNT`].
    kubeconfig: PathBuf,
    token: String,
}

impl Cluster {
    /// Starts a control plane in `dir`, installs battery-apiserver into it and makes the
    /// kubectl user: the ServiceAccount `default/dev`, which the test's own binding lets
    /// do everything, as `dev`'s local policy does; tests of RBAC as shipped make users
    /// of their own.
    pub async fn start(dir: &Path, battery_apiserver: &Path, options: Options) -> Self {
        let plane = ControlPlane::start(&dir.join("cluster"), options).await;
        let installation = install::install(&plane, battery_apiserver, &dir.join("install")).await;
        let (namespace, name) = DEV_ACCOUNT;
        let token = plane.service_account_token(namespace, name).await;
        let kubeconfig = dir.join("kubeconfig");
        plane
            .pki()
            .write_kubeconfig(&kubeconfig, serde_json::json!({"token": token}), namespace)
            .expect("write the kubectl user's kubeconfig");
        let cluster = Self {
            plane,
            installation,
            kubeconfig,
            token,
        };
        cluster
            .bind(
                &format!("e2e:{name}"),
                "cluster-admin",
                service_account(namespace, name),
            )
            .await;
        cluster
    }

    /// Binds the ClusterRole `role` to `subject` cluster-wide, as the admin.
    pub async fn bind(&self, binding: &str, role: &str, subject: Subject) {
        let bindings: Api<ClusterRoleBinding> = Api::all(self.plane.admin().await);
        let object = ClusterRoleBinding {
            metadata: named(binding),
            role_ref: cluster_role(role),
            subjects: Some(vec![subject]),
        };
        bindings
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("bind {role} as {binding}: {e}"));
    }

    /// Grants `subject` the `rules` cluster-wide: a ClusterRole `name` and its binding.
    /// Returns once kube-apiserver allows `subject` the first rule (the role and its
    /// binding reach RBAC's informers a moment after their creates answer), so that the
    /// test's next request is judged with the grant.
    pub async fn grant(&self, name: &str, rules: Vec<PolicyRule>, subject: Subject) {
        let review = rules
            .first()
            .map(|rule| access_review(rule, &subject, None));
        let admin = self.plane.admin().await;
        let roles: Api<ClusterRole> = Api::all(admin.clone());
        let role = ClusterRole {
            metadata: named(name),
            rules: Some(rules),
            ..Default::default()
        };
        roles
            .create(&PostParams::default(), &role)
            .await
            .unwrap_or_else(|e| panic!("create the ClusterRole {name}: {e}"));
        self.bind(name, name, subject).await;
        if let Some(review) = review {
            let what = format!("kube-apiserver to allow what the ClusterRole {name} grants");
            self.wait_allowed(review, &what).await;
        }
    }

    /// Binds the ClusterRole `role` to `subject` in `namespace` (a RoleBinding), as a
    /// namespace's admin does, and returns once kube-apiserver allows `subject` there the
    /// first verb of `expected` on its first resource.
    pub async fn bind_in(
        &self,
        namespace: &str,
        role: &str,
        subject: Subject,
        expected: &PolicyRule,
    ) {
        let review = access_review(expected, &subject, Some(namespace));
        let bindings: Api<RoleBinding> = Api::namespaced(self.plane.admin().await, namespace);
        let binding = format!("e2e:{role}:{}", subject.name);
        let object = RoleBinding {
            metadata: named(&binding),
            role_ref: cluster_role(role),
            subjects: Some(vec![subject]),
        };
        bindings
            .create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("bind {role} in {namespace} as {binding}: {e}"));
        let what = format!("kube-apiserver to allow what {role} grants in {namespace}");
        self.wait_allowed(review, &what).await;
    }

    /// Returns once kube-apiserver allows `review` (new roles and bindings reach RBAC's
    /// informers a moment after their creates answer; aggregated roles once the
    /// aggregation controller has run), so that a test's next request is judged with them.
    async fn wait_allowed(&self, review: SubjectAccessReview, what: &str) {
        let reviews: Api<SubjectAccessReview> = Api::all(self.plane.admin().await);
        crate::eventually(GRANT_TIMEOUT, what, async || {
            let answer = reviews
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| e.to_string())?;
            match answer.status {
                Some(status) if status.allowed => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
}

/// A SubjectAccessReview of `subject` doing `rule`'s first verb on its first resource or
/// URL, in `namespace` or cluster-wide: RBAC allows it once it sees the binding.
fn access_review(
    rule: &PolicyRule,
    subject: &Subject,
    namespace: Option<&str>,
) -> SubjectAccessReview {
    let first = |list: Option<&Vec<String>>| list.and_then(|l| l.first()).cloned();
    let verb = rule.verbs.first().cloned();
    let (resource_attributes, non_resource_attributes) =
        match first(rule.non_resource_urls.as_ref()) {
            Some(path) => (
                None,
                Some(NonResourceAttributes {
                    path: Some(path),
                    verb,
                }),
            ),
            None => {
                let resource = first(rule.resources.as_ref()).unwrap_or_default();
                let (resource, subresource) = match resource.split_once('/') {
                    Some((resource, subresource)) => (resource, Some(subresource.to_owned())),
                    None => (resource.as_str(), None),
                };
                let attributes = ResourceAttributes {
                    verb,
                    group: first(rule.api_groups.as_ref()),
                    resource: Some(resource.to_owned()),
                    subresource,
                    name: first(rule.resource_names.as_ref()),
                    namespace: namespace.map(str::to_owned),
                    ..Default::default()
                };
                (Some(attributes), None)
            }
        };
    let (user, groups) = match (subject.kind.as_str(), &subject.namespace) {
        ("ServiceAccount", Some(namespace)) => (
            Some(battery_types::service_account_username(
                namespace,
                &subject.name,
            )),
            None,
        ),
        ("User", _) => (Some(subject.name.clone()), None),
        _ => (None, Some(vec![subject.name.clone()])),
    };
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user,
            groups,
            resource_attributes,
            non_resource_attributes,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A rule on battery's API group: `verbs` on `resources` (subresources as `pools/scale`).
pub fn battery_rule(resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let strings = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect();
    PolicyRule {
        api_groups: Some(vec![battery_types::GROUP.to_owned()]),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        ..Default::default()
    }
}

/// Metadata naming an object `name`.
fn named(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        ..Default::default()
    }
}

/// A binding's reference to the ClusterRole `role`.
fn cluster_role(role: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".to_owned(),
        kind: "ClusterRole".to_owned(),
        name: role.to_owned(),
    }
}

/// The ServiceAccount `namespace/name` as an RBAC subject.
pub fn service_account(namespace: &str, name: &str) -> Subject {
    Subject {
        kind: "ServiceAccount".to_owned(),
        name: name.to_owned(),
        namespace: Some(namespace.to_owned()),
        ..Default::default()
    }
}

/// A user (a client certificate's CN) as an RBAC subject.
pub fn user(name: &str) -> Subject {
    Subject {
        kind: "User".to_owned(),
        name: name.to_owned(),
        api_group: Some("rbac.authorization.k8s.io".to_owned()),
        ..Default::default()
    }
}

impl Cluster {
    /// The URL clients reach the API at: kube-apiserver's.
    pub fn url(&self) -> &str {
        self.plane.url()
    }

    /// The CA of kube-apiserver's serving certificate.
    pub fn ca(&self) -> PathBuf {
        self.plane.pki().ca()
    }

    /// The kubectl user's kubeconfig (`system:serviceaccount:default:dev`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The kubectl user's credentials, for a hand-written client.
    pub fn kubectl_identity(&self) -> crate::https::Identity {
        crate::https::Identity::Token(self.token.clone())
    }

    /// A client certificate of the cluster's CA for the user `cn` in `groups`.
    pub fn client_certificate(&self, cn: &str, groups: &[&str]) -> (PathBuf, PathBuf) {
        let file = format!("user-{}", uuid::Uuid::new_v4().simple());
        self.plane.pki().client_certificate(&file, cn, groups)
    }

    /// A client certificate of the ServiceAccount `namespace/name`, as the cluster
    /// accepts it (in `system:serviceaccounts`): (certificate, key).
    pub fn service_account_certificate(&self, namespace: &str, name: &str) -> (PathBuf, PathBuf) {
        let user = battery_types::service_account_username(namespace, name);
        self.client_certificate(&user, &["system:serviceaccounts"])
    }

    /// A client of kube-apiserver as the ServiceAccount `namespace/name`.
    pub fn service_account_client(&self, namespace: &str, name: &str) -> crate::https::Client {
        let (cert, key) = self.service_account_certificate(namespace, name);
        crate::https::Client::new(
            self.url(),
            &self.ca(),
            crate::https::Identity::Cert(cert, key),
        )
    }

    /// Writes a kubeconfig at `path` for the user of a client certificate.
    pub fn write_kubeconfig(&self, path: &Path, (cert, key): (&Path, &Path)) {
        let user = serde_json::json!({"client-certificate": cert, "client-key": key});
        self.plane
            .pki()
            .write_kubeconfig(path, user, "default")
            .expect("write a kubeconfig");
    }

    /// `serve`'s flags: where it listens (the ExternalName's address), its serving
    /// certificate, and the cluster it asks (TokenReview, SubjectAccessReview, its CAs'
    /// ConfigMap) as its ServiceAccount.
    pub fn serve_args(&self) -> Vec<OsString> {
        let installed = &self.installation;
        vec![
            "--listen".into(),
            installed.address.to_string().into(),
            "--tls-cert-file".into(),
            installed.serving_cert.clone().into(),
            "--tls-private-key-file".into(),
            installed.serving_key.clone().into(),
            "--kubeconfig".into(),
            installed.kubeconfig.clone().into(),
        ]
    }

    /// Waits until kube-apiserver forwards to `serve`: the aggregator's own check calls
    /// the APIService Available, and its discovery lists our resources.
    pub async fn wait_serving(&self) {
        install::wait_available(&self.plane, "True").await;
        install::wait_discovered(&self.plane).await;
    }
}
