//! What both directions of a copy share: the [`Files`] handle and the script command it
//! runs, the scripts' common parts and limits, and reading and checking what the guest
//! reports.

use std::io;
use std::sync::Arc;

use tokio::io::AsyncReadExt as _;

use crate::client::Client;
use crate::error::Error;
use crate::exec::{Command, OutputStream, Process};

/// The most read or written in one piece.
pub(super) const CHUNK: usize = 64 * 1024;
/// The most kept of a script's report or its stderr: a line or a few. The rest is read
/// and dropped, so a chatty guest never stalls.
pub(super) const REPORT_LIMIT: u64 = 64 * 1024;
/// The longest first line a download may start with.
pub(super) const HEADER_LIMIT: u64 = 128;
/// The line a script prints when the guest lacks a tool it needs.
pub(super) const MISSING: &str = "battery-transfer: missing ";
/// What a shell exits with when the command is not found.
pub(super) const NOT_FOUND_EXIT_CODE: i32 = 127;

/// Checks the guest has every tool named, before anything is written.
pub(super) const NEED: &str = r#"need() {
  for tool; do
    command -v "$tool" >/dev/null 2>&1 || { echo "battery-transfer: missing $tool" >&2; exit 127; }
  done
}
set -eu
"#;

/// A first line, then `$1`: a directory as `directory` and a tar stream of it; a file as
/// `file MODE SIZE`, its bytes, then its sha256 read again once it is sent.
pub(super) const DOWNLOAD: &str = r#"need cat sha256sum stat wc
if [ -d "$1" ]; then
  need tar
  echo directory
  cd -- "$1"
  exec tar -cf - .
fi
[ -e "$1" ] || { echo "$2: no such file or directory" >&2; exit 1; }
[ -f "$1" ] || { echo "$2 is neither a regular file nor a directory" >&2; exit 1; }
echo "file $(stat -L -c %a -- "$1") $(wc -c < "$1")"
cat -- "$1"
sha256sum < "$1"
"#;

/// Reports progress: bytes so far, and the total when it is known.
pub(super) type OnProgress = Arc<dyn Fn(u64, Option<u64>) + Send + Sync>;

/// What a copy moved, once the guest confirmed it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Transferred {
    /// The bytes sent: a file's content, or a directory's tar stream.
    pub bytes: u64,
    /// A file's sha256 (hex), as both ends computed it; `None` for a directory, which
    /// its tar stream's accounting verifies.
    pub sha256: Option<String>,
}

/// Files in the MicroVM of one claim, which this client's user holds: from
/// [`Client::files`](crate::Client::files), or through [`Claim::upload`](crate::Claim::upload) and the rest.
#[derive(Clone)]
pub struct Files {
    pub(super) client: Client,
    pub(super) claim: String,
    pub(super) pool: String,
}

impl Files {
    pub(super) fn command(&self, script: &str, args: Vec<String>) -> Command {
        let mut argv = vec!["sh".to_owned(), "-c".to_owned(), format!("{NEED}{script}")];
        argv.push("sh".to_owned());
        argv.extend(args);
        Command::new(
            self.client.clone(),
            self.claim.clone(),
            self.pool.clone(),
            argv,
        )
        .working_dir("/")
    }
}

/// All of `stream` up to [`REPORT_LIMIT`]; the rest is read and dropped.
pub(super) async fn read_limited(stream: Option<OutputStream>) -> Result<Vec<u8>, Error> {
    let mut kept = Vec::new();
    if let Some(mut stream) = stream {
        (&mut stream)
            .take(REPORT_LIMIT)
            .read_to_end(&mut kept)
            .await
            .map_err(Error::Output)?;
        tokio::io::copy(&mut stream, &mut tokio::io::sink())
            .await
            .map_err(Error::Output)?;
    }
    Ok(kept)
}

/// The command's exit: `Ok` for 0, else what the guest said on stderr.
pub(super) async fn exited(process: Process, path: &str, stderr: &[u8]) -> Result<(), Error> {
    match process.wait().await? {
        0 => Ok(()),
        code => Err(guest_failure(path, code, stderr)),
    }
}

