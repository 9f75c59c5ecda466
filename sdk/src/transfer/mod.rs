//! Files in and out of a claim's MicroVM over its exec session, as flintlock has no file
//! API: [`Files`], [`Claim::upload`], [`Claim::download`] and the path copies.
//!
//! A file travels as its bytes on a command's stdin (upload) or stdout (download), and the
//! guest confirms what it holds, its size and sha256 (`wc -c`, `sha256sum`), which are
//! compared with what was sent or received: a short write is an error, never a truncated
//! file taken for whole. A directory travels as a tar stream (the `tar` crate here, `tar`
//! in the guest), whose headers carry each entry's size and mode, so a stream cut short
//! fails the tar at the other end and with it the copy. Nothing is held in memory beyond
//! the session's bounded pipes, whatever the size.
//!
//! Guest paths are taken relative to `/`, in a session whose working directory is `/`, as
//! the server writes a claim's files at bind: a Host that roots sessions elsewhere (a
//! simulated Host roots them in the MicroVM's directory) puts the file at the same guest
//! path. The scripts are fixed text; paths reach them as arguments, never as shell text.

use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::task::JoinHandle;
use tokio_util::io::SyncIoBridge;

use crate::claim::Claim;
use crate::client::Client;
use crate::error::Error;
use crate::exec::{Command, OutputStream, Process};

mod download;

pub use download::Download;
use download::Header;

/// The most read or written in one piece.
const CHUNK: usize = 64 * 1024;
/// Bytes between the thread that packs or unpacks a tar stream and the session.
const TAR_PIPE: usize = 256 * 1024;
/// The most kept of a script's report or its stderr: a line or a few. The rest is read
/// and dropped, so a chatty guest never stalls.
const REPORT_LIMIT: u64 = 64 * 1024;
/// The longest first line a download may start with.
const HEADER_LIMIT: u64 = 128;
/// The line a script prints when the guest lacks a tool it needs.
const MISSING: &str = "battery-transfer: missing ";
/// What a shell exits with when the command is not found.
const NOT_FOUND_EXIT_CODE: i32 = 127;

/// Checks the guest has every tool named, before anything is written.
const NEED: &str = r#"need() {
  for tool; do
    command -v "$tool" >/dev/null 2>&1 || { echo "battery-transfer: missing $tool" >&2; exit 127; }
  done
}
set -eu
"#;

/// Writes stdin to `$1` (to `$1/$3` when `$1` is a directory and `$3` is given) with mode
/// `$2`, then reports the size and sha256 of what the file holds. Written in place, as
/// `cp` writes, so a path that is a link writes its target.
const UPLOAD_FILE: &str = r#"need cat chmod sha256sum wc
t=$1
if [ -d "$t" ]; then
  [ -n "$3" ] || { echo "$4 is a directory" >&2; exit 1; }
  t=$t/$3
fi
umask 077
cat > "$t"
chmod "$2" "$t"
printf '%s ' "$(wc -c < "$t")"
sha256sum < "$t"
"#;

/// Unpacks the tar stream on stdin into `$1` (into `$1/$2` when `$1` is a directory), as
/// `cp -r` copies a directory; modes as the stream has them, owners the guest's.
const UPLOAD_DIRECTORY: &str = r#"need mkdir tar
d=$1
if [ -d "$d" ]; then d=$d/$2; fi
[ -d "$d" ] || mkdir -- "$d"
exec tar -x -p -o -f - -C "$d"
"#;

/// A first line, then `$1`: a directory as `directory` and a tar stream of it; a file as
/// `file MODE SIZE`, its bytes, then its sha256 read again once it is sent.
const DOWNLOAD: &str = r#"need cat sha256sum stat wc
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
type OnProgress = Arc<dyn Fn(u64, Option<u64>) + Send + Sync>;

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
/// [`Client::files`], or through [`Claim::upload`] and the rest.
#[derive(Clone)]
pub struct Files {
    client: Client,
    claim: String,
    pool: String,
}

