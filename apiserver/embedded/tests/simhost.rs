//! The simulated flintlock Host, driven over gRPC with the generated clients, as
//! the embedded battery drives it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use battery_embedded::simhost::{SimHostError, SimulatedHost, SimulatedHostConfig};
use battery_proto::Bytes;
use battery_proto::flintlock::types::micro_vm_status::MicroVmState;
use battery_proto::flintlock::types::network_interface::IfaceType;
use battery_proto::flintlock::types::{MicroVm, MicroVmSpec, NetworkInterface};
use battery_proto::microvm::services::api::v1alpha1::micro_vm_client::MicroVmClient;
use battery_proto::microvm::services::api::v1alpha1::{
    CreateMicroVmRequest, DeleteMicroVmRequest, GetMicroVmRequest, ListMicroVMsRequest,
};
use battery_proto::microvmexec::services::api::v1alpha1::exec_command_request::Payload as RequestPayload;
use battery_proto::microvmexec::services::api::v1alpha1::exec_command_response::Payload as ResponsePayload;
use battery_proto::microvmexec::services::api::v1alpha1::micro_vm_exec_client::MicroVmExecClient;
use battery_proto::microvmexec::services::api::v1alpha1::{
    ExecCommandRequest, ExecCommandResponse, ExecStart,
};
use battery_telemetry::eventually;
use tempfile::TempDir;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// How long any awaited condition may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(10);
/// A provisioning delay no test waits out.
const FOREVER: Duration = Duration::from_secs(3600);

struct Fixture {
    dir: TempDir,
    host: SimulatedHost,
    microvms: MicroVmClient<Channel>,
    exec: MicroVmExecClient<Channel>,
}

impl Fixture {
    async fn start(provisioning_delay: Duration) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let host = start_host(dir.path(), provisioning_delay).await;
        let channel = connect(&host).await;
        Self {
            dir,
            host,
            microvms: MicroVmClient::new(channel.clone()),
            exec: MicroVmExecClient::new(channel),
        }
    }

    /// A MicroVM in state CREATED.
    async fn created(&mut self, id: &str) -> String {
        let uid = uid(&create(&mut self.microvms, spec(id)).await);
        wait_for_state(&mut self.microvms, &uid, MicroVmState::Created).await;
        uid
    }

    fn scratch_dir(&self, uid: &str) -> PathBuf {
        self.dir.path().join("microvms").join(uid)
    }
}

async fn start_host(state_dir: &Path, provisioning_delay: Duration) -> SimulatedHost {
    SimulatedHost::start(SimulatedHostConfig {
        state_dir: state_dir.to_owned(),
        provisioning_delay,
        ..SimulatedHostConfig::default()
    })
    .await
    .expect("simulated host starts")
}

async fn connect(host: &SimulatedHost) -> Channel {
    Channel::from_shared(format!("http://{}", host.address()))
        .expect("endpoint")
        .connect()
        .await
        .expect("connected")
}

fn tap(device_id: &str) -> NetworkInterface {
    NetworkInterface {
        device_id: device_id.to_owned(),
        r#type: IfaceType::Tap.into(),
        ..NetworkInterface::default()
    }
}

fn spec(id: &str) -> MicroVmSpec {
    MicroVmSpec {
        id: id.to_owned(),
        namespace: "ns".to_owned(),
        vcpu: 1,
        memory_in_mb: 128,
        interfaces: vec![tap("eth0")],
        ..MicroVmSpec::default()
    }
}

async fn create(client: &mut MicroVmClient<Channel>, spec: MicroVmSpec) -> MicroVm {
    client
        .create_micro_vm(CreateMicroVmRequest {
            microvm: Some(spec),
            ..CreateMicroVmRequest::default()
        })
        .await
        .expect("created")
        .into_inner()
        .microvm
        .expect("microvm in the response")
}

async fn get(client: &mut MicroVmClient<Channel>, uid: &str) -> Result<MicroVm, Status> {
    let response = client
        .get_micro_vm(GetMicroVmRequest {
            uid: uid.to_owned(),
        })
        .await?;
    Ok(response
        .into_inner()
        .microvm
        .expect("microvm in the response"))
}

