//! The agent in-process between a relay client with an rcgen client certificate and a
//! simulated flintlock Host from `battery-embedded`, whose MicroVMs run commands as
//! local processes.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use battery_agent::Cli;
use battery_agent::certificate::ServingCertificate;
use battery_agent::ssh::SshIdentity;
use battery_agent::testing::{Ca, Signed};
use battery_apiserver::resources::hosts::ssh_certificate::SshUserCa;
use battery_embedded::simhost::testing::create_microvm;
use battery_embedded::simhost::{
    SSHD_MAX_SESSIONS, SimulatedHost, SimulatedHostConfig, SshProxyConfig,
};
use battery_proto::Bytes;
use battery_proto::agent::v1alpha1::relay_client::RelayClient;
use battery_proto::agent::v1alpha1::{
    AttachOpen, ClaimRef, ExecOpen, ExecRequest, ExecResponse, ListProcessesRequest,
    PortForwardOpen, PortForwardRequest, Process, ProcessRef, ProcessState, StartProcessRequest,
    StdinEof, StopProcessRequest, TerminalSize, exec_request, exec_response, exit_status,
    port_forward_request,
};
use battery_telemetry::eventually;
use clap::Parser as _;
use sha2::{Digest as _, Sha256};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
use tonic::{Code, Streaming};

/// How long any awaited condition may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(30);
/// The client's HTTP/2 receive window per stream.
const CLIENT_WINDOW_BYTES: u32 = 64 * 1024;

struct Fixture {
    _dir: TempDir,
    host: SimulatedHost,
    microvm_uid: String,
    agent: SocketAddr,
    /// Signs the agent's serving certificate, and the client certificates it accepts.
    ca: Ca,
    _stop: oneshot::Sender<()>,
}

impl Fixture {
    async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// As [`Fixture::start`], with more flags for the agent.
    async fn start_with(flags: &[&str]) -> Self {
        Self::start_full(flags, None).await
    }

    /// As [`Fixture::start`], with terminals: the Host serves its SSH proxy with a real
    /// sshd trusting an SSH CA, which has certified the agent's SSH key, as the API
    /// server does at `hosts/<name>/certificate`.
    async fn with_terminals() -> Self {
        let ca = SshUserCa::generate().expect("an SSH CA");
        let ssh = SshIdentity::generate().expect("an SSH key");
        let in_an_hour = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 3600;
        ssh.set_certificate(
            &ca.certify("host-0", &ssh.public_key(), in_an_hour)
                .expect("certified"),
        );
        Self::start_full(&[], Some((ca, ssh))).await
    }

    async fn start_full(flags: &[&str], terminals: Option<(SshUserCa, SshIdentity)>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let host = SimulatedHost::start(SimulatedHostConfig {
            state_dir: dir.path().join("host"),
            ssh_proxy: terminals.as_ref().map(|(ca, _)| SshProxyConfig {
                user_ca_public_key: ca.public_key(),
                sshd: None,
            }),
            ..SimulatedHostConfig::default()
        })
        .await
        .expect("simulated host starts");
        let microvm_uid = create_microvm(&host, "vm").await;

        let ca = Ca::new("relay CA");
        let serving = ca.loopback_server();
        let cli = agent_cli(
            dir.path(),
            &host,
            &ca,
            &serving,
            &dir.path().join("agent-state"),
            flags,
        );
        let config = cli.into_config().expect("valid config");
        let agent = match terminals {
            Some((_, ssh)) => {
                let serving =
                    ServingCertificate::from_pem(serving.cert.as_bytes(), serving.key.as_bytes())
                        .expect("a serving certificate");
                battery_agent::build_with(config, Arc::new(serving), Arc::new(ssh))
            }
            None => battery_agent::build(config),
        }
        .expect("agent builds");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(agent.serve(listener, async {
            let _ = stopped.await;
        }));
        Self {
            _dir: dir,
            host,
            microvm_uid,
            agent: address,
            ca,
            _stop: stop,
        }
    }

    /// A relay client presenting a certificate from `ca`, or none.
    async fn client(
        &self,
        ca: Option<&Ca>,
    ) -> Result<RelayClient<Channel>, tonic::transport::Error> {
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca.pem))
            .domain_name("localhost");
        if let Some(ca) = ca {
            let client = ca.client("battery-apiserver");
            tls = tls.identity(Identity::from_pem(client.cert, client.key));
        }
        let channel = Channel::from_shared(format!("https://{}", self.agent))
            .expect("endpoint")
            .tls_config(tls)?
            // Small, so what piles up while a test does not read is the agent's and
            // the Host's, not the client's.
            .initial_stream_window_size(CLIENT_WINDOW_BYTES)
            .connect()
            .await?;
        Ok(RelayClient::new(channel))
    }

    async fn trusted_client(&self) -> RelayClient<Channel> {
        self.client(Some(&self.ca)).await.expect("connected")
    }

    fn open(&self, command: &[&str]) -> ExecOpen {
        ExecOpen {
            claim: Some(ClaimRef {
                namespace: "team-a".into(),
                name: "claim-1".into(),
                uid: "c-1".into(),
            }),
            microvm_uid: self.microvm_uid.clone(),
            command: command.iter().map(|arg| (*arg).to_owned()).collect(),
            stdout: true,
            stderr: true,
            ..ExecOpen::default()
        }
    }
}

