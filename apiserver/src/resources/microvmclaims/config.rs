//! A claim's `env` and `files` (issue 14; ADR 0016): resolved at bind, before `ClaimVM`,
//! as the **requesting user** — each Secret or ConfigMap is read only after the
//! authorizer (the cluster's SubjectAccessReview) says that user may `get` it, so the
//! server's own access lends nobody anything. Files are written through the Host's agent
//! after `ClaimVM` and before the `201`.
//!
//! Values are kept in memory only, as `secrecy` secrets, in a bounded map by claim uid
//! that a release, an expiry or a delete empties. After a restart (or an eviction) the
//! next exec reads them again with the server's own client: the references were
//! authorized when the claim was created, and they cannot change since.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use battery_api_machinery::request_info::RequestInfo;
use battery_api_machinery::status::ApiError;
use battery_types::validation::{FieldError, FieldPath};
use battery_types::{KeySelector, MicroVMClaim, MicroVMClaimSpec, SourceKind};
use moka::sync::Cache;
use secrecy::{ExposeSecret as _, SecretSlice, SecretString};

use crate::auth::{Authorizer, Decision, UserInfo};
use crate::cluster::tokens::NO_CLUSTER_FOR_TOKENS;
use crate::cluster::{Cluster, KeyValues};
use crate::relay::AgentRelay;

pub use api_server::GuestApiServer;
use api_server::{SERVICE_HOST, SERVICE_PORT};

/// Claims whose env is kept; past it the least used are dropped and read again at their
/// next exec.
const ENV_ENTRIES: u64 = 16 * 1024;
/// A claim's environment, its values secret.
pub type ClaimEnv = BTreeMap<String, SecretString>;

/// A file to write at bind.
pub struct FileContent {
    path: String,
    mode: i32,
    content: SecretSlice<u8>,
}

impl FileContent {
    /// A file of `content` at `path` (absolute, as in the guest) with `mode`.
    pub fn new(path: String, mode: i32, content: SecretSlice<u8>) -> Self {
        Self {
            path,
            mode,
            content,
        }
    }
}

/// What binding a claim read.
#[derive(Default)]
pub struct Resolved {
    pub env: ClaimEnv,
    pub files: Vec<FileContent>,
}

/// Reads, keeps and writes claims' configuration.
pub struct ClaimConfig {
    /// `None` in `dev`: references are refused, literal values work.
    cluster: Option<Arc<Cluster>>,
    /// The server's authorizer; `None` allows every request (nothing else reaches it).
    authorizer: Option<Arc<dyn Authorizer>>,
    relay: Arc<AgentRelay>,
    env: Cache<String, Arc<ClaimEnv>>,
    /// Where guests with a ServiceAccount token are told kube-apiserver is; `None`, they
    /// are told nothing.
    api_server: Option<GuestApiServer>,
}

/// The objects a spec refers to, read: `None` for one that does not exist.
type Fetched = HashMap<(SourceKind, String), Option<KeyValues>>;

impl ClaimConfig {
    pub fn new(
        cluster: Option<Arc<Cluster>>,
        authorizer: Option<Arc<dyn Authorizer>>,
        relay: Arc<AgentRelay>,
    ) -> Self {
        Self {
            cluster,
            authorizer,
            relay,
            env: Cache::new(ENV_ENTRIES),
            api_server: None,
        }
    }

    /// Tells the guests of claims with a ServiceAccount token where kube-apiserver is, as
    /// a Pod is told (ADR 45).
    #[must_use]
    pub fn with_guest_api_server(mut self, api_server: Option<GuestApiServer>) -> Self {
        self.api_server = api_server;
        self
    }

    /// Resolves every reference of `claim` as `user`: authorized first (a `403` naming
    /// the object, nothing read), then read, then assembled (a `422` naming a missing
    /// key).
    pub async fn resolve(
        &self,
        user: &UserInfo,
        claim: &MicroVMClaim,
    ) -> Result<Resolved, ApiError> {
        let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
        let refs = references(&claim.spec, true);
        if !refs.is_empty() {
            self.cluster()?;
        }
        for (kind, name) in &refs {
            self.authorize(user, *kind, namespace, name).await?;
        }
        let fetched = self.fetch(namespace, refs).await?;
        assemble(claim, &fetched, true)
    }

    /// `get` on the object, as `user`.
    async fn authorize(
        &self,
        user: &UserInfo,
        kind: SourceKind,
        namespace: &str,
        name: &str,
    ) -> Result<(), ApiError> {
        let Some(authorizer) = &self.authorizer else {
            return Ok(());
        };
        let request = get_request(kind, namespace, name);
        match authorizer.authorize(user, &request).await? {
            Decision::Allow => Ok(()),
            Decision::Deny(reason) => Err(ApiError::forbidden(&user.name, &request, &reason)),
        }
    }

    /// The cluster to request a claim's ServiceAccount tokens from; `dev` has none.
    pub fn cluster_for_tokens(&self) -> Result<&Arc<Cluster>, ApiError> {
        self.cluster
            .as_ref()
            .ok_or_else(|| ApiError::bad_request(NO_CLUSTER_FOR_TOKENS))
    }

