//! Downloads: a file as a verified stream ([`Download`]), written beside its place and
//! renamed in; a directory as a tar stream unpacked here.

use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::stream::BoxStream;
use sha2::{Digest as _, Sha256};
use tokio::io::{
    AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, AsyncWriteExt as _, BufReader,
};
use tokio::task::JoinHandle;
use tokio_util::io::{StreamReader, SyncIoBridge};

use super::guest::{
    CHUNK, DOWNLOAD, Files, HEADER_LIMIT, OnProgress, REPORT_LIMIT, Transferred, exited,
    guest_name, hex, local, read_limited, relative, verify_report,
};
use crate::error::Error;
use crate::exec::{OutputStream, Process};

impl Files {
    /// Starts the download of `from` and reads its first line.
    pub(super) async fn open_download(&self, from: &str) -> Result<(Header, Session), Error> {
        let command = self
            .command(DOWNLOAD, vec![relative(from), from.to_owned()])
            .stdin(false);
        let mut process = command.spawn().await?;
        let stdout = process.stdout().map(|s| BufReader::with_capacity(CHUNK, s));
        let stderr = tokio::spawn(read_limited(process.stderr()));
        let mut session = Session {
            stdout,
            stderr,
            process,
            path: from.to_owned(),
        };
        let mut line = Vec::new();
        if let Some(stdout) = session.stdout.as_mut() {
            stdout
                .take(HEADER_LIMIT)
                .read_until(b'\n', &mut line)
                .await
                .map_err(Error::Output)?;
        }
        match parse_header(&String::from_utf8_lossy(&line)) {
            Some(header) => Ok((header, session)),
            None => Err(session
                .failure(format!("it sent {line:?} instead of what it holds"))
                .await),
        }
    }

    pub(super) async fn download_into(
        &self,
        from: &str,
        to: &Path,
        progress: Option<OnProgress>,
    ) -> Result<Transferred, Error> {
        let name = guest_name(from).ok_or_else(|| Error::GuestFailed {
            path: from.to_owned(),
            message: "it names no file or directory; name one, as /work".to_owned(),
        })?;
        let target = match tokio::fs::metadata(to).await {
            Ok(meta) if meta.is_dir() => to.join(name),
            _ => to.to_owned(),
        };
        match self.open_download(from).await? {
            (Header::File { mode, size }, session) => {
                let download = Download::new(session, mode, size);
                write_local(download, &target, progress).await
            }
            (Header::Directory, session) => unpack(session, &target, progress).await,
        }
    }
}

/// What a download starts with.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Header {
    File { mode: u32, size: u64 },
    Directory,
}

pub(super) fn parse_header(line: &str) -> Option<Header> {
    let mut words = line.split_whitespace();
    match words.next()? {
        "directory" => Some(Header::Directory),
        "file" => {
            let mode = u32::from_str_radix(words.next()?, 8).ok()?;
            let size = words.next()?.parse().ok()?;
            Some(Header::File { mode, size })
        }
        _ => None,
    }
}

/// The download's session: its stdout after the first line, its stderr being collected,
/// and its exit status to come.
pub(super) struct Session {
    stdout: Option<BufReader<OutputStream>>,
    stderr: JoinHandle<Result<Vec<u8>, Error>>,
    process: Process,
    path: String,
}

impl Session {
    /// Waits for the command's exit: the guest's own error if it failed.
    async fn finish(mut self) -> Result<(), Error> {
        // What is left after a tar stream's end (its padding) is read and dropped.
        if let Some(mut stdout) = self.stdout.take() {
            tokio::io::copy(&mut stdout, &mut tokio::io::sink())
                .await
                .map_err(Error::Output)?;
        }
        let complaint = (&mut self.stderr)
            .await
            .map_err(|e| Error::Exec(Box::new(e)))??;
        exited(self.process, &self.path, &complaint).await
    }

    /// The guest's error if the command failed, else the copy unverified: `why`.
    async fn failure(self, why: String) -> Error {
        let path = self.path.clone();
        match self.finish().await {
            Err(error) => error,
            Ok(()) => Error::Unverified { path, message: why },
        }
    }
}