/// A failed script as an [`Error`]: a missing tool by name, else the guest's own words.
pub(super) fn guest_failure(path: &str, code: i32, stderr: &[u8]) -> Error {
    let text = String::from_utf8_lossy(stderr);
    let missing = text.lines().find_map(|line| line.strip_prefix(MISSING));
    if let Some(tool) = missing {
        return Error::GuestToolMissing {
            tool: tool.trim().to_owned(),
        };
    }
    let said: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if said.is_empty() && code == NOT_FOUND_EXIT_CODE {
        // Not even the shell the scripts run in.
        return Error::GuestToolMissing {
            tool: "sh".to_owned(),
        };
    }
    let message = match said.as_slice() {
        [] => format!("it exited with code {code}"),
        lines => format!("{} (exit code {code})", lines.join("; ")),
    };
    Error::GuestFailed {
        path: path.to_owned(),
        message,
    }
}

/// Checks the guest's `SIZE SHA256 ...` against what was sent or received.
pub(super) fn verify_report(
    path: &str,
    report: &str,
    bytes: u64,
    sha256: &str,
) -> Result<(), Error> {
    let unverified = |message: String| Error::Unverified {
        path: path.to_owned(),
        message,
    };
    let mut words = report.split_whitespace();
    let (Some(size), Some(theirs)) = (words.next(), words.next()) else {
        return Err(unverified(format!("the guest reported {report:?}")));
    };
    match size.parse::<u64>() {
        Ok(size) if size == bytes => {}
        Ok(size) => {
            return Err(unverified(format!(
                "the guest has {size} bytes of the {bytes} sent"
            )));
        }
        Err(_) => return Err(unverified(format!("the guest reported {report:?}"))),
    }
    if theirs != sha256 {
        return Err(unverified(format!(
            "the guest's sha256 is {theirs}, this end's {sha256}"
        )));
    }
    Ok(())
}

/// A guest path relative to `/`, where the sessions run: `/work/x` and `work/x` are both
/// `./work/x`, as the server writes a claim's files.
pub(super) fn relative(path: &str) -> String {
    match path.trim_start_matches('/') {
        "" => ".".to_owned(),
        rest => format!("./{rest}"),
    }
}

/// The last name of a guest path, which a copy into a local directory takes.
pub(super) fn guest_name(path: &str) -> Option<&str> {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|name| !name.is_empty() && *name != "." && *name != "..")
}

pub(super) fn local(what: String, source: io::Error) -> Error {
    Error::Local { what, source }
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use sha2::{Digest as _, Sha256};

    use super::*;

    #[test]
    fn guest_paths_are_relative_to_the_root() {
        assert_eq!(relative("/work/x"), "./work/x");
        assert_eq!(relative("work/x"), "./work/x");
        assert_eq!(relative("/"), ".");
        assert_eq!(guest_name("/work/out.tar"), Some("out.tar"));
        assert_eq!(guest_name("/work/dir/"), Some("dir"));
        assert_eq!(guest_name("/"), None);
        assert_eq!(guest_name("/work/.."), None);
    }

    #[test]
    fn the_guests_report_must_match_what_was_sent() {
        let sha = hex(&Sha256::digest(b"data"));
        assert!(verify_report("/f", &format!("4 {sha}  -\n"), 4, &sha).is_ok());
        let short = verify_report("/f", &format!("3 {sha}  -\n"), 4, &sha).unwrap_err();
        assert_eq!(
            short.to_string(),
            "copying /f was not verified: the guest has 3 bytes of the 4 sent; copy it again"
        );
        assert!(matches!(
            verify_report("/f", &format!("4 {}  -\n", "0".repeat(64)), 4, &sha),
            Err(Error::Unverified { .. })
        ));
        assert!(matches!(
            verify_report("/f", "", 4, &sha),
            Err(Error::Unverified { .. })
        ));
    }

    #[test]
    fn a_failed_script_says_what_the_guest_said_or_lacks() {
        let missing = guest_failure("/f", 127, b"battery-transfer: missing sha256sum\n");
        assert!(
            matches!(&missing, Error::GuestToolMissing { tool } if tool == "sha256sum"),
            "{missing:?}"
        );
        assert!(matches!(
            guest_failure("/f", 127, b""),
            Error::GuestToolMissing { tool } if tool == "sh"
        ));
        assert_eq!(
            guest_failure("/full", 1, b"cat: write error: No space left on device\n").to_string(),
            "copying /full failed in the MicroVM: cat: write error: No space left on device \
             (exit code 1)"
        );
        assert_eq!(
            guest_failure("/f", 2, b"").to_string(),
            "copying /f failed in the MicroVM: it exited with code 2"
        );
    }
}
