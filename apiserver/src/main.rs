//! `battery-apiserver`: parse the command line, run the command, print the error
//! chain on failure.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = battery_apiserver::config::Cli::parse();
    battery_apiserver::logging::init();
    match battery_apiserver::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("battery-apiserver: {err:#}");
            ExitCode::from(1)
        }
    }
}
