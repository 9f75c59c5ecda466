//! The kubeconfigs `dev` writes: the dev user's, and each agent's.

use std::path::Path;

use super::pki::{DevPki, write_file};

/// A kubeconfig for the dev user, pointing at the certificate files.
pub fn write_kubeconfig(path: &Path, server: &str, pki: &DevPki) -> anyhow::Result<()> {
    write_kubeconfig_for(
        path,
        server,
        &pki.ca_cert,
        &pki.client_cert,
        &pki.client_key,
    )
}

/// A kubeconfig for the user of the client certificate `cert`, trusting `ca`.
pub(super) fn write_kubeconfig_for(
    path: &Path,
    server: &str,
    ca: &Path,
    cert: &Path,
    key: &Path,
) -> anyhow::Result<()> {
    use kube::config::{
        AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
    };
    const NAME: &str = "battery-dev";
    let config = Kubeconfig {
        api_version: Some("v1".to_owned()),
        kind: Some("Config".to_owned()),
        clusters: vec![NamedCluster {
            name: NAME.to_owned(),
            cluster: Some(Cluster {
                server: Some(server.to_owned()),
                certificate_authority: Some(ca.display().to_string()),
                ..Cluster::default()
            }),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: NAME.to_owned(),
            auth_info: Some(AuthInfo {
                client_certificate: Some(cert.display().to_string()),
                client_key: Some(key.display().to_string()),
                ..AuthInfo::default()
            }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: NAME.to_owned(),
            context: Some(Context {
                cluster: NAME.to_owned(),
                user: Some(NAME.to_owned()),
                namespace: Some("default".to_owned()),
                ..Context::default()
            }),
            other: Default::default(),
        }],
        current_context: Some(NAME.to_owned()),
        ..Kubeconfig::default()
    };
    let yaml = serde_norway::to_string(&config)?;
    write_file(path, &yaml, false)?;
    Ok(())
}