/// The flags of an agent relaying to `host`, serving `serving` and trusting clients of
/// `ca`, its process table in `state_dir`, and `flags`; its PEM files written to `dir`.
fn agent_cli(
    dir: &Path,
    host: &SimulatedHost,
    ca: &Ca,
    serving: &Signed,
    state_dir: &Path,
    flags: &[&str],
) -> Cli {
    let write = |name: &str, pem: &str| {
        let path = dir.join(name);
        std::fs::write(&path, pem).expect("write PEM");
        path.display().to_string()
    };
    Cli::try_parse_from(
        [
            "battery-agent".to_owned(),
            "--tls-cert-file".to_owned(),
            write("agent.crt", &serving.cert),
            "--tls-private-key-file".to_owned(),
            write("agent.key", &serving.key),
            "--client-ca-file".to_owned(),
            write("client-ca.crt", &ca.pem),
            "--flintlock-address".to_owned(),
            host.address().to_string(),
            "--flintlock-insecure".to_owned(),
            "--state-dir".to_owned(),
            state_dir.display().to_string(),
        ]
        .into_iter()
        .chain(flags.iter().map(|flag| (*flag).to_owned())),
    )
    .expect("flags parse")
}

fn request(payload: exec_request::Payload) -> ExecRequest {
    ExecRequest {
        payload: Some(payload),
    }
}

/// An open session: the sender of its requests and the stream of its responses.
struct Session {
    requests: mpsc::Sender<ExecRequest>,
    responses: Streaming<ExecResponse>,
}

async fn open(client: &mut RelayClient<Channel>, open: ExecOpen) -> Result<Session, tonic::Status> {
    let (requests, rx) = mpsc::channel(1);
    requests
        .send(request(exec_request::Payload::Open(open)))
        .await
        .expect("queued");
    let responses = client.exec(ReceiverStream::new(rx)).await?.into_inner();
    Ok(Session {
        requests,
        responses,
    })
}

#[derive(Debug, Default)]
struct Output {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit: Option<exit_status::Outcome>,
}

impl Session {
    async fn next(&mut self) -> Option<exec_response::Payload> {
        tokio::time::timeout(DEADLINE, self.responses.message())
            .await
            .expect("the relay answered in time")
            .expect("the relay stream is healthy")
            .map(|response| response.payload.expect("payload"))
    }

    /// Reads to the end, checking that the exit status comes last and only once.
    async fn collect(mut self) -> Output {
        let mut output = Output::default();
        while let Some(payload) = self.next().await {
            assert!(output.exit.is_none(), "{payload:?} after the exit status");
            match payload {
                exec_response::Payload::Stdout(bytes) => output.stdout.extend(bytes),
                exec_response::Payload::Stderr(bytes) => output.stderr.extend(bytes),
                exec_response::Payload::Exit(status) => output.exit = status.outcome,
            }
        }
        output
    }
}

async fn run(fixture: &Fixture, command: &[&str]) -> Output {
    let mut client = fixture.trusted_client().await;
    open(&mut client, fixture.open(command))
        .await
        .expect("opened")
        .collect()
        .await
}

#[tokio::test]
async fn echo_hi_prints_hi_and_exits_0() {
    let fixture = Fixture::start().await;
    let output = run(&fixture, &["echo", "hi"]).await;
    assert_eq!(output.stdout, b"hi\n");
    assert_eq!(output.stderr, b"");
    assert_eq!(output.exit, Some(exit_status::Outcome::Code(0)));
}

#[tokio::test]
async fn exit_code_is_passed_back() {
    let fixture = Fixture::start().await;
    let output = run(&fixture, &["sh", "-c", "exit 3"]).await;
    assert_eq!(output.exit, Some(exit_status::Outcome::Code(3)));
}

#[tokio::test]
async fn stdout_and_stderr_arrive_apart() {
    let fixture = Fixture::start().await;
    let output = run(&fixture, &["sh", "-c", "echo out; echo err >&2; echo more"]).await;
    assert_eq!(output.stdout, b"out\nmore\n");
    assert_eq!(output.stderr, b"err\n");
    assert_eq!(output.exit, Some(exit_status::Outcome::Code(0)));
}

