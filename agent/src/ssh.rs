//! Sessions with a terminal and forwarded ports (ADR 33): flintlock's `MicroVMExec` has
//! no PTY and no ports, so the agent logs in to the guest's sshd over flintlockd's
//! `MicroVMSSHProxy.SSHProxy` byte stream, and runs the command there on a PTY or opens a
//! `direct-tcpip` channel to the port.
//!
//! The agent authenticates with an SSH user certificate the API server signs for the key
//! below, beside its serving certificate (`hosts/<name>/certificate`); the key never
//! leaves the process. The guest's host key is not checked: the stream reaches the
//! MicroVM of that uid through flintlockd, which the agent authenticated with mTLS, so
//! the channel already names the guest, as `kubectl exec`'s path through kubelet does.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use battery_proto::agent::v1alpha1::TerminalSize;
use battery_proto::microvmsshproxy::services::api::v1alpha1::{SshProxyRequest, ssh_proxy_request};
use russh::client::{self, Handle};
use russh::keys::ssh_key::{Certificate, PrivateKey};
use russh::keys::{Algorithm, PublicKeyOrCertificate};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tracing::debug;

use crate::flintlock::Flintlock;

/// The guest user the certificate names (`SSH_PRINCIPAL` on the API server).
const GUEST_USER: &str = "root";
/// Bytes between the SSH client and the gRPC stream, each way.
const PIPE_BYTES: usize = 64 * 1024;
/// Messages of the guest's bytes queued towards flintlockd.
const PROXY_BUFFER: usize = 4;
/// The terminal a PTY starts as when the client never says its size.
pub const DEFAULT_SIZE: TerminalSize = TerminalSize {
    width: 80,
    height: 24,
};
/// Where forwarded connections go in the guest, and say they come from.
const GUEST_LOOPBACK: &str = "127.0.0.1";
/// What `TERM` the guest's programs see: what kubectl's and ssh's terminals are.
const TERM: &str = "xterm-256color";

/// The agent's SSH key, and the certificate the API server last signed for it.
pub struct SshIdentity {
    key: Arc<PrivateKey>,
    certificate: RwLock<Option<Certificate>>,
}

impl std::fmt::Debug for SshIdentity {
    // The private key: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshIdentity").finish_non_exhaustive()
    }
}

impl SshIdentity {
    /// A new Ed25519 key, without a certificate yet.
    pub fn generate() -> Result<Self, russh::keys::ssh_key::Error> {
        let key = PrivateKey::random(&mut russh::keys::key::safe_rng(), Algorithm::Ed25519)?;
        Ok(Self {
            key: Arc::new(key),
            certificate: RwLock::new(None),
        })
    }

    /// The public key, one line, for the API server to certify.
    pub fn public_key(&self) -> String {
        self.key.public_key().to_openssh().unwrap_or_default()
    }

    /// Keeps the certificate the API server signed; an empty or unreadable one (a server
    /// without an SSH CA) leaves the agent without one, which refuses terminals.
    pub fn set_certificate(&self, text: &str) {
        let certificate = if text.is_empty() {
            None
        } else {
            Certificate::from_openssh(text)
                .inspect_err(|error| tracing::warn!(%error, "the API server's SSH certificate"))
                .ok()
        };
        *self.certificate.write().unwrap_or_else(|e| e.into_inner()) = certificate;
    }

    fn login(&self) -> Option<(Arc<PrivateKey>, Certificate)> {
        let certificate = self
            .certificate
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        Some((self.key.clone(), certificate))
    }
}

/// russh's callbacks: the host key is taken as the channel names it (see above). Public
/// for the simulated Host's SSH tests, which reach a guest the same way.
pub struct Guest;

impl client::Handler for Guest {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        _key: &PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        Ok(true)
    }
}

/// An SSH connection to a MicroVM's sshd, logged in.
pub struct Login {
    handle: Handle<Guest>,
}

/// The agent's logged-in connections to guests, one per MicroVM, each shared by the
/// terminals and forwarded connections opened into that MicroVM as channels: only the
/// first pays the login (flintlockd's proxy stream, a key exchange, the certificate
/// checked, an sshd session). A connection that broke is replaced; one no new channel
/// asked for in [`IDLE`] is let go, and closes once its last channel has.
#[derive(Clone)]
pub struct Logins {
    flintlock: Flintlock,
    identity: Arc<SshIdentity>,
    shared: moka::future::Cache<String, Arc<Login>>,
}

/// How long a connection no new channel asked for stays open.
const IDLE: Duration = Duration::from_secs(60);
/// The most connections kept for sharing: one per MicroVM on the Host, with room.
const MAX_SHARED: u64 = 4096;

impl std::fmt::Debug for Logins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Logins")
            .field("connections", &self.shared.entry_count())
            .finish_non_exhaustive()
    }
}

