//! The harness of the kubectl suite (`tests/kubectl/`): the real `battery-apiserver`
//! binary driven by the real kubectl.
//!
//! - [`ApiServer`]: one `battery-apiserver dev` (loopback, a free port, the embedded
//!   battery with the Pool `default/dev`, self-made certificates) in its own temporary
//!   directory, killed when dropped. Every test starts its own, so tests never see each
//!   other's objects.
//! - [`Kubectl`]: one installed kubectl release pointed at that server, with a private
//!   `HOME` and discovery cache. [`ApiServer::kubectls`] gives one per release the suite
//!   covers, so a test runs the same steps with each.
//!
//! The binary is the one in the target directory; it is built (once) only when missing,
//! so after changing the server run `cargo build -p battery-apiserver` before the suite.

mod kubectl;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{Semaphore, SemaphorePermit};

pub use kubectl::{Background, Invocation, Kubectl, Output, Stream};

/// The binary under test, as cargo names it.
const BINARY: &str = "battery-apiserver";
/// What `battery-apiserver dev` prints once it accepts connections, before the URL.
const SERVING_PREFIX: &str = "battery-apiserver dev: serving ";
/// How long a server may take to start: a debug build on a loaded 2-core CI machine.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How many servers run at once. Each test keeps one busy with a stream of kubectl
/// processes, so more than this only makes every test slower on a 2-core CI machine.
const MAX_SERVERS: usize = 2;
/// How much of the server's log a failing test prints.
const LOG_TAIL_LINES: usize = 60;

static SERVERS: Semaphore = Semaphore::const_new(MAX_SERVERS);

/// A running `battery-apiserver dev`, killed when dropped.
pub struct ApiServer {
    /// Held only so that dropping the server kills it (`kill_on_drop`).
    _child: Child,
    url: String,
    dir: TempDir,
    _slot: SemaphorePermit<'static>,
}

impl ApiServer {
    /// Starts a server and waits until it serves. Panics with the server's log if it
    /// exits or does not announce itself within [`START_TIMEOUT`].
    pub async fn start() -> Self {
        let slot = SERVERS
            .acquire()
            .await
            .expect("the server semaphore is never closed");
        let dir = tempfile::Builder::new()
            .prefix("battery-apiserver-e2e-")
            .tempdir()
            .expect("create the server's temporary directory");
        let log = File::create(dir.path().join("server.log")).expect("create the server log");
        let mut child = Command::new(binary())
            .args(["dev", "--listen", "127.0.0.1:0", "--dir"])
            .arg(dir.path().join("dev"))
            // The log is read by people when a test fails; colour codes only get in the way.
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary().display()));

        let mut lines = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
        let announced = tokio::time::timeout(START_TIMEOUT, async {
            while let Some(line) = lines.next_line().await.expect("read the server's stdout") {
                if let Some(url) = line.strip_prefix(SERVING_PREFIX) {
                    return Some(url.trim().to_owned());
                }
            }
            None
        })
        .await;
        let url = match announced {
            Ok(Some(url)) => url,
            Ok(None) => panic!(
                "battery-apiserver dev exited before serving; its log:\n{}",
                log_tail(dir.path())
            ),
            Err(_) => panic!(
                "battery-apiserver dev did not serve within {START_TIMEOUT:?}; its log:\n{}",
                log_tail(dir.path())
            ),
        };
        // Keep reading stdout so that a later line never meets a closed pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

        let server = Self {
            _child: child,
            url,
            dir,
            _slot: slot,
        };
        assert!(
            server.kubeconfig().is_file(),
            "battery-apiserver dev serves {} but wrote no {}",
            server.url,
            server.kubeconfig().display()
        );
        server
    }

    /// One [`Kubectl`] per kubectl release the suite covers, oldest first, each with its
    /// own discovery cache so that one release never reads what the other wrote. Each
    /// says which release it is on the test's output when it is taken, so that a
    /// failure's output names the release it happened with.
    pub fn kubectls(&self) -> impl Iterator<Item = Kubectl> + '_ {
        kubectl::releases().iter().map(|release| {
            let kubectl = Kubectl::new(
                release,
                self.kubeconfig(),
                self.dir.path().join(format!("kubectl-{}", release.tag())),
            );
            eprintln!("--- with {kubectl}");
            kubectl
        })
    }

    /// A scratch directory for files a test hands to kubectl (manifests, editor scripts).
    pub fn scratch(&self) -> &Path {
        self.dir.path()
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("dev").join("kubeconfig")
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        // The log goes with the temporary directory: show it while it is still there.
        if std::thread::panicking() {
            eprintln!(
                "--- the last lines of the log of battery-apiserver at {} ---\n{}",
                self.url,
                log_tail(self.dir.path())
            );
        }
    }
}

fn log_tail(dir: &Path) -> String {
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

/// The `battery-apiserver` binary of this build: it sits beside the test binary's
/// `deps/` directory (`target/<profile>/`), wherever the target directory is. Built with
/// cargo, once, when it is missing.
fn binary() -> &'static Path {
    static BINARY_PATH: OnceLock<PathBuf> = OnceLock::new();
    BINARY_PATH.get_or_init(|| {
        let test_binary = std::env::current_exe().expect("the test binary's path");
        let profile_dir = test_binary
            .parent()
            .and_then(Path::parent)
            .expect("the test binary lives in target/<profile>/deps");
        let path = profile_dir.join(BINARY);
        if !path.is_file() {
            build(profile_dir);
        }
        assert!(
            path.is_file(),
            "cargo built {BINARY} but {} is missing",
            path.display()
        );
        path
    })
}

fn build(profile_dir: &Path) {
    // cargo's directory for the `dev` profile is `debug`; every other profile's is its name.
    let profile = match profile_dir.file_name().and_then(|name| name.to_str()) {
        Some("debug") | None => "dev",
        Some(other) => other,
    };
    eprintln!("{BINARY} is not built: running cargo build -p {BINARY} --profile {profile}");
    let status = std::process::Command::new(env!("CARGO"))
        .args(["build", "-p", BINARY, "--profile", profile])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo");
    assert!(status.success(), "cargo build -p {BINARY} failed");
}