async fn delete(client: &mut MicroVmClient<Channel>, uid: &str) -> Result<(), Status> {
    client
        .delete_micro_vm(DeleteMicroVmRequest {
            uid: uid.to_owned(),
        })
        .await
        .map(|_| ())
}

async fn list(
    client: &mut MicroVmClient<Channel>,
    namespace: &str,
    name: Option<&str>,
) -> Vec<MicroVm> {
    client
        .list_micro_v_ms(ListMicroVMsRequest {
            namespace: namespace.to_owned(),
            name: name.map(str::to_owned),
        })
        .await
        .expect("listed")
        .into_inner()
        .microvm
}

fn uid(microvm: &MicroVm) -> String {
    microvm
        .spec
        .as_ref()
        .and_then(|spec| spec.uid.clone())
        .expect("spec.uid set")
}

fn state(microvm: &MicroVm) -> MicroVmState {
    let status = microvm.status.as_ref().expect("status");
    MicroVmState::try_from(status.state).expect("known state")
}

async fn wait_for_state(
    client: &mut MicroVmClient<Channel>,
    uid: &str,
    want: MicroVmState,
) -> MicroVm {
    let mut last = None;
    eventually(
        DEADLINE,
        &format!("microvm {uid} is {want:?}"),
        async || {
            let microvm = get(client, uid).await.expect("microvm exists");
            let done = state(&microvm) == want;
            last = Some(microvm);
            done
        },
    )
    .await;
    last.expect("polled at least once")
}

/// Dead: gone, or a zombie nobody has reaped yet.
fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

fn shell(uid: &str, cmd: &str) -> ExecStart {
    ExecStart {
        uid: uid.to_owned(),
        cmd: cmd.to_owned(),
        shell: true,
        ..ExecStart::default()
    }
}

fn start_request(start: ExecStart) -> ExecCommandRequest {
    ExecCommandRequest {
        payload: Some(RequestPayload::Start(start)),
    }
}

fn stdin_request(data: &[u8]) -> ExecCommandRequest {
    ExecCommandRequest {
        payload: Some(RequestPayload::Stdin(Bytes::copy_from_slice(data))),
    }
}

#[derive(Debug, Default)]
struct Output {
    stdout: String,
    stderr: String,
    errors: Vec<String>,
    exit_code: Option<i32>,
}

/// Reads the stream to its end, as battery does.
async fn collect(responses: &mut Streaming<ExecCommandResponse>) -> Result<Output, Status> {
    let mut output = Output::default();
    while let Some(response) = next(responses).await? {
        assert_eq!(output.exit_code, None, "nothing may follow exit_code");
        match response.payload.expect("payload") {
            ResponsePayload::Stdout(bytes) => {
                output.stdout.push_str(&String::from_utf8_lossy(&bytes))
            }
            ResponsePayload::Stderr(bytes) => {
                output.stderr.push_str(&String::from_utf8_lossy(&bytes))
            }
            ResponsePayload::Error(message) => output.errors.push(message),
            ResponsePayload::ExitCode(code) => output.exit_code = Some(code),
        }
    }
    Ok(output)
}

async fn next(
    responses: &mut Streaming<ExecCommandResponse>,
) -> Result<Option<ExecCommandResponse>, Status> {
    tokio::time::timeout(DEADLINE, responses.message())
        .await
        .expect("exec stream answered in time")
}

/// Sends `start` and half-closes, as battery does.
async fn exec(client: &mut MicroVmExecClient<Channel>, start: ExecStart) -> Result<Output, Status> {
    let requests = tokio_stream::iter(vec![start_request(start)]);
    let mut responses = client.exec_command(requests).await?.into_inner();
    collect(&mut responses).await
}

