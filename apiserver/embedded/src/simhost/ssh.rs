//! flintlock's `microvmsshproxy.services.api.v1alpha1.MicroVMSSHProxy` service on the
//! simulated Host: a raw byte stream to the MicroVM's SSH server.
//!
//! Where flintlock relays the stream to the sshd inside the guest, this runs the Host's
//! own OpenSSH `sshd` in inetd mode (`sshd -i`, speaking SSH on its stdin and stdout),
//! one per stream. A real sshd rather than an SSH server library, so that clients meet
//! what a guest's OpenSSH does: its certificate checks, ptys, exit statuses and
//! forwarding.
//!
//! **Like exec, this has no isolation.** The client logs in as a local user of this
//! machine, any user its certificate names (root included), and its session runs with
//! that user's full rights. The session only *starts* in the MicroVM's directory (a
//! ForceCommand `cd`s there); nothing confines it there. The semantics are documented
//! on the parent module.

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use battery_proto::microvmsshproxy::services::api::v1alpha1::micro_vmssh_proxy_server::MicroVmsshProxy;
use battery_proto::microvmsshproxy::services::api::v1alpha1::ssh_proxy_request::Payload;
use battery_proto::microvmsshproxy::services::api::v1alpha1::{SshProxyRequest, SshProxyResponse};
use russh::keys::ssh_key::LineEnding;
use russh::keys::{Algorithm, PrivateKey, PublicKey};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, warn};

use super::error::{RequestError, SimHostError};
use super::host::Host;
use super::registry::ExecTarget;

/// How many sessions (terminals, commands) one SSH connection may hold at once.
pub const SSHD_MAX_SESSIONS: usize = 10;
/// Where Debian's openssh-server installs sshd: looked in after `PATH`, and the sshd a
/// session names as missing when there is none.
const DEBIAN_SSHD_DIR: &str = "/usr/sbin";
/// sshd's privilege separation directory, compiled into it: it refuses to run without
/// it, and `/run` is a tmpfs, so it can be gone after a reboot or in a fresh container.
const PRIVSEP_DIR: &str = "/run/sshd";
/// Responses queued for a slow client before reading sshd's output waits: with
/// `OUTPUT_CHUNK`, at most 256 KiB per session.
const OUTPUT_BUFFER: usize = 4;
/// The most of sshd's output read into one response; SSH packets are at most 32 KiB of
/// payload, so a bulk transfer fills a response with a few of them.
const OUTPUT_CHUNK: usize = 64 * 1024;

type Reply = Result<SshProxyResponse, Status>;

/// Serve flintlock's SSH proxy, as flintlockd does with `--enable-ssh-proxy-api`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshProxyConfig {
    /// The OpenSSH public key (`ssh-ed25519 AAAA… comment`) of the user CA whose
    /// certificates the MicroVMs' sshd accepts, as its `TrustedUserCAKeys`. A
    /// certificate's principals are the local users it may log in as.
    pub user_ca_public_key: String,
    /// The OpenSSH sshd each session runs, by an absolute path (sshd re-executes itself
    /// by the path it was started with); `None` runs [`find_sshd`]'s, looked for as each
    /// session starts, so one installed while the Host runs serves the next session.
    pub sshd: Option<PathBuf>,
}

/// OpenSSH's sshd on this machine: the first `sshd` executable in an absolute directory
/// of `PATH`, else in `/usr/sbin` (where Debian's openssh-server puts it, outside a
/// user's `PATH`); `None` when there is none.
pub fn find_sshd() -> Option<PathBuf> {
    find_sshd_in(
        std::env::var_os("PATH").as_deref(),
        Path::new(DEBIAN_SSHD_DIR),
    )
}

