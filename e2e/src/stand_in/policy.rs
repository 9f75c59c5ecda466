//! Who is who and who may do what: the policy file (bearer tokens, RBAC-like rules,
//! namespaces), and the decision both the front side and SubjectAccessReview use, on a
//! request's attributes as battery-apiserver's `RequestInfo` (a port of kube-apiserver's)
//! reads them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::{Context as _, Result};
use battery_api_machinery::request_info::RequestInfo;
use serde::{Deserialize, Serialize};

use super::pki::{APISERVER_USER, KUBECTL_USER};

/// The group kube-apiserver always allows (`AlwaysAllowGroups`).
pub const MASTERS: &str = "system:masters";
pub const AUTHENTICATED: &str = "system:authenticated";
pub const ANONYMOUS: &str = "system:anonymous";
pub const UNAUTHENTICATED: &str = "system:unauthenticated";

/// The policy file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    #[serde(default)]
    pub tokens: Vec<TokenUser>,
    #[serde(default)]
    pub rules: Vec<Rule>,
    #[serde(default)]
    pub namespaces: Vec<NamespaceEntry>,
}

/// A bearer token and the user it stands for.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenUser {
    pub token: String,
    pub user: User,
}

/// A user as TokenReview and SubjectAccessReview carry one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    pub username: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    pub fn anonymous() -> Self {
        Self {
            username: ANONYMOUS.to_owned(),
            groups: vec![UNAUTHENTICATED.to_owned()],
            ..Self::default()
        }
    }

    /// Adds `system:authenticated`, as kube-apiserver's authenticated-group adder does
    /// for every user but the anonymous one and one already in either group.
    pub fn authenticated(mut self) -> Self {
        if battery_apiserver::http::authn::joins_authenticated_group(&self.username, &self.groups) {
            self.groups.push(AUTHENTICATED.to_owned());
        }
        self
    }
}

/// One rule: RBAC's PolicyRule and the subjects of its binding in one.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rule {
    #[serde(default)]
    pub users: Vec<String>,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub verbs: Vec<String>,
    #[serde(default)]
    pub api_groups: Vec<String>,
    #[serde(default)]
    pub resources: Vec<String>,
    /// Empty: any name.
    #[serde(default)]
    pub resource_names: Vec<String>,
    /// Missing: every namespace and the cluster scope, as a ClusterRoleBinding grants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<Vec<String>>,
    #[serde(default, rename = "nonResourceURLs")]
    pub non_resource_urls: Vec<String>,
}

/// A namespace that exists, and its phase (`Active` when not given).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceEntry {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
}

/// An authorization decision; `reason` says which rule allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

impl Policy {
    /// The default policy (see the module's README section): the kubectl user may do
    /// everything, battery-apiserver's account what its RBAC in a cluster grants, every
    /// authenticated user discovery (`system:discovery`).
    pub fn default_with_token(apiserver_token: &str) -> Self {
        let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let apiserver = |verbs: &[&str], group: &str, resources: &[&str]| Rule {
            users: strings(&[APISERVER_USER]),
            verbs: strings(verbs),
            api_groups: strings(&[group]),
            resources: strings(resources),
            ..Rule::default()
        };
        Self {
            tokens: vec![TokenUser {
                token: apiserver_token.to_owned(),
                user: User {
                    username: APISERVER_USER.to_owned(),
                    uid: uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, APISERVER_USER.as_bytes())
                        .to_string(),
                    groups: strings(&[
                        "system:serviceaccounts",
                        "system:serviceaccounts:battery-system",
                    ]),
                    extra: BTreeMap::new(),
                },
            }],
            rules: vec![
                Rule {
                    users: strings(&[KUBECTL_USER]),
                    verbs: strings(&["*"]),
                    api_groups: strings(&["*"]),
                    resources: strings(&["*"]),
                    ..Rule::default()
                },
                Rule {
                    users: strings(&[KUBECTL_USER]),
                    verbs: strings(&["*"]),
                    non_resource_urls: strings(&["*"]),
                    ..Rule::default()
                },
                // system:auth-delegator
                apiserver(&["create"], "authentication.k8s.io", &["tokenreviews"]),
                apiserver(
                    &["create"],
                    "authorization.k8s.io",
                    &["subjectaccessreviews"],
                ),
                // extension-apiserver-authentication-reader, in kube-system only
                Rule {
                    resource_names: strings(&["extension-apiserver-authentication"]),
                    namespaces: Some(strings(&["kube-system"])),
                    ..apiserver(&["get", "list", "watch"], "", &["configmaps"])
                },
                apiserver(&["get", "list", "watch"], "", &["namespaces"]),
                // What claims' `env` and `files` name, read after the creating user's
                // SubjectAccessReview (deploy/'s RBAC grants the same).
                apiserver(&["get"], "", &["secrets", "configmaps"]),
                apiserver(&["create", "patch", "update"], "", &["events"]),
                // Quotas on claims: read, and our entries of their status written.
                apiserver(&["get", "list"], "", &["resourcequotas"]),
                apiserver(&["patch"], "", &["resourcequotas/status"]),
                // system:discovery and system:public-info-viewer
                Rule {
                    groups: strings(&[AUTHENTICATED]),
                    verbs: strings(&["get"]),
                    non_resource_urls: strings(&[
                        "/api",
                        "/api/*",
                        "/apis",
                        "/apis/*",
                        "/openapi",
                        "/openapi/*",
                        "/version",
                        "/version/",
                        "/healthz",
                        "/livez",
                        "/readyz",
                    ]),
                    ..Rule::default()
                },
            ],
            namespaces: ["default", "kube-system", "battery-system"]
                .iter()
                .map(|name| NamespaceEntry {
                    name: (*name).to_owned(),
                    phase: None,
                })
                .collect(),
        }
    }

    /// The user a bearer token stands for.
    pub fn token_user(&self, token: &str) -> Option<&User> {
        self.tokens
            .iter()
            .find(|t| t.token == token)
            .map(|t| &t.user)
    }

    /// The phase of a namespace that exists.
    pub fn namespace_phase(&self, name: &str) -> Option<&str> {
        self.namespaces
            .iter()
            .find(|n| n.name == name)
            .map(|n| n.phase.as_deref().unwrap_or("Active"))
    }

    /// May `user` do what `request` asks (its attributes as kube-apiserver's
    /// `RequestInfo` gives them, battery-apiserver's own reading)? `system:masters` may do
    /// everything; otherwise the first rule that matches allows, and nothing matching
    /// denies.
    pub fn authorize(&self, user: &User, request: &RequestInfo) -> Decision {
        if user.groups.iter().any(|g| g == MASTERS) {
            return Decision {
                allowed: true,
                reason: format!("{MASTERS} may do everything"),
            };
        }
        match self
            .rules
            .iter()
            .position(|rule| rule.applies_to(user) && rule.allows(request))
        {
            Some(index) => Decision {
                allowed: true,
                reason: format!("allowed by the stand-in's policy rule {index}"),
            },
            None => Decision {
                allowed: false,
                reason: String::new(),
            },
        }
    }
}