/// Starts a command that prints a pid it runs and keeps running; the request
/// stream stays open while the sender lives.
async fn start_long_running(
    client: &mut MicroVmExecClient<Channel>,
    uid: &str,
) -> (
    u32,
    mpsc::Sender<ExecCommandRequest>,
    Streaming<ExecCommandResponse>,
) {
    let (requests, stream) = mpsc::channel(4);
    requests
        .send(start_request(shell(uid, "sleep 30 & echo $!; wait")))
        .await
        .expect("start sent");
    let mut responses = client
        .exec_command(ReceiverStream::new(stream))
        .await
        .expect("exec started")
        .into_inner();
    let mut printed = String::new();
    while !printed.ends_with('\n') {
        match next(&mut responses)
            .await
            .expect("output")
            .expect("not ended")
            .payload
        {
            Some(ResponsePayload::Stdout(bytes)) => {
                printed.push_str(&String::from_utf8_lossy(&bytes))
            }
            other => panic!("expected the pid on stdout, got {other:?}"),
        }
    }
    let pid = printed.trim().parse().expect("a pid");
    (pid, requests, responses)
}

#[tokio::test]
async fn create_is_pending_then_created_after_the_delay() {
    let delay = Duration::from_millis(100);
    let mut fixture = Fixture::start(delay).await;
    let asked = Instant::now();
    let created = create(&mut fixture.microvms, spec("vm-a")).await;
    assert_eq!(state(&created), MicroVmState::Pending);
    assert_eq!(created.version, 1);
    let uid = uid(&created);
    assert!(!uid.is_empty());
    let created_spec = created.spec.as_ref().expect("spec");
    assert_eq!(
        (created_spec.id.as_str(), created_spec.namespace.as_str()),
        ("vm-a", "ns")
    );
    assert!(created_spec.created_at.is_some());
    assert_eq!(fixture.host.microvm_uids(), vec![uid.clone()]);

    let booted = wait_for_state(&mut fixture.microvms, &uid, MicroVmState::Created).await;
    assert!(
        asked.elapsed() >= delay,
        "CREATED before the provisioning delay"
    );
    assert!(booted.version > created.version);
}

