//! `bench`: issue 13's benchmark of battery-apiserver (see `battery_e2e::bench`).

use clap::Parser as _;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = battery_e2e::bench::Args::parse();
    match battery_e2e::bench::main(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bench: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