#[tokio::test]
async fn output_of_an_unattached_stream_is_discarded() {
    let fixture = Fixture::start().await;
    let mut client = fixture.trusted_client().await;
    let output = open(
        &mut client,
        ExecOpen {
            stderr: false,
            ..fixture.open(&["sh", "-c", "echo out; echo err >&2"])
        },
    )
    .await
    .expect("opened")
    .collect()
    .await;
    assert_eq!(output.stdout, b"out\n");
    assert_eq!(output.stderr, b"");
}

#[tokio::test]
async fn a_command_that_cannot_run_ends_with_an_error() {
    let fixture = Fixture::start().await;
    let output = run(&fixture, &["/no/such/program"]).await;
    let Some(exit_status::Outcome::Error(message)) = output.exit else {
        panic!("want an error exit, got {:?}", output.exit);
    };
    assert!(message.contains("/no/such/program"), "{message}");
}

#[tokio::test]
async fn stdin_eof_lets_wc_finish() {
    let fixture = Fixture::start().await;
    let mut client = fixture.trusted_client().await;
    let session = open(
        &mut client,
        ExecOpen {
            stdin: true,
            ..fixture.open(&["wc", "-c"])
        },
    )
    .await
    .expect("opened");
    for payload in [
        exec_request::Payload::Stdin(Bytes::from_static(b"hello")),
        exec_request::Payload::StdinEof(StdinEof {}),
    ] {
        session.requests.send(request(payload)).await.expect("sent");
    }
    // The request stream stays open: only the EOF message can end wc's input.
    let requests = session.requests.clone();
    let output = session.collect().await;
    drop(requests);
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "5");
    assert_eq!(output.exit, Some(exit_status::Outcome::Code(0)));
}

