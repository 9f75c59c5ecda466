//! The simulated Host's MicroVMSSHProxy: a real SSH client (russh) through the gRPC
//! stream to the Host's OpenSSH sshd, logging in with a user certificate.
//!
//! Needs `/usr/sbin/sshd` (`scripts/install-test-tools` installs it) and root, as the
//! tests run: the certificate's principal is `root`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use battery_agent::ssh::Guest;
use battery_embedded::simhost::testing::{connect, create_microvm};
use battery_embedded::simhost::{SimulatedHost, SimulatedHostConfig, SshProxyConfig};
use battery_proto::microvm::services::api::v1alpha1::DeleteMicroVmRequest;
use battery_proto::microvm::services::api::v1alpha1::micro_vm_client::MicroVmClient;
use battery_proto::microvmsshproxy::services::api::v1alpha1::micro_vmssh_proxy_client::MicroVmsshProxyClient;
use battery_proto::microvmsshproxy::services::api::v1alpha1::ssh_proxy_request::Payload;
use battery_proto::microvmsshproxy::services::api::v1alpha1::{SshProxyRequest, SshProxyResponse};
use russh::client::{self, AuthResult};
use russh::keys::ssh_key::certificate::{Builder, CertType};
use russh::keys::{Algorithm, Certificate, PrivateKey};
use russh::{ChannelMsg, Disconnect};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

/// How long any awaited condition may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(20);
const SSHD: &str = "/usr/sbin/sshd";

struct Fixture {
    dir: TempDir,
    host: SimulatedHost,
    channel: Channel,
    microvms: MicroVmClient<Channel>,
}

impl Fixture {
    async fn start(ssh_proxy: Option<SshProxyConfig>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let host = SimulatedHost::start(SimulatedHostConfig {
            state_dir: dir.path().to_owned(),
            ssh_proxy,
            ..SimulatedHostConfig::default()
        })
        .await
        .expect("simulated host starts");
        let channel = connect(&host).await;
        Self {
            dir,
            host,
            microvms: MicroVmClient::new(channel.clone()),
            channel,
        }
    }

    /// sshd present, a Host serving SSHProxy for a new user CA, and a MicroVM on it.
    async fn booted_with_ssh() -> (UserCa, Self, String) {
        require_sshd();
        let ca = UserCa::new();
        let fixture = Self::start(Some(ca.config())).await;
        let uid = fixture.created("vm").await;
        (ca, fixture, uid)
    }

    /// A MicroVM in state CREATED.
    async fn created(&self, id: &str) -> String {
        create_microvm(&self.host, id).await
    }

    fn scratch_dir(&self, uid: &str) -> PathBuf {
        self.dir.path().join("microvms").join(uid)
    }

    /// Opens SSHProxy: sends `first`, and answers the call's outcome with the sender
    /// of the rest of the requests.
    async fn open(
        &self,
        first: SshProxyRequest,
    ) -> Result<(mpsc::Sender<SshProxyRequest>, Streaming<SshProxyResponse>), Status> {
        let (requests, stream) = mpsc::channel(16);
        requests.send(first).await.expect("first request queued");
        let responses = MicroVmsshProxyClient::new(self.channel.clone())
            .ssh_proxy(ReceiverStream::new(stream))
            .await?
            .into_inner();
        Ok((requests, responses))
    }

    /// An SSH connection to MicroVM `uid` as `root` with `key` and its `certificate`,
    /// and whether sshd took them.
    async fn login(
        &self,
        uid: &str,
        key: PrivateKey,
        certificate: Certificate,
    ) -> (client::Handle<Guest>, AuthResult) {
        let mut session = self.connect(uid).await;
        let auth = session
            .authenticate_openssh_cert("root", Arc::new(key), certificate)
            .await
            .expect("authentication ran");
        (session, auth)
    }

    /// An SSH connection to MicroVM `uid` through SSHProxy, carried by an in-memory pipe.
    async fn connect(&self, uid: &str) -> client::Handle<Guest> {
        let (requests, responses) = self
            .open(uid_request(uid))
            .await
            .expect("ssh proxy stream opened");
        let transport = bridge(requests, responses);
        client::connect_stream(Arc::new(client::Config::default()), transport, Guest)
            .await
            .expect("ssh handshake")
    }
}