/// A file of the guest, as a stream of its bytes ([`Files::download`]). End of file comes
/// only once every byte came and the sha256 matched the guest's; otherwise a read fails,
/// with the [`Error`] inside the `io::Error`.
pub struct Download {
    mode: u32,
    size: u64,
    bytes: StreamReader<BoxStream<'static, io::Result<Bytes>>, Bytes>,
}

/// Where a download's stream is.
struct Receiving {
    session: Session,
    left: u64,
    hash: Sha256,
}

impl Download {
    pub(super) fn new(session: Session, mode: u32, size: u64) -> Self {
        let state = Receiving {
            session,
            left: size,
            hash: Sha256::new(),
        };
        let stream = futures::stream::try_unfold(Some(state), move |state| async move {
            let Some(mut state) = state else {
                return Ok(None);
            };
            if state.left == 0 {
                verify_download(state, size)
                    .await
                    .map_err(io::Error::other)?;
                return Ok(None);
            }
            let mut chunk = vec![0; CHUNK.min(usize::try_from(state.left).unwrap_or(CHUNK))];
            let read = match state.session.stdout.as_mut() {
                Some(stdout) => stdout.read(&mut chunk).await?,
                None => 0,
            };
            if read == 0 {
                let why = format!("it sent {} of its {size} bytes", size - state.left);
                return Err(io::Error::other(state.session.failure(why).await));
            }
            chunk.truncate(read);
            state.hash.update(&chunk);
            state.left -= read as u64;
            Ok(Some((Bytes::from(chunk), Some(state))))
        });
        Self {
            mode,
            size,
            bytes: StreamReader::new(Box::pin(stream)),
        }
    }

    /// The file's size, as the guest gave it before sending it.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The file's mode in the guest (permission bits, as `0o755`).
    pub fn mode(&self) -> u32 {
        self.mode
    }
}

impl AsyncRead for Download {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.bytes).poll_read(cx, buf)
    }
}

/// After the last byte: the guest's sha256 line, then its exit status.
async fn verify_download(mut state: Receiving, size: u64) -> Result<(), Error> {
    let mut trailer = Vec::new();
    if let Some(stdout) = state.session.stdout.as_mut() {
        stdout
            .take(REPORT_LIMIT)
            .read_to_end(&mut trailer)
            .await
            .map_err(Error::Output)?;
    }
    let path = state.session.path.clone();
    state.session.finish().await?;
    let ours = hex(&state.hash.finalize());
    let theirs = String::from_utf8_lossy(&trailer);
    verify_report(&path, &format!("{size} {theirs}"), size, &ours)
}

/// Writes `download` beside `target`, then renames it into place once verified.
pub(super) async fn write_local(
    mut download: Download,
    target: &Path,
    progress: Option<OnProgress>,
) -> Result<Transferred, Error> {
    let size = download.size();
    let partial = partial_path(target);
    let writing = async {
        let mut file = tokio::fs::File::create(&partial)
            .await
            .map_err(|e| local(format!("creating {}", partial.display()), e))?;
        let mut buffer = vec![0; CHUNK];
        let (mut done, mut hash) = (0, Sha256::new());
        loop {
            let read = download.read(&mut buffer).await.map_err(from_io)?;
            if read == 0 {
                break;
            }
            hash.update(&buffer[..read]);
            file.write_all(&buffer[..read])
                .await
                .map_err(|e| local(format!("writing {}", partial.display()), e))?;
            done += read as u64;
            if let Some(progress) = &progress {
                progress(done, Some(size));
            }
        }
        file.sync_all()
            .await
            .map_err(|e| local(format!("writing {}", partial.display()), e))?;
        file.set_permissions(std::fs::Permissions::from_mode(download.mode()))
            .await
            .map_err(|e| local(format!("setting the mode of {}", partial.display()), e))?;
        Ok(hex(&hash.finalize()))
    };
    match writing.await {
        Ok(sha256) => {
            tokio::fs::rename(&partial, target)
                .await
                .map_err(|e| local(format!("renaming into {}", target.display()), e))?;
            Ok(Transferred {
                bytes: size,
                sha256: Some(sha256),
            })
        }
        Err(error) => {
            // Best effort: the copy's own error is the one to report.
            let _ = tokio::fs::remove_file(&partial).await;
            Err(error)
        }
    }
}

