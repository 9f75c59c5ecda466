//! Uploads: a file's bytes on a script's stdin, confirmed by the size and sha256 the
//! guest reports; a directory as a tar stream into `tar` in the guest.

use std::io;
use std::path::Path;

use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::task::JoinHandle;
use tokio_util::io::SyncIoBridge;

use super::guest::{
    CHUNK, Files, OnProgress, Transferred, exited, hex, local, read_limited, relative,
    verify_report,
};
use crate::error::Error;
use crate::exec::Command;

/// Bytes between the thread that packs or unpacks a tar stream and the session.
const TAR_PIPE: usize = 256 * 1024;
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

    /// [`Files::upload`], into `to/name` when `to` is a directory and `name` is given.
    pub(super) async fn upload_file(
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
    pub(super) async fn upload_directory(
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