impl Client {
    /// The files of the claim `claim` of this client's namespace. Unlike a [`Claim`]'s
    /// methods, nothing renews that claim's lease meanwhile.
    pub fn files(&self, claim: impl Into<String>) -> Files {
        Files {
            client: self.clone(),
            claim: claim.into(),
            pool: String::new(),
        }
    }
}

impl Claim {
    fn files(&self) -> Files {
        Files {
            client: self.client.clone(),
            claim: self.name().to_owned(),
            pool: self.pool.clone(),
        }
    }

    /// Writes all of `from` to the file `to` in the guest, with `mode`, and gives what
    /// the guest confirmed. See [`Files::upload`].
    pub async fn upload(
        &self,
        from: impl AsyncRead + Send + Unpin,
        to: &str,
        mode: u32,
    ) -> Result<Transferred, Error> {
        self.files().upload(from, to, mode).await
    }

    /// The file `from` of the guest, as a stream. See [`Files::download`].
    pub async fn download(&self, from: &str) -> Result<Download, Error> {
        self.files().download(from).await
    }

    /// Copies the local file or directory `from` into the guest at `to`, as `cp -r`
    /// does. See [`Files::upload_path`].
    pub fn upload_path(&self, from: impl Into<PathBuf>, to: impl Into<String>) -> CopyPath {
        self.files().upload_path(from, to)
    }

    /// Copies the guest's file or directory `from` to the local `to`, as `cp -r` does.
    /// See [`Files::download_path`].
    pub fn download_path(&self, from: impl Into<String>, to: impl Into<PathBuf>) -> CopyPath {
        self.files().download_path(from, to)
    }
}

impl Files {
    /// Writes all of `from` to the file `to` in the guest (created, or overwritten in
    /// place) and sets its `mode`. Returns once the guest has confirmed the size and
    /// sha256 of what the file holds; a short write, a full disk or a read-only path is
    /// [`Error::GuestFailed`], a mismatch [`Error::Unverified`].
    pub async fn upload(
        &self,
        from: impl AsyncRead + Send + Unpin,
        to: &str,
        mode: u32,
    ) -> Result<Transferred, Error> {
        self.upload_file(from, to, mode, "", None).await
    }

    /// The file `from` of the guest, as a stream of its bytes. The stream ends only once
    /// all [`Download::size`] bytes came and their sha256 is the one the guest computed;
    /// otherwise a read fails (its error wraps the [`Error`]). A directory is
    /// [`Error::GuestFailed`]: copy it with [`Files::download_path`].
    pub async fn download(&self, from: &str) -> Result<Download, Error> {
        match self.open_download(from).await? {
            (Header::File { mode, size }, session) => Ok(Download::new(session, mode, size)),
            (Header::Directory, _) => Err(Error::GuestFailed {
                path: from.to_owned(),
                message: "it is a directory; copy it with download_path".to_owned(),
            }),
        }
    }

    /// Copies the local file or directory `from` into the guest, as `cp -r` does: into
    /// `to` when that is a directory of the guest, else as `to`. Modes come along; a
    /// directory goes as a tar stream, so the guest needs `tar`.
    pub fn upload_path(&self, from: impl Into<PathBuf>, to: impl Into<String>) -> CopyPath {
        CopyPath {
            files: self.clone(),
            direction: Direction::Up {
                from: from.into(),
                to: to.into(),
            },
            on_progress: None,
        }
    }

    /// Copies the guest's file or directory `from` here, as `cp -r` does: into `to` when
    /// that is a local directory, else as `to`. Modes come along. A file is written
    /// beside its place and renamed into it once verified, so a failed copy leaves none.
    pub fn download_path(&self, from: impl Into<String>, to: impl Into<PathBuf>) -> CopyPath {
        CopyPath {
            files: self.clone(),
            direction: Direction::Down {
                from: from.into(),
                to: to.into(),
            },
            on_progress: None,
        }
    }

