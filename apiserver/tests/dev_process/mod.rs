//! The real `battery-apiserver dev` process, as a person starts it: in a temporary
//! directory, on port 0, until it prints its `next:` line.

// Each test crate that includes this module uses a different part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long `dev` may take to start, and to stop after SIGTERM.
const DEADLINE: Duration = Duration::from_secs(60);

pub struct DevProcess {
    child: Child,
    /// `127.0.0.1:<port>`, from the serving line.
    pub address: String,
    /// The directory given as `--dir`: certificates and the kubeconfig.
    pub dir: PathBuf,
}

impl DevProcess {
    /// Starts `dev` in `dir` with `args` after the defaults, its stderr to `stderr`, and
    /// returns once it has printed its `next:` line. `RUST_LOG` and the log-format
    /// variable are removed so the defaults apply unless `env` sets them.
    pub fn start(dir: &Path, args: &[&str], env: &[(&str, &str)], stderr: Stdio) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_battery-apiserver"));
        command
            .args(["dev", "--listen", "127.0.0.1:0", "--dir"])
            .arg(dir)
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("BATTERY_APISERVER_LOG_FORMAT")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(stderr);
        let mut child = command.spawn().expect("spawn battery-apiserver dev");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut address = None;
        loop {
            let mut line = String::new();
            let read = stdout.read_line(&mut line).expect("read dev's stdout");
            assert!(read > 0, "dev exited before its next: line");
            if let Some(url) = line
                .trim()
                .strip_prefix("battery-apiserver dev: serving https://")
            {
                address = Some(url.to_owned());
            }
            if line.starts_with("next:") {
                break;
            }
        }
        // Keep reading what else it prints: a closed pipe would fail its next write.
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        Self {
            child,
            address: address.expect("a serving line before next:"),
            dir: dir.to_owned(),
        }
    }

    /// Sends SIGTERM, as Ctrl-C or the kubelet would, and waits for the exit.
    pub fn stop(mut self) -> ExitStatus {
        terminate(&mut self.child, DEADLINE)
    }
}

/// Sends SIGTERM to `child`, as Ctrl-C or the kubelet would, and waits up to `within`
/// for it to exit.
pub fn terminate(child: &mut Child, within: Duration) -> ExitStatus {
    let pid = child.id().to_string();
    let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(sent.success(), "kill -TERM {pid}");
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{pid} did not stop after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for DevProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