#[tokio::test]
async fn create_without_id_gets_a_name_and_without_spec_is_refused() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    let unnamed = create(
        &mut fixture.microvms,
        MicroVmSpec {
            id: String::new(),
            namespace: String::new(),
            ..spec("")
        },
    )
    .await;
    let unnamed_spec = unnamed.spec.expect("spec");
    assert!(!unnamed_spec.id.is_empty());
    assert_eq!(unnamed_spec.namespace, "default");

    let refused = fixture
        .microvms
        .create_micro_vm(CreateMicroVmRequest::default())
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::InvalidArgument);
    let no_namespace = fixture
        .microvms
        .create_micro_vm(CreateMicroVmRequest {
            microvm: Some(MicroVmSpec {
                namespace: String::new(),
                ..spec("vm")
            }),
            ..CreateMicroVmRequest::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(no_namespace.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn get_and_list_filter_by_namespace_and_name() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    let a1 = uid(&create(&mut fixture.microvms, spec("a1")).await);
    create(&mut fixture.microvms, spec("a2")).await;
    create(
        &mut fixture.microvms,
        MicroVmSpec {
            namespace: "other".to_owned(),
            ..spec("b1")
        },
    )
    .await;

    assert_eq!(
        uid(&get(&mut fixture.microvms, &a1).await.expect("found")),
        a1
    );
    assert_eq!(list(&mut fixture.microvms, "ns", None).await.len(), 2);
    assert_eq!(list(&mut fixture.microvms, "other", None).await.len(), 1);
    assert_eq!(list(&mut fixture.microvms, "", None).await.len(), 3);
    let named = list(&mut fixture.microvms, "ns", Some("a1")).await;
    assert_eq!(named.iter().map(uid).collect::<Vec<_>>(), vec![a1.clone()]);

    let mut stream = fixture
        .microvms
        .list_micro_v_ms_stream(ListMicroVMsRequest::default())
        .await
        .expect("stream")
        .into_inner();
    let mut streamed = BTreeSet::new();
    while let Some(message) = stream.message().await.expect("message") {
        streamed.insert(uid(&message.microvm.expect("microvm")));
    }
    assert_eq!(streamed, fixture.host.microvm_uids().into_iter().collect());

    let unknown = get(&mut fixture.microvms, "no-such-uid")
        .await
        .expect_err("unknown");
    assert_eq!(unknown.code(), Code::NotFound);
    let empty = get(&mut fixture.microvms, "").await.expect_err("empty uid");
    assert_eq!(empty.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn delete_removes_the_microvm_and_its_directory() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    let uid = fixture.created("vm").await;
    let written = exec(&mut fixture.exec, shell(&uid, "echo data > file"))
        .await
        .expect("exec");
    assert_eq!(written.exit_code, Some(0));
    assert!(fixture.scratch_dir(&uid).join("file").is_file());

    delete(&mut fixture.microvms, &uid).await.expect("deleted");
    assert_eq!(
        get(&mut fixture.microvms, &uid)
            .await
            .expect_err("gone")
            .code(),
        Code::NotFound
    );
    assert!(!fixture.scratch_dir(&uid).exists());
    assert!(fixture.host.microvm_uids().is_empty());
    assert!(list(&mut fixture.microvms, "", None).await.is_empty());
    let again = delete(&mut fixture.microvms, &uid)
        .await
        .expect_err("already gone");
    assert_eq!(again.code(), Code::NotFound);
}

#[tokio::test]
async fn network_interfaces_follow_the_template() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    let template = MicroVmSpec {
        interfaces: vec![
            tap("eth0"),
            NetworkInterface {
                guest_mac: Some("aa:bb:cc:00:11:22".to_owned()),
                ..tap("eth1")
            },
            NetworkInterface {
                r#type: IfaceType::Macvtap.into(),
                ..tap("eth2")
            },
        ],
        ..spec("vm")
    };
    let first = create(&mut fixture.microvms, template.clone()).await;
    let second = create(
        &mut fixture.microvms,
        MicroVmSpec {
            id: "vm2".to_owned(),
            ..template
        },
    )
    .await;

    let mut indices = BTreeSet::new();
    let mut devices = BTreeSet::new();
    for microvm in [&first, &second] {
        let interfaces = &microvm.status.as_ref().expect("status").network_interfaces;
        let keys: BTreeSet<_> = interfaces.keys().map(String::as_str).collect();
        assert_eq!(keys, BTreeSet::from(["eth0", "eth1", "eth2"]));
        assert!(interfaces["eth0"].host_device_name.starts_with("tap"));
        assert!(interfaces["eth2"].host_device_name.starts_with("macvtap"));
        assert_eq!(interfaces["eth1"].mac_address, "aa:bb:cc:00:11:22");
        let generated = &interfaces["eth0"].mac_address;
        assert!(
            generated.starts_with("02:") && generated.len() == 17,
            "{generated}"
        );
        for status in interfaces.values() {
            assert!(
                indices.insert(status.index),
                "index {} reused",
                status.index
            );
            assert!(devices.insert(status.host_device_name.clone()));
        }
    }
    // GetMicroVM reports the same interfaces as the create answer.
    let fetched = get(&mut fixture.microvms, &uid(&first))
        .await
        .expect("found");
    assert_eq!(
        fetched.status.expect("status").network_interfaces,
        first.status.expect("status").network_interfaces
    );
}

#[tokio::test]
async fn exec_streams_stdout_stderr_and_the_exit_code() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    let uid = fixture.created("vm").await;
    let output = exec(
        &mut fixture.exec,
        shell(&uid, "echo out; echo err >&2; exit 3"),
    )
    .await
    .expect("exec");
    assert_eq!(output.stdout, "out\n");
    assert_eq!(output.stderr, "err\n");
    assert!(output.errors.is_empty());
    assert_eq!(output.exit_code, Some(3));

    let signalled = exec(&mut fixture.exec, shell(&uid, "kill -TERM $$"))
        .await
        .expect("exec");
    assert_eq!(signalled.exit_code, Some(128 + 15));
}

#[tokio::test]
async fn exec_without_shell_passes_argv_verbatim() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    let uid = fixture.created("vm").await;
    let argv = exec(
        &mut fixture.exec,
        ExecStart {
            uid: uid.clone(),
            cmd: "printf".to_owned(),
            args: vec!["%s|%s".to_owned(), "a b".to_owned(), "$HOME".to_owned()],
            ..ExecStart::default()
        },
    )
    .await
    .expect("exec");
    assert_eq!(argv.stdout, "a b|$HOME");
    assert_eq!(argv.exit_code, Some(0));

    let positional = exec(
        &mut fixture.exec,
        ExecStart {
            args: vec!["x".to_owned(), "y z".to_owned()],
            ..shell(&uid, r#"echo "$1-$2""#)
        },
    )
    .await
    .expect("exec");
    assert_eq!(positional.stdout, "x-y z\n");

    let missing = exec(
        &mut fixture.exec,
        ExecStart {
            uid,
            cmd: "/no/such/program".to_owned(),
            ..ExecStart::default()
        },
    )
    .await
    .expect("exec");
    assert_eq!(missing.errors.len(), 1, "{missing:?}");
    assert_eq!(missing.exit_code, Some(127));
}

#[tokio::test]
async fn exec_runs_in_the_microvm_directory_with_a_clean_environment() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    let uid = fixture.created("vm").await;
    let root = std::fs::canonicalize(fixture.scratch_dir(&uid)).expect("scratch dir exists");

    let made = exec(&mut fixture.exec, shell(&uid, "mkdir -p srv/app && pwd"))
        .await
        .expect("exec");
    assert_eq!(made.stdout.trim(), root.to_str().expect("utf-8 path"));

    let nested = exec(
        &mut fixture.exec,
        ExecStart {
            cwd: "/srv/../srv/app".to_owned(),
            ..shell(&uid, "pwd")
        },
    )
    .await
    .expect("exec");
    assert_eq!(Path::new(nested.stdout.trim()), root.join("srv/app"));

    let environment = exec(
        &mut fixture.exec,
        ExecStart {
            uid,
            cmd: "env".to_owned(),
            env: [("GREETING".to_owned(), "hi".to_owned())].into(),
            ..ExecStart::default()
        },
    )
    .await
    .expect("exec");
    let names: BTreeSet<_> = environment
        .stdout
        .lines()
        .filter_map(|line| line.split_once('=').map(|(name, _)| name))
        .collect();
    assert_eq!(names, BTreeSet::from(["GREETING", "HOME", "PATH"]));
    assert!(environment.stdout.contains("GREETING=hi\n"));
}