/// Unpacks the session's tar stream into `target` (made if missing, as `cp -r` makes it).
pub(super) async fn unpack(
    mut session: Session,
    target: &Path,
    progress: Option<OnProgress>,
) -> Result<Transferred, Error> {
    let Some(stdout) = session.stdout.take() else {
        return Err(session.failure("it sent no tar stream".to_owned()).await);
    };
    let counted = Counted {
        inner: stdout,
        done: 0,
        progress,
    };
    let dst = target.to_owned();
    let mut bridge = SyncIoBridge::new(counted);
    let unpacking = tokio::task::spawn_blocking(move || {
        let unpacked = (|| {
            std::fs::create_dir_all(&dst)?;
            let mut archive = tar::Archive::new(&mut bridge);
            archive.set_preserve_permissions(true);
            archive.unpack(&dst)
        })();
        (unpacked, bridge.into_inner())
    });
    let (unpacked, counted) = unpacking.await.map_err(|e| Error::Exec(Box::new(e)))?;
    let bytes = counted.done;
    session.stdout = Some(counted.inner);
    match unpacked {
        Ok(()) => {
            session.finish().await?;
            Ok(Transferred {
                bytes,
                sha256: None,
            })
        }
        // The stream ended early: the guest's error says why.
        Err(error) if is_short(&error) => Err(session
            .failure(format!("its tar stream ended early: {error}"))
            .await),
        Err(error) => Err(local(format!("unpacking into {}", target.display()), error)),
    }
}

/// Whether unpacking failed for want of bytes, however deep the tar crate wrapped it.
fn is_short(error: &io::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if let Some(io) = error.downcast_ref::<io::Error>()
            && io.kind() == io::ErrorKind::UnexpectedEof
        {
            return true;
        }
        cause = error.source();
    }
    false
}

/// A reader that reports how much went through it.
struct Counted<R> {
    inner: R,
    done: u64,
    progress: Option<OnProgress>,
}

impl<R: AsyncRead + Unpin> AsyncRead for Counted<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut self.inner).poll_read(cx, buf))?;
        self.done += (buf.filled().len() - before) as u64;
        if let Some(progress) = &self.progress {
            progress(self.done, None);
        }
        Poll::Ready(Ok(()))
    }
}

/// Where a download is written before it is verified: beside its place, hidden.
pub(super) fn partial_path(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    target.with_file_name(format!(".{name}.battery-partial"))
}

/// The [`Error`] a download's read failed with, or the read's own failure.
pub(super) fn from_io(error: io::Error) -> Error {
    if error.get_ref().is_some_and(|e| e.is::<Error>()) {
        if let Some(inner) = error.into_inner()
            && let Ok(error) = inner.downcast::<Error>()
        {
            return *error;
        }
        unreachable!("checked to hold an Error")
    }
    Error::Output(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downloads_start_with_what_they_are() {
        assert_eq!(
            parse_header("file 755 1024\n"),
            Some(Header::File {
                mode: 0o755,
                size: 1024
            })
        );
        assert_eq!(parse_header("directory\n"), Some(Header::Directory));
        assert_eq!(parse_header("file  1024\n"), None);
        assert_eq!(parse_header(""), None);
    }

    #[test]
    fn a_partial_download_hides_beside_its_place() {
        assert_eq!(
            partial_path(Path::new("out/big.bin")),
            Path::new("out/.big.bin.battery-partial")
        );
    }

    #[test]
    fn an_error_comes_back_out_of_a_read() {
        let wrapped = io::Error::other(Error::StdinCannotEnd);
        assert!(matches!(from_io(wrapped), Error::StdinCannotEnd));
        assert!(matches!(
            from_io(io::Error::from(io::ErrorKind::BrokenPipe)),
            Error::Output(_)
        ));
    }
}