/// Deterministic bytes that do not compress or repeat within a chunk.
fn payload(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_megabytes_through_cat_come_back_whole_and_buffers_stay_bounded() {
    const TOTAL: usize = 20 * 1024 * 1024;
    const CHUNK: usize = 64 * 1024;
    /// The most stdin the whole path may take while nobody reads stdout: the HTTP/2
    /// windows and bounded queues of each hop (the agent's 256 KiB windows and queues
    /// of 4 messages, the simulated Host's 1 MiB window and 1 MiB of output queued in
    /// messages of up to 256 KiB, this client's 2 MiB window) plus the pipes (1 MiB
    /// for stdout); an agent that buffered without bound would take all of `TOTAL`.
    const IN_FLIGHT_BOUND: usize = 8 * 1024 * 1024;

    let fixture = Fixture::start().await;
    let mut client = fixture.trusted_client().await;
    let session = open(
        &mut client,
        ExecOpen {
            stdin: true,
            ..fixture.open(&["cat"])
        },
    )
    .await
    .expect("opened");
    let data = Arc::new(payload(TOTAL));
    let sent = Arc::new(AtomicUsize::new(0));
    let requests = session.requests.clone();
    let writer = tokio::spawn({
        let data = Arc::clone(&data);
        let sent = Arc::clone(&sent);
        async move {
            for chunk in data.chunks(CHUNK) {
                requests
                    .send(request(exec_request::Payload::Stdin(
                        Bytes::copy_from_slice(chunk),
                    )))
                    .await
                    .expect("sent");
                sent.fetch_add(chunk.len(), Ordering::SeqCst);
            }
            requests
                .send(request(exec_request::Payload::StdinEof(StdinEof {})))
                .await
                .expect("sent EOF");
        }
    });

    // Nobody reads stdout yet: the writer must stall once the path is full, instead
    // of the agent taking everything in.
    let mut last = 0;
    let mut still_since = Instant::now();
    eventually(
        DEADLINE,
        "stdin stops moving while stdout is not read",
        async || {
            let now = sent.load(Ordering::SeqCst);
            if now != last {
                last = now;
                still_since = Instant::now();
            }
            now > 0 && still_since.elapsed() > Duration::from_millis(500)
        },
    )
    .await;
    let stalled_at = sent.load(Ordering::SeqCst);
    assert!(
        stalled_at < IN_FLIGHT_BOUND,
        "{stalled_at} bytes taken in while stdout was not read"
    );

    let Session {
        requests: _keep_open,
        mut responses,
    } = session;
    let mut digest = Sha256::new();
    let mut received = 0;
    let mut exit = None;
    while let Some(response) = tokio::time::timeout(DEADLINE, responses.message())
        .await
        .expect("output in time")
        .expect("healthy stream")
    {
        match response.payload.expect("payload") {
            exec_response::Payload::Stdout(bytes) => {
                received += bytes.len();
                digest.update(&bytes);
            }
            exec_response::Payload::Stderr(bytes) => {
                panic!("stderr: {}", String::from_utf8_lossy(&bytes))
            }
            exec_response::Payload::Exit(status) => exit = status.outcome,
        }
    }
    writer.await.expect("writer finished");
    assert_eq!(received, TOTAL);
    assert_eq!(digest.finalize()[..], Sha256::digest(data.as_slice())[..]);
    assert_eq!(exit, Some(exit_status::Outcome::Code(0)));
}

/// Dead: gone, or a zombie nobody has reaped yet.
fn process_gone(pid: &str) -> bool {
    match std::fs::read_to_string(Path::new("/proc").join(pid).join("stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn dropping_the_stream_ends_the_command() {
    let fixture = Fixture::start().await;
    let mut client = fixture.trusted_client().await;
    let mut session = open(
        &mut client,
        ExecOpen {
            stdin: true,
            ..fixture.open(&["sh", "-c", "echo $$; exec sleep 600"])
        },
    )
    .await
    .expect("opened");
    let Some(exec_response::Payload::Stdout(pid)) = session.next().await else {
        panic!("want the pid on stdout");
    };
    let pid = String::from_utf8(pid.to_vec()).expect("utf-8");
    dropping_it_ends(session, pid.trim()).await;
}

/// Checks that `sleep` of `pid`, run by `session`, runs until the session is dropped,
/// then ends.
async fn dropping_it_ends(session: Session, pid: &str) {
    assert!(!process_gone(pid), "sleep {pid} runs");
    drop(session);
    eventually(DEADLINE, &format!("sleep {pid} is gone"), async || {
        process_gone(pid)
    })
    .await;
}

/// Whether a session with `ca`'s client certificate (or none) fails. The handshake may
/// fail at connect, or on the first request once rustls's TLS 1.3 client learns the
/// server rejected its certificate.
async fn refused(fixture: &Fixture, ca: Option<&Ca>) -> bool {
    match fixture.client(ca).await {
        Err(_) => true,
        Ok(mut client) => open(&mut client, fixture.open(&["true"])).await.is_err(),
    }
}

#[tokio::test]
async fn only_client_certificates_from_the_client_ca_are_accepted() {
    let fixture = Fixture::start().await;
    let other = Ca::new("another CA");
    assert!(
        refused(&fixture, Some(&other)).await,
        "a certificate from another CA was accepted"
    );
    assert!(
        refused(&fixture, None).await,
        "a client without a certificate was accepted"
    );
    // The same agent still serves a trusted client.
    let output = run(&fixture, &["true"]).await;
    assert_eq!(output.exit, Some(exit_status::Outcome::Code(0)));
}

#[tokio::test]
async fn an_unknown_microvm_is_refused_before_the_session_opens() {
    let fixture = Fixture::start().await;
    let mut client = fixture.trusted_client().await;
    let status = open(
        &mut client,
        ExecOpen {
            microvm_uid: "no-such-uid".into(),
            ..fixture.open(&["true"])
        },
    )
    .await
    .err()
    .expect("refused");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
}

#[tokio::test]
async fn the_first_message_must_be_open() {
    let fixture = Fixture::start().await;
    let mut client = fixture.trusted_client().await;
    let (requests, rx) = mpsc::channel(1);
    requests
        .send(request(exec_request::Payload::Stdin(Bytes::from_static(
            b"x",
        ))))
        .await
        .expect("queued");
    let status = client
        .exec(ReceiverStream::new(rx))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
}

#[tokio::test]
async fn sessions_past_max_sessions_are_refused_until_one_ends() {
    let fixture = Fixture::start_with(&["--max-sessions", "1"]).await;
    let mut client = fixture.trusted_client().await;
    let first = open(&mut client, fixture.open(&["sleep", "100"]))
        .await
        .expect("the first session opens");
    let refused = open(&mut client, fixture.open(&["true"])).await.err();
    assert_eq!(
        refused.as_ref().map(tonic::Status::code),
        Some(tonic::Code::ResourceExhausted),
        "{refused:?}"
    );
    // Ending the first frees its place.
    drop(first);
    let mut freed = None;
    eventually(DEADLINE, "a session can open again", async || {
        freed = open(&mut client, fixture.open(&["echo", "again"]))
            .await
            .ok();
        freed.is_some()
    })
    .await;
    let output = freed.unwrap().collect().await;
    assert_eq!(output.stdout, b"again\n");
}

/// A terminal session's open: stdin and stdout (which carries stderr) on a PTY.
fn on_a_terminal(fixture: &Fixture, command: &[&str]) -> ExecOpen {
    ExecOpen {
        tty: true,
        stdin: true,
        stderr: false,
        ..fixture.open(command)
    }
}

fn resize(width: u32, height: u32) -> ExecRequest {
    request(exec_request::Payload::Resize(TerminalSize {
        width,
        height,
    }))
}

/// `sh -c script` on a terminal, through an agent that opens terminals; the fixture
/// must outlive the session.
async fn script_on_a_terminal(script: &str) -> (Fixture, Session) {
    let fixture = Fixture::with_terminals().await;
    let mut client = fixture.trusted_client().await;
    let session = open(&mut client, on_a_terminal(&fixture, &["sh", "-c", script]))
        .await
        .expect("opened");
    (fixture, session)
}

impl Session {
    /// Sends `keys` as typed on the terminal.
    async fn type_keys(&self, keys: &'static [u8]) {
        self.requests
            .send(request(exec_request::Payload::Stdin(Bytes::from_static(
                keys,
            ))))
            .await
            .unwrap();
    }

    /// Reads output until it contains `text`, and returns all read so far.
    async fn read_until(&mut self, seen: &mut Vec<u8>, text: &str) {
        while !String::from_utf8_lossy(seen).contains(text) {
            match self.next().await {
                Some(exec_response::Payload::Stdout(bytes)) => seen.extend(bytes),
                other => panic!(
                    "{other:?} before {text:?}; so far {:?}",
                    String::from_utf8_lossy(seen)
                ),
            }
        }
    }
}

#[tokio::test]
async fn a_terminal_starts_at_the_clients_size_follows_its_resizes_and_exits_with_the_code() {
    let script = "stty size; read line; stty size; echo \"got $line\"; exit 4";
    let (_fixture, mut session) = script_on_a_terminal(script).await;
    session.requests.send(resize(100, 30)).await.unwrap();
    let mut seen = Vec::new();
    session.read_until(&mut seen, "30 100").await;
    session.requests.send(resize(120, 40)).await.unwrap();
    // The terminal echoes what is typed, and turns Enter into a line.
    session.type_keys(b"hi\r").await;
    let rest = session.collect().await;
    seen.extend(rest.stdout);
    let text = String::from_utf8_lossy(&seen);
    assert!(text.contains("40 120"), "{text:?}");
    assert!(text.contains("got hi"), "{text:?}");
    assert_eq!(rest.exit, Some(exit_status::Outcome::Code(4)), "{text:?}");
}

#[tokio::test]
async fn ctrl_c_on_a_terminal_interrupts_the_command() {
    let script = "trap 'echo interrupted; exit 130' INT; echo ready; sleep 100 & wait";
    let (_fixture, mut session) = script_on_a_terminal(script).await;
    session.requests.send(resize(80, 24)).await.unwrap();
    let mut seen = Vec::new();
    session.read_until(&mut seen, "ready").await;
    session.type_keys(b"\x03").await;
    let rest = session.collect().await;
    let text = String::from_utf8_lossy(&rest.stdout);
    assert!(text.contains("interrupted"), "{text:?}");
    assert_eq!(rest.exit, Some(exit_status::Outcome::Code(130)), "{text:?}");
}

#[tokio::test]
async fn a_terminal_without_an_ssh_certificate_is_refused_before_it_opens() {
    let fixture = Fixture::start().await;
    let mut client = fixture.trusted_client().await;
    let refused = open(&mut client, on_a_terminal(&fixture, &["sh"]))
        .await
        .err()
        .expect("refused");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("--agent-ssh-ca-key-file"),
        "{refused:?}"
    );
}

/// Opens a `PortForward` stream to `port` of the fixture's MicroVM.
async fn forward_port(
    fixture: &Fixture,
    port: u32,
) -> Result<
    (
        mpsc::Sender<PortForwardRequest>,
        Streaming<battery_proto::agent::v1alpha1::PortForwardResponse>,
    ),
    tonic::Status,
> {
    let mut client = fixture.trusted_client().await;
    let (requests, rx) = mpsc::channel(1);
    let open = PortForwardOpen {
        claim: None,
        microvm_uid: fixture.microvm_uid.clone(),
        port,
    };
    requests
        .send(PortForwardRequest {
            payload: Some(port_forward_request::Payload::Open(open)),
        })
        .await
        .expect("queued");
    let responses = client
        .port_forward(ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok((requests, responses))
}

#[tokio::test]
async fn a_forwarded_port_carries_bytes_both_ways_until_the_guest_closes() {
    let fixture = Fixture::with_terminals().await;
    // The simulated guest's loopback is this machine's.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (mut connection, _) = listener.accept().await.unwrap();
        let mut asked = [0; 4];
        connection.read_exact(&mut asked).await.unwrap();
        connection.write_all(b"pong:").await.unwrap();
        connection.write_all(&asked).await.unwrap();
    });
    let (requests, mut responses) = forward_port(&fixture, port.into()).await.expect("opened");
    requests
        .send(PortForwardRequest {
            payload: Some(port_forward_request::Payload::Data(Bytes::from_static(
                b"ping",
            ))),
        })
        .await
        .unwrap();
    assert_eq!(read_until_closed(&mut responses).await, b"pong:ping");
    server.await.unwrap();
}

/// What a forwarded connection reads until the guest closes it.
async fn read_until_closed(
    responses: &mut Streaming<battery_proto::agent::v1alpha1::PortForwardResponse>,
) -> Vec<u8> {
    let mut answer = Vec::new();
    while let Some(response) = tokio::time::timeout(DEADLINE, responses.message())
        .await
        .expect("in time")
        .expect("a healthy stream")
    {
        answer.extend(response.data);
    }
    answer
}

#[tokio::test]
async fn a_closed_guest_port_is_refused_saying_so() {
    let fixture = Fixture::with_terminals().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let refused = forward_port(&fixture, closed.into())
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused
            .message()
            .contains(&format!("connecting to port {closed} in the MicroVM")),
        "{refused:?}"
    );
    let zero = forward_port(&fixture, 0).await.expect_err("refused");
    assert_eq!(zero.code(), Code::InvalidArgument, "{zero:?}");
}

