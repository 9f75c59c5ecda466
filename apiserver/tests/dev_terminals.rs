//! `dev` on a machine without OpenSSH's sshd (issue 40 item 7): it still serves, and says
//! at start, in one line with the command that installs it, that terminals are off and
//! why; with sshd, it says nothing of the kind.

mod dev_process;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The start of the line that says terminals are off.
const TERMINALS_OFF: &str = "  terminals (exec -it, shell): off: ";

/// Starts `dev` with `args` in a temporary directory, reads what it prints up to its
/// `next:` line, stops it, and returns those lines.
fn dev_start_lines(args: &[&str]) -> Vec<String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_battery-apiserver"))
        .args([
            "dev",
            "--listen",
            "127.0.0.1:0",
            "--hosts",
            "1",
            "--pool-size",
            "0",
        ])
        .arg("--dir")
        .arg(dir.path().join("dev"))
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("BATTERY_APISERVER_SSHD")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn battery-apiserver dev");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        let read = stdout.read_line(&mut line).expect("read dev's stdout");
        if read == 0 {
            let status = child.wait().expect("dev's exit");
            panic!("dev exited ({status}) before its next: line; it printed {lines:#?}");
        }
        let line = line.trim_end().to_owned();
        let next = line.starts_with("next:");
        lines.push(line);
        if next {
            break;
        }
    }
    drop(stdout);
    dev_process::terminate(&mut child, Duration::from_secs(20));
    lines
}

#[test]
fn issue_40_dev_without_sshd_says_terminals_are_off_and_what_to_run() {
    let missing = "/nonexistent/battery-test/sshd";
    let lines = dev_start_lines(&["--sshd", missing]);
    let off: Vec<&String> = lines
        .iter()
        .filter(|line| line.starts_with(TERMINALS_OFF))
        .collect();
    assert_eq!(off.len(), 1, "one line says terminals are off: {lines:#?}");
    let line = off[0];
    assert!(
        line.contains(&format!("--sshd {missing} is not there")),
        "it says why: {line}"
    );
    assert!(
        line.ends_with("apt-get install -y openssh-server"),
        "it ends with the command to run: {line}"
    );
    // Said before the next command to type, which stays the last line.
    assert!(lines.last().expect("lines").starts_with("next: kubectl"));
}

#[test]
fn issue_40_dev_with_sshd_says_nothing_of_terminals() {
    let Some(sshd) = battery_embedded::simhost::find_sshd() else {
        eprintln!("no sshd in PATH or /usr/sbin on this machine: nothing to check");
        return;
    };
    for args in [
        vec![],
        vec!["--sshd".to_owned(), sshd.display().to_string()],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let lines = dev_start_lines(&args);
        assert!(
            !lines.iter().any(|line| line.starts_with(TERMINALS_OFF)),
            "with {args:?}: {lines:#?}"
        );
    }
}

#[test]
fn issue_40_dev_refuses_an_sshd_that_is_no_absolute_path() {
    let output = Command::new(env!("CARGO_BIN_EXE_battery-apiserver"))
        .args(["dev", "--sshd", "sbin/sshd"])
        .env_remove("BATTERY_APISERVER_SSHD")
        .output()
        .expect("run battery-apiserver dev");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("sbin/sshd is not an absolute path (try /usr/sbin/sshd)"),
        "{stderr}"
    );
}
