//! `kubectl microvm shell` and `exec -it` on a real terminal (tmux), on `dev` and through a
//! real kube-apiserver, its aggregator, `serve`, the agent and a real sshd behind the
//! simulated Host's SSH proxy (ADR 33): typing, the terminal's size before and after a
//! resize, Ctrl-C, and the shell's exit code as the plugin's. Every wait polls the screen
//! until what it waits for is on it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::{hold, kubectl, path_with_plugin};
use battery_e2e::apiserver::{ApiServer, Route};

/// How long the screen may take to show what a step waits for, on a loaded machine.
const SCREEN_TIMEOUT: Duration = Duration::from_secs(60);

/// A tmux server of the test's own, with one window running one command.
struct Tmux {
    socket: PathBuf,
    /// Where the command's exit status is written once it exits: by a shell around it,
    /// which waits for it, so the status does not depend on tmux reaping it.
    status: PathBuf,
}

impl Tmux {
    /// Runs `argv` in a `cols`x`rows` window, which stays once it exits.
    fn start(dir: &Path, argv: &[OsString], (cols, rows): (u16, u16)) -> Self {
        let tmux = Self {
            socket: dir.join("tmux.sock"),
            status: dir.join("tmux.status"),
        };
        let mut args: Vec<OsString> = ["new-session", "-d", "-s", "t", "-x"]
            .map(OsString::from)
            .into();
        args.extend([
            cols.to_string().into(),
            "-y".into(),
            rows.to_string().into(),
        ]);
        // The command starts only once remain-on-exit is set, so its last screen stays.
        args.extend([";", "set-option", "-g", "remain-on-exit", "on", ";"].map(OsString::from));
        args.extend(["respawn-pane", "-k", "-t", "t", "sh", "-c"].map(OsString::from));
        args.push(r#""$@"; echo $? >"$0""#.into());
        args.push(tmux.status.clone().into());
        args.extend(argv.iter().cloned());
        tmux.run(&args);
        tmux
    }

    fn run(&self, args: &[OsString]) -> String {
        let output = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux runs (scripts/install-test-tools installs it)");
        assert!(
            output.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn tmux(&self, args: &[&str]) -> String {
        self.run(&args.iter().map(OsString::from).collect::<Vec<_>>())
    }

    /// Types `text`, then Enter.
    fn type_line(&self, text: &str) {
        self.tmux(&["send-keys", "-t", "t", "-l", text]);
        self.tmux(&["send-keys", "-t", "t", "Enter"]);
    }

    fn screen(&self) -> String {
        // Lines the terminal wrapped are joined, so what is looked for is found whole.
        self.tmux(&["capture-pane", "-p", "-J", "-t", "t"])
    }

    /// Waits until the screen shows `text`; returns the screen.
    async fn wait_for(&self, text: &str) -> String {
        battery_e2e::eventually(
            SCREEN_TIMEOUT,
            &format!("{text:?} on the screen"),
            async || {
                let screen = self.screen();
                if screen.contains(text) {
                    Ok(screen)
                } else {
                    Err(screen)
                }
            },
        )
        .await
    }

    /// Waits until the window's command exits; returns its exit status.
    async fn exit_status(&self) -> i32 {
        battery_e2e::eventually(SCREEN_TIMEOUT, "the plugin to exit", async || {
            match std::fs::read_to_string(&self.status) {
                Ok(status) => status
                    .trim()
                    .parse()
                    .map_err(|_| format!("not a status: {status:?}")),
                Err(_) => Err(format!("still running:\n{}", self.screen())),
            }
        })
        .await
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
    }
}

#[tokio::test]
async fn a_shell_through_kube_apiserver_types_resizes_takes_ctrl_c_and_exits_with_its_code() {
    let server = ApiServer::aggregated_with_agents().await;
    let kubectl = kubectl(&server);
    a_shell_types_resizes_takes_ctrl_c_and_exits_with_its_code(&server, &kubectl).await;
    no_ssh_secret_anywhere(&server, &kubectl).await;
}

/// The same on `dev`, whose agents run in its process and whose SSH CA never leaves its
/// memory.
#[tokio::test]
async fn a_shell_on_dev_types_resizes_takes_ctrl_c_and_exits_with_its_code() {
    let server = ApiServer::start(Route::Direct).await;
    a_shell_types_resizes_takes_ctrl_c_and_exits_with_its_code(&server, &kubectl(&server)).await;
}

async fn a_shell_types_resizes_takes_ctrl_c_and_exits_with_its_code(
    server: &ApiServer,
    kubectl: &battery_e2e::apiserver::Kubectl,
) {
    let _held = hold(kubectl, "c").await;
    let shell = kubectl
        .cmd(&["microvm", "shell", "c"])
        .env("PATH", path_with_plugin())
        .env("TERM", "xterm-256color")
        .env_argv();
    let tmux = Tmux::start(server.scratch(), &shell, (100, 30));

    // Arithmetic the shell does, so the typed line itself never matches.
    tmux.type_line("echo typed-$((40 + 2)); stty size");
    let screen = tmux.wait_for("typed-42").await;
    tmux.wait_for("30 100").await;
    assert!(!screen.contains("warning"), "{screen}");

    tmux.tmux(&["resize-window", "-t", "t", "-x", "120", "-y", "40"]);
    tmux.type_line("clear; stty size");
    tmux.wait_for("40 120").await;

    tmux.type_line("sleep 100; echo slept-$((1 + 1))");
    tmux.wait_for("sleep 100").await;
    tmux.tmux(&["send-keys", "-t", "t", "C-c"]);
    tmux.type_line("echo interrupted-$((2 + 2))");
    let screen = tmux.wait_for("interrupted-4").await;
    assert!(
        !screen.contains("slept-2"),
        "Ctrl-C did not end sleep:\n{screen}"
    );

    tmux.type_line("exit 4");
    assert_eq!(tmux.exit_status().await, 4, "{}", tmux.screen());
}

/// Nothing of the SSH CA's private key, and no private key at all, is in any process's
/// log of the run (kube-apiserver's, etcd's, the battery's, `serve`'s, the agents'), in
/// any Host or in any Event.
async fn no_ssh_secret_anywhere(server: &ApiServer, kubectl: &battery_e2e::apiserver::Kubectl) {
    let key = std::fs::read_to_string(server.scratch().join("agents/relay/ssh-user-ca"))
        .expect("the e2e SSH CA's key");
    let secrets: Vec<&str> = key
        .lines()
        .filter(|line| !line.starts_with("-----") && line.len() > 16)
        .collect();
    assert!(!secrets.is_empty(), "{key}");
    let mut texts = vec![(
        "Hosts and Events".to_owned(),
        kubectl
            .ok(&["get", "hosts,events", "--all-namespaces", "-o", "json"])
            .await,
    )];
    for log in logs(server.scratch()) {
        let text = String::from_utf8_lossy(&std::fs::read(&log).expect("a log")).into_owned();
        texts.push((log.display().to_string(), text));
    }
    assert!(
        texts.len() > 3,
        "no logs found under {}",
        server.scratch().display()
    );
    for (what, text) in texts {
        assert!(!text.contains("PRIVATE KEY"), "a private key in {what}");
        for secret in &secrets {
            assert!(!text.contains(secret), "the SSH CA's key in {what}");
        }
    }
}

/// Every `*.log` under `dir`.
fn logs(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a directory").flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(logs(&path));
        } else if path.extension().is_some_and(|e| e == "log") {
            found.push(path);
        }
    }
    found
}

#[tokio::test]
async fn exec_it_runs_a_command_on_a_terminal_and_exits_with_its_code() {
    let server = ApiServer::aggregated_with_agents().await;
    let kubectl = kubectl(&server);
    let _held = hold(&kubectl, "c").await;
    let exec = kubectl
        .cmd(&[
            "microvm",
            "exec",
            "-it",
            "c",
            "--",
            "sh",
            "-c",
            "test -t 0 && test -t 1 && echo on-a-terminal; read line; exit \"$line\"",
        ])
        .env("PATH", path_with_plugin())
        .env_argv();
    let tmux = Tmux::start(server.scratch(), &exec, (80, 24));
    tmux.wait_for("on-a-terminal").await;
    tmux.type_line("3");
    assert_eq!(tmux.exit_status().await, 3, "{}", tmux.screen());
}