#[tokio::test]
async fn exec_streams_stdin_until_stdin_eof() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    let uid = fixture.created("vm").await;
    let (requests, stream) = mpsc::channel(4);
    requests
        .send(start_request(ExecStart {
            uid,
            cmd: "cat".to_owned(),
            has_stdin: true,
            ..ExecStart::default()
        }))
        .await
        .expect("sent");
    let mut responses = fixture
        .exec
        .exec_command(ReceiverStream::new(stream))
        .await
        .expect("exec")
        .into_inner();

    requests.send(stdin_request(b"hello ")).await.expect("sent");
    // Output streams back while stdin is still open.
    let echoed = next(&mut responses).await.expect("output").expect("more");
    assert_eq!(
        echoed.payload,
        Some(ResponsePayload::Stdout(Bytes::from_static(b"hello ")))
    );

    requests.send(stdin_request(b"world")).await.expect("sent");
    requests
        .send(ExecCommandRequest {
            payload: Some(RequestPayload::StdinEof(true)),
        })
        .await
        .expect("sent");
    // The request stream stays open: stdin_eof alone ends the command's input.
    let rest = collect(&mut responses).await.expect("exec");
    assert_eq!(rest.stdout, "world");
    assert_eq!(rest.exit_code, Some(0));
    drop(requests);
}

#[tokio::test]
async fn exec_without_has_stdin_gives_the_command_no_input() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    let uid = fixture.created("vm").await;
    let requests = tokio_stream::iter(vec![
        start_request(ExecStart {
            uid,
            cmd: "cat".to_owned(),
            ..ExecStart::default()
        }),
        stdin_request(b"dropped"),
    ]);
    let mut responses = fixture
        .exec
        .exec_command(requests)
        .await
        .expect("exec")
        .into_inner();
    let output = collect(&mut responses).await.expect("exec");
    assert_eq!(output.stdout, "");
    assert_eq!(output.exit_code, Some(0));
}

