//! `kubectl-microvm`: claim battery MicroVMs, run commands in them, copy files in and
//! out and forward their ports, from a terminal, on battery-sdk. On PATH, kubectl runs it
//! as `kubectl microvm`.
//!
//! Every failure is one line on stderr that says what to do, and exit code 1; `exec`,
//! `shell` and `run` exit with the command's code (130 after Ctrl-C, 143 after SIGTERM);
//! `port-forward` runs until Ctrl-C, then exits 0, as kubectl's does.

mod cli;
mod commands;
mod failure;
mod processes;
mod progress;
mod session;

use clap::{CommandFactory as _, Parser as _};
use kube::config::{KubeConfigOptions, Kubeconfig};

use cli::{Cli, ClusterArgs, Command};
use commands::Context;
use failure::Failure;

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let code = match run(cli).await {
        Ok(code) => code,
        Err(failure) => {
            eprintln!("error: {failure}");
            1
        }
    };
    // Exits now rather than waiting for a read of stdin that may never end.
    std::process::exit(code);
}

async fn run(cli: Cli) -> Result<i32, Failure> {
    if let Command::Completion { shell } = cli.command {
        let mut command = Cli::command();
        let name = command.get_name().to_owned();
        clap_complete::generate(shell, &mut command, name, &mut std::io::stdout());
        return Ok(0);
    }
    let cx = connect(&cli.cluster).await?;
    match cli.command {
        Command::Claim(args) => commands::claim(&cx, args).await,
        Command::Exec(args) => commands::exec(&cx, args).await,
        Command::Shell(args) => commands::exec(&cx, args.into_exec()).await,
        Command::Run(args) => commands::run(&cx, args).await,
        Command::Cp(args) => commands::cp(&cx, args).await,
        Command::PortForward(args) => commands::port_forward(&cx, args).await,
        Command::Start(args) => processes::start(&cx, args).await,
        Command::Ps { selector } => processes::list(&cx, selector.as_deref()).await,
        Command::Attach { process, stdin } => processes::attach(&cx, &process, stdin).await,
        Command::Kill { process } => processes::kill(&cx, &process).await,
        Command::Renew { claim } => commands::renew(&cx, &claim).await,
        Command::Release { claim } => commands::release(&cx, &claim).await,
        Command::Ls => commands::list(&cx).await,
        Command::Completion { .. } => unreachable!("answered above"),
    }
}

/// The SDK's client for the cluster, user and namespace kubectl would choose.
async fn connect(args: &ClusterArgs) -> Result<Context, Failure> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..KubeConfigOptions::default()
    };
    let no_config = |error: &(dyn std::error::Error + 'static)| {
        Failure::new(format!(
            "no usable kubeconfig: {}; pass --kubeconfig or set KUBECONFIG (and --context \
             to pick a context)",
            failure::chain(error)
        ))
    };
    let config = match (&args.kubeconfig, &args.context) {
        (Some(path), _) => {
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| {
                Failure::new(format!(
                    "cannot read the kubeconfig {}: {}; check --kubeconfig",
                    path.display(),
                    failure::chain(&e)
                ))
            })?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| no_config(&e))?
        }
        (None, Some(_)) => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| no_config(&e))?,
        // As kubectl: KUBECONFIG, ~/.kube/config, then the Pod's ServiceAccount.
        (None, None) => kube::Config::infer().await.map_err(|e| no_config(&e))?,
    };
    let server = config.cluster_url.to_string();
    let mut client =
        battery_sdk::Client::from_config(config).map_err(|e| Failure::of(&e, &server))?;
    if let Some(namespace) = &args.namespace {
        client = client.namespace(namespace);
    }
    Ok(Context { client, server })
}
