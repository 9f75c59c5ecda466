//! Whether `dev`'s terminals work on this machine. A terminal (`exec -it`, `shell`) is an
//! SSH session, and a simulated Host serves one by running OpenSSH's sshd (ADR 33); a
//! fresh machine may not have it. `dev` starts anyway, and says at start, in one line with
//! the command that installs it, that terminals are off and why. The Hosts look for sshd
//! again at each session, so once it is installed they work without a restart.
//!
//! `dev` does not install it itself: Debian's openssh-server also starts the machine's
//! own sshd on port 22, which is no choice for a development command to make.

use std::path::{Path, PathBuf};

/// The line that says terminals are off, or `None` when the sshd `asked` for (`--sshd`)
/// or, without one, the sshd `found` is there. `root` picks the command to run.
pub fn off(asked: Option<&Path>, found: Option<PathBuf>, root: bool) -> Option<String> {
    let install = if root {
        "apt-get install -y openssh-server"
    } else {
        "sudo apt-get install -y openssh-server"
    };
    let (why, fix) = match asked {
        Some(sshd) if sshd.is_file() => return None,
        Some(sshd) => (
            format!("--sshd {} is not there", sshd.display()),
            "point --sshd at OpenSSH's sshd, or leave it out and run: ",
        ),
        None if found.is_some() => return None,
        None => (
            "the simulated Hosts run OpenSSH's sshd for them and there is none in PATH or /usr/sbin"
                .to_owned(),
            "run: ",
        ),
    };
    Some(format!(
        "  terminals (exec -it, shell): off: {why}; to turn them on, {fix}{install}"
    ))
}

/// Whether this process runs as root (effective uid 0), from `/proc/self/status`; false
/// where that cannot be read.
pub fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_sshd_is_one_line_with_the_command_that_installs_it() {
        assert_eq!(
            off(None, None, true).as_deref(),
            Some(
                "  terminals (exec -it, shell): off: the simulated Hosts run OpenSSH's sshd for \
                 them and there is none in PATH or /usr/sbin; to turn them on, run: apt-get \
                 install -y openssh-server"
            )
        );
        let line = off(None, None, false).expect("a line");
        assert!(
            line.ends_with("run: sudo apt-get install -y openssh-server"),
            "{line}"
        );
        assert!(!line.contains('\n'));
    }

    #[test]
    fn an_sshd_found_or_given_says_nothing() {
        let dir = tempfile::tempdir().expect("temp dir");
        let sshd = dir.path().join("sshd");
        std::fs::write(&sshd, "").expect("sshd");
        assert_eq!(off(None, Some(sshd.clone()), true), None);
        assert_eq!(off(Some(&sshd), None, true), None);
        let missing = dir.path().join("nowhere/sshd");
        let line = off(Some(&missing), Some(sshd), true).expect("a line");
        assert!(
            line.contains(&format!("--sshd {} is not there", missing.display())),
            "{line}"
        );
        assert!(
            line.ends_with(
                "point --sshd at OpenSSH's sshd, or leave it out and run: apt-get install -y \
                 openssh-server"
            ),
            "{line}"
        );
    }

    #[test]
    fn root_is_read_from_the_process_status() {
        let status = std::fs::read_to_string("/proc/self/status").expect("status");
        let euid = status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1).map(str::to_owned))
            .expect("Uid line");
        assert_eq!(running_as_root(), euid == "0");
    }
}