/// A listener on this machine's loopback, which is the simulated guest's, that answers
/// one connection with "pong" and closes it; and its port.
async fn pong_server() -> (u16, tokio::task::JoinHandle<()>) {
    use tokio::io::AsyncWriteExt as _;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let (mut connection, _) = listener.accept().await.unwrap();
        connection.write_all(b"pong").await.unwrap();
    });
    (port, server)
}

#[tokio::test]
async fn terminals_and_forwarded_connections_into_one_microvm_share_one_login() {
    let fixture = Fixture::with_terminals().await;
    let mut client = fixture.trusted_client().await;
    for word in ["one", "two"] {
        let output = open(&mut client, on_a_terminal(&fixture, &["echo", word]))
            .await
            .expect("opened")
            .collect()
            .await;
        assert!(
            String::from_utf8_lossy(&output.stdout).contains(word),
            "{output:?}"
        );
    }
    for _ in 0..2 {
        let (port, server) = pong_server().await;
        let (_requests, mut responses) = forward_port(&fixture, port.into()).await.expect("opened");
        assert_eq!(read_until_closed(&mut responses).await, b"pong");
        server.await.unwrap();
    }
    assert_eq!(fixture.host.ssh_logins(), 1);
}

#[tokio::test]
async fn terminals_past_sshds_max_sessions_get_a_login_of_their_own() {
    let fixture = Fixture::with_terminals().await;
    let mut client = fixture.trusted_client().await;
    let mut sessions = Vec::new();
    for _ in 0..=SSHD_MAX_SESSIONS {
        let command = on_a_terminal(&fixture, &["sh", "-c", "echo ready; read line"]);
        sessions.push(open(&mut client, command).await.expect("opened"));
    }
    for session in &mut sessions {
        session.read_until(&mut Vec::new(), "ready").await;
    }
    assert_eq!(fixture.host.ssh_logins(), 2);
}

