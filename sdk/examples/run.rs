//! Claims a MicroVM of a Pool, runs a command in it, releases it and exits with the
//! command's code.
//!
//! `cargo run -p battery-sdk --example run -- [--kubeconfig PATH] POOL CMD...`
//! (without `--kubeconfig`, `KUBECONFIG` or `~/.kube/config`, as kubectl). The Holder is
//! the kubeconfig's user, which must be a ServiceAccount of the namespace.

use battery_sdk::Client;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> Result<()> {
    let code = run(std::env::args().skip(1).collect()).await?;
    std::process::exit(code);
}

/// The example itself, apart from `main` so that the SDK's tests run it.
pub async fn run(mut args: Vec<String>) -> Result<i32> {
    let config = if args.first().map(String::as_str) == Some("--kubeconfig") {
        let path = args.get(1).ok_or("--kubeconfig needs a path")?.clone();
        args.drain(..2);
        let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
    } else {
        kube::Config::infer().await?
    };
    let [pool, command @ ..] = args.as_slice() else {
        return Err("usage: run [--kubeconfig PATH] POOL CMD...".into());
    };
    let client = Client::from_config(config)?;
    let claim = client.claim(pool).send().await?;
    let output = claim.run(command.iter().cloned()).await?;
    print!("{}", String::from_utf8_lossy(&output.stdout));
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    claim.release().await?;
    Ok(output.code)
}
