//! `battery-apiserver`: parse the command line, run the command, print the error
//! chain on failure.

use std::process::ExitCode;

use clap::Parser;

/// mimalloc hands freed memory back to the system within milliseconds; glibc's malloc
/// kept the peak of every large list in its per-thread arenas (ADR 20).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// sysexits' EX_USAGE: the configuration is wrong, so restarting will not help.
const EXIT_USAGE: u8 = 64;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = battery_apiserver::cli::Cli::parse();
    let log_format = cli.log_format;
    battery_telemetry::init(log_format);
    match battery_apiserver::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            battery_apiserver::logging::fatal(log_format, &err);
            if err.is::<battery_apiserver::cli::ConfigError>() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::from(1)
            }
        }
    }
}