    fn command(&self, script: &str, args: Vec<String>) -> Command {
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

    /// [`Files::upload`], into `to/name` when `to` is a directory and `name` is given.
    async fn upload_file(
        &self,
        from: impl AsyncRead + Send + Unpin,
        to: &str,
        mode: u32,
        name: &str,
        progress: Option<(OnProgress, Option<u64>)>,
    ) -> Result<Transferred, Error> {
        let args = vec![
            relative(to),
            format!("{:o}", mode & 0o7777),
            name.to_owned(),
            to.to_owned(),
        ];
        let mut sent = Sent::new(progress);
        let report = self
            .feed(
                self.command(UPLOAD_FILE, args),
                to,
                from,
                &mut sent,
                async { Ok(()) },
            )
            .await?;
        let sha256 = hex(&sent.hash.finalize());
        verify_report(to, &String::from_utf8_lossy(&report), sent.bytes, &sha256)?;
        Ok(Transferred {
            bytes: sent.bytes,
            sha256: Some(sha256),
        })
    }

    /// Packs the local directory `from` as a tar stream into the guest's `to`.
    async fn upload_directory(
        &self,
        from: &Path,
        to: &str,
        name: &str,
        progress: Option<OnProgress>,
    ) -> Result<Transferred, Error> {
        let (reader, writer) = tokio::io::duplex(TAR_PIPE);
        let root = from.to_owned();
        let mut bridge = SyncIoBridge::new(writer);
        let packing: JoinHandle<io::Result<()>> = tokio::task::spawn_blocking(move || {
            let mut tar = tar::Builder::new(&mut bridge);
            // A link is copied as a link, as `cp -r` without -L does.
            tar.follow_symlinks(false);
            tar.append_dir_all(".", &root)?;
            tar.finish()?;
            drop(tar);
            bridge.shutdown()
        });
        let packed = async {
            match packing.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(error)) => Err(local(format!("packing {}", from.display()), error)),
                Err(join) => Err(local(
                    format!("packing {}", from.display()),
                    io::Error::other(join),
                )),
            }
        };
        let args = vec![relative(to), name.to_owned()];
        let mut sent = Sent::new(progress.map(|p| (p, None)));
        self.feed(
            self.command(UPLOAD_DIRECTORY, args),
            to,
            reader,
            &mut sent,
            packed,
        )
        .await?;
        Ok(Transferred {
            bytes: sent.bytes,
            sha256: None,
        })
    }

    /// Runs `command` with `from` on its stdin (and `source_done` resolved before end of
    /// file is sent, so a source that failed is never taken for complete), and gives what
    /// it printed once it exited 0.
    async fn feed(
        &self,
        command: Command,
        path: &str,
        mut from: impl AsyncRead + Unpin,
        sent: &mut Sent,
        source_done: impl Future<Output = Result<(), Error>>,
    ) -> Result<Vec<u8>, Error> {
        let mut process = command.spawn().await?;
        if !process.stdin_can_end() {
            return Err(Error::StdinCannotEnd);
        }
        let (mut stdin, stdout, stderr) = (process.stdin(), process.stdout(), process.stderr());
        let pump = async {
            let Some(stdin) = stdin.as_mut() else {
                return Ok(());
            };
            let mut buffer = vec![0; CHUNK];
            loop {
                let read = from
                    .read(&mut buffer)
                    .await
                    .map_err(|e| local(format!("reading what to copy to {path}"), e))?;
                if read == 0 {
                    break;
                }
                sent.add(&buffer[..read]);
                // The guest stopped reading: its exit status and stderr say why.
                if stdin.write_all(&buffer[..read]).await.is_err() {
                    return Ok(());
                }
            }
            source_done.await?;
            // A failure here is the guest gone, which its exit status tells.
            let _ = stdin.shutdown().await;
            Ok(())
        };
        let (_, report, complaint) =
            tokio::try_join!(pump, read_limited(stdout), read_limited(stderr))?;
        drop(stdin);
        exited(process, path, &complaint).await?;
        Ok(report)
    }
}

/// [`Files::upload_path`] or [`Files::download_path`], to report progress before it is
/// sent.
#[must_use = "a copy runs only by send()"]
pub struct CopyPath {
    files: Files,
    direction: Direction,
    on_progress: Option<OnProgress>,
}

