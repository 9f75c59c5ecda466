//! The command line: global flags as kubectl has them, and one subcommand per verb.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Claim battery MicroVMs, run commands in them, copy files in and out and forward their
/// ports. On PATH, kubectl runs it as `kubectl microvm`.
#[derive(Debug, Parser)]
#[command(name = "kubectl-microvm", version, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Which cluster, user and namespace, as kubectl chooses them.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// The kubeconfig file; without it KUBECONFIG, then ~/.kube/config, then the Pod's
    /// own ServiceAccount.
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context; without it the current context.
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// The namespace; without it the context's.
    #[arg(short = 'n', long, global = true, value_name = "NAME")]
    pub namespace: Option<String>,
}

/// Where `exec -t` and `shell` say what a terminal needs of the guest.
const TTY_NEEDS_SSHD: &str = "A terminal (-t, shell) needs the guest to run sshd trusting \
                              battery's SSH CA; docs/exec.md says how.";

/// Where `port-forward` says what reaching a guest port needs of the guest.
const FORWARD_NEEDS_SSHD: &str = "A guest port is reached through the guest's sshd \
                                  (direct-tcpip), so the guest must run sshd trusting \
                                  battery's SSH CA, as for a terminal; docs/exec.md says how.";

/// What `shell` runs: the guest user's login shell, or sh when it names none.
const LOGIN_SHELL: [&str; 3] = ["/bin/sh", "-c", "exec \"${SHELL:-/bin/sh}\" -l"];

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Claim a MicroVM of POOL: when this returns, the claim is Bound.
    ///
    /// Without --hold the claim stays Bound only while something renews it
    /// (`kubectl microvm renew`); with --hold this command renews it until Ctrl-C, then
    /// releases it.
    Claim(ClaimArgs),
    /// Run a command in the MicroVM of CLAIM, as kubectl exec runs one in a Pod.
    ///
    /// stdout and stderr are streamed; the exit code is the command's; Ctrl-C ends the
    /// command. With -it (on a terminal) the command gets a terminal, as `kubectl exec
    /// -it` gives one: `exec -it CLAIM -- vi notes`. Only the claim's Holder may.
    #[command(after_help = TTY_NEEDS_SSHD)]
    Exec(ExecArgs),
    /// Open the guest's login shell in the MicroVM of CLAIM, in a terminal.
    ///
    /// The same as `exec -it CLAIM -- /bin/sh -c 'exec "${SHELL:-/bin/sh}" -l'`: keys go
    /// to the shell as typed (Ctrl-C and Ctrl-D too), and `exit` ends it. The exit code is
    /// the shell's.
    #[command(after_help = TTY_NEEDS_SSHD)]
    Shell(ShellArgs),
    /// Claim a MicroVM of POOL, run a command in it, and release it.
    ///
    /// The exit code is the command's.
    Run(RunArgs),
    /// Copy a file or directory into or out of the MicroVM of a claim, as kubectl cp
    /// copies one for a Pod.
    ///
    /// One of SRC and DST is CLAIM:PATH, the other a local path: `cp ./dir CLAIM:/work`
    /// puts it in /work when that is a directory (else makes /work of it), `cp
    /// CLAIM:/work/out.tar ./` puts it here. Modes come along; every file is verified by
    /// its size and sha256 in the guest; a directory travels as a tar stream, so the
    /// guest needs tar. A progress bar shows on a terminal.
    Cp(CpArgs),
    /// Forward local ports to ports of the MicroVM of CLAIM, as kubectl port-forward
    /// forwards them to a Pod.
    ///
    /// Each mapping is [LOCAL:]REMOTE: `8080:80` listens on 8080 for the guest's port 80,
    /// `:80` on a free local port, `80` on port 80 here too. Runs until Ctrl-C (exit 0); a
    /// connection that fails prints an error line and the others go on. Only the claim's
    /// Holder may.
    #[command(after_help = FORWARD_NEEDS_SSHD)]
    PortForward(PortForwardArgs),
    /// Start a command in the background in the MicroVM of CLAIM: it runs on after this
    /// returns, and whoever holds the claim can attach to it, list it and stop it.
    ///
    /// Prints its name: `attach` streams its output from its start, `ps` lists it, `kill`
    /// stops it. Only the claim's Holder may.
    Start(StartArgs),
    /// List the background processes of the namespace: claim, command, state, exit code.
    Ps {
        /// Only those with these labels, as kubectl's -l: KEY=VALUE,...
        #[arg(short = 'l', long = "selector", value_name = "SELECTOR")]
        selector: Option<String>,
    },
    /// Stream a background process's output from its start (the latest 1 MiB), then live,
    /// until it ends; the exit code is its own. Ctrl-C leaves it running.
    Attach {
        /// The process (NAME or microvmprocess/NAME).
        process: String,
        /// Pass this terminal's stdin to it (it must have been started with -i).
        #[arg(short = 'i', long)]
        stdin: bool,
    },
    /// Stop a background process: SIGTERM, then SIGKILL after its grace period. It stays
    /// listed with the signal that ended it, until `kubectl delete microvmprocess NAME`.
    Kill {
        /// The process (NAME or microvmprocess/NAME).
        process: String,
    },
    /// Renew the lease of CLAIM once.
    Renew {
        /// The claim (NAME or microvmclaim/NAME).
        claim: String,
    },
    /// Release CLAIM (delete it), which frees its MicroVM.
    Release {
        /// The claim (NAME or microvmclaim/NAME).
        claim: String,
    },
    /// List the claims of the namespace.
    #[command(visible_alias = "list")]
    Ls,
    /// Print the shell completion script for SHELL.
    ///
    /// For example `kubectl-microvm completion bash > /etc/bash_completion.d/kubectl-microvm`.
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// How a claim is asked for, shared by `claim` and `run`.
#[derive(Debug, Args)]
pub struct ClaimRequest {
    /// The Pool to claim from.
    pub pool: String,
    /// The ServiceAccount that holds the claim; without it, your own user when it is a
    /// ServiceAccount of the namespace.
    #[arg(long, value_name = "SERVICEACCOUNT")]
    pub holder: Option<String>,
    /// How long to wait for a free MicroVM, such as 30s or 2m.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub deadline: Duration,
    /// End the claim after this long without an exec, terminal, port-forward, copy or
    /// running background process, such as 15m; without it, the Pool's default.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub idle_timeout: Option<Duration>,
    /// End the claim this long after it binds, however often renewed, such as 8h;
    /// without it, the Pool's default.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub max_lifetime: Option<Duration>,
    /// Put a token of the Holder's ServiceAccount in the MicroVM, as a Pod has one
    /// (/var/run/secrets/kubernetes.io/serviceaccount); the Pool's settings apply unless
    /// --token-audience or --token-expiration say otherwise.
    #[arg(long)]
    pub service_account_token: bool,
    /// The audience of the MicroVM's token, such as sts.amazonaws.com; implies
    /// --service-account-token.
    #[arg(long, value_name = "AUDIENCE")]
    pub token_audience: Option<String>,
    /// How long each of the MicroVM's tokens is valid, at least 10m, such as 1h; implies
    /// --service-account-token.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub token_expiration: Option<Duration>,
}