/// How the stream ends, past whatever it still carries; fails the test after [`DEADLINE`].
async fn stream_end(
    responses: &mut Streaming<SshProxyResponse>,
) -> Result<Option<SshProxyResponse>, Status> {
    tokio::time::timeout(DEADLINE, async {
        loop {
            match responses.message().await {
                Ok(Some(_)) => {}
                other => break other,
            }
        }
    })
    .await
    .expect("the stream ended in time")
}

fn uid_request(uid: &str) -> SshProxyRequest {
    SshProxyRequest {
        payload: Some(Payload::Uid(uid.to_owned())),
    }
}

/// The gRPC stream as one AsyncRead + AsyncWrite: what the client writes becomes `data`
/// requests, and response `data` is what it reads.
fn bridge(
    requests: mpsc::Sender<SshProxyRequest>,
    mut responses: Streaming<SshProxyResponse>,
) -> DuplexStream {
    let (ours, theirs) = tokio::io::duplex(64 * 1024);
    let (mut from_client, mut to_client) = tokio::io::split(theirs);
    tokio::spawn(async move {
        let mut buffer = vec![0; 32 * 1024];
        loop {
            match from_client.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(read) => {
                    let data = buffer[..read].to_vec();
                    let request = SshProxyRequest {
                        payload: Some(Payload::Data(data)),
                    };
                    if requests.send(request).await.is_err() {
                        break;
                    }
                }
            }
        }
        // Dropping `requests` half-closes the stream.
    });
    tokio::spawn(async move {
        while let Ok(Some(response)) = responses.message().await {
            if to_client.write_all(&response.data).await.is_err() {
                break;
            }
        }
        // Dropping `to_client` is end of file for the SSH client.
    });
    ours
}

struct UserCa {
    ca: PrivateKey,
}

impl UserCa {
    fn new() -> Self {
        let ca = PrivateKey::random(&mut russh::keys::key::safe_rng(), Algorithm::Ed25519)
            .expect("CA key");
        Self { ca }
    }

    fn config(&self) -> SshProxyConfig {
        SshProxyConfig {
            user_ca_public_key: self.ca.public_key().to_openssh().expect("CA public key"),
            sshd: None,
        }
    }

    /// A new user key and its certificate for `principal`, valid from a minute ago
    /// (clock skew) for an hour, with a pty and port forwarding allowed.
    fn user(&self, principal: &str) -> (PrivateKey, Certificate) {
        let mut rng = russh::keys::key::safe_rng();
        let key = PrivateKey::random(&mut rng, Algorithm::Ed25519).expect("user key");
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after the epoch")
            .as_secs();
        let mut builder = Builder::new_with_random_nonce(
            &mut rng,
            key.public_key().key_data().clone(),
            now - 60,
            now + 3600,
        )
        .expect("certificate builder");
        builder
            .serial(1)
            .and_then(|b| b.key_id("simhost-ssh-test"))
            .and_then(|b| b.cert_type(CertType::User))
            .and_then(|b| b.valid_principal(principal))
            .and_then(|b| b.extension("permit-pty", ""))
            .and_then(|b| b.extension("permit-port-forwarding", ""))
            .expect("certificate fields");
        let certificate = builder.sign(&self.ca).expect("signed");
        (key, certificate)
    }
}

fn require_sshd() {
    assert!(
        Path::new(SSHD).is_file(),
        "{SSHD} is missing: run scripts/install-test-tools"
    );
}

/// What a command run over `session` printed on stdout, and its exit status.
async fn exec(session: &client::Handle<Guest>, command: &str, pty: bool) -> (String, Option<u32>) {
    let mut channel = session.channel_open_session().await.expect("channel");
    if pty {
        channel
            .request_pty(true, "xterm", 80, 24, 0, 0, &[])
            .await
            .expect("pty requested");
    }
    channel.exec(true, command).await.expect("exec requested");
    let mut stdout = Vec::new();
    let mut status = None;
    while let Some(message) = channel.wait().await {
        match message {
            ChannelMsg::Data { data } => stdout.extend_from_slice(&data),
            ChannelMsg::ExitStatus { exit_status } => status = Some(exit_status),
            _ => {}
        }
    }
    (String::from_utf8(stdout).expect("utf-8 output"), status)
}

