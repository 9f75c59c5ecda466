//! Hook commands that block until the test lets them go. They watch a file in this
//! process's temp directory, so they only work where the hooks run on this machine:
//! the embedded battery's simulated Hosts.

use std::path::PathBuf;

use tempfile::TempDir;

/// A file-based latch for create or pre-lease commands.
pub struct Gate {
    _dir: TempDir,
    file: PathBuf,
}

impl Gate {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("battery-e2e-gate-")
            .tempdir()
            .expect("create gate directory");
        let file = dir.path().join("open");
        Self { _dir: dir, file }
    }

    /// A shell command that returns once the gate is open.
    pub fn wait_command(&self) -> String {
        format!(
            "while [ ! -e '{}' ]; do sleep 0.01; done",
            self.file.display()
        )
    }

    /// A shell command that waits for the gate only the first time any VM runs it;
    /// every later run returns at once.
    pub fn first_waits_command(&self) -> String {
        let first = self.file.with_file_name("first");
        format!(
            "if mkdir '{}' 2>/dev/null; then {}; fi",
            first.display(),
            self.wait_command()
        )
    }

    /// Opens the gate: every waiting (and future) command returns.
    pub fn open(&self) {
        std::fs::write(&self.file, b"open").expect("open gate");
    }
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}
