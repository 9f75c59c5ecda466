//! `battery-apiserver embedded-battery`: serve the embedded battery and its simulated
//! Hosts until Ctrl-C or SIGTERM.

use anyhow::Context as _;
use battery_embedded::BatteryConfig;
use battery_embedded::local::{LocalBattery, LocalBatteryConfig};
use battery_embedded::simhost::SshProxyConfig;

use crate::cli::EmbeddedBatteryArgs;

/// Starts the embedded battery, prints where it listens and the next command to try,
/// and stops it cleanly on a signal.
pub async fn run(args: EmbeddedBatteryArgs) -> anyhow::Result<()> {
    let ssh_proxy = match &args.ssh_user_ca_public_key_file {
        Some(path) => Some(SshProxyConfig {
            user_ca_public_key: std::fs::read_to_string(path).with_context(|| {
                format!("reading --ssh-user-ca-public-key-file {}", path.display())
            })?,
        }),
        None => None,
    };
    let local = LocalBattery::start(LocalBatteryConfig {
        listen: args.listen,
        data_dir: args.data_dir.clone(),
        hosts: args.hosts,
        provisioning_delay: args.provisioning_delay,
        battery: BatteryConfig {
            sweep_interval: args.sweep_interval,
            warning_window: args.warning_window,
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
    crate::logging::announce(&[
        format!("embedded battery serving battery's gRPC API on {addr}"),
        format!(
            "  a simulation of poolmgrd with {} simulated Hosts (no isolation: commands run as you), {state}",
            local.hosts().len()
        ),
        format!("next: grpcurl -plaintext {addr} list"),
    ]);
    shutdown.await;
    tracing::info!("stopping the embedded battery");
    local.shutdown().await;
    Ok(())
}
