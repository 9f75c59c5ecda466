//! `aggregator-stand-in`: a test stand-in for kube-apiserver's aggregator and its
//! authentication/authorization webhooks (not a kube-apiserver). See
//! `battery_e2e::stand_in`.

use clap::Parser as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // The harness writes the log to a file that people read: no colour codes there.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    battery_e2e::stand_in::run(battery_e2e::stand_in::Args::parse()).await
}
