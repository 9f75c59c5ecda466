//! An agent's sandbox: claims a MicroVM of a Pool that goes back to the Pool on its own
//! once nothing has used it for 10 minutes, and after 2 hours whatever happens; runs a
//! command in it, and says so if a limit ends the claim first. With `--token AUDIENCE`
//! the guest also gets a token of the Holder's ServiceAccount for that audience, as a Pod
//! has one (a cluster's `serve` only: `battery-apiserver dev` refuses it).
//!
//! `cargo run -p battery-sdk --example agent -- [--kubeconfig PATH] [--token AUDIENCE]
//! POOL CMD...` (without `--kubeconfig`, `KUBECONFIG` or `~/.kube/config`, as kubectl).
//! The Holder is the kubeconfig's user, which must be a ServiceAccount of the namespace.

use std::time::Duration;

use battery_sdk::Client;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const USAGE: &str = "usage: agent [--kubeconfig PATH] [--token AUDIENCE] POOL CMD...";

#[tokio::main]
async fn main() -> Result<()> {
    let code = run(std::env::args().skip(1).collect()).await?;
    std::process::exit(code);
}

/// The example itself, apart from `main` so that the SDK's tests run it.
pub async fn run(mut args: Vec<String>) -> Result<i32> {
    let mut kubeconfig = None;
    let mut audience = None;
    while let Some(flag @ ("--kubeconfig" | "--token")) = args.first().map(String::as_str) {
        let value = args.get(1).ok_or(USAGE)?.clone();
        if flag == "--kubeconfig" {
            kubeconfig = Some(value);
        } else {
            audience = Some(value);
        }
        args.drain(..2);
    }
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    let [pool, command @ ..] = args.as_slice() else {
        return Err(USAGE.into());
    };
    let client = Client::from_config(config)?;
    let mut builder = client
        .claim(pool)
        .idle_timeout(Duration::from_secs(10 * 60))
        .max_lifetime(Duration::from_secs(2 * 60 * 60));
    if let Some(audience) = audience {
        builder = builder.token_audience(audience);
    }
    let claim = builder.send().await?;
    // As the bind resolved them; a Pool whose maximum is lower refuses these (a 422).
    if let Some(status) = &claim.object().status {
        let shown = |limit: Option<battery_sdk::types::Duration>| {
            limit.map_or_else(|| "none".to_owned(), |d| d.to_string())
        };
        eprintln!(
            "microvmclaim/{}: idle timeout {}, maximum lifetime {}",
            claim.name(),
            shown(status.idle_timeout),
            shown(status.max_lifetime),
        );
    }
    // The claim may end under the command: its limits, or its lease.
    let output = tokio::select! {
        output = claim.run(command.iter().cloned()) => output?,
        reason = claim.lost() => {
            eprintln!("microvmclaim/{} ended: {reason}", claim.name());
            return Ok(1);
        }
    };
    print!("{}", String::from_utf8_lossy(&output.stdout));
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    claim.release().await?;
    Ok(output.code)
}
