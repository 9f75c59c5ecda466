//! Who is who and who may do what: the policy file (bearer tokens, RBAC-like rules,
//! namespaces), the request attributes kube-apiserver derives from a request
//! (`RequestInfo`), and the decision both the front side and SubjectAccessReview use.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::{Context as _, Result};
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

/// What a request asks to do, as kube-apiserver's `RequestInfo` and the authorizer's
/// attributes describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    pub verb: String,
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    NonResource { path: String },
    Resource(ResourceAttributes),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceAttributes {
    pub namespace: String,
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
}

/// An authorization decision; `reason` says which rule allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

impl Action {
    /// The attributes of an HTTP request, following `NewRequestInfo`
    /// (`k8s.io/apiserver/pkg/endpoints/request/requestinfo.go`).
    pub fn from_request(method: &str, path: &str, query: Option<&str>) -> Self {
        let non_resource = || Action {
            verb: method.to_ascii_lowercase(),
            target: Target::NonResource {
                path: path.to_owned(),
            },
        };
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        if parts.len() < 3 || !matches!(parts[0], "api" | "apis") {
            return non_resource();
        }
        let mut rest = &parts[1..];
        let mut attributes = ResourceAttributes::default();
        if parts[0] == "apis" {
            if rest.len() < 3 {
                return non_resource();
            }
            attributes.group = rest[0].to_owned();
            rest = &rest[1..];
        }
        attributes.version = rest[0].to_owned();
        rest = &rest[1..];
        let query = Query::parse(query);
        // `/watch/…` is the old way to say watch=true; it has no subresources.
        let (mut verb, special) = if rest[0] == "watch" && rest.len() > 1 {
            rest = &rest[1..];
            ("watch", true)
        } else {
            let verb = match method {
                "POST" => "create",
                "GET" | "HEAD" => "get",
                "PUT" => "update",
                "PATCH" => "patch",
                "DELETE" => "delete",
                _ => "",
            };
            (verb, false)
        };
        if rest[0] == "namespaces" && rest.len() > 1 {
            attributes.namespace = rest[1].to_owned();
            // `namespaces/{ns}/status` and `/finalize` are subresources of the Namespace.
            if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
                rest = &rest[2..];
            }
        }
        attributes.resource = rest[0].to_owned();
        if let Some(name) = rest.get(1) {
            attributes.name = (*name).to_owned();
        }
        if let Some(subresource) = rest.get(2).filter(|_| !special) {
            attributes.subresource = (*subresource).to_owned();
        }
        if attributes.name.is_empty() && verb == "get" {
            verb = if query.watch() { "watch" } else { "list" };
            if let Some(name) = query.field_selector_name() {
                attributes.name = name;
            }
        }
        if attributes.name.is_empty() && verb == "delete" {
            verb = "deletecollection";
        }
        Action {
            verb: verb.to_owned(),
            target: Target::Resource(attributes),
        }
    }

    /// kube-apiserver's 403 message for this action (`NewForbidden` around
    /// `forbiddenMessage`), without a reason, as RBAC's denials have none.
    pub fn forbidden_message(&self, user: &str) -> String {
        match &self.target {
            Target::NonResource { path } => format!(
                "forbidden: User \"{user}\" cannot {} path \"{path}\"",
                self.verb
            ),
            Target::Resource(r) => {
                let mut resource = r.resource.clone();
                if !r.subresource.is_empty() {
                    resource = format!("{resource}/{}", r.subresource);
                }
                let scope = if r.namespace.is_empty() {
                    "at the cluster scope".to_owned()
                } else {
                    format!("in the namespace \"{}\"", r.namespace)
                };
                let why = format!(
                    "User \"{user}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
                    self.verb, r.group
                );
                let qualified = if r.group.is_empty() {
                    r.resource.clone()
                } else {
                    format!("{}.{}", r.resource, r.group)
                };
                if r.name.is_empty() {
                    format!("{qualified} is forbidden: {why}")
                } else {
                    format!("{qualified} \"{}\" is forbidden: {why}", r.name)
                }
            }
        }
    }
}

/// The query parameters the attributes depend on.
pub struct Query(Vec<(String, String)>);

