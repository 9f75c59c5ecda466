//! `battery-apiserver embedded-battery`: serve the embedded battery and its simulated
//! Hosts until Ctrl-C or SIGTERM.

use anyhow::Context as _;
use battery_embedded::local::{LocalBattery, LocalBatteryConfig};
use battery_embedded::simhost::SshProxyConfig;
use battery_embedded::{ApiSecurity, BatteryConfig, ServerTls};

use crate::cli::{ConfigError, EmbeddedBatteryArgs};

/// Starts the embedded battery, prints where it listens and the next command to try,
/// and stops it cleanly on a signal.
pub async fn run(args: EmbeddedBatteryArgs) -> anyhow::Result<()> {
    let ssh_proxy = match &args.ssh_user_ca_public_key_file {
        Some(path) => Some(SshProxyConfig {
            user_ca_public_key: std::fs::read_to_string(path).with_context(|| {
                format!("reading --ssh-user-ca-public-key-file {}", path.display())
            })?,
            sshd: None,
        }),
        None => None,
    };
    let api = args.api_security()?;
    let secured = match (&api.tls, &api.basic_auth_token) {
        (None, None) => "plaintext, no token",
        (None, Some(_)) => "plaintext, token required",
        (Some(tls), token) => match (tls.client_ca_pem.is_some(), token.is_some()) {
            (false, false) => "TLS",
            (false, true) => "TLS, token required",
            (true, false) => "TLS, client certificate required",
            (true, true) => "TLS, client certificate and token required",
        },
    };
    let plaintext = api.tls.is_none();
    let local = LocalBattery::start(LocalBatteryConfig {
        listen: args.listen,
        data_dir: args.data_dir.clone(),
        hosts: args.hosts,
        provisioning_delay: args.provisioning_delay,
        battery: BatteryConfig {
            sweep_interval: args.sweep_interval,
            warning_window: args.warning_window,
            event_poll_interval: args.event_poll_interval,
            extension_events_on_commit: args.extension_events_on_commit,
            api,
            ..BatteryConfig::default()
        },
        ssh_proxy,
    })
    .await?;
    let addr = local.address();
    let state = match &args.data_dir {
        Some(dir) => format!("state in {}", dir.display()),
        None => "state in memory".to_owned(),
    };
    let shutdown = crate::serve_command::shutdown_signal();
    // Tests and scripts read the first line to learn the port when --listen has port 0.
    let next = if plaintext {
        format!("next: grpcurl -plaintext {addr} list")
    } else {
        format!(
            "next: grpcurl -cacert CA.crt {addr} list (with -cert/-key and -H 'authorization: Basic ...' as configured)"
        )
    };
    crate::logging::announce(&[
        format!("embedded battery serving battery's gRPC API on {addr}"),
        format!(
            "  a simulation of poolmgrd with {} simulated Hosts (no isolation: commands run as you), {state}, {secured}",
            local.hosts().len()
        ),
        next,
    ]);
    shutdown.await;
    tracing::info!("stopping the embedded battery");
    local.shutdown().await;
    Ok(())
}

impl EmbeddedBatteryArgs {
    /// The gRPC port's security from the flags, every file read; a file that cannot be
    /// read is a [`ConfigError`] naming its flag.
    fn api_security(&self) -> Result<ApiSecurity, ConfigError> {
        let read = |flag: &'static str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| ConfigError::invalid(flag, path.display(), e))
        };
        let tls = match (&self.tls_cert_file, &self.tls_private_key_file) {
            (Some(cert), Some(key)) => Some(ServerTls {
                cert_pem: read("tls-cert-file", cert)?,
                key_pem: read("tls-private-key-file", key)?,
                client_ca_pem: self
                    .client_ca_file
                    .as_deref()
                    .map(|ca| read("client-ca-file", ca))
                    .transpose()?,
            }),
            _ => None,
        };
        let basic_auth_token = match &self.basic_auth_token_file {
            Some(path) => {
                let text =
                    String::from_utf8(read("basic-auth-token-file", path)?).map_err(|e| {
                        ConfigError::invalid("basic-auth-token-file", path.display(), e)
                    })?;
                let token = ApiSecurity::token_in(&text).ok_or_else(|| {
                    ConfigError::invalid(
                        "basic-auth-token-file",
                        path.display(),
                        "the file holds no token",
                    )
                })?;
                Some(token.to_owned())
            }
            None => None,
        };
        Ok(ApiSecurity {
            tls,
            basic_auth_token,
        })
    }
}