/// A channel into a guest, and the connection it rides on. Its user closes the channel
/// when done ([`russh::Channel::close`]): the connection outlives it, and a channel only
/// dropped stays open in the guest, a terminal's shell with it.
pub struct Opened {
    pub channel: russh::Channel<client::Msg>,
    /// Held until the channel is closed, so that the connection stays up while it is
    /// used even if [`Logins`] has let it go.
    pub connection: Arc<Login>,
}

/// Why no channel opened.
#[derive(Debug)]
pub enum OpenError {
    /// No login: a gRPC status for the API server to refuse the session with.
    Login(Status),
    /// Logged in, but the guest refused the channel.
    Channel(russh::Error),
}

/// What channel to open.
#[derive(Clone, Copy)]
enum Kind {
    /// A session, for a command on a terminal.
    Session,
    /// `direct-tcpip` to a port on the guest's loopback.
    Port(u16),
}

impl Logins {
    pub fn new(flintlock: Flintlock, identity: Arc<SshIdentity>) -> Self {
        Self {
            flintlock,
            identity,
            shared: moka::future::Cache::builder()
                .max_capacity(MAX_SHARED)
                .time_to_idle(IDLE)
                .build(),
        }
    }

    /// A session channel in the MicroVM `uid`, for a command on a terminal.
    pub async fn open_session(&self, uid: &str) -> Result<Opened, OpenError> {
        self.open(uid, Kind::Session).await
    }

    /// A TCP connection to `port` on the guest's loopback (`direct-tcpip`).
    pub async fn open_port(&self, uid: &str, port: u16) -> Result<Opened, OpenError> {
        self.open(uid, Kind::Port(port)).await
    }

    async fn open(&self, uid: &str, kind: Kind) -> Result<Opened, OpenError> {
        let login = self.shared(uid).await.map_err(OpenError::Login)?;
        let error = match login.open(kind).await {
            Ok(channel) => {
                return Ok(Opened {
                    channel,
                    connection: login,
                });
            }
            Err(error) => error,
        };
        let login = if login.handle.is_closed() {
            // The connection broke (the guest's sshd or flintlockd's stream ended):
            // `shared` sees it closed and logs in anew, for everyone.
            debug!(uid, %error, "the shared SSH connection to the guest broke");
            self.shared(uid).await.map_err(OpenError::Login)?
        } else if matches!(
            (kind, &error),
            (Kind::Session, russh::Error::ChannelOpenFailure(_))
        ) {
            // sshd allows a connection some sessions at once (`MaxSessions`, 10 by
            // default), and refuses more (OpenSSH says "connect failed"): past that, this
            // session gets a connection of its own.
            debug!(uid, %error, "the guest's sshd took no more sessions on the shared connection");
            Arc::new(
                login_to(&self.flintlock, &self.identity, uid)
                    .await
                    .map_err(OpenError::Login)?,
            )
        } else {
            return Err(OpenError::Channel(error));
        };
        let channel = login.open(kind).await.map_err(OpenError::Channel)?;
        Ok(Opened {
            channel,
            connection: login,
        })
    }

    /// The MicroVM's shared connection, logged in when there is none or it broke; one
    /// login for all who ask at once.
    async fn shared(&self, uid: &str) -> Result<Arc<Login>, Status> {
        if let Some(login) = self.shared.get(uid).await {
            if !login.handle.is_closed() {
                return Ok(login);
            }
            self.shared.invalidate(uid).await;
        }
        self.shared
            .try_get_with_by_ref(uid, async {
                login_to(&self.flintlock, &self.identity, uid)
                    .await
                    .map(Arc::new)
            })
            .await
            .map_err(|status| Status::clone(&status))
    }
}