fn listed(list: &[String], value: &str) -> bool {
    list.iter().any(|item| item == "*" || item == value)
}

impl Rule {
    fn applies_to(&self, user: &User) -> bool {
        listed(&self.users, &user.username) || user.groups.iter().any(|g| listed(&self.groups, g))
    }

    /// RBAC's `RuleAllows` (`plugin/pkg/auth/authorizer/rbac/rbac.go`).
    fn allows(&self, r: &RequestInfo) -> bool {
        if !listed(&self.verbs, &r.verb) {
            return false;
        }
        if !r.is_resource_request {
            return self.non_resource_urls.iter().any(|rule| {
                rule == "*"
                    || *rule == r.path
                    || rule
                        .strip_suffix('*')
                        .is_some_and(|prefix| r.path.starts_with(prefix))
            });
        }
        let combined = if r.subresource.is_empty() {
            r.resource.clone()
        } else {
            format!("{}/{}", r.resource, r.subresource)
        };
        listed(&self.api_groups, &r.api_group)
            && self.resources.iter().any(|rule| {
                rule == "*"
                    || *rule == combined
                    || (!r.subresource.is_empty()
                        && rule.strip_prefix("*/") == Some(r.subresource.as_str()))
            })
            && (self.resource_names.is_empty() || listed(&self.resource_names, &r.name))
            && self
                .namespaces
                .as_ref()
                .is_none_or(|namespaces| listed(namespaces, &r.namespace))
    }
}

/// The policy file, read again whenever its modification time or size changes, so
/// that a test can edit it (delete a user, add a rule) while the stand-in runs.
pub struct PolicyFile {
    path: PathBuf,
    current: Mutex<(Option<Stamp>, Arc<Policy>)>,
}

impl PolicyFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = Self {
            path: path.to_owned(),
            current: Mutex::new((None, Arc::default())),
        };
        let (stamp, policy) = file.read()?;
        *file.current.lock().expect("policy lock") = (stamp, Arc::new(policy));
        Ok(file)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn read(&self) -> Result<(Option<Stamp>, Policy)> {
        let stamp = stamp(&self.path);
        let text = std::fs::read_to_string(&self.path)
            .with_context(|| format!("reading the policy {}", self.path.display()))?;
        let policy = serde_json::from_str(&text)
            .with_context(|| format!("parsing the policy {}", self.path.display()))?;
        Ok((stamp, policy))
    }

    /// The policy as the file says now. A file that does not parse keeps the last good
    /// policy (and says so in the log), so a half-written edit never opens everything.
    pub fn current(&self) -> Arc<Policy> {
        let mut current = self.current.lock().expect("policy lock");
        let now = stamp(&self.path);
        if now != current.0 {
            match self.read() {
                Ok((stamp, policy)) => {
                    tracing::info!(path = %self.path.display(), "policy changed: read it again");
                    *current = (stamp, Arc::new(policy));
                }
                Err(error) => {
                    tracing::warn!("keeping the last policy: {error:#}");
                    current.0 = now;
                }
            }
        }
        current.1.clone()
    }
}

/// What tells one version of the file from another: modification time and size.
type Stamp = (SystemTime, u64);

fn stamp(path: &Path) -> Option<Stamp> {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}
