//! Writing a claim's files into its MicroVM at bind: all of them in one agent session that
//! runs one `tar -x`, the archive on stdin. Starting processes in the guest is most of
//! what a write costs, so a bind starts one however many files it has (the script this
//! replaced started six per file).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use battery_api_machinery::status::{ApiError, Reason};
use battery_types::MicroVMClaim;
use bytes::Bytes;
use secrecy::{ExposeSecret as _, ExposeSecretMut as _, SecretBox};

use super::{ClaimConfig, FileContent};
use crate::relay::{ClaimRef, ExecInput, ExecOpen, ExecOutput, Exit};

/// How long writing a claim's files may take, the session's opening included.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// stdin chunks towards the agent, well under its 1 MiB message limit.
const CHUNK_BYTES: usize = 256 * 1024;
/// What of a failed write's stderr is shown.
const STDERR_BYTES: usize = 2048;
/// tar's block: every header and every file's content is padded to it.
const BLOCK: usize = 512;
/// What a shell, and flintlock's guest agent, exit with when the command is not found.
const NOT_FOUND_EXIT_CODE: i32 = 127;
/// GNU and BusyBox tar alike: the archive on stdin, each file's mode as archived whatever
/// the guest's umask (`-p`), the guest's own clock for its times (`-m`). Fixed: nothing a
/// user gives is ever in argv, and the content arrives on stdin only.
const EXTRACT: [&str; 6] = ["tar", "-x", "-p", "-m", "-f", "-"];

/// The ServiceAccount directory's files from the archive on stdin, each renamed over the
/// one there (rename is atomic). Relative to the session's `/`, as the archive's paths
/// are; fixed, so nothing a user gives is ever in argv.
fn replace_script() -> String {
    let dir = battery_types::SERVICE_ACCOUNT_DIR.trim_start_matches('/');
    format!(
        "set -e; d={dir}; s=\"$d/..staging\"; mkdir -p \"$d\"; rm -rf \"$s\"; \
         mkdir -m 0755 \"$s\"; tar -x -p -m -f - -C \"$s\"; \
         for f in \"$s\"/*; do mv -f \"$f\" \"$d/\"; done; rmdir \"$s\""
    )
}

/// A claim's files as one archive, zeroed when dropped.
type Archive = SecretBox<Vec<u8>>;

impl ClaimConfig {
    /// Writes `files` into the bound `claim`'s MicroVM through its Host's agent; a failure
    /// is answered naming the paths, with what the guest said.
    pub async fn write_files(
        &self,
        claim: &MicroVMClaim,
        files: Vec<FileContent>,
    ) -> Result<(), ApiError> {
        if files.is_empty() {
            return Ok(());
        }
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let paths: Vec<_> = files.iter().map(|file| file.path.as_str()).collect();
        let what = match paths.as_slice() {
            [path] => format!("file {path}"),
            paths => format!("files {}", paths.join(", ")),
        };
        self.write(claim, files, EXTRACT.map(str::to_owned).into())
            .await
            .map_err(|why| {
                ApiError::new(
                    Reason::InternalError,
                    format!(
                        "cannot write {what} into the MicroVM of microvmclaim {namespace}/{name}; \
                         the MicroVM was released: {why}"
                    ),
                )
            })
    }

    /// Writes `files` (bare names) into the guest's ServiceAccount directory, each
    /// replacing the one there at once: extracted beside it, then renamed over it, so a
    /// reader sees the old token or the new one, never part of one (ADR 43).
    pub async fn write_service_account(
        &self,
        claim: &MicroVMClaim,
        files: Vec<FileContent>,
    ) -> Result<(), String> {
        let script = replace_script();
        self.write(claim, files, vec!["sh".to_owned(), "-c".to_owned(), script])
            .await
    }