#[derive(Debug, Args)]
pub struct ClaimArgs {
    #[command(flatten)]
    pub request: ClaimRequest,
    /// The claim's name; without it, the Pool's name and a random suffix.
    #[arg(long)]
    pub name: Option<String>,
    /// A label for the claim, KEY=VALUE; repeat for more.
    #[arg(short = 'l', long = "label", value_name = "KEY=VALUE", value_parser = key_value)]
    pub labels: Vec<(String, String)>,
    /// Keep renewing the claim until Ctrl-C, then release it.
    #[arg(long)]
    pub hold: bool,
    /// What to print of the bound claim.
    #[arg(short, long, value_enum)]
    pub output: Option<Output>,
}

/// The command to run and how, shared by `exec` and `run`.
#[derive(Debug, Args)]
pub struct CommandArgs {
    /// Pass this terminal's stdin to the command (it sees end of file when stdin ends).
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// With -i, run the command in a terminal, driven by this one in raw mode: keys go
    /// as typed (Ctrl-C and Ctrl-D too), its size follows this one's. When stdin is not
    /// a terminal, says so and runs without one, as kubectl does; without -i, ignored.
    #[arg(short = 't', long)]
    pub tty: bool,
    /// An environment variable for the command, NAME=VALUE; repeat for more.
    #[arg(short, long = "env", value_name = "NAME=VALUE", value_parser = key_value)]
    pub env: Vec<(String, String)>,
    /// The directory in the guest the command starts in.
    #[arg(short, long, value_name = "DIR")]
    pub workdir: Option<String>,
    /// The program and its arguments, after `--`. No shell: use `-- sh -c '...'` for one.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The claim (NAME or microvmclaim/NAME).
    pub claim: String,
    #[command(flatten)]
    pub command: CommandArgs,
}

