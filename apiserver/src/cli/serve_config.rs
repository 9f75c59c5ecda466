//! `serve`'s flags as one checked configuration: every file read, every address and key
//! parsed, before a port is bound or the cluster or battery is called, so a mistake
//! stops the process at once naming its flag (as the agent's, and linkerd2-proxy's).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_rustls::TlsAcceptor;

use super::serve_args::ServeArgs;
use crate::api::{CreateRate, Limits};
use crate::battery::{BatteryClient, BatteryEndpoint, ChannelError, Security, TlsSettings};
use crate::http::authn::{RequestHeaderFlags, RequestHeaderNames, TrustSources, verifier};
use crate::http::serve::{self, TlsError, TlsFiles};
use crate::relay::AgentRelayTls;
use crate::resources::hosts::certificate::AgentSigner;
use crate::resources::hosts::ssh_certificate::SshUserCa;
use crate::resources::microvmclaims::GuestApiServer;

/// What `serve` runs with.
pub struct ServeConfig {
    pub listen: SocketAddr,
    /// battery's client: its address parsed, nothing dialled until the first call.
    pub battery: BatteryClient,
    /// The serving certificate, loaded (and reloaded when its files change).
    pub tls: TlsAcceptor,
    /// Where trusted CAs come from; the cluster, when there is one, is set by `serve`.
    pub trust: TrustSources,
    /// The cluster served, built but not yet called; `None` without a kubeconfig outside
    /// a pod.
    pub cluster: Option<kube::Client>,
    pub data_dir: Option<PathBuf>,
    pub bind_wait: Duration,
    pub slow_request_threshold: Duration,
    pub guest_api_server: Option<GuestApiServer>,
    pub limits: Limits,
    pub agent_relay: Option<AgentRelayTls>,
    pub max_exec_sessions: usize,
    pub agent_signer: Option<Arc<AgentSigner>>,
}

/// A flag whose value cannot be used, named so the message says which to fix; the cause
/// (a file that cannot be read, an address or a key that does not parse) follows it.
#[derive(Debug, thiserror::Error)]
#[error("--{flag} {value}")]
pub struct ConfigError {
    flag: &'static str,
    value: String,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl ConfigError {
    pub(crate) fn invalid(
        flag: &'static str,
        value: impl std::fmt::Display,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self {
            flag,
            value: value.to_string(),
            source: source.into(),
        }
    }
}

impl ServeArgs {
    /// Reads every file and checks every value; calls nothing and binds nothing.
    pub async fn into_config(self) -> Result<ServeConfig, ConfigError> {
        for (flag, path) in [
            ("client-ca-file", &self.client_ca_file),
            (
                "requestheader-client-ca-file",
                &self.requestheader_client_ca_file,
            ),
        ] {
            if let Some(path) = path {
                check_ca_bundle(flag, path)?;
            }
        }
        let files = TlsFiles {
            cert: self.tls_cert_file.clone(),
            key: self.tls_private_key_file.clone(),
        };
        // The reloader runs for as long as the process does.
        let (tls, _reloader) = serve::acceptor(&files).map_err(|e| tls_invalid(&files, e))?;
        let battery = self.battery()?;
        let cluster = cluster(self.kubeconfig.as_deref()).await?;
        Ok(ServeConfig {
            listen: self.listen,
            battery,
            tls,
            agent_relay: self.agent_relay()?,
            agent_signer: self.agent_signer()?,
            trust: self.trust(),
            cluster,
            data_dir: self.data_dir,
            bind_wait: self.requests.bind_wait.into(),
            slow_request_threshold: self.requests.slow_request_threshold.into(),
            guest_api_server: self.guest_api_server,
            limits: Limits {
                max_watches: self.max_watches,
                creates: self.creates_per_second.map(|per_second| CreateRate {
                    per_second,
                    burst: self.create_burst,
                }),
                request_timeout: self.request_timeout,
            },
            max_exec_sessions: self.max_exec_sessions,
        })
    }

    /// battery's client, its files read; the task that follows them runs for as long as
    /// the process does.
    fn battery(&self) -> Result<BatteryClient, ConfigError> {
        let security = match &self.battery_ca_file {
            Some(ca_file) if !self.battery_insecure => Security::Tls(TlsSettings {
                ca_file: ca_file.clone(),
                client: self
                    .battery_client_cert_file
                    .clone()
                    .zip(self.battery_client_key_file.clone())
                    .map(|(cert, key)| TlsFiles { cert, key }),
                server_name: self.battery_tls_server_name.clone(),
            }),
            _ => Security::Plaintext,
        };
        let endpoint = BatteryEndpoint {
            address: self.battery_address.clone(),
            security,
            token_file: self.battery_token_file.clone(),
        };
        let (battery, _follower) = BatteryClient::connect_secured(&endpoint).map_err(|err| {
            let path = |path: &Option<PathBuf>| {
                path.as_deref()
                    .map_or_else(String::new, |p| p.display().to_string())
            };
            let (flag, value) = match &err {
                ChannelError::Address(_)
                | ChannelError::PlaintextNotAsked
                | ChannelError::TlsNotConfigured => {
                    ("battery-address", self.battery_address.clone())
                }
                ChannelError::ServerName(name) => ("battery-tls-server-name", name.clone()),
                ChannelError::CaFile(_) | ChannelError::Tls(_) => {
                    ("battery-ca-file", path(&self.battery_ca_file))
                }
                ChannelError::ClientCertificate(_) => (
                    "battery-client-cert-file",
                    path(&self.battery_client_cert_file),
                ),
                ChannelError::TokenRead { .. }
                | ChannelError::TokenEmpty { .. }
                | ChannelError::TokenInvalid { .. } => {
                    ("battery-token-file", path(&self.battery_token_file))
                }
            };
            ConfigError::invalid(flag, value, err)
        })?;
        Ok(battery)
    }