    /// One agent session that runs `command` with `files` as a tar archive on stdin.
    async fn write(
        &self,
        claim: &MicroVMClaim,
        files: Vec<FileContent>,
        command: Vec<String>,
    ) -> Result<(), String> {
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let status = claim.status.clone().unwrap_or_default();
        let (Some(host), Some(microvm)) = (&status.host, &status.micro_vm) else {
            return Err("the bind names no Host or MicroVM".to_owned());
        };
        let Some(address) = &host.agent_address else {
            return Err(format!(
                "its Host {} has no exec agent registered",
                host.node_name
            ));
        };
        let archive = archive(&files).map_err(|err| format!("archiving them: {err}"))?;
        drop(files);
        let open = ExecOpen {
            claim: ClaimRef {
                namespace,
                name,
                uid: claim.metadata.uid.clone().unwrap_or_default(),
            },
            microvm_uid: microvm.uid.clone(),
            command,
            env: HashMap::new(),
            // The archive's paths are relative to `/`, so a Host that roots sessions
            // elsewhere (the simulated Hosts root them in the MicroVM's directory) keeps
            // the files there.
            working_dir: "/".to_owned(),
            stdin: true,
            stdout: false,
            stderr: true,
            tty: false,
        };
        tokio::time::timeout(
            WRITE_TIMEOUT,
            self.extract(&host.node_name, address, open, archive),
        )
        .await
        .unwrap_or_else(|_| Err(format!("it took over {}s", WRITE_TIMEOUT.as_secs())))
    }

    /// The session: the archive on stdin, then the exit status.
    async fn extract(
        &self,
        host: &str,
        address: &str,
        open: ExecOpen,
        archive: Archive,
    ) -> Result<(), String> {
        let session = self
            .relay
            .open(host, address, open)
            .await
            .map_err(|e| e.message().to_owned())?;
        let requests = session.input;
        let feeder = tokio::spawn(async move {
            for chunk in archive.expose_secret().chunks(CHUNK_BYTES) {
                let stdin = ExecInput::Stdin(Bytes::copy_from_slice(chunk));
                if requests.send(stdin).await.is_err() {
                    return;
                }
            }
            let _ = requests.send(ExecInput::StdinEof).await;
        });
        let mut responses = session.output;
        let mut stderr = Vec::new();
        let outcome = loop {
            match responses.next().await {
                Ok(Some(ExecOutput::Stderr(bytes))) => {
                    let room = STDERR_BYTES.saturating_sub(stderr.len());
                    stderr.extend_from_slice(&bytes[..bytes.len().min(room)]);
                }
                Ok(Some(ExecOutput::Exit(exit))) => break exit,
                Ok(Some(ExecOutput::Stdout(_))) => {}
                // Ended without an exit status: told as one that says neither.
                Ok(None) => break Exit::Unknown,
                Err(failed) => {
                    feeder.abort();
                    return Err(format!("the exec agent's stream failed: {failed}"));
                }
            }
        };
        // A command that exits early leaves the rest of stdin unread.
        feeder.abort();
        let stderr = String::from_utf8_lossy(&stderr);
        match outcome {
            Exit::Code(0) => Ok(()),
            Exit::Code(NOT_FOUND_EXIT_CODE) => Err(format!(
                "the MicroVM has no `tar`, which writing files needs (exit {NOT_FOUND_EXIT_CODE}): {}",
                stderr.trim()
            )),
            Exit::Code(code) => Err(format!("`tar -x` exited with {code}: {}", stderr.trim())),
            Exit::Error(error) => Err(format!("the write failed: {error}")),
            Exit::Unknown => {
                Err("the exec agent ended the write without an exit status".to_owned())
            }
        }
    }
}

/// `files` as one tar archive: paths relative to `/`, owned by root, with their modes. The
/// buffer is sized up front, so that growing it never leaves a copy of a secret behind.
fn archive(files: &[FileContent]) -> std::io::Result<Archive> {
    let mut archive: Archive = SecretBox::new(Box::new(Vec::with_capacity(archived_size(files))));
    let mtime = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let mut builder = tar::Builder::new(archive.expose_secret_mut());
    for file in files {
        let content = file.content.expose_secret();
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(file.mode.unsigned_abs());
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(mtime);
        header.set_size(content.len() as u64);
        builder.append_data(&mut header, file.path.trim_start_matches('/'), content)?;
    }
    builder.into_inner()?;
    Ok(archive)
}

