//! A claim's ServiceAccount token (issue 42; ADR 43): the Secret each token is bound to,
//! the cluster's TokenRequest, and the CA a Pod is given. A token bound to a Secret stops
//! authenticating once the Secret is gone, as a Pod's token does once its Pod is: the
//! Secret is created with the claim and deleted when the claim ends. Tokens are held as
//! `secrecy` strings and never logged; errors carry kube-apiserver's words, never a token.

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams};
use secrecy::SecretString;

use super::Cluster;

/// Why `dev` (or `serve` without a cluster) refuses a Pool or a claim that asks for a
/// ServiceAccount token.
pub const NO_CLUSTER_FOR_TOKENS: &str = "this API server has no cluster to request \
     ServiceAccount tokens from (battery-apiserver dev, or serve without --kubeconfig \
     outside a pod): serviceAccountToken needs battery-apiserver serve in a cluster";

/// The label that names the claim (by uid) a binding Secret belongs to.
pub const CLAIM_UID_LABEL: &str = "battery.liquidmetal-x.dev/claim-uid";
/// The type of a binding Secret: it holds no data, only a token's validity.
pub const BINDING_SECRET_TYPE: &str = "battery.liquidmetal-x.dev/token-binding";
/// The ConfigMap kube-controller-manager publishes in every namespace with the CA that
/// signed kube-apiserver's certificate: what the kubelet puts in a Pod's `ca.crt`.
const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";
const ROOT_CA_KEY: &str = "ca.crt";

/// The name of the Secret a claim's tokens are bound to: one per claim, from its uid, so
/// the server finds it again after a restart.
pub fn binding_name(claim_uid: &str) -> String {
    format!("battery-token-{claim_uid}")
}

/// The Secret a claim's tokens are bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBinding {
    pub name: String,
    pub uid: String,
}

/// A token TokenRequest issued.
pub struct IssuedToken {
    /// The token: shown to nothing but the guest's file.
    pub token: SecretString,
    /// When it expires, as kube-apiserver says.
    pub expires: Timestamp,
    /// Its lifetime as issued (kube-apiserver may shorten what was asked).
    pub lifetime_seconds: i64,
}

impl std::fmt::Debug for IssuedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `SecretString` redacts itself; said again here so a derive can never show it.
        f.debug_struct("IssuedToken")
            .field("token", &"[REDACTED]")
            .field("expires", &self.expires)
            .field("lifetime_seconds", &self.lifetime_seconds)
            .finish()
    }
}

impl Cluster {
    /// Creates the claim's binding Secret. One that exists for the same claim is taken as
    /// it is. It has no ownerReference to the claim: the garbage collector would look the
    /// claim up before its bind has recorded it, find none, and delete the Secret under
    /// the bind (ADR 43).
    pub async fn create_token_binding(
        &self,
        claim: &ObjectMeta,
    ) -> Result<TokenBinding, kube::Error> {
        let namespace = claim.namespace.clone().unwrap_or_default();
        let claim_uid = claim.uid.clone().unwrap_or_default();
        let name = binding_name(&claim_uid);
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                labels: Some(
                    [
                        (CLAIM_UID_LABEL.to_owned(), claim_uid.clone()),
                        (
                            "app.kubernetes.io/managed-by".to_owned(),
                            super::COMPONENT.to_owned(),
                        ),
                    ]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            type_: Some(BINDING_SECRET_TYPE.to_owned()),
            ..Secret::default()
        };
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &namespace);
        let created = match api.create(&PostParams::default(), &secret).await {
            Ok(created) => created,
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let found = api.get(&name).await?;
                let ours = found
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(CLAIM_UID_LABEL))
                    == Some(&claim_uid);
                if !ours {
                    return Err(kube::Error::Api(status));
                }
                found
            }
            Err(err) => return Err(err),
        };
        Ok(TokenBinding {
            name,
            uid: created.metadata.uid.unwrap_or_default(),
        })
    }

    /// The claim's binding Secret, `None` once it is gone.
    pub async fn token_binding(
        &self,
        namespace: &str,
        claim_uid: &str,
    ) -> Result<Option<TokenBinding>, kube::Error> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let name = binding_name(claim_uid);
        Ok(api.get_opt(&name).await?.map(|secret| TokenBinding {
            name,
            uid: secret.metadata.uid.unwrap_or_default(),
        }))
    }

    /// Deletes the claim's binding Secret, which invalidates every token bound to it; one
    /// already gone is fine.
    pub async fn delete_token_binding(
        &self,
        namespace: &str,
        claim_uid: &str,
    ) -> Result<(), kube::Error> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        match api
            .delete(&binding_name(claim_uid), &DeleteParams::default())
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// A token of `service_account` bound to `binding`, from TokenRequest.
    pub async fn request_token(
        &self,
        namespace: &str,
        service_account: &str,
        settings: &battery_types::TokenSettings,
        binding: &TokenBinding,
    ) -> Result<IssuedToken, kube::Error> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), namespace);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: settings.audience.iter().cloned().collect(),
                expiration_seconds: Some(settings.expiration_seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".to_owned()),
                    kind: Some("Secret".to_owned()),
                    name: Some(binding.name.clone()),
                    uid: Some(binding.uid.clone()),
                }),
            },
            ..TokenRequest::default()
        };
        let issued = api
            .create_token_request(service_account, &PostParams::default(), &request)
            .await?;
        let Some(status) = issued.status else {
            return Err(kube::Error::Api(
                kube::core::Status::failure("TokenRequest answered without a token", "").boxed(),
            ));
        };
        Ok(IssuedToken {
            token: status.token.into(),
            expires: status.expiration_timestamp.0,
            lifetime_seconds: issued
                .spec
                .expiration_seconds
                .unwrap_or(settings.expiration_seconds),
        })
    }

    /// The CA a Pod of `namespace` gets as `ca.crt`, PEM, or `None` when the namespace
    /// has none published (kube-controller-manager's root-ca-cert-publisher is not
    /// running).
    pub async fn root_ca(&self, namespace: &str) -> Result<Option<Vec<u8>>, kube::Error> {
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(self.client.clone(), namespace);
        Ok(api
            .get_opt(ROOT_CA_CONFIG_MAP)
            .await?
            .and_then(|config_map| config_map.data?.remove(ROOT_CA_KEY))
            .map(String::into_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issued_token_never_shows_in_a_debug_print() {
        let issued = IssuedToken {
            token: "eyJhbGciOi.secret-part".to_owned().into(),
            expires: Timestamp::UNIX_EPOCH,
            lifetime_seconds: 600,
        };
        let shown = format!("{issued:?} {:?}", issued.token);
        assert!(!shown.contains("secret-part"), "{shown}");
        assert!(shown.contains("REDACTED"), "{shown}");
    }
}