#[tokio::test]
async fn exec_timeout_kills_the_command_and_reports_124() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    let uid = fixture.created("vm").await;
    let began = Instant::now();
    let output = exec(
        &mut fixture.exec,
        ExecStart {
            timeout_seconds: 1,
            ..shell(&uid, "echo started; sleep 30")
        },
    )
    .await
    .expect("exec");
    assert!(began.elapsed() < DEADLINE);
    assert_eq!(output.stdout, "started\n");
    assert_eq!(output.errors, vec!["command timed out after 1s".to_owned()]);
    assert_eq!(output.exit_code, Some(124));
}

#[tokio::test]
async fn exec_protocol_errors_are_invalid_argument() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    let uid = fixture.created("vm").await;

    let not_start = fixture
        .exec
        .exec_command(tokio_stream::iter(vec![stdin_request(b"x")]))
        .await
        .expect_err("refused");
    assert_eq!(not_start.code(), Code::InvalidArgument);

    let nothing = fixture
        .exec
        .exec_command(tokio_stream::iter(Vec::<ExecCommandRequest>::new()))
        .await
        .expect_err("refused");
    assert_eq!(nothing.code(), Code::InvalidArgument);

    let no_cmd = exec(&mut fixture.exec, shell(&uid, ""))
        .await
        .expect_err("refused");
    assert_eq!(no_cmd.code(), Code::InvalidArgument);

    let negative = exec(
        &mut fixture.exec,
        ExecStart {
            timeout_seconds: -1,
            ..shell(&uid, "true")
        },
    )
    .await
    .expect_err("refused");
    assert_eq!(negative.code(), Code::InvalidArgument);

    // A second start ends a running command's stream.
    let requests = tokio_stream::iter(vec![
        start_request(ExecStart {
            has_stdin: true,
            ..shell(&uid, "cat")
        }),
        start_request(shell(&uid, "true")),
    ]);
    let mut responses = fixture
        .exec
        .exec_command(requests)
        .await
        .expect("started")
        .into_inner();
    let second = collect(&mut responses)
        .await
        .expect_err("second start refused");
    assert_eq!(second.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn exec_needs_a_known_created_microvm() {
    let mut fixture = Fixture::start(FOREVER).await;
    let unknown = exec(&mut fixture.exec, shell("no-such-uid", "true"))
        .await
        .expect_err("refused");
    assert_eq!(unknown.code(), Code::NotFound);

    let pending = uid(&create(&mut fixture.microvms, spec("vm")).await);
    let refused = exec(&mut fixture.exec, shell(&pending, "true"))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::FailedPrecondition);
}

#[tokio::test]
async fn client_cancel_kills_the_command() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    let uid = fixture.created("vm").await;
    let (pid, requests, responses) = start_long_running(&mut fixture.exec, &uid).await;
    assert!(!process_gone(pid));
    drop(responses);
    drop(requests);
    eventually(DEADLINE, "the cancelled command is killed", async || {
        process_gone(pid)
    })
    .await;
}

#[tokio::test]
async fn exit_kills_what_the_command_left_running() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    let uid = fixture.created("vm").await;
    let output = exec(&mut fixture.exec, shell(&uid, "sleep 30 & echo $!"))
        .await
        .expect("exec");
    assert_eq!(output.exit_code, Some(0));
    let pid: u32 = output.stdout.trim().parse().expect("a pid");
    eventually(DEADLINE, "the background child is killed", async || {
        process_gone(pid)
    })
    .await;
}

#[tokio::test]
async fn delete_kills_running_commands() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    let uid = fixture.created("vm").await;
    let (pid, _requests, mut responses) = start_long_running(&mut fixture.exec, &uid).await;
    delete(&mut fixture.microvms, &uid).await.expect("deleted");
    eventually(DEADLINE, "the command is killed", async || {
        process_gone(pid)
    })
    .await;
    let ended = collect(&mut responses).await.expect_err("stream cut");
    assert_eq!(ended.code(), Code::Aborted);
    assert!(!fixture.scratch_dir(&uid).exists());
}