/// Logs in to the sshd of the MicroVM `uid` through flintlockd's SSH proxy. Errors are
/// gRPC statuses for the API server to refuse the session with.
async fn login_to(
    flintlock: &Flintlock,
    identity: &SshIdentity,
    uid: &str,
) -> Result<Login, Status> {
    let (key, certificate) = identity.login().ok_or_else(|| {
        Status::failed_precondition(
            "a terminal needs an SSH certificate, and the API server signed none for this \
             agent: start it with --agent-ssh-ca-key-file",
        )
    })?;
    let (to_guest, requests) = mpsc::channel(PROXY_BUFFER);
    let first = SshProxyRequest {
        payload: Some(ssh_proxy_request::Payload::Uid(uid.to_owned())),
    };
    // Room for one: the channel is new.
    to_guest
        .try_send(first)
        .map_err(|_| Status::internal("queueing the SSH proxy's uid failed"))?;
    let mut from_guest = flintlock
        .ssh_proxy(ReceiverStream::new(requests))
        .await
        .map_err(|status| {
            Status::new(
                status.code(),
                format!("flintlockd's SSH proxy: {}", status.message()),
            )
        })?;
    // russh reads and writes a byte stream; the proxy is a stream of messages.
    let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
    let (mut read_theirs, mut write_theirs) = tokio::io::split(theirs);
    tokio::spawn(async move {
        while let Ok(Some(message)) = from_guest.message().await {
            if write_theirs.write_all(&message.data).await.is_err() {
                return;
            }
        }
        debug!("flintlockd's SSH proxy stream ended");
        let _ = write_theirs.shutdown().await;
    });
    tokio::spawn(async move {
        let mut buffer = vec![0; PIPE_BYTES];
        while let Ok(read) = read_theirs.read(&mut buffer).await {
            if read == 0 {
                return;
            }
            let data = SshProxyRequest {
                payload: Some(ssh_proxy_request::Payload::Data(buffer[..read].to_vec())),
            };
            if to_guest.send(data).await.is_err() {
                return;
            }
        }
    });
    let config = Arc::new(client::Config {
        // The session's own end is the client's or the command's; a dead proxy shows as
        // a failed keepalive.
        keepalive_interval: Some(Duration::from_secs(30)),
        nodelay: true,
        ..client::Config::default()
    });
    let mut handle = client::connect_stream(config, ours, Guest)
        .await
        .map_err(|error| Status::unavailable(format!("SSH to the MicroVM's sshd: {error}")))?;
    let authenticated = handle
        .authenticate_openssh_cert(GUEST_USER, key, certificate)
        .await
        .map_err(|error| Status::unavailable(format!("SSH to the MicroVM's sshd: {error}")))?;
    if !authenticated.success() {
        return Err(Status::permission_denied(
            "the MicroVM's sshd refused the agent's SSH certificate: the guest image must \
             trust battery's SSH user CA (TrustedUserCAKeys) and permit root's login by key",
        ));
    }
    Ok(Login { handle })
}

impl Login {
    async fn open(&self, kind: Kind) -> Result<russh::Channel<client::Msg>, russh::Error> {
        match kind {
            Kind::Session => self.handle.channel_open_session().await,
            Kind::Port(port) => {
                self.handle
                    .channel_open_direct_tcpip(GUEST_LOOPBACK, port.into(), GUEST_LOOPBACK, 0)
                    .await
            }
        }
    }
}

/// Runs `command` (already a shell command line) on a PTY of `size` on `channel`, a
/// session channel.
pub async fn run_on_terminal(
    channel: &russh::Channel<client::Msg>,
    command: &str,
    size: TerminalSize,
) -> Result<(), russh::Error> {
    channel
        .request_pty(false, TERM, size.width, size.height, 0, 0, &[])
        .await?;
    channel.exec(true, command).await
}

/// argv as one shell command line, each word quoted, run in `working_dir` (when given)
/// with `env` set: SSH carries a command as a string the guest's shell parses.
pub fn command_line(
    argv: &[String],
    env: &std::collections::HashMap<String, String>,
    working_dir: &str,
) -> String {
    let mut line = String::new();
    if !working_dir.is_empty() {
        line.push_str("cd ");
        line.push_str(&quote(working_dir));
        line.push_str(" && ");
    }
    line.push_str("exec");
    if !env.is_empty() {
        let mut pairs: Vec<_> = env.iter().collect();
        pairs.sort();
        line.push_str(" env");
        for (name, value) in pairs {
            line.push(' ');
            line.push_str(&quote(&format!("{name}={value}")));
        }
        // A program whose name has a `=` is not an assignment.
        line.push_str(" --");
    }
    for word in argv {
        line.push(' ');
        line.push_str(&quote(word));
    }
    line
}

/// `word` in single quotes, each `'` in it closed, escaped and reopened.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn argv_is_quoted_word_by_word() {
        let argv = ["sh", "-c", "echo 'hi' $HOME"].map(str::to_owned);
        assert_eq!(
            command_line(&argv, &HashMap::new(), ""),
            r#"exec 'sh' '-c' 'echo '\''hi'\'' $HOME'"#
        );
        let env = HashMap::from([
            ("B".to_owned(), "2".to_owned()),
            ("A".to_owned(), "x y".to_owned()),
        ]);
        assert_eq!(
            command_line(&["ls".to_owned()], &env, "/srv/it's"),
            r#"cd '/srv/it'\''s' && exec env 'A=x y' 'B=2' -- 'ls'"#
        );
    }

    #[test]
    fn a_certificate_is_kept_only_when_it_reads() {
        let identity = SshIdentity::generate().unwrap();
        assert!(identity.public_key().starts_with("ssh-ed25519 "));
        identity.set_certificate("not a certificate");
        assert!(identity.login().is_none());
        assert!(!format!("{identity:?}").contains("PRIVATE"));
    }
}