/// At most what [`archive`] writes: per file a header, a GNU long-name entry for a path
/// the header cannot hold, and the padded content; then the two zero blocks that end it.
fn archived_size(files: &[FileContent]) -> usize {
    let padded = |bytes: usize| bytes.div_ceil(BLOCK) * BLOCK;
    let entries: usize = files
        .iter()
        .map(|file| {
            let long_name = BLOCK + padded(file.path.len() + 1);
            BLOCK + long_name + padded(file.content.expose_secret().len())
        })
        .sum();
    entries + 2 * BLOCK
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    fn file(path: &str, mode: i32, content: &[u8]) -> FileContent {
        FileContent {
            path: path.to_owned(),
            mode,
            content: content.to_vec().into(),
        }
    }

    #[test]
    fn the_archive_holds_each_file_relative_to_root_with_its_mode_and_never_grows() {
        let long = format!("/etc/{}/token", "d".repeat(150));
        let files = [
            file("/etc/app/token", 0o600, b"s3cret"),
            file(&long, 0o755, &[7; 1500]),
            file("/empty", 0o644, b""),
        ];
        let archive = archive(&files).unwrap();
        let bytes = archive.expose_secret();
        assert_eq!(bytes.capacity(), archived_size(&files), "the buffer grew");
        let mut read = tar::Archive::new(bytes.as_slice());
        let mut seen = Vec::new();
        for entry in read.entries().unwrap() {
            let mut entry = entry.unwrap();
            let header = entry.header();
            let (mode, uid, gid) = (
                header.mode().unwrap(),
                header.uid().unwrap(),
                header.gid().unwrap(),
            );
            let path = entry.path().unwrap().display().to_string();
            let mut content = Vec::new();
            entry.read_to_end(&mut content).unwrap();
            seen.push((path, mode, uid, gid, content));
        }
        let expected: Vec<_> = files
            .iter()
            .map(|f| {
                let path = f.path.trim_start_matches('/').to_owned();
                let mode = f.mode.unsigned_abs();
                (path, mode, 0, 0, f.content.expose_secret().to_vec())
            })
            .collect();
        assert_eq!(seen, expected);
    }

    /// The archive and the command together, with the machine's own tar, as a guest runs
    /// them: relative to the session's `/`, over a file the image already has.
    #[test]
    fn tar_extracts_the_archive_with_the_modes_over_what_is_there() {
        use std::os::unix::fs::PermissionsExt as _;
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("etc")).unwrap();
        std::fs::write(root.path().join("etc/motd"), "from the image").unwrap();
        let files = [
            file("/etc/motd", 0o640, b"from the claim"),
            file("/srv/app/run.sh", 0o750, b"#!/bin/sh\n"),
        ];
        let archive = archive(&files).unwrap();
        let mut tar = std::process::Command::new(EXTRACT[0])
            .args(&EXTRACT[1..])
            .current_dir(root.path())
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut tar.stdin.take().unwrap(), archive.expose_secret()).unwrap();
        assert!(tar.wait().unwrap().success());
        for file in &files {
            let path = root.path().join(file.path.trim_start_matches('/'));
            assert_eq!(std::fs::read(&path).unwrap(), file.content.expose_secret());
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, file.mode.unsigned_abs(), "{}", file.path);
        }
    }

    /// The ServiceAccount directory's script, with the machine's own sh and tar, as a
    /// guest runs it: each file replaced by a rename, so one opened before still reads
    /// whole what it was, and nothing staged is left behind.
    #[test]
    fn the_service_account_files_replace_the_old_ones_by_a_rename() {
        let root = tempfile::tempdir().unwrap();
        let dir = root
            .path()
            .join(battery_types::SERVICE_ACCOUNT_DIR.trim_start_matches('/'));
        let run = |files: &[FileContent]| {
            let archive = archive(files).unwrap();
            let mut sh = std::process::Command::new("sh")
                .args(["-c", &replace_script()])
                .current_dir(root.path())
                .stdin(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            std::io::Write::write_all(&mut sh.stdin.take().unwrap(), archive.expose_secret())
                .unwrap();
            assert!(sh.wait().unwrap().success());
        };
        run(&[
            file("token", 0o644, b"first"),
            file("namespace", 0o644, b"ns"),
        ]);
        let mut held = std::fs::File::open(dir.join("token")).unwrap();
        run(&[file("token", 0o644, b"second")]);
        let mut old = String::new();
        held.read_to_string(&mut old).unwrap();
        assert_eq!(old, "first");
        assert_eq!(std::fs::read(dir.join("token")).unwrap(), b"second");
        assert_eq!(std::fs::read(dir.join("namespace")).unwrap(), b"ns");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }
}