#[derive(Debug, Args)]
pub struct ShellArgs {
    /// The claim (NAME or microvmclaim/NAME).
    pub claim: String,
}

impl ShellArgs {
    /// The `exec -it` that `shell` is.
    pub fn into_exec(self) -> ExecArgs {
        ExecArgs {
            claim: self.claim,
            command: CommandArgs {
                stdin: true,
                tty: true,
                env: Vec::new(),
                workdir: None,
                command: LOGIN_SHELL.map(String::from).into(),
            },
        }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub request: ClaimRequest,
    #[command(flatten)]
    pub command: CommandArgs,
}

#[derive(Debug, Args)]
pub struct StartArgs {
    /// The claim (NAME or microvmclaim/NAME).
    pub claim: String,
    /// Its name; without it, the claim's name and a random suffix.
    #[arg(long)]
    pub name: Option<String>,
    /// A label for it, KEY=VALUE; repeat for more.
    #[arg(short = 'l', long = "label", value_name = "KEY=VALUE", value_parser = key_value)]
    pub labels: Vec<(String, String)>,
    /// Keep its stdin open, for `attach -i` to write to.
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// An environment variable for it, NAME=VALUE; repeat for more.
    #[arg(short, long = "env", value_name = "NAME=VALUE", value_parser = key_value)]
    pub env: Vec<(String, String)>,
    /// The directory in the guest it starts in.
    #[arg(short, long, value_name = "DIR")]
    pub workdir: Option<String>,
    /// How long a stop waits after SIGTERM before SIGKILL, such as 10s.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub grace_period: Option<Duration>,
    /// The program and its arguments, after `--`. No shell: use `-- sh -c '...'` for one.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// A process's name from NAME or microvmprocess/NAME (as kubectl prints it).
pub fn process_name(process: &str) -> &str {
    without_kind(process, ["microvmprocess/", "microvmprocesses/", "mvp/"])
}

#[derive(Debug, Args)]
pub struct CpArgs {
    /// What to copy: a local path, or CLAIM:PATH in the guest.
    #[arg(value_name = "SRC")]
    pub src: String,
    /// Where to: CLAIM:PATH in the guest, or a local path.
    #[arg(value_name = "DST")]
    pub dst: String,
}

#[derive(Debug, Args)]
pub struct PortForwardArgs {
    /// The claim (NAME or microvmclaim/NAME).
    pub claim: String,
    /// A port to forward, [LOCAL:]REMOTE: 8080:80, :80 (a free local port) or 80.
    #[arg(required = true, value_name = "[LOCAL:]REMOTE", value_parser = Mapping::parse)]
    pub ports: Vec<Mapping>,
    /// The local addresses to listen on, comma-separated: IP addresses, or localhost.
    #[arg(
        long = "address",
        value_name = "ADDRESS",
        value_delimiter = ',',
        default_value = "127.0.0.1",
        value_parser = address
    )]
    pub addresses: Vec<IpAddr>,
}

