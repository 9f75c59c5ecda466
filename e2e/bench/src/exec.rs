//! Exec: the first byte and the stdout throughput of a command run through the API
//! server, the agent and the simulated Host, against the same command run here with its
//! stdout on a local pipe, in the same run. Both are also measured from the agent's relay
//! and from the simulated Host straight, so each hop's part is told apart.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use futures::StreamExt as _;
use tokio::io::AsyncReadExt as _;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

use battery_proto::Bytes;
use battery_proto::agent::v1alpha1::relay_client::RelayClient;
use battery_proto::agent::v1alpha1::{
    ExecOpen, ExecRequest, StdinEof, exec_request, exec_response, exit_status,
};
use battery_proto::microvmexec::services::api::v1alpha1::micro_vm_exec_client::MicroVmExecClient;
use battery_proto::microvmexec::services::api::v1alpha1::{
    ExecCommandRequest, ExecStart, exec_command_request, exec_command_response,
};
use http::{Method, StatusCode};
use serde_json::Value;

use super::binds::bind;
use super::client::NAMESPACE;
use super::report::{Row, Unit, percentiles, quantile};
use super::rig::{CpuUse, Rig, Route};
use battery_e2e::channel_exec;
use battery_types::channel::{self, ERROR, STDOUT};

pub const EXEC: &str = "exec";

/// A session may stay quiet this long before the run fails.
const QUIET_LIMIT: Duration = Duration::from_secs(60);
pub(super) const MB: f64 = 1_000_000.0;
/// Throughput runs of each kind, interleaved; each rate is their median, so that one run
/// slowed by the rest of this 2-core machine does not set it.
pub(super) const THROUGHPUT_ROUNDS: usize = 5;

/// When the first stdout byte came, and how many came in all, and when the last did.
pub(super) struct Run {
    pub(super) first_byte: Duration,
    pub(super) bytes: usize,
    pub(super) took: Duration,
}

/// `rounds` runs of `echo` for the first byte, then `head -c bytes /dev/zero` for the
/// throughput, each through a claim bound on `pool` and on a local pipe, and also from
/// the agent's relay, as the API server asks it, and straight from the simulated Host's
/// `MicroVMExec`, as the agent asks it.
pub async fn run(rig: &Rig, pool: &str, rounds: usize, bytes: usize) -> Result<Vec<Row>> {
    let client = rig.client().await?;
    let (_, claim) = bind(&client, "exec", pool).await?;
    let target = Target::of(&client, &claim).await?;
    let mut host = target.host_exec().await?;
    let mut agent = target.agent_exec(rig).await?;
    let exec = rig.exec_client(Route::Direct);
    let through_kube = rig.exec_client(Route::Kube);
    let echo = ["echo", "battery"];
    let size = bytes.to_string();
    let head = ["head", "-c", size.as_str(), "/dev/zero"];
    let (mut remote, mut kube, mut relayed, mut direct, mut local) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        remote.push(through_server(&exec, "exec", &echo).await?.first_byte);
        kube.push(
            through_server(&through_kube, "exec", &echo)
                .await?
                .first_byte,
        );
        relayed.push(agent.run(&echo).await?.first_byte);
        direct.push(host.run(&echo).await?.first_byte);
        local.push(on_a_pipe(&echo).await?.first_byte);
    }
    // Interleaved, and the median of each: this machine's speed drifts between runs
    // more than they differ. The relay's and the Host's own rates tell each hop's part.
    let mut rates = [const { Vec::new() }; 5];
    // Each process's CPU for the output straight through `serve`: which hop costs what.
    let mut through_serve_cpu = Vec::with_capacity(THROUGHPUT_ROUNDS);
    for _ in 0..THROUGHPUT_ROUNDS {
        let before = rig.cpu_use()?;
        let through_serve = through_server(&exec, "exec", &head).await?;
        through_serve_cpu.push(rig.cpu_use()?.since(&before));
        let runs = [
            through_serve,
            through_server(&through_kube, "exec", &head).await?,
            agent.run(&head).await?,
            host.run(&head).await?,
            on_a_pipe(&head).await?,
        ];
        for (rates, run) in rates.iter_mut().zip(runs) {
            if run.bytes != bytes {
                bail!("head printed {} bytes, not {bytes}", run.bytes);
            }
            rates.push(run.bytes as f64 / MB / run.took.as_secs_f64());
        }
    }
    let [through, kube_rate, relayed_rate, direct_rate, piped] = rates.map(median);
    let [p50, _, p99] = percentiles(EXEC, "first byte through server+agent", &remote);
    let mut rows = vec![p50.at_most(5.0), p99];
    let [p50, _, p99] = percentiles(
        EXEC,
        "first byte through kube-apiserver+server+agent",
        &kube,
    );
    rows.extend([p50, p99]);
    rows.push(Row::millis(
        EXEC,
        "first byte from the agent's relay p50",
        quantile(&relayed, 0.5),
    ));
    rows.push(Row::millis(
        EXEC,
        "first byte straight from the simulated Host p50",
        quantile(&direct, 0.5),
    ));
    rows.push(Row::millis(
        EXEC,
        "first byte on a local pipe p50",
        quantile(&local, 0.5),
    ));
    for (path, rate) in [
        ("through server+agent", through),
        ("through kube-apiserver+server+agent", kube_rate),
        ("from the agent's relay", relayed_rate),
        ("straight from the simulated Host", direct_rate),
        ("on a local pipe", piped),
    ] {
        rows.push(Row::new(
            EXEC,
            format!(
                "stdout MB/s {path} ({} MB, median of {THROUGHPUT_ROUNDS})",
                bytes / 1_000_000
            ),
            rate,
            Unit::MegabytesPerSecond,
        ));
    }
    rows.push(
        Row::new(
            EXEC,
            "throughput ratio server+agent / pipe",
            through / piped,
            Unit::Times,
        )
        .at_least(0.5),
    );
    rows.extend(through_serve_cpu.into_iter().sum::<CpuUse>().rows(
        EXEC,
        "a MB through server+agent",
        (bytes * THROUGHPUT_ROUNDS) as f64 / MB,
    ));
    Ok(rows)
}