#[tokio::test]
async fn a_terminal_whose_client_goes_away_hangs_up_its_command() {
    let (_fixture, mut session) = script_on_a_terminal("echo pid=$$; exec sleep 600").await;
    let mut seen = Vec::new();
    session.read_until(&mut seen, "\n").await;
    let seen = String::from_utf8_lossy(&seen);
    let pid = seen
        .split("pid=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no pid in {seen:?}"));
    // The shared connection stays; only this session's channel closes, and with it
    // the terminal, whose hangup ends the command.
    dropping_it_ends(session, pid).await;
}

// Background processes (ADR 44).

fn process_ref(name: &str) -> ProcessRef {
    ProcessRef {
        namespace: "team-a".into(),
        name: name.into(),
    }
}

impl Fixture {
    fn start_process(&self, name: &str, command: &[&str], stdin: bool) -> StartProcessRequest {
        StartProcessRequest {
            process: Some(process_ref(name)),
            claim: self.open(&[]).claim,
            microvm_uid: self.microvm_uid.clone(),
            object: format!("{{\"name\":\"{name}\"}}"),
            command: command.iter().map(|arg| (*arg).to_owned()).collect(),
            stdin,
            ..StartProcessRequest::default()
        }
    }
}

/// The process `name` as the agent lists it.
async fn listed(client: &mut RelayClient<Channel>, name: &str) -> Option<Process> {
    let list = client
        .list_processes(ListProcessesRequest {
            namespace: "team-a".into(),
        })
        .await
        .expect("listed")
        .into_inner();
    list.items
        .into_iter()
        .find(|process| process.process.as_ref().is_some_and(|p| p.name == name))
}

