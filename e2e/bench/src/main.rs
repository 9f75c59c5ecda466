//! `bench`: issue 13's benchmark of battery-apiserver (see `battery_bench`).

use clap::Parser as _;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = battery_bench::Args::parse();
    match battery_bench::main(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bench: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