pub(super) fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

/// Runs `command` in the claim's MicroVM over the WebSocket channel protocol (v5), on a
/// new connection as kubectl makes one per exec (to `serve`, or to kube-apiserver, which
/// dials `serve` for it), timed from before the connection.
pub(super) async fn through_server(
    exec: &channel_exec::Client,
    claim: &str,
    command: &[&str],
) -> Result<Run> {
    let started = Instant::now();
    let path = format!(
        "{}?{}",
        channel_exec::exec_path(NAMESPACE, claim),
        channel_exec::query(command, false)
    );
    let tls = exec.https.connect(b"http/1.1").await;
    let mut request = format!("wss://{}{path}", exec.https.authority()).into_client_request()?;
    request
        .headers_mut()
        .insert("sec-websocket-protocol", "v5.channel.k8s.io".parse()?);
    let (mut ws, _) = tokio_tungstenite::client_async(request, tls)
        .await
        .context("the exec WebSocket handshake")?;
    let (mut first_byte, mut bytes, mut status) = (None, 0, None);
    while let Some(message) = tokio::time::timeout(QUIET_LIMIT, ws.next())
        .await
        .context("the exec said nothing for a minute")?
    {
        // The server may close the TCP connection without a TLS close_notify once the
        // session is over, as kubectl tolerates; the Status below says how it ended.
        let Ok(Message::Binary(data)) = message else {
            if message.is_err() {
                break;
            }
            continue;
        };
        match channel::decode_binary(&data) {
            Some((STDOUT, payload)) => {
                if !payload.is_empty() {
                    first_byte.get_or_insert_with(|| started.elapsed());
                }
                bytes += payload.len();
            }
            Some((ERROR, payload)) => {
                status = serde_json::from_slice::<serde_json::Value>(payload).ok();
            }
            _ => {}
        }
    }
    let status = status.context("the exec ended without a Status")?;
    if status["status"] != "Success" {
        bail!("{command:?} failed: {status}");
    }
    Ok(Run {
        first_byte: first_byte.context("the exec printed nothing")?,
        bytes,
        took: started.elapsed(),
    })
}

/// Where the claim's MicroVM is: its uid, its Host, the Host's flintlock and agent.
pub(super) struct Target {
    uid: String,
    host: String,
    flintlock: String,
    agent: String,
}

impl Target {
    pub(super) async fn of(client: &super::client::Client, claim: &Value) -> Result<Self> {
        let text = |v: &Value, what: &str| v.as_str().map(str::to_owned).context(what.to_owned());
        let uid = text(
            &claim["status"]["microVM"]["uid"],
            "the claim's MicroVM uid",
        )?;
        let host = text(&claim["status"]["host"]["nodeName"], "the claim's Host")?;
        let path = format!("{}/hosts/{host}", super::client::GROUP_VERSION);
        let object = client
            .json(Method::GET, &path, None, StatusCode::OK)
            .await?;
        Ok(Self {
            uid,
            flintlock: text(&object["spec"]["address"], "the Host's flintlock address")?,
            agent: text(&object["spec"]["agentAddress"], "the Host's agent address")?,
            host,
        })
    }

    /// flintlock's `MicroVMExec` on the Host, on one connection kept open as the agent
    /// keeps its own.
    async fn host_exec(&self) -> Result<HostExec> {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", self.flintlock))?
                .tcp_nodelay(true)
                .connect()
                .await
                .with_context(|| {
                    format!("connecting to the simulated Host at {}", self.flintlock)
                })?;
        Ok(HostExec {
            client: MicroVmExecClient::new(channel),
            uid: self.uid.clone(),
        })
    }

    /// The agent's relay, on one connection kept open as the API server keeps its own.
    pub(super) async fn agent_exec(&self, rig: &Rig) -> Result<AgentExec> {
        Ok(AgentExec {
            client: rig.relay_client(&self.host, &self.agent).await?,
            uid: self.uid.clone(),
        })
    }
}

/// flintlock's `MicroVMExec` for the claim's MicroVM.
struct HostExec {
    client: MicroVmExecClient<tonic::transport::Channel>,
    uid: String,
}