/// Attaches to the process `name`, with stdin when `stdin` is given.
async fn attach(client: &mut RelayClient<Channel>, name: &str, stdin: bool) -> Session {
    let (requests, rx) = mpsc::channel(1);
    let open = exec_request::Payload::Attach(AttachOpen {
        process: Some(process_ref(name)),
        stdin,
        stdout: true,
        stderr: true,
    });
    requests.send(request(open)).await.expect("queued");
    let responses = client
        .attach_process(ReceiverStream::new(rx))
        .await
        .expect("attached")
        .into_inner();
    Session {
        requests,
        responses,
    }
}

impl Session {
    /// Reads stdout until it holds `text`.
    async fn stdout_until(&mut self, text: &str) -> Vec<u8> {
        let mut seen = Vec::new();
        while !String::from_utf8_lossy(&seen).contains(text) {
            match self.next().await {
                Some(exec_response::Payload::Stdout(bytes)) => seen.extend(bytes),
                Some(exec_response::Payload::Stderr(_)) => {}
                other => panic!("{other:?} before {text:?} on stdout"),
            }
        }
        seen
    }
}

#[tokio::test]
async fn a_background_process_runs_on_without_its_client_and_is_attached_from_its_start() {
    let fixture = Fixture::start().await;
    let mut client = fixture.trusted_client().await;
    // Paced by stdin, not by time: it waits for a line an attach sends.
    let script = "echo early; echo warning >&2; read line; echo \"got $line\"; exit 3";
    let started = client
        .start_process(fixture.start_process("p", &["sh", "-c", script], true))
        .await
        .expect("started")
        .into_inner();
    assert_eq!(started.state(), ProcessState::Running);
    assert_eq!(started.object, "{\"name\":\"p\"}");
    drop(client);

    let mut client = fixture.trusted_client().await;
    let listed_one = listed(&mut client, "p").await.expect("listed");
    assert_eq!(listed_one.state(), ProcessState::Running);
    assert_eq!(listed_one.claim.expect("claim").uid, "c-1");
    let mut watching = attach(&mut client, "p", false).await;
    watching.stdout_until("early\n").await;
    drop(watching);

    // A later attach gets the earlier output again, then writes the line it waits for.
    let writing = attach(&mut client, "p", true).await;
    writing
        .requests
        .send(request(exec_request::Payload::Stdin(Bytes::from_static(
            b"hi\n",
        ))))
        .await
        .expect("sent");
    let output = writing.collect().await;
    assert_eq!(output.stdout, b"early\ngot hi\n");
    assert_eq!(output.stderr, b"warning\n");
    assert_eq!(output.exit, Some(exit_status::Outcome::Code(3)));
    let ended = listed(&mut client, "p").await.expect("still listed");
    assert_eq!(ended.state(), ProcessState::Exited);
    assert_eq!(ended.exit_code, 3);
    assert!(ended.end_time >= ended.start_time);

    // Ended, it is still attached to: its output, then its exit.
    let again = attach(&mut client, "p", false).await.collect().await;
    assert_eq!(again.stdout, b"early\ngot hi\n");
    assert_eq!(again.exit, Some(exit_status::Outcome::Code(3)));
    let refused = client
        .start_process(fixture.start_process("p", &["true"], false))
        .await
        .expect_err("the name is taken");
    assert_eq!(refused.code(), Code::AlreadyExists);
}

#[tokio::test]
async fn a_stopped_process_records_the_signal_that_ended_it_and_a_delete_forgets_it() {
    let fixture = Fixture::start().await;
    let mut client = fixture.trusted_client().await;
    client
        .start_process(fixture.start_process("sleeper", &["sleep", "600"], false))
        .await
        .expect("started");
    // It ignores SIGTERM, so only SIGKILL ends it once its grace period (none) passed.
    let stubborn = "trap '' TERM; echo ready; while :; do sleep 1; done";
    client
        .start_process(fixture.start_process("stubborn", &["sh", "-c", stubborn], false))
        .await
        .expect("started");
    attach(&mut client, "stubborn", false)
        .await
        .stdout_until("ready\n")
        .await;

    let stop = |name: &str, grace_period_seconds| StopProcessRequest {
        process: Some(process_ref(name)),
        grace_period_seconds,
    };
    client
        .stop_process(stop("sleeper", 30))
        .await
        .expect("stopping");
    client
        .stop_process(stop("stubborn", 0))
        .await
        .expect("stopping");
    for (name, code, signal) in [("sleeper", 143, "SIGTERM"), ("stubborn", 137, "SIGKILL")] {
        let output = attach(&mut client, name, false).await.collect().await;
        assert_eq!(
            output.exit,
            Some(exit_status::Outcome::Code(code)),
            "{name}"
        );
        let ended = listed(&mut client, name).await.expect("still listed");
        assert_eq!(
            (ended.exit_code, ended.signal.as_str()),
            (code, signal),
            "{name}"
        );
    }

    client
        .start_process(fixture.start_process("doomed", &["sleep", "600"], false))
        .await
        .expect("started");
    let deleting = client
        .delete_process(stop("doomed", 30))
        .await
        .expect("deleting")
        .into_inner();
    assert!(deleting.deletion_time >= deleting.start_time);
    eventually(DEADLINE, "the deleted process is forgotten", async || {
        listed(&mut client.clone(), "doomed").await.is_none()
    })
    .await;
    client
        .delete_process(stop("sleeper", 30))
        .await
        .expect("deleted");
    assert!(
        listed(&mut client, "sleeper").await.is_none(),
        "an ended one goes at once"
    );
    let missing = client
        .stop_process(stop("sleeper", 30))
        .await
        .expect_err("gone");
    assert_eq!(missing.code(), Code::NotFound);
}