impl Query {
    pub fn parse(query: Option<&str>) -> Self {
        Self(
            query
                .map(|q| {
                    url_pairs(q)
                        .map(|(k, v)| (k.into_owned(), v.into_owned()))
                        .collect()
                })
                .unwrap_or_default(),
        )
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `watch=true` or `watch=1`, as the parameter codec reads a bool.
    pub fn watch(&self) -> bool {
        matches!(self.get("watch"), Some("true" | "1"))
    }

    /// The name a `fieldSelector` requires exactly (`metadata.name=X` or `==X`).
    pub fn field_selector_name(&self) -> Option<String> {
        self.field_selector()
            .into_iter()
            .find(|(field, _)| field == "metadata.name")
            .map(|(_, value)| value)
    }

    /// The `field=value` terms of `fieldSelector` (`!=` terms are not understood and dropped).
    pub fn field_selector(&self) -> Vec<(String, String)> {
        let Some(selector) = self.get("fieldSelector") else {
            return Vec::new();
        };
        selector
            .split(',')
            .filter(|term| !term.contains("!="))
            .filter_map(|term| {
                let (field, value) = term.split_once('=')?;
                let value = value.strip_prefix('=').unwrap_or(value);
                Some((field.trim().to_owned(), value.trim().to_owned()))
            })
            .collect()
    }
}

/// `application/x-www-form-urlencoded` pairs; `+` is a space.
fn url_pairs(
    query: &str,
) -> impl Iterator<Item = (std::borrow::Cow<'_, str>, std::borrow::Cow<'_, str>)> {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k), percent_decode(v))
    })
}

pub(crate) fn percent_decode(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains(['%', '+']) {
        return text.into();
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|hex| u8::from_str_radix(hex, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned().into()
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
                apiserver(&["create", "patch", "update"], "", &["events"]),
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

    /// May `user` do `action`? `system:masters` may do everything; otherwise the first
    /// rule that matches allows, and nothing matching denies.
    pub fn authorize(&self, user: &User, action: &Action) -> Decision {
        if user.groups.iter().any(|g| g == MASTERS) {
            return Decision {
                allowed: true,
                reason: format!("{MASTERS} may do everything"),
            };
        }
        match self
            .rules
            .iter()
            .position(|rule| rule.applies_to(user) && rule.allows(action))
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
    fn allows(&self, action: &Action) -> bool {
        if !listed(&self.verbs, &action.verb) {
            return false;
        }
        match &action.target {
            Target::NonResource { path } => self.non_resource_urls.iter().any(|rule| {
                rule == "*"
                    || rule == path
                    || rule
                        .strip_suffix('*')
                        .is_some_and(|prefix| path.starts_with(prefix))
            }),
            Target::Resource(r) => {
                let combined = if r.subresource.is_empty() {
                    r.resource.clone()
                } else {
                    format!("{}/{}", r.resource, r.subresource)
                };
                listed(&self.api_groups, &r.group)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn action(method: &str, path: &str, query: Option<&str>) -> (String, ResourceAttributes) {
        let action = Action::from_request(method, path, query);
        match action.target {
            Target::Resource(r) => (action.verb, r),
            Target::NonResource { path } => (
                action.verb,
                ResourceAttributes {
                    name: path,
                    ..Default::default()
                },
            ),
        }
    }

    #[test]
    fn request_info_follows_kube_apiserver() {
        let claims = "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/microvmclaims";
        let (verb, r) = action("GET", claims, None);
        assert_eq!(
            (verb.as_str(), r.resource.as_str(), r.namespace.as_str()),
            ("list", "microvmclaims", "default")
        );
        let (verb, r) = action(
            "GET",
            claims,
            Some("watch=1&fieldSelector=metadata.name%3Dc"),
        );
        assert_eq!((verb.as_str(), r.name.as_str()), ("watch", "c"));
        let (verb, r) = action("POST", &format!("{claims}/c/exec"), None);
        assert_eq!(
            (verb.as_str(), r.name.as_str(), r.subresource.as_str()),
            ("create", "c", "exec")
        );
        let (verb, _) = action("DELETE", claims, None);
        assert_eq!(verb, "deletecollection");
        let (verb, r) = action("GET", "/api/v1/namespaces/default", None);
        assert_eq!(
            (
                verb.as_str(),
                r.resource.as_str(),
                r.name.as_str(),
                r.namespace.as_str()
            ),
            ("get", "namespaces", "default", "default")
        );
        for path in [
            "/apis",
            "/apis/battery.liquidmetal-x.dev/v1alpha1",
            "/api/v1",
            "/openapi/v2",
        ] {
            assert_eq!(
                Action::from_request("GET", path, None).target,
                Target::NonResource {
                    path: path.to_owned()
                }
            );
        }
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%3Db+c"), "a=b c");
        assert_eq!(percent_decode("100%"), "100%");
    }
}