/// The agent's `Relay` for the claim's MicroVM.
pub(super) struct AgentExec {
    client: RelayClient<tonic::transport::Channel>,
    uid: String,
}

impl AgentExec {
    /// `command`'s stdout, timed from before the stream opened.
    async fn run(&mut self, command: &[&str]) -> Result<Run> {
        let started = Instant::now();
        let open = ExecRequest {
            payload: Some(exec_request::Payload::Open(ExecOpen {
                microvm_uid: self.uid.clone(),
                command: command.iter().map(|a| (*a).to_owned()).collect(),
                stdout: true,
                ..ExecOpen::default()
            })),
        };
        let stream = self
            .client
            .exec(futures::stream::iter([open]))
            .await
            .context("Exec on the agent's relay")?
            .into_inner();
        read_stdout(started, stream, |message| match message.payload {
            Some(exec_response::Payload::Stdout(bytes)) => bytes.len(),
            _ => 0,
        })
        .await
        .context("the agent's exec")
    }

    /// How long `command` took to exit, `stdin` given and closed, timed from before the
    /// stream opened: what writing a claim's files at bind costs past the API server.
    pub(super) async fn until_exit(&mut self, command: &[&str], stdin: &[u8]) -> Result<Duration> {
        let started = Instant::now();
        let requests = [
            exec_request::Payload::Open(ExecOpen {
                microvm_uid: self.uid.clone(),
                command: command.iter().map(|a| (*a).to_owned()).collect(),
                stdin: true,
                stderr: true,
                ..ExecOpen::default()
            }),
            exec_request::Payload::Stdin(Bytes::copy_from_slice(stdin)),
            exec_request::Payload::StdinEof(StdinEof {}),
        ]
        .map(|payload| ExecRequest {
            payload: Some(payload),
        });
        let mut stream = self
            .client
            .exec(futures::stream::iter(requests))
            .await
            .context("Exec on the agent's relay")?
            .into_inner();
        while let Some(message) = stream.message().await? {
            if let Some(exec_response::Payload::Exit(exit)) = message.payload {
                return match exit.outcome {
                    Some(exit_status::Outcome::Code(0)) => Ok(started.elapsed()),
                    outcome => bail!("{command:?} ended with {outcome:?}"),
                };
            }
        }
        bail!("{command:?} ended without an exit status")
    }
}

impl HostExec {
    /// `command`'s stdout, timed from before the stream opened.
    async fn run(&mut self, command: &[&str]) -> Result<Run> {
        let started = Instant::now();
        let start = ExecCommandRequest {
            payload: Some(exec_command_request::Payload::Start(ExecStart {
                uid: self.uid.clone(),
                cmd: command[0].to_owned(),
                args: command[1..].iter().map(|a| (*a).to_owned()).collect(),
                ..ExecStart::default()
            })),
        };
        let stream = self
            .client
            .exec_command(futures::stream::iter([start]))
            .await
            .context("MicroVMExec on the simulated Host")?
            .into_inner();
        read_stdout(started, stream, |message| match message.payload {
            Some(exec_command_response::Payload::Stdout(bytes)) => bytes.len(),
            _ => 0,
        })
        .await
        .context("the Host's exec")
    }
}

/// `stream` read to its end (`stdout` tells how many stdout bytes a message holds),
/// timed from `started`.
async fn read_stdout<M: Send + 'static>(
    started: Instant,
    mut stream: tonic::Streaming<M>,
    stdout: impl Fn(M) -> usize,
) -> Result<Run> {
    let (mut first_byte, mut bytes) = (None, 0);
    while let Some(message) = stream.message().await? {
        let printed = stdout(message);
        if printed > 0 {
            first_byte.get_or_insert_with(|| started.elapsed());
        }
        bytes += printed;
    }
    Ok(Run {
        first_byte: first_byte.context("the command printed nothing")?,
        bytes,
        took: started.elapsed(),
    })
}

/// Runs `command` here with its stdout on a pipe read by the bench.
pub(super) async fn on_a_pipe(command: &[&str]) -> Result<Run> {
    let started = Instant::now();
    let mut child = tokio::process::Command::new(command[0])
        .args(&command[1..])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("running {command:?}"))?;
    let stdout = child.stdout.take().context("stdout is piped")?;
    let run = read_to_end(stdout, started)
        .await
        .context("the command's stdout")?;
    child.wait().await?;
    Ok(Run {
        took: started.elapsed(),
        ..run
    })
}

/// `stream` read to its end, timed from `started`: when its first byte came, how many
/// came, and when the last did.
pub(super) async fn read_to_end(
    mut stream: impl tokio::io::AsyncRead + Unpin,
    started: Instant,
) -> Result<Run> {
    let mut buffer = vec![0; 64 * 1024];
    let (mut first_byte, mut bytes) = (None, 0);
    loop {
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            break;
        }
        first_byte.get_or_insert_with(|| started.elapsed());
        bytes += read;
    }
    Ok(Run {
        first_byte: first_byte.context("nothing came")?,
        bytes,
        took: started.elapsed(),
    })
}
