//! `HostCertificateRequest`: what an exec agent posts to `hosts/<name>/certificate` to get
//! its relay serving certificate, and what it gets back (ADR 0011). Like a TokenRequest it
//! is not stored: the response carries the signed certificate and nothing is kept.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::validation::{FieldError, FieldPath};
use crate::wire::required_fields;

/// The certificate an exec agent asks for: a PKCS#10 request signed with the key it keeps.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "battery.liquidmetal-x.dev",
    version = "v1alpha1",
    kind = "HostCertificateRequest",
    status = "HostCertificateRequestStatus",
    derive = "PartialEq",
    doc = "A HostCertificateRequest asks the API server, through hosts/<name>/certificate, to sign the relay serving certificate of that Host's exec agent. Only that Host's agent may ask, and only for the Host's names. The response carries the certificate; nothing is stored."
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = required_fields(&["request"]))]
pub struct HostCertificateRequestSpec {
    /// A PEM-encoded PKCS#10 certificate signing request. It may ask only for the Host's
    /// names (its name, and the host of its `agentAddress`); the certificate gets exactly
    /// those, whatever the request's subject says, and the request's public key.
    #[serde(default)]
    pub request: String,
    /// The agent's SSH public key, in OpenSSH's one-line form, to be certified for
    /// logging in to the Host's MicroVMs through flintlock's SSH proxy (interactive exec,
    /// ADR 33). Left out, no SSH certificate is made.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ssh_public_key: String,
}

/// The signed certificate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, rename_all = "camelCase")]
pub struct HostCertificateRequestStatus {
    /// The PEM chain: the certificate, then the CA that signed it.
    pub certificate: String,
    /// When the certificate expires; the agent renews it before then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expiration_time: Option<Time>,
    /// The OpenSSH user certificate of `spec.sshPublicKey`, signed by the API server's SSH
    /// user CA, for the principal `root`, with PTYs and port forwarding permitted; it
    /// expires with `certificate`. Empty when no key was sent or the server has no SSH CA.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub ssh_certificate: String,
}

impl HostCertificateRequestSpec {
    /// Checks the request as the subresource must find it, with paths from `spec`. The
    /// CSR itself is checked where it is signed, which knows the Host's names.
    pub fn validate(&self) -> Vec<FieldError> {
        let path = FieldPath::new("spec");
        if self.request.trim().is_empty() {
            return vec![FieldError::required(
                path.child("request"),
                "a PEM-encoded certificate signing request",
            )];
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_request_round_trips_and_an_empty_one_is_invalid() {
        let wire = json!({
            "apiVersion": "battery.liquidmetal-x.dev/v1alpha1",
            "kind": "HostCertificateRequest",
            "metadata": {},
            "spec": { "request": "-----BEGIN CERTIFICATE REQUEST-----\n" },
            "status": { "certificate": "pem", "expirationTime": "2026-12-02T12:00:00Z" }
        });
        let request: HostCertificateRequest = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(serde_json::to_value(&request).unwrap(), wire);
        assert!(request.spec.validate().is_empty());
        let errors: Vec<String> = HostCertificateRequestSpec::default()
            .validate()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            errors,
            ["spec.request: Required value: a PEM-encoded certificate signing request"]
        );
    }
}