#[tokio::test]
async fn a_claims_end_ends_and_forgets_its_processes() {
    let fixture = Fixture::start().await;
    let mut client = fixture.trusted_client().await;
    client
        .start_process(fixture.start_process(
            "pid",
            &["sh", "-c", "echo $$; exec sleep 600"],
            false,
        ))
        .await
        .expect("started");
    let seen = attach(&mut client, "pid", false)
        .await
        .stdout_until("\n")
        .await;
    let pid = String::from_utf8(seen).expect("utf-8");
    assert!(!process_gone(pid.trim()), "it runs");
    client
        .forget_claim_processes(fixture.open(&[]).claim.expect("claim"))
        .await
        .expect("forgotten");
    assert!(listed(&mut client, "pid").await.is_none());
    eventually(DEADLINE, "the claim's process is gone", async || {
        process_gone(pid.trim())
    })
    .await;
}

/// An agent built from `cli` and served on a runtime of its own, on a thread of its own,
/// until `stop` is sent or dropped: then the runtime is dropped, which ends every task of
/// the agent as the end of its process would.
fn agent_on_its_own_runtime(
    cli: Cli,
) -> (SocketAddr, oneshot::Sender<()>, std::thread::JoinHandle<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("non-blocking");
    let address = listener.local_addr().expect("address");
    let (stop, stopped) = oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        runtime.block_on(async move {
            let agent = battery_agent::build(cli.into_config().expect("valid")).expect("builds");
            let listener = TcpListener::from_std(listener).expect("a tokio listener");
            // Not a graceful shutdown: the agent is cut off where it is.
            tokio::select! {
                _ = agent.serve(listener, std::future::pending()) => {}
                _ = stopped => {}
            }
        });
    });
    (address, stop, thread)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_agent_reports_what_was_running_as_lost_and_keeps_what_ended() {
    let mut fixture = Fixture::start().await;
    let state = fixture._dir.path().join("restarted");
    let serving = fixture.ca.loopback_server();
    // Both on the same state directory, as a restarted agent on its Host.
    let [first, second] = [(); 2].map(|()| {
        agent_cli(
            fixture._dir.path(),
            &fixture.host,
            &fixture.ca,
            &serving,
            &state,
            &[],
        )
    });
    let (address, stop, thread) = agent_on_its_own_runtime(first);
    fixture.agent = address;
    let mut client = fixture.trusted_client().await;
    let pid = "echo $$; exec sleep 600";
    client
        .start_process(fixture.start_process("running", &["sh", "-c", pid], false))
        .await
        .expect("started");
    client
        .start_process(fixture.start_process("done", &["sh", "-c", "exit 7"], false))
        .await
        .expect("started");
    let seen = attach(&mut client, "running", false)
        .await
        .stdout_until("\n")
        .await;
    let pid = String::from_utf8(seen).expect("utf-8");
    let done = attach(&mut client, "done", false).await.collect().await;
    assert_eq!(done.exit, Some(exit_status::Outcome::Code(7)));
    drop(client);

    stop.send(()).expect("the agent serves");
    tokio::task::spawn_blocking(move || thread.join().expect("the agent's thread"))
        .await
        .expect("joined");
    eventually(DEADLINE, "its command ended with the agent", async || {
        process_gone(pid.trim())
    })
    .await;

    let (address, _stop, _thread) = agent_on_its_own_runtime(second);
    fixture.agent = address;
    let mut client = fixture.trusted_client().await;
    let lost = listed(&mut client, "running").await.expect("still listed");
    assert_eq!(lost.state(), ProcessState::Lost);
    assert!(
        lost.message.contains("the exec agent restarted"),
        "{}",
        lost.message
    );
    assert!(lost.end_time > 0);
    let output = attach(&mut client, "running", false).await.collect().await;
    let Some(exit_status::Outcome::Error(why)) = output.exit else {
        panic!("a lost process's attach ends with why: {:?}", output.exit);
    };
    assert_eq!(why, lost.message);
    let done = listed(&mut client, "done").await.expect("still listed");
    assert_eq!((done.state(), done.exit_code), (ProcessState::Exited, 7));
}