/// One `[LOCAL:]REMOTE` of `port-forward`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// The local port; 0 for a free one.
    pub local: u16,
    /// The guest's port.
    pub remote: u16,
}

impl Mapping {
    /// As kubectl port-forward reads its ports: `LOCAL:REMOTE`, `:REMOTE` (or
    /// `0:REMOTE`) for a free local port, `PORT` for the same port on both sides.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (local, remote) = match text.split_once(':') {
            Some(("", remote)) => (0, port(remote)?),
            Some((local, remote)) => (port(local)?, port(remote)?),
            None => {
                let port = port(text)?;
                (port, port)
            }
        };
        if remote == 0 {
            return Err(
                "the guest's port cannot be 0; give one from 1 to 65535, as in 8080:80 (:80 \
                 picks a free local port)"
                    .to_owned(),
            );
        }
        Ok(Self { local, remote })
    }
}

fn port(text: &str) -> Result<u16, String> {
    text.parse().map_err(|_| {
        format!("{text:?} is not a port; ports are numbers from 1 to 65535, as in 8080:80")
    })
}

/// An address to listen on: an IP address, or `localhost` for 127.0.0.1.
fn address(text: &str) -> Result<IpAddr, String> {
    if text == "localhost" {
        return Ok(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    text.parse().map_err(|_| {
        format!(
            "{text:?} is not an IP address; give one as 127.0.0.1, ::1 or 0.0.0.0, or localhost"
        )
    })
}

/// One side of `cp`.
#[derive(Debug, PartialEq, Eq)]
pub enum Location<'a> {
    /// A path on this machine.
    Local(&'a str),
    /// A path in the guest of a claim.
    Guest { claim: &'a str, path: &'a str },
}

impl<'a> Location<'a> {
    /// As kubectl cp reads its arguments: `CLAIM:PATH` names a claim when what is before
    /// the colon is a claim's name (no `/` but for `microvmclaim/`), so `./a:b` is local.
    /// `CLAIM:` alone is the guest's `/`.
    pub fn parse(arg: &'a str) -> Self {
        match arg.split_once(':') {
            Some((claim, path)) if !claim.is_empty() && !claim_name(claim).contains('/') => {
                Self::Guest {
                    claim: claim_name(claim),
                    path: if path.is_empty() { "/" } else { path },
                }
            }
            _ => Self::Local(arg),
        }
    }
}

/// `-o`, as kubectl's.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Output {
    /// `microvmclaim/NAME`.
    Name,
    Yaml,
    Json,
}

fn key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

/// A claim argument as kubectl takes names: `NAME`, or `microvmclaim/NAME` as `-o name`
/// prints it.
pub fn claim_name(arg: &str) -> &str {
    without_kind(arg, ["microvmclaim/", "microvmclaims/", "mvc/"])
}

/// `arg` without the first of `prefixes` it starts with.
fn without_kind<'a>(arg: &'a str, prefixes: [&str; 3]) -> &'a str {
    prefixes
        .iter()
        .find_map(|prefix| arg.strip_prefix(prefix))
        .unwrap_or(arg)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn exec_takes_the_command_after_the_double_dash() {
        let cli = Cli::try_parse_from([
            "kubectl-microvm",
            "exec",
            "c",
            "-i",
            "-e",
            "A=1",
            "-n",
            "ci",
            "--",
            "sh",
            "-c",
            "exit 7",
        ])
        .unwrap();
        let Command::Exec(exec) = cli.command else {
            panic!("{:?}", cli.command)
        };
        assert_eq!(exec.claim, "c");
        assert!(exec.command.stdin);
        assert_eq!(exec.command.env, [("A".to_owned(), "1".to_owned())]);
        assert_eq!(exec.command.command, ["sh", "-c", "exit 7"]);
        assert_eq!(cli.cluster.namespace.as_deref(), Some("ci"));
        // A command is required, and an env must be NAME=VALUE.
        assert!(Cli::try_parse_from(["kubectl-microvm", "exec", "c"]).is_err());
        assert!(
            Cli::try_parse_from(["kubectl-microvm", "exec", "c", "-e", "=x", "--", "true"])
                .is_err()
        );
    }

    fn exec_of(args: &[&str]) -> ExecArgs {
        let cli = Cli::try_parse_from(["kubectl-microvm"].iter().chain(args)).unwrap();
        match cli.command {
            Command::Exec(exec) => exec,
            Command::Shell(shell) => shell.into_exec(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn exec_takes_i_and_t_as_kubectl_does() {
        for flags in [&["-it"][..], &["-ti"], &["-i", "-t"], &["--stdin", "--tty"]] {
            let args: Vec<&str> = ["exec", "c"]
                .iter()
                .chain(flags)
                .chain(&["--", "vi"])
                .copied()
                .collect();
            let exec = exec_of(&args);
            assert!(exec.command.stdin && exec.command.tty, "{flags:?}");
            assert_eq!(exec.command.command, ["vi"]);
        }
        // Before the claim too, as kubectl takes them.
        assert!(exec_of(&["exec", "-it", "c", "--", "vi"]).command.tty);
        let plain = exec_of(&["exec", "c", "--", "true"]);
        assert!(!plain.command.stdin && !plain.command.tty);
        let run =
            Cli::try_parse_from(["kubectl-microvm", "run", "-it", "dev", "--", "sh"]).unwrap();
        let Command::Run(run) = run.command else {
            panic!("{:?}", run.command)
        };
        assert!(run.command.stdin && run.command.tty);
    }

    #[test]
    fn shell_is_exec_it_with_the_login_shell() {
        let shell = exec_of(&["shell", "microvmclaim/c", "-n", "ci"]);
        assert_eq!(shell.claim, "microvmclaim/c");
        assert!(shell.command.stdin && shell.command.tty);
        assert_eq!(
            shell.command.command,
            ["/bin/sh", "-c", r#"exec "${SHELL:-/bin/sh}" -l"#]
        );
        // No command of its own.
        assert!(Cli::try_parse_from(["kubectl-microvm", "shell", "c", "--", "sh"]).is_err());
        assert!(Cli::try_parse_from(["kubectl-microvm", "shell"]).is_err());
    }

    #[test]
    fn cp_reads_its_arguments_as_kubectl_cp() {
        let guest = |claim, path| Location::Guest { claim, path };
        assert_eq!(Location::parse("dev-x2:/work"), guest("dev-x2", "/work"));
        assert_eq!(
            Location::parse("microvmclaim/dev-x2:/work/out.tar"),
            guest("dev-x2", "/work/out.tar")
        );
        assert_eq!(Location::parse("dev-x2:"), guest("dev-x2", "/"));
        assert_eq!(Location::parse("./dir"), Location::Local("./dir"));
        assert_eq!(Location::parse("./a:b"), Location::Local("./a:b"));
        assert_eq!(Location::parse(":x"), Location::Local(":x"));
        let cli = Cli::try_parse_from([
            "kubectl-microvm",
            "cp",
            "./dir",
            "c:/work",
            "-n",
            "ci",
            "--kubeconfig",
            "k",
        ])
        .unwrap();
        let Command::Cp(cp) = cli.command else {
            panic!("{:?}", cli.command)
        };
        assert_eq!((cp.src.as_str(), cp.dst.as_str()), ("./dir", "c:/work"));
        assert_eq!(cli.cluster.namespace.as_deref(), Some("ci"));
        assert!(Cli::try_parse_from(["kubectl-microvm", "cp", "./dir"]).is_err());
    }

    fn port_forward_of(args: &[&str]) -> Result<PortForwardArgs, clap::Error> {
        let cli = Cli::try_parse_from(["kubectl-microvm", "port-forward"].iter().chain(args))?;
        match cli.command {
            Command::PortForward(args) => Ok(args),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ports_are_mapped_as_kubectl_port_forward_maps_them() {
        let mapping = |local, remote| Mapping { local, remote };
        assert_eq!(Mapping::parse("8080:80"), Ok(mapping(8080, 80)));
        assert_eq!(Mapping::parse(":80"), Ok(mapping(0, 80)));
        assert_eq!(Mapping::parse("0:80"), Ok(mapping(0, 80)));
        assert_eq!(Mapping::parse("5432"), Ok(mapping(5432, 5432)));
        assert_eq!(Mapping::parse("65535:1"), Ok(mapping(65535, 1)));
        for bad in [
            "http",
            "80x",
            "8080:",
            ":",
            "",
            "-1",
            "65536",
            "8080:65536",
            "1:2:3",
        ] {
            let error = Mapping::parse(bad).unwrap_err();
            assert!(error.contains("is not a port"), "{bad}: {error}");
            assert!(
                error.contains("8080:80") && !error.contains('\n'),
                "{bad}: {error}"
            );
        }
        for zero in ["0", "8080:0", ":0"] {
            let error = Mapping::parse(zero).unwrap_err();
            assert!(error.contains("cannot be 0"), "{zero}: {error}");
        }
    }

    #[test]
    fn port_forward_takes_mappings_and_addresses() {
        let args = port_forward_of(&["microvmclaim/c", "8080:80", ":22", "-n", "ci"]).unwrap();
        assert_eq!(claim_name(&args.claim), "c");
        assert_eq!(
            args.ports,
            [
                Mapping {
                    local: 8080,
                    remote: 80
                },
                Mapping {
                    local: 0,
                    remote: 22
                }
            ]
        );
        assert_eq!(args.addresses, [IpAddr::V4(Ipv4Addr::LOCALHOST)]);
        let args = port_forward_of(&["c", "80", "--address", "localhost,::1,0.0.0.0"]).unwrap();
        let addresses: Vec<String> = args.addresses.iter().map(ToString::to_string).collect();
        assert_eq!(addresses, ["127.0.0.1", "::1", "0.0.0.0"]);
        // A port is required, and each must be one; an address must be an address.
        assert!(port_forward_of(&["c"]).is_err());
        let bad = port_forward_of(&["c", "80", "8080:0"]).unwrap_err();
        assert_eq!(bad.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(port_forward_of(&["c", "80", "--address", "example.com"]).is_err());
    }

    #[test]
    fn claim_and_run_ask_for_a_service_account_token() {
        let request = |args: &[&str]| {
            let cli = Cli::try_parse_from(["kubectl-microvm"].iter().chain(args)).unwrap();
            match cli.command {
                Command::Claim(claim) => claim.request,
                Command::Run(run) => run.request,
                other => panic!("{other:?}"),
            }
        };
        let plain = request(&["claim", "dev"]);
        assert!(!plain.service_account_token);
        assert_eq!((plain.token_audience, plain.token_expiration), (None, None));
        assert!(request(&["claim", "dev", "--service-account-token"]).service_account_token);
        let given = request(&[
            "run",
            "dev",
            "--token-audience",
            "sts.amazonaws.com",
            "--token-expiration",
            "1h",
            "--",
            "true",
        ]);
        assert_eq!(given.token_audience.as_deref(), Some("sts.amazonaws.com"));
        assert_eq!(given.token_expiration, Some(Duration::from_secs(3600)));
        assert!(
            Cli::try_parse_from([
                "kubectl-microvm",
                "claim",
                "dev",
                "--token-expiration",
                "soon"
            ])
            .is_err()
        );
    }

    #[test]
    fn claims_are_named_as_kubectl_names_them() {
        assert_eq!(claim_name("microvmclaim/dev-x2"), "dev-x2");
        assert_eq!(claim_name("dev-x2"), "dev-x2");
    }
}