    /// Whether ServiceAccount tokens can be had: only with a cluster.
    pub fn serves_tokens(&self) -> bool {
        self.cluster.is_some()
    }

    /// Whether `user` may have a token of `service_account` themself (`create` on its
    /// `serviceaccounts/token`): a claim gives its guest one only then, so no one gets
    /// through a claim a token they could not request (ADR 43).
    pub async fn authorize_token(
        &self,
        user: &UserInfo,
        namespace: &str,
        service_account: &str,
    ) -> Result<(), ApiError> {
        let Some(authorizer) = &self.authorizer else {
            return Ok(());
        };
        let request = RequestInfo {
            is_resource_request: true,
            verb: "create".to_owned(),
            api_prefix: "api".to_owned(),
            api_version: "v1".to_owned(),
            namespace: namespace.to_owned(),
            resource: "serviceaccounts".to_owned(),
            subresource: "token".to_owned(),
            name: service_account.to_owned(),
            path: format!("/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"),
            ..RequestInfo::default()
        };
        match authorizer.authorize(user, &request).await? {
            Decision::Allow => Ok(()),
            Decision::Deny(reason) => Err(ApiError::forbidden(&user.name, &request, &reason)),
        }
    }

    /// Deletes a claim's token binding now, which invalidates its tokens: before its
    /// record goes, so a crash in between leaves the claim to be deleted again.
    pub async fn delete_token(&self, namespace: &str, uid: &str) -> Result<(), ApiError> {
        let cluster = self.cluster_for_tokens()?;
        cluster
            .delete_token_binding(namespace, uid)
            .await
            .map_err(|err| {
                ApiError::service_unavailable(format!(
                    "cannot delete the Secret the claim's tokens are bound to: {err}"
                ))
            })
    }

    /// Deletes a claim's token binding, which invalidates its tokens, retrying until the
    /// cluster answers (a restart finds what it could not delete: `resume_tokens`).
    pub fn end_token(&self, namespace: String, uid: String) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        tokio::spawn(async move {
            let mut pause = std::time::Duration::from_millis(200);
            loop {
                match cluster.delete_token_binding(&namespace, &uid).await {
                    Ok(()) => return,
                    Err(err) => {
                        tracing::warn!(error = %err, namespace = %namespace, claim_uid = %uid, "deleting an ended claim's token binding; retrying");
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(std::time::Duration::from_secs(30));
                    }
                }
            }
        });
    }

    fn cluster(&self) -> Result<&Cluster, ApiError> {
        self.cluster.as_deref().ok_or_else(|| {
            ApiError::bad_request(
                "this API server has no cluster to read Secrets and ConfigMaps from \
                 (battery-apiserver dev): give env values as `value`, and no files",
            )
        })
    }

    async fn fetch(
        &self,
        namespace: &str,
        refs: Vec<(SourceKind, String)>,
    ) -> Result<Fetched, ApiError> {
        let mut fetched = Fetched::new();
        if refs.is_empty() {
            return Ok(fetched);
        }
        let cluster = self.cluster()?;
        for (kind, name) in refs {
            let data = match kind {
                SourceKind::Secret => cluster.secret_data(namespace, &name).await?,
                SourceKind::ConfigMap => cluster.config_map_data(namespace, &name).await?,
            };
            fetched.insert((kind, name), data);
        }
        Ok(fetched)
    }

    /// Keeps a bound claim's env for its exec sessions; `token`: its guest has a
    /// ServiceAccount token.
    pub fn remember(&self, uid: &str, env: ClaimEnv, token: bool) {
        self.env
            .insert(uid.to_owned(), Arc::new(self.for_sessions(env, token)));
    }

    /// `env` as the sessions of a claim get it: with `token` and a `--guest-api-server`,
    /// `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT` under the claim's own, as
    /// a container's env wins over the kubelet's Service variables.
    fn for_sessions(&self, mut env: ClaimEnv, token: bool) -> ClaimEnv {
        if let (true, Some(api)) = (token, &self.api_server) {
            for (name, value) in [
                (SERVICE_HOST, api.host.clone()),
                (SERVICE_PORT, api.port.to_string()),
            ] {
                env.entry(name.to_owned()).or_insert_with(|| value.into());
            }
        }
        env
    }

    /// Drops a claim's env: it was released, expired or deleted.
    pub fn forget(&self, uid: &str) {
        self.env.invalidate(uid);
    }

    /// A bound claim's env, read again (with the server's own client) if it is not kept;
    /// `token`: its guest has a ServiceAccount token.
    pub async fn env(&self, claim: &MicroVMClaim, token: bool) -> Result<Arc<ClaimEnv>, ApiError> {
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        if let Some(env) = self.env.get(&uid) {
            return Ok(env);
        }
        let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
        let fetched = self
            .fetch(namespace, references(&claim.spec, false))
            .await?;
        let env = Arc::new(self.for_sessions(assemble(claim, &fetched, false)?.env, token));
        self.env.insert(uid, env.clone());
        Ok(env)
    }
}

