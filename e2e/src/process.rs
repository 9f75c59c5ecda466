//! [`Process`]: one of our binaries started for a test, killed when dropped, whose
//! stdout announcements (the lines a binary prints when it is ready, such as
//! `…: serving https://127.0.0.1:PORT`) a test can wait for, and whose log (stderr, in a
//! file) a failing test prints.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

/// How long a binary may take to announce something: a debug build on a loaded 2-core CI
/// machine.
pub const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of a log a failing test prints.
const LOG_TAIL_LINES: usize = 60;

/// A running binary, killed when dropped.
pub struct Process {
    /// Held so that dropping the process kills it (`kill_on_drop`).
    child: Child,
    /// Its `TMPDIR`, removed once it is killed: a killed process cleans up nothing
    /// itself (`dev` keeps its simulated Hosts' state there).
    _tmp: tempfile::TempDir,
    name: String,
    log: PathBuf,
    /// Every line it printed on stdout, in order.
    lines: Arc<Mutex<Vec<String>>>,
    printed: watch::Receiver<usize>,
}

impl Process {
    /// Spawns `command` (stdout piped and collected, stderr to `log`, no stdin) and
    /// waits for a stdout line starting with `prefix`; returns the process and the rest
    /// of that line. Panics with the log if it exits first or takes too long.
    pub async fn start(command: Command, log: &Path, prefix: &str) -> (Self, String) {
        let process = Self::spawn(command, log);
        let rest = process.announced(prefix).await;
        (process, rest)
    }

    /// Spawns `command` like [`Self::start`], for a program that announces nothing on
    /// stdout (etcd, kube-apiserver): the caller waits for it its own way.
    pub fn spawn(mut command: Command, log: &Path) -> Self {
        let name = command
            .as_std()
            .get_program()
            .to_string_lossy()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned();
        let file =
            std::fs::File::create(log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
        let tmp = tempfile::Builder::new()
            .prefix(&format!("{name}-tmp-"))
            .tempdir()
            .unwrap_or_else(|e| panic!("a TMPDIR for {name}: {e}"));
        let mut child = command
            .env("TMPDIR", tmp.path())
            // The log is read by people when a test fails; colour codes only get in the way.
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (count, printed) = watch::channel(0);
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
        let collected = lines.clone();
        // Keeps reading, so that a later line never meets a closed pipe.
        tokio::spawn(async move {
            while let Ok(Some(line)) = stdout.next_line().await {
                let mut all = collected.lock().unwrap_or_else(|e| e.into_inner());
                all.push(line);
                count.send_replace(all.len());
            }
        });
        Self {
            child,
            _tmp: tmp,
            name,
            log: log.to_owned(),
            lines,
            printed,
        }
    }

    /// Panics with its log if it has exited: for a caller polling a program that
    /// announces nothing.
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "{} exited ({status}); its log:\n{}",
                self.name,
                self.log_tail()
            );
        }
    }

    /// The rest of the first stdout line that starts with `prefix`,
    /// waiting for it. Panics with the log if the process exits first or takes too long.
    async fn announced(&self, prefix: &str) -> String {
        let mut printed = self.printed.clone();
        let found = tokio::time::timeout(ANNOUNCE_TIMEOUT, async {
            loop {
                if let Some(rest) = self
                    .lines
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .iter()
                    .find_map(|line| line.strip_prefix(prefix))
                {
                    return Some(rest.trim().to_owned());
                }
                if printed.changed().await.is_err() {
                    return None;
                }
            }
        })
        .await;
        match found {
            Ok(Some(rest)) => rest,
            Ok(None) => panic!(
                "{} exited before printing {prefix:?}; its log:\n{}",
                self.name,
                self.log_tail()
            ),
            Err(_) => panic!(
                "{} did not print {prefix:?} within {ANNOUNCE_TIMEOUT:?}; its log:\n{}",
                self.name,
                self.log_tail()
            ),
        }
    }

    /// Kills it (SIGKILL, as a crash would end it) and waits until it is gone, so that
    /// its port is free again.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }

    /// Its process id, to signal it or read what /proc says of it.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the process is running")
    }

    /// The CPU time it and its children it has reaped have used so far: see [`cpu_time`].
    pub fn cpu_time(&self) -> Duration {
        cpu_time(self.pid()).unwrap_or_else(|e| panic!("read the CPU time of {}: {e}", self.name))
    }

    /// The most memory it has held at once so far (`VmHWM`, its peak resident set), in
    /// bytes.
    pub fn peak_rss_bytes(&self) -> u64 {
        let pid = self.pid();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_else(|e| panic!("read the status of {}: {e}", self.name));
        status_kb(&status, "VmHWM")
            .map(|kb| kb * 1024)
            .unwrap_or_else(|| panic!("no VmHWM in the status of {}", self.name))
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
    }
}

/// The field `name` (such as `VmRSS`) of a `/proc/PID/status`, in kB.
pub fn status_kb(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The CPU time (user and system) the process `pid` and the children it has reaped have
/// used so far, from `/proc/PID/stat`: what a benchmark charges to a process, including
/// the commands it ran.
pub fn cpu_time(pid: u32) -> std::io::Result<Duration> {
    /// The unit of `/proc`'s times: `USER_HZ`, part of Linux's ABI, 100 on the
    /// architectures we run on.
    const TICKS_PER_SECOND: u64 = 100;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields follow the command's name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // utime, stime, cutime and cstime: fields 14 to 17, of which the first after the
    // name is field 3.
    let ticks = fields
        .get(11..15)
        .and_then(|times| {
            times
                .iter()
                .map(|t| t.parse::<u64>().ok())
                .sum::<Option<u64>>()
        })
        .ok_or_else(|| std::io::Error::other(format!("/proc/{pid}/stat does not read: {stat}")))?;
    Ok(Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND))
}

impl Drop for Process {
    fn drop(&mut self) {
        // The log may go with a temporary directory: show it while it is still there.
        if std::thread::panicking() {
            eprintln!(
                "--- the last lines of the log of {} ---\n{}",
                self.name,
                self.log_tail()
            );
        }
    }
}