#[tokio::test]
async fn a_certificate_of_the_user_ca_logs_in_and_runs_commands_in_the_microvm() {
    let (ca, fixture, uid) = Fixture::booted_with_ssh().await;
    let (key, certificate) = ca.user("root");

    tokio::time::timeout(DEADLINE, async {
        let (session, auth) = fixture.login(&uid, key, certificate).await;
        assert!(matches!(auth, AuthResult::Success), "refused: {auth:?}");

        // Sessions start in the MicroVM's directory.
        let (stdout, status) = exec(&session, "pwd", false).await;
        assert_eq!(
            stdout.trim_end(),
            fixture.scratch_dir(&uid).to_str().expect("utf-8")
        );
        assert_eq!(status, Some(0));

        let (_, status) = exec(&session, "exit 4", false).await;
        assert_eq!(status, Some(4));

        // The pty has the size asked for.
        let (stdout, status) = exec(&session, "stty size", true).await;
        assert_eq!(stdout.trim_end(), "24 80");
        assert_eq!(status, Some(0));

        session
            .disconnect(Disconnect::ByApplication, "", "en")
            .await
            .expect("disconnected");
    })
    .await
    .expect("logged in and ran the commands in time");
}

#[tokio::test]
async fn a_certificate_of_another_ca_is_refused() {
    let (_, fixture, uid) = Fixture::booted_with_ssh().await;
    let (key, certificate) = UserCa::new().user("root");

    tokio::time::timeout(DEADLINE, async {
        let (_session, auth) = fixture.login(&uid, key, certificate).await;
        assert!(
            matches!(auth, AuthResult::Failure { .. }),
            "accepted: {auth:?}"
        );
    })
    .await
    .expect("refused in time");
}

#[tokio::test]
async fn requests_are_checked_before_sshd_starts() {
    let ca = UserCa::new();
    let fixture = Fixture::start(Some(ca.config())).await;

    let data_first = SshProxyRequest {
        payload: Some(Payload::Data(b"SSH-2.0-x\r\n".to_vec())),
    };
    let error = fixture.open(data_first).await.expect_err("data first");
    assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");

    let error = fixture
        .open(uid_request("nope"))
        .await
        .expect_err("unknown uid");
    assert_eq!(error.code(), Code::NotFound, "{error:?}");

    let error = fixture.open(uid_request("")).await.expect_err("empty uid");
    assert_eq!(error.code(), Code::InvalidArgument, "{error:?}");
}

#[tokio::test]
async fn without_the_setting_the_service_is_unimplemented() {
    let fixture = Fixture::start(None).await;
    let uid = fixture.created("vm").await;
    let error = fixture
        .open(uid_request(&uid))
        .await
        .expect_err("not served");
    assert_eq!(error.code(), Code::Unimplemented, "{error:?}");
}

#[tokio::test]
async fn deleting_the_microvm_ends_the_session() {
    let (_, mut fixture, uid) = Fixture::booted_with_ssh().await;
    let (requests, mut responses) = fixture.open(uid_request(&uid)).await.expect("opened");

    // sshd speaks first: its version line.
    let first = tokio::time::timeout(DEADLINE, responses.message())
        .await
        .expect("sshd answered in time")
        .expect("a response")
        .expect("not the end");
    assert!(first.data.starts_with(b"SSH-2.0-"), "{:?}", first.data);

    fixture
        .microvms
        .delete_micro_vm(DeleteMicroVmRequest { uid: uid.clone() })
        .await
        .expect("deleted");
    let end = stream_end(&mut responses).await;
    let error = end.expect_err("ended with an error");
    assert_eq!(error.code(), Code::Aborted, "{error:?}");
    drop(requests);
}

#[tokio::test]
async fn the_client_half_closing_ends_the_session() {
    let (_, fixture, uid) = Fixture::booted_with_ssh().await;
    let (requests, mut responses) = fixture.open(uid_request(&uid)).await.expect("opened");
    drop(requests);

    // sshd reads end of file, says its version line at most, and exits.
    let end = stream_end(&mut responses).await;
    assert!(matches!(end, Ok(None)), "{end:?}");
}