enum Direction {
    Up { from: PathBuf, to: String },
    Down { from: String, to: PathBuf },
}

impl CopyPath {
    /// Calls `report` as the copy goes, with the bytes moved so far and the total when
    /// it is known (a file's size; not a directory's tar stream).
    pub fn on_progress(
        mut self,
        report: impl Fn(u64, Option<u64>) + Send + Sync + 'static,
    ) -> Self {
        self.on_progress = Some(Arc::new(report));
        self
    }

    /// Copies, and gives what moved once the other end confirmed it.
    pub async fn send(self) -> Result<Transferred, Error> {
        match self.direction {
            Direction::Up { from, to } => {
                let files = self.files;
                let meta = tokio::fs::metadata(&from)
                    .await
                    .map_err(|e| local(format!("reading {}", from.display()), e))?;
                let name = local_name(&from)?;
                if meta.is_dir() {
                    files
                        .upload_directory(&from, &to, &name, self.on_progress)
                        .await
                } else if meta.is_file() {
                    let file = tokio::fs::File::open(&from)
                        .await
                        .map_err(|e| local(format!("opening {}", from.display()), e))?;
                    let progress = self.on_progress.map(|p| (p, Some(meta.len())));
                    files
                        .upload_file(file, &to, meta.mode(), &name, progress)
                        .await
                } else {
                    Err(local(
                        format!("copying {}", from.display()),
                        io::Error::other("it is neither a regular file nor a directory"),
                    ))
                }
            }
            Direction::Down { from, to } => {
                self.files.download_into(&from, &to, self.on_progress).await
            }
        }
    }
}

/// What an upload sent so far.
struct Sent {
    bytes: u64,
    hash: Sha256,
    progress: Option<(OnProgress, Option<u64>)>,
}

impl Sent {
    fn new(progress: Option<(OnProgress, Option<u64>)>) -> Self {
        Self {
            bytes: 0,
            hash: Sha256::new(),
            progress,
        }
    }

    fn add(&mut self, chunk: &[u8]) {
        self.bytes += chunk.len() as u64;
        self.hash.update(chunk);
        if let Some((progress, total)) = &self.progress {
            progress(self.bytes, *total);
        }
    }
}

/// All of `stream` up to [`REPORT_LIMIT`]; the rest is read and dropped.
async fn read_limited(stream: Option<OutputStream>) -> Result<Vec<u8>, Error> {
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
async fn exited(process: Process, path: &str, stderr: &[u8]) -> Result<(), Error> {
    match process.wait().await? {
        0 => Ok(()),
        code => Err(guest_failure(path, code, stderr)),
    }
}

/// A failed script as an [`Error`]: a missing tool by name, else the guest's own words.
fn guest_failure(path: &str, code: i32, stderr: &[u8]) -> Error {
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
fn verify_report(path: &str, report: &str, bytes: u64, sha256: &str) -> Result<(), Error> {
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
fn relative(path: &str) -> String {
    match path.trim_start_matches('/') {
        "" => ".".to_owned(),
        rest => format!("./{rest}"),
    }
}

/// The last name of a guest path, which a copy into a local directory takes.
fn guest_name(path: &str) -> Option<&str> {
    path.trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|name| !name.is_empty() && *name != "." && *name != "..")
}

/// The name a local file or directory keeps in the guest (`.` is named for what it is).
fn local_name(path: &Path) -> Result<String, Error> {
    let named = match path.file_name() {
        Some(name) => Some(name.to_owned()),
        None => std::fs::canonicalize(path)
            .map_err(|e| local(format!("reading {}", path.display()), e))?
            .file_name()
            .map(ToOwned::to_owned),
    };
    named
        .and_then(|name| name.to_str().map(ToOwned::to_owned))
        .ok_or_else(|| {
            local(
                format!("copying {}", path.display()),
                io::Error::other("its name is not UTF-8 (or it is /); name a directory under it"),
            )
        })
}

fn local(what: String, source: io::Error) -> Error {
    Error::Local { what, source }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
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