/// [`find_sshd`] in the directories of `path` (a `PATH` value), then `fallback`. A
/// relative directory of `PATH` is skipped: sshd needs an absolute path, and one that
/// depends on the working directory is no choice of the user's.
fn find_sshd_in(path: Option<&std::ffi::OsStr>, fallback: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    path.into_iter()
        .flat_map(std::env::split_paths)
        .filter(|dir| dir.is_absolute())
        .chain(std::iter::once(fallback.to_owned()))
        .map(|dir| dir.join("sshd"))
        .find(|sshd| {
            std::fs::metadata(sshd)
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
}

/// What every session's sshd shares: its host key and configuration, in a directory
/// that lives as long as the Host serves and any session runs.
pub(super) struct SshProxy {
    /// The configured sshd; `None` finds one for each session.
    sshd: Option<PathBuf>,
    dir: TempDir,
    config: PathBuf,
    host_key: PathBuf,
    /// Numbers the sessions' log files.
    sessions: AtomicU64,
}

impl SshProxy {
    /// Generates the host key and writes sshd's configuration, trusting `config`'s CA.
    pub(super) fn prepare(config: &SshProxyConfig) -> Result<Self, SimHostError> {
        // Checked here, since sshd would only log an unreadable key and refuse everyone.
        let sshd = config.sshd.clone();
        let user_ca = PublicKey::from_openssh(config.user_ca_public_key.trim())
            .map_err(|error| SimHostError::UserCaKey(error.into()))?;
        let dir = tempfile::Builder::new()
            .prefix("simhost-sshd-")
            .tempdir()
            .map_err(|source| setup_error(std::env::temp_dir(), source))?;

        // A new key per Host: nothing pins it, as nothing pins a fresh guest's.
        // write_openssh_file creates it 0600, without which sshd ignores it.
        let host_key = dir.path().join("host_key");
        PrivateKey::random(&mut russh::keys::key::safe_rng(), Algorithm::Ed25519)
            .and_then(|key| key.write_openssh_file(&host_key, LineEnding::LF))
            .map_err(|source| setup_error(&host_key, source))?;

        let user_ca_file = dir.path().join("user_ca.pub");
        let user_ca_line = user_ca
            .to_openssh()
            .map_err(|source| setup_error(&user_ca_file, source))?;
        std::fs::write(&user_ca_file, user_ca_line + "\n")
            .map_err(|source| setup_error(&user_ca_file, source))?;

        let config = dir.path().join("sshd_config");
        let text = sshd_config(&user_ca_file).map_err(|source| setup_error(&config, source))?;
        std::fs::write(&config, text).map_err(|source| setup_error(&config, source))?;
        Ok(Self {
            sshd,
            dir,
            config,
            host_key,
            sessions: AtomicU64::new(0),
        })
    }

    /// How many sessions [`Self::spawn`] has started.
    pub(super) fn sessions_started(&self) -> u64 {
        self.sessions.load(Ordering::Relaxed)
    }

    /// Starts an sshd for one session, its shell and commands starting in `workdir`.
    fn spawn(&self, workdir: &Path) -> Result<Session, RequestError> {
        // Checked first, so a Host without sshd says what to install rather than how
        // it failed to start it.
        let sshd = match &self.sshd {
            Some(sshd) if sshd.is_file() => sshd.clone(),
            Some(sshd) => return Err(RequestError::SshdMissing { path: sshd.clone() }),
            None => find_sshd().ok_or_else(|| RequestError::SshdMissing {
                path: Path::new(DEBIAN_SSHD_DIR).join("sshd"),
            })?,
        };
        create_privsep_dir()?;
        let number = self.sessions.fetch_add(1, Ordering::Relaxed);
        let log = self.dir.path().join(format!("sshd-{number}.log"));
        let child = Command::new(&sshd)
            .arg("-i")
            .arg("-f")
            .arg(&self.config)
            .arg("-h")
            .arg(&self.host_key)
            .arg("-E")
            .arg(&log)
            .arg("-o")
            .arg(force_command(workdir))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // With -E, sshd logs to its file; stderr would only mix into the Host's.
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| RequestError::StartSshd { path: sshd, source })?;
        Ok(Session { child, log })
    }
}

fn setup_error(
    path: impl Into<PathBuf>,
    source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> SimHostError {
    SimHostError::SshProxySetup {
        path: path.into(),
        source: source.into(),
    }
}

/// sshd's configuration: certificates of the user CA are the only way in, and logins
/// get ptys and forwarding, as on a guest. `StrictModes no` because the temp directory's
/// ancestors are not all owned by the user logging in. `MaxSessions` is OpenSSH's
/// default, said so that tests of a connection's limit do not rest on a build's.
fn sshd_config(user_ca_file: &Path) -> io::Result<String> {
    Ok(format!(
        "PidFile none\n\
         TrustedUserCAKeys {}\n\
         AuthorizedKeysFile none\n\
         PubkeyAuthentication yes\n\
         PasswordAuthentication no\n\
         KbdInteractiveAuthentication no\n\
         UsePAM no\n\
         PermitRootLogin prohibit-password\n\
         AllowTcpForwarding yes\n\
         PermitTTY yes\n\
         MaxSessions {SSHD_MAX_SESSIONS}\n\
         StrictModes no\n\
         LogLevel INFO\n",
        config_word(user_ca_file)?
    ))
}

/// `path` as one word of an sshd_config line: double-quoted, with `\` and `"` escaped,
/// so a temp directory with spaces still works.
fn config_word(path: &Path) -> io::Result<String> {
    let Some(text) = path.to_str() else {
        return Err(io::Error::other(
            "sshd_config cannot name a path that is not UTF-8",
        ));
    };
    if text.contains(['\n', '\r']) {
        return Err(io::Error::other(
            "sshd_config cannot name a path with a line break",
        ));
    }
    Ok(format!(
        "\"{}\"",
        text.replace('\\', "\\\\").replace('"', "\\\"")
    ))
}

/// The `-o ForceCommand=…` that starts every session in `workdir`, then runs what the
/// client asked for (in `SSH_ORIGINAL_COMMAND`) or, for a shell session, a login shell.
/// sshd runs it with the user's shell, so it is shell text.
fn force_command(workdir: &Path) -> OsString {
    let mut option = b"ForceCommand=cd ".to_vec();
    option.extend(shell_quote(workdir.as_os_str().as_bytes()));
    option.extend_from_slice(
        br#" || exit 1; if [ -n "$SSH_ORIGINAL_COMMAND" ]; then eval "$SSH_ORIGINAL_COMMAND"; else exec "${SHELL:-/bin/sh}" -l; fi"#,
    );
    OsString::from_vec(option)
}

/// `word` in single quotes, each `'` in it written `'\''`: the shell takes it as one
/// word, whatever it holds.
fn shell_quote(word: &[u8]) -> Vec<u8> {
    let mut quoted = Vec::with_capacity(word.len() + 2);
    quoted.push(b'\'');
    for &byte in word {
        if byte == b'\'' {
            quoted.extend_from_slice(br"'\''");
        } else {
            quoted.push(byte);
        }
    }
    quoted.push(b'\'');
    quoted
}

fn create_privsep_dir() -> Result<(), RequestError> {
    match std::fs::DirBuilder::new().mode(0o755).create(PRIVSEP_DIR) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(RequestError::SshdPrivsepDir {
            path: PRIVSEP_DIR.into(),
            source,
        }),
    }
}

/// One stream's sshd.
struct Session {
    child: Child,
    log: PathBuf,
}

pub(super) struct SshProxyService {
    host: Arc<Host>,
    proxy: Arc<SshProxy>,
}

impl SshProxyService {
    pub(super) fn new(host: Arc<Host>, proxy: Arc<SshProxy>) -> Self {
        Self { host, proxy }
    }
}

#[tonic::async_trait]
impl MicroVmsshProxy for SshProxyService {
    type SSHProxyStream = ReceiverStream<Reply>;

    async fn ssh_proxy(
        &self,
        request: Request<Streaming<SshProxyRequest>>,
    ) -> Result<Response<Self::SSHProxyStream>, Status> {
        let mut requests = request.into_inner();
        let Some(SshProxyRequest {
            payload: Some(Payload::Uid(uid)),
        }) = requests.message().await?
        else {
            return Err(RequestError::UidFirst.into());
        };
        let target = self.host.registry.exec_target(&uid)?;
        let session = self.proxy.spawn(&target.scratch_dir)?;
        debug!(host = %self.host.name, uid, log = %session.log.display(), "simulated ssh session");
        let (replies, stream) = mpsc::channel(OUTPUT_BUFFER);
        tokio::spawn(relay(
            uid,
            target,
            session,
            Arc::clone(&self.proxy),
            requests,
            replies,
        ));
        Ok(Response::new(ReceiverStream::new(stream)))
    }
}

/// How a session ended.
enum End {
    /// sshd exited and all it wrote was sent.
    Finished,
    /// The stream ends with this error.
    Failed(RequestError),
    /// Nobody is listening any more.
    ClientGone,
}

/// Relays one stream to its sshd until the session ends. `_proxy` keeps sshd's files
/// until it has exited.
async fn relay(
    uid: String,
    target: ExecTarget,
    mut session: Session,
    _proxy: Arc<SshProxy>,
    requests: Streaming<SshProxyRequest>,
    replies: mpsc::Sender<Reply>,
) {
    match run(&uid, &target, &mut session, requests, &replies).await {
        End::Finished => debug!(uid, "ssh session ended"),
        End::ClientGone => debug!(uid, "ssh client gone"),
        End::Failed(error) => {
            // Best effort: a client too slow to take it is cut off without it rather
            // than holding up a delete or a shutdown.
            if replies.try_send(Err(error.into())).is_err() {
                debug!(uid, "ssh client gone before the error");
            }
        }
    }
    // `target` is dropped only now, so a delete waits until sshd is gone.
}

/// Runs the session to its end. When this returns, sshd has exited and been reaped.
async fn run(
    uid: &str,
    target: &ExecTarget,
    session: &mut Session,
    requests: Streaming<SshProxyRequest>,
    replies: &mpsc::Sender<Reply>,
) -> End {
    let inbound = pump_in(requests, session.child.stdin.take());
    let outbound = pump_out(session.child.stdout.take(), replies.clone());
    tokio::pin!(inbound, outbound);
    let mut inbound_done = false;
    let mut output: Option<Output> = None;
    let mut exit: Option<ExitStatus> = None;

    let end = loop {
        if let (Some(status), Some(output)) = (exit, output) {
            break match output {
                Output::Ended { sent_any: false } if !status.success() => {
                    End::Failed(RequestError::SshdFailed {
                        status: status.to_string(),
                        log: session.log.clone(),
                    })
                }
                Output::Ended { .. } => End::Finished,
                Output::ClientGone => End::ClientGone,
            };
        }
        tokio::select! {
            biased;
            () = target.cancel.cancelled() => break End::Failed(interruption(target, uid)),
            () = replies.closed() => break End::ClientGone,
            ended = &mut inbound, if !inbound_done => {
                inbound_done = true;
                match ended {
                    // sshd reads end of file, ends the session and exits.
                    Inbound::HalfClosed => {}
                    Inbound::Invalid(error) => break End::Failed(error),
                    Inbound::ClientGone => break End::ClientGone,
                }
            }
            ended = &mut outbound, if output.is_none() => output = Some(ended),
            status = session.child.wait(), if exit.is_none() => match status {
                Ok(status) => exit = Some(status),
                Err(error) => break End::Failed(RequestError::WaitCommand(error)),
            },
        }
    };
    if exit.is_none() {
        // Its privilege-separated children hold the other ends of the pipes, which are
        // closed when this returns, so they end too.
        if let Err(error) = session.child.start_kill() {
            warn!(uid, %error, "killing sshd failed");
        }
        if let Err(error) = session.child.wait().await {
            warn!(uid, %error, "reaping sshd failed");
        }
    }
    end
}

fn interruption(target: &ExecTarget, uid: &str) -> RequestError {
    if target.host_shutdown.is_cancelled() {
        RequestError::ShuttingDown
    } else {
        RequestError::DeletedDuringSsh(uid.to_owned())
    }
}

/// How the client's side of the stream ended.
enum Inbound {
    HalfClosed,
    Invalid(RequestError),
    ClientGone,
}

/// Writes the client's `data` to sshd until the client half-closes; then closes sshd's
/// stdin, by dropping it.
async fn pump_in(
    mut requests: Streaming<SshProxyRequest>,
    mut stdin: Option<ChildStdin>,
) -> Inbound {
    loop {
        let request = match requests.message().await {
            Ok(Some(request)) => request,
            Ok(None) => return Inbound::HalfClosed,
            Err(status) => {
                debug!(%status, "ssh proxy request stream broke");
                return Inbound::ClientGone;
            }
        };
        match request.payload {
            Some(Payload::Data(data)) => {
                if let Some(pipe) = stdin.as_mut()
                    && pipe.write_all(&data).await.is_err()
                {
                    // sshd stopped reading: it is exiting, which ends the session. The
                    // client's data is drained meanwhile so its stream does not stall.
                    stdin = None;
                }
            }
            Some(Payload::Uid(_)) => return Inbound::Invalid(RequestError::UidRepeated),
            None => return Inbound::Invalid(RequestError::EmptyRequest),
        }
    }
}

/// How sshd's output ended.
#[derive(Clone, Copy)]
enum Output {
    /// Read to its end; `sent_any` tells whether sshd wrote anything at all.
    Ended {
        sent_any: bool,
    },
    ClientGone,
}

/// Sends what sshd writes to the client, a chunk a response. A full channel stops the
/// reading, so a client that stops reading stops sshd at a full pipe.
async fn pump_out(stdout: Option<ChildStdout>, replies: mpsc::Sender<Reply>) -> Output {
    let mut sent_any = false;
    let Some(mut stdout) = stdout else {
        return Output::Ended { sent_any };
    };
    let mut buffer = vec![0; OUTPUT_CHUNK];
    loop {
        let read = match stdout.read(&mut buffer).await {
            Ok(0) => return Output::Ended { sent_any },
            Ok(read) => read,
            Err(error) => {
                // Ends the output the same way for the client.
                debug!(%error, "reading sshd's output failed");
                return Output::Ended { sent_any };
            }
        };
        let data = buffer[..read].to_vec();
        if replies.send(Ok(SshProxyResponse { data })).await.is_err() {
            return Output::ClientGone;
        }
        sent_any = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting_keeps_one_word() {
        assert_eq!(shell_quote(b"/state/u"), b"'/state/u'");
        assert_eq!(shell_quote(b"it's $HOME"), br"'it'\''s $HOME'");
    }

    #[test]
    fn force_command_starts_in_the_directory() {
        let option = force_command(Path::new("/state/microvms/u"));
        let text = option.to_str().expect("utf-8");
        assert!(
            text.starts_with("ForceCommand=cd '/state/microvms/u' || exit 1; "),
            "{text}"
        );
    }

    #[test]
    fn config_paths_are_quoted() {
        assert_eq!(
            config_word(Path::new("/tmp/a b/\"c\"")).expect("quoted"),
            r#""/tmp/a b/\"c\"""#
        );
        assert!(config_word(Path::new("/tmp/a\nb")).is_err());
    }

    #[test]
    fn sshd_is_looked_for_in_path_then_the_fallback() {
        use std::os::unix::fs::PermissionsExt as _;
        let dirs = tempfile::tempdir().expect("temp dir");
        let dir = |name: &str| {
            let dir = dirs.path().join(name);
            std::fs::create_dir(&dir).expect("dir");
            dir
        };
        let (empty, first, second, fallback) =
            (dir("empty"), dir("first"), dir("second"), dir("sbin"));
        let sshd = |dir: &Path, mode: u32| {
            let sshd = dir.join("sshd");
            std::fs::write(&sshd, "").expect("sshd");
            std::fs::set_permissions(&sshd, std::fs::Permissions::from_mode(mode)).expect("mode");
            sshd
        };
        let path = |dirs: &[&Path]| std::env::join_paths(dirs).expect("PATH");

        assert_eq!(find_sshd_in(Some(&path(&[&empty])), &fallback), None);
        assert_eq!(find_sshd_in(None, &fallback), None);
        let in_fallback = sshd(&fallback, 0o755);
        assert_eq!(
            find_sshd_in(Some(&path(&[&empty])), &fallback),
            Some(in_fallback.clone())
        );
        assert_eq!(find_sshd_in(None, &fallback), Some(in_fallback));
        // Not executable: no sshd.
        sshd(&second, 0o644);
        let in_path = sshd(&first, 0o755);
        assert_eq!(
            find_sshd_in(Some(&path(&[&empty, &second, &first])), &fallback),
            Some(in_path)
        );
        // A relative directory of PATH is never taken.
        assert_eq!(
            find_sshd_in(Some(std::ffi::OsStr::new("first")), &empty),
            None
        );
    }

    #[test]
    fn a_bad_user_ca_key_is_refused_at_start() {
        let config = SshProxyConfig {
            user_ca_public_key: "not a key".to_owned(),
            sshd: None,
        };
        assert!(matches!(
            SshProxy::prepare(&config),
            Err(SimHostError::UserCaKey(_))
        ));
    }
}
