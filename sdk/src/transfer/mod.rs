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

use tokio::io::AsyncRead;

use crate::claim::Claim;
use crate::client::Client;
use crate::error::Error;

mod download;
mod guest;
mod upload;

pub use download::Download;
use download::Header;
pub use guest::{Files, Transferred};
use guest::{OnProgress, local};

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