#[tokio::test]
async fn shutdown_kills_running_commands() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    let uid = fixture.created("vm").await;
    let (pid, _requests, mut responses) = start_long_running(&mut fixture.exec, &uid).await;
    tokio::time::timeout(DEADLINE, fixture.host.shutdown())
        .await
        .expect("shutdown completes");
    eventually(DEADLINE, "the command is killed", async || {
        process_gone(pid)
    })
    .await;
    let ended = collect(&mut responses).await.expect_err("stream cut");
    assert_eq!(ended.code(), Code::Unavailable, "{ended:?}");
}

#[tokio::test]
async fn fail_creates_answers_unavailable() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    fixture.host.faults().fail_creates(true);
    let refused = fixture
        .microvms
        .create_micro_vm(CreateMicroVmRequest {
            microvm: Some(spec("vm")),
            ..CreateMicroVmRequest::default()
        })
        .await
        .expect_err("fault");
    assert_eq!(refused.code(), Code::Unavailable);
    assert!(fixture.host.microvm_uids().is_empty());

    fixture.host.faults().fail_creates(false);
    create(&mut fixture.microvms, spec("vm")).await;
    assert_eq!(fixture.host.microvm_uids().len(), 1);
}

#[tokio::test]
async fn fail_deletes_answers_unavailable_and_keeps_the_microvm() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    let uid = fixture.created("vm").await;
    fixture.host.faults().fail_deletes(true);
    let refused = delete(&mut fixture.microvms, &uid)
        .await
        .expect_err("fault");
    assert_eq!(refused.code(), Code::Unavailable);
    assert_eq!(
        state(&get(&mut fixture.microvms, &uid).await.expect("kept")),
        MicroVmState::Created
    );

    fixture.host.faults().fail_deletes(false);
    delete(&mut fixture.microvms, &uid).await.expect("deleted");
}

#[tokio::test]
async fn fail_boot_leaves_new_microvms_failed() {
    let mut fixture = Fixture::start(Duration::ZERO).await;
    fixture.host.faults().fail_boot(true);
    let failed = uid(&create(&mut fixture.microvms, spec("vm")).await);
    wait_for_state(&mut fixture.microvms, &failed, MicroVmState::Failed).await;
    let refused = exec(&mut fixture.exec, shell(&failed, "true"))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), Code::FailedPrecondition);

    fixture.host.faults().fail_boot(false);
    fixture.created("vm2").await;
    delete(&mut fixture.microvms, &failed)
        .await
        .expect("a FAILED microvm can be deleted");
}

#[tokio::test]
async fn a_restarted_host_keeps_its_microvms() {
    let dir = tempfile::tempdir().expect("temp dir");
    let host = start_host(dir.path(), Duration::ZERO).await;
    let channel = connect(&host).await;
    let mut microvms = MicroVmClient::new(channel.clone());
    let mut exec_client = MicroVmExecClient::new(channel);
    let kept = uid(&create(&mut microvms, spec("kept")).await);
    let kept = wait_for_state(&mut microvms, &kept, MicroVmState::Created).await;
    let kept_uid = uid(&kept);
    let wrote = exec(&mut exec_client, shell(&kept_uid, "echo kept > file"))
        .await
        .expect("exec");
    assert_eq!(wrote.exit_code, Some(0));
    let deleted = uid(&create(&mut microvms, spec("deleted")).await);
    delete(&mut microvms, &deleted).await.expect("deleted");
    host.shutdown().await;

    // PENDING across the restart: this Host never finishes booting it.
    let host = start_host(dir.path(), FOREVER).await;
    let mut microvms = MicroVmClient::new(connect(&host).await);
    let pending = uid(&create(&mut microvms, spec("pending")).await);
    host.shutdown().await;

    // As a crash between making a directory and writing the list leaves one.
    let orphan = dir.path().join("microvms").join("not-listed");
    std::fs::create_dir_all(&orphan).expect("orphan made");

    let host = start_host(dir.path(), Duration::ZERO).await;
    assert!(!orphan.exists(), "unlisted directory removed");
    let channel = connect(&host).await;
    let mut microvms = MicroVmClient::new(channel.clone());
    let mut exec_client = MicroVmExecClient::new(channel);
    let expected: BTreeSet<_> = [kept_uid.clone(), pending.clone()].into();
    assert_eq!(
        host.microvm_uids().into_iter().collect::<BTreeSet<_>>(),
        expected
    );

    let reloaded = get(&mut microvms, &kept_uid).await.expect("kept");
    assert_eq!(state(&reloaded), MicroVmState::Created);
    assert_eq!(reloaded.spec, kept.spec);
    assert_eq!(reloaded.status, kept.status);
    let read = exec(&mut exec_client, shell(&kept_uid, "cat file"))
        .await
        .expect("exec");
    assert_eq!(read.stdout, "kept\n");

    wait_for_state(&mut microvms, &pending, MicroVmState::Created).await;

    // New interfaces do not reuse the indices of the reloaded ones.
    let fresh = create(&mut microvms, spec("fresh")).await;
    let index = |microvm: &MicroVm| {
        microvm.status.as_ref().expect("status").network_interfaces["eth0"].index
    };
    assert_ne!(index(&fresh), index(&reloaded));
    host.shutdown().await;
}

