//! The Kubernetes aggregated API server for battery's warm pools of flintlock
//! MicroVMs, and the commands around it.

pub mod api;
pub mod auth;
pub mod battery;
mod cache;
pub mod certs;
pub mod cli;
mod clock;
pub mod cluster;
mod detached;
pub mod dev;
pub mod embedded_battery;
pub mod failpoint;
pub mod http;
pub mod logging;
pub mod meta_store;
pub mod metrics;
pub mod relay;
pub mod resources;
mod serve_command;
pub mod server;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod tls_files;
pub mod trace;
pub mod watch;

/// Runs the command the user chose.
pub async fn run(cli: cli::Cli) -> anyhow::Result<()> {
    match cli.command {
        cli::Command::Serve(args) => serve_command::run(args.into_config().await?).await,
        cli::Command::Dev(args) => dev::run(args).await,
        cli::Command::EmbeddedBattery(args) => embedded_battery::run(args).await,
        cli::Command::Certs(args) => certs::run(&args),
    }
}