    fn trust(&self) -> TrustSources {
        TrustSources {
            client_ca_file: self.client_ca_file.clone(),
            request_header: self.requestheader_client_ca_file.clone().map(|ca_file| {
                RequestHeaderFlags {
                    ca_file,
                    names: RequestHeaderNames {
                        allowed_names: self.requestheader_allowed_names.clone(),
                        username_headers: self.requestheader_username_headers.clone(),
                        uid_headers: self.requestheader_uid_headers.clone(),
                        group_headers: self.requestheader_group_headers.clone(),
                        extra_prefixes: self.requestheader_extra_headers_prefix.clone(),
                    },
                }
            }),
            cluster: None,
            tolerate_lookup_failure: self.authentication_tolerate_lookup_failure,
        }
    }

    /// The exec relay's TLS material; clap ensures the three files come together.
    fn agent_relay(&self) -> Result<Option<AgentRelayTls>, ConfigError> {
        let (Some(ca), Some(cert), Some(key)) = (
            &self.agent_ca_file,
            &self.agent_client_cert_file,
            &self.agent_client_key_file,
        ) else {
            return Ok(None);
        };
        Ok(Some(AgentRelayTls {
            ca_pem: check_ca_bundle("agent-ca-file", ca)?,
            client_cert_pem: read("agent-client-cert-file", cert)?,
            client_key_pem: read("agent-client-key-file", key)?,
        }))
    }

    /// The CA that signs agents' certificates at `hosts/<name>/certificate`, and the SSH
    /// CA that certifies their keys; clap ensures the CA's two files come together.
    fn agent_signer(&self) -> Result<Option<Arc<AgentSigner>>, ConfigError> {
        let (Some(cert), Some(key)) = (&self.agent_signing_cert_file, &self.agent_signing_key_file)
        else {
            return Ok(None);
        };
        let signer = AgentSigner::from_pem(
            &read_text("agent-signing-cert-file", cert)?,
            &read_text("agent-signing-key-file", key)?,
            self.agent_certificate_lifetime,
        )
        .map_err(|e| ConfigError::invalid("agent-signing-cert-file", cert.display(), e))?;
        let signer = match &self.agent_ssh_ca_key_file {
            Some(path) => signer.with_ssh_ca(
                SshUserCa::from_openssh(&read_text("agent-ssh-ca-key-file", path)?).map_err(
                    |e| ConfigError::invalid("agent-ssh-ca-key-file", path.display(), e),
                )?,
            ),
            None => signer,
        };
        Ok(Some(Arc::new(signer)))
    }
}

/// A client of the cluster served: from `kubeconfig` when given, else the in-cluster
/// config of the pod; without either, authorization, namespace lifecycle checks and
/// Events are off. Built, not called.
async fn cluster(kubeconfig: Option<&Path>) -> Result<Option<kube::Client>, ConfigError> {
    let config = match kubeconfig {
        Some(path) => {
            let invalid = |e: Box<dyn std::error::Error + Send + Sync>| {
                ConfigError::invalid("kubeconfig", path.display(), e)
            };
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| invalid(e.into()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .map_err(|e| invalid(e.into()))?
        }
        None => match kube::Config::incluster() {
            Ok(config) => config,
            Err(err) => {
                tracing::debug!(error = %err, "no in-cluster config");
                return Ok(None);
            }
        },
    };
    crate::cluster::client(config).map(Some).map_err(|e| {
        let value = kubeconfig.map_or_else(
            || "(not given: the pod's in-cluster config)".to_owned(),
            |path| path.display().to_string(),
        );
        ConfigError::invalid("kubeconfig", value, e)
    })
}

/// A serving certificate that cannot be used, named by the flag of the file at fault.
fn tls_invalid(files: &TlsFiles, error: TlsError) -> ConfigError {
    let key_at_fault = match &error {
        // The certificate's file first: both flags may name one file.
        TlsError::Read { path, .. } | TlsError::Pem { path, .. } => *path != files.cert,
        TlsError::Key { .. } => true,
        TlsError::NoCertificate { .. } | TlsError::Config(_) => false,
    };
    if key_at_fault {
        ConfigError::invalid("tls-private-key-file", files.key.display(), error)
    } else {
        ConfigError::invalid("tls-cert-file", files.cert.display(), error)
    }
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| ConfigError::invalid(flag, path.display(), e))
}

fn read_text(flag: &'static str, path: &Path) -> Result<String, ConfigError> {
    String::from_utf8(read(flag, path)?).map_err(|e| ConfigError::invalid(flag, path.display(), e))
}

/// The file's bytes, if they are a CA bundle that can verify: a wrong file (a DER, a
/// path mix-up) is caught here with its flag's name, not when a client first connects.
fn check_ca_bundle(flag: &'static str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    let bytes = read(flag, path)?;
    verifier(&bytes, "the CA bundle").map_err(|e| ConfigError::invalid(flag, path.display(), e))?;
    Ok(bytes)
}