#[tokio::test]
async fn concurrent_creates_are_each_persisted_before_they_are_answered() {
    let dir = tempfile::tempdir().expect("temp dir");
    let host = start_host(dir.path(), FOREVER).await;
    let channel = connect(&host).await;
    // Many creates at once; each answer means its MicroVM's record is written, so a
    // crash right after loses none of them.
    let creates = (0..64).map(|i| {
        let mut microvms = MicroVmClient::new(channel.clone());
        async move { uid(&create(&mut microvms, spec(&format!("vm{i}"))).await) }
    });
    let created: BTreeSet<String> = futures::future::join_all(creates)
        .await
        .into_iter()
        .collect();
    assert_eq!(created.len(), 64);
    for uid in &created {
        let record = dir.path().join("records").join(format!("{uid}.json"));
        let record = std::fs::read_to_string(&record)
            .unwrap_or_else(|e| panic!("{uid} answered but not persisted: {e}"));
        assert!(record.contains(uid.as_str()), "{record}");
    }
    host.shutdown().await;
    let host = start_host(dir.path(), FOREVER).await;
    assert_eq!(
        host.microvm_uids().into_iter().collect::<BTreeSet<_>>(),
        created
    );
    host.shutdown().await;
}

#[tokio::test]
async fn server_info_and_health() {
    let dir = tempfile::tempdir().expect("temp dir");
    let host = SimulatedHost::start(SimulatedHostConfig {
        name: "host-7".to_owned(),
        state_dir: dir.path().to_owned(),
        version: "v0.16.0".to_owned(),
        ..SimulatedHostConfig::default()
    })
    .await
    .expect("started");
    assert_eq!(host.name(), "host-7");
    assert_ne!(host.address().port(), 0);
    let channel = connect(&host).await;

    let info = MicroVmClient::new(channel.clone())
        .server_info(())
        .await
        .expect("server info")
        .into_inner();
    assert_eq!(info.version.expect("version").version, "v0.16.0");

    let mut health = HealthClient::new(channel);
    for service in [
        "",
        "microvm.services.api.v1alpha1.MicroVM",
        "microvmexec.services.api.v1alpha1.MicroVMExec",
    ] {
        let status = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("health")
            .into_inner()
            .status;
        assert_eq!(
            status,
            i32::from(ServingStatus::Serving),
            "service {service:?}"
        );
    }
    host.shutdown().await;
}

#[tokio::test]
async fn start_refuses_a_missing_or_unreadable_state_dir() {
    let missing = SimulatedHost::start(SimulatedHostConfig::default())
        .await
        .expect_err("state_dir required");
    assert!(matches!(missing, SimHostError::StateDirRequired));

    // A corrupt record, and a corrupt list of an earlier version.
    for file in ["records/vm.json", "microvms.json"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(file);
        std::fs::create_dir_all(path.parent().unwrap()).expect("dir");
        std::fs::write(&path, "not json").expect("written");
        let corrupt = SimulatedHost::start(SimulatedHostConfig {
            state_dir: dir.path().to_owned(),
            ..SimulatedHostConfig::default()
        })
        .await
        .expect_err("corrupt state refused");
        assert!(
            matches!(&corrupt, SimHostError::ParseState { path: p, .. } if *p == path),
            "{corrupt:?}"
        );
    }
}
