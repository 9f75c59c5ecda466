//! `battery-agent`: parse and check the command line, then serve; print the error chain
//! on failure.

use std::process::ExitCode;

use clap::Parser;

/// sysexits' EX_USAGE: the configuration is wrong, so restarting will not help.
const EXIT_USAGE: u8 = 64;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = battery_agent::Cli::parse();
    battery_telemetry::init(cli.log_format);
    let config = match cli.into_config() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("battery-agent: {:#}", anyhow::Error::from(error));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match battery_agent::run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("battery-agent: {:#}", anyhow::Error::from(error));
            ExitCode::FAILURE
        }
    }
}