/// Merges a claim's env under a session's own: the session's `env` wins on a clash, as a
/// command's own assignment wins over its environment.
pub fn session_env(claim: &ClaimEnv, own: HashMap<String, String>) -> HashMap<String, String> {
    let mut env: HashMap<String, String> = claim
        .iter()
        .map(|(name, value)| (name.clone(), value.expose_secret().to_owned()))
        .collect();
    env.extend(own);
    env
}

/// The attributes of `get` on one core object, as a SubjectAccessReview carries them.
fn get_request(kind: SourceKind, namespace: &str, name: &str) -> RequestInfo {
    RequestInfo {
        is_resource_request: true,
        verb: "get".to_owned(),
        api_prefix: "api".to_owned(),
        api_version: "v1".to_owned(),
        namespace: namespace.to_owned(),
        resource: kind.resource().to_owned(),
        name: name.to_owned(),
        path: format!("/api/v1/namespaces/{namespace}/{}/{name}", kind.resource()),
        ..RequestInfo::default()
    }
}

/// The distinct objects the env (and, with `files`, the files) refer to, in order.
fn references(spec: &MicroVMClaimSpec, files: bool) -> Vec<(SourceKind, String)> {
    let env = spec
        .env
        .iter()
        .filter_map(|var| var.value_from.as_ref()?.reference());
    let files = spec
        .files
        .iter()
        .filter(|_| files)
        .filter_map(|file| file.reference());
    let mut refs: Vec<(SourceKind, String)> = Vec::new();
    for (kind, selector) in env.chain(files) {
        let key = (kind, selector.name.clone());
        if !refs.contains(&key) {
            refs.push(key);
        }
    }
    refs
}

/// The value a selector names, `Ok(None)` when it is optional and missing.
fn lookup<'a>(
    fetched: &'a Fetched,
    kind: SourceKind,
    selector: &KeySelector,
    namespace: &str,
    at: &FieldPath,
) -> Result<Option<&'a SecretSlice<u8>>, FieldError> {
    let object = fetched
        .get(&(kind, selector.name.clone()))
        .and_then(Option::as_ref);
    let Some(object) = object else {
        if selector.is_optional() {
            return Ok(None);
        }
        return Err(FieldError::invalid(
            at.child("name"),
            selector.name.as_str(),
            format!("{} {namespace}/{} not found", kind.kind(), selector.name),
        ));
    };
    match object.get(&selector.key) {
        Some(value) => Ok(Some(value)),
        None if selector.is_optional() => Ok(None),
        None => Err(FieldError::invalid(
            at.child("key"),
            selector.key.as_str(),
            format!(
                "no such key in {} {namespace}/{}",
                kind.kind(),
                selector.name
            ),
        )),
    }
}

/// The env (and, with `files`, the files) of `claim` from what was read; every missing
/// object or key that is not optional is a field error, answered `422` together.
fn assemble(claim: &MicroVMClaim, fetched: &Fetched, files: bool) -> Result<Resolved, ApiError> {
    let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    let spec_path = FieldPath::new("spec");
    let mut errors = Vec::new();
    let mut resolved = Resolved::default();
    for (index, var) in claim.spec.env.iter().enumerate() {
        let Some((kind, selector)) = var.value_from.as_ref().and_then(|v| v.reference()) else {
            let value = var.value.clone().unwrap_or_default();
            resolved.env.insert(var.name.clone(), value.into());
            continue;
        };
        let field = match kind {
            SourceKind::Secret => "secretKeyRef",
            SourceKind::ConfigMap => "configMapKeyRef",
        };
        let at = spec_path
            .child("env")
            .index(index)
            .child("valueFrom")
            .child(field);
        match lookup(fetched, kind, selector, namespace, &at) {
            Ok(None) => {}
            Ok(Some(value)) => match std::str::from_utf8(value.expose_secret()) {
                Ok(text) => {
                    resolved.env.insert(var.name.clone(), text.into());
                }
                Err(_) => errors.push(FieldError::invalid(
                    at.child("key"),
                    selector.key.as_str(),
                    "the value is not UTF-8 text, so it cannot be an environment variable",
                )),
            },
            Err(error) => errors.push(error),
        }
    }
    for (index, file) in claim.spec.files.iter().enumerate().filter(|_| files) {
        let Some((kind, selector)) = file.reference() else {
            continue;
        };
        let field = match kind {
            SourceKind::Secret => "secretKeyRef",
            SourceKind::ConfigMap => "configMapKeyRef",
        };
        let at = spec_path.child("files").index(index).child(field);
        match lookup(fetched, kind, selector, namespace, &at) {
            Ok(None) => {}
            Ok(Some(content)) => resolved.files.push(FileContent {
                path: file.path.clone(),
                mode: file.mode_or_default(),
                content: content.expose_secret().to_vec().into(),
            }),
            Err(error) => errors.push(error),
        }
    }
    if errors.is_empty() {
        Ok(resolved)
    } else {
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        Err(ApiError::invalid(super::info(), name, &errors))
    }
}

mod api_server;
#[cfg(test)]
mod tests;
mod write;
