//! Exec: the first byte and the stdout throughput of a command run through the API
//! server, the agent and the simulated Host, against the same command run here with its
//! stdout on a local pipe, in the same run.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use futures::StreamExt as _;
use tokio::io::AsyncReadExt as _;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

use super::binds::bind;
use super::client::NAMESPACE;
use super::report::{Row, Unit, percentiles, quantile};
use super::rig::Rig;
use crate::channel_exec::{self, ERROR, STDOUT};

pub const EXEC: &str = "exec";

/// A session may stay quiet this long before the run fails.
const QUIET_LIMIT: Duration = Duration::from_secs(60);
const MB: f64 = 1_000_000.0;

/// When the first stdout byte came, and how many came in all, and when the last did.
struct Run {
    first_byte: Duration,
    bytes: usize,
    took: Duration,
}

/// `rounds` runs of `echo` for the first byte, then one `head -c bytes /dev/zero` for
/// the throughput, each through a claim bound on `pool` and on a local pipe.
pub async fn run(rig: &Rig, pool: &str, rounds: usize, bytes: usize) -> Result<Vec<Row>> {
    let client = rig.client().await?;
    bind(&client, "exec", pool).await?;
    let exec = rig.exec_client();
    let echo = ["echo", "battery"];
    let size = bytes.to_string();
    let head = ["head", "-c", size.as_str(), "/dev/zero"];
    let (mut remote, mut local) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        remote.push(through_server(&exec, "exec", &echo).await?.first_byte);
        local.push(on_a_pipe(&echo).await?.first_byte);
    }
    let through = through_server(&exec, "exec", &head).await?;
    let piped = on_a_pipe(&head).await?;
    for run in [&through, &piped] {
        if run.bytes != bytes {
            bail!("head printed {} bytes, not {bytes}", run.bytes);
        }
    }
    let rate = |run: &Run| run.bytes as f64 / MB / run.took.as_secs_f64();
    let [p50, _, p99] = percentiles(EXEC, "first byte through server+agent", &remote);
    let mut rows = vec![p50.at_most(5.0), p99];
    rows.push(Row::millis(
        EXEC,
        "first byte on a local pipe p50",
        quantile(&local, 0.5),
    ));
    rows.push(Row::new(
        EXEC,
        format!(
            "stdout MB/s through server+agent ({} MB)",
            bytes / 1_000_000
        ),
        rate(&through),
        Unit::MegabytesPerSecond,
    ));
    rows.push(Row::new(
        EXEC,
        "stdout MB/s on a local pipe",
        rate(&piped),
        Unit::MegabytesPerSecond,
    ));
    rows.push(
        Row::new(
            EXEC,
            "throughput ratio server+agent / pipe",
            rate(&through) / rate(&piped),
            Unit::Times,
        )
        .at_least(0.5),
    );
    Ok(rows)
}

/// Runs `command` in the claim's MicroVM over the WebSocket channel protocol (v5), on a
/// new connection as kubectl makes one per exec, timed from before the connection.
async fn through_server(exec: &channel_exec::Client, claim: &str, command: &[&str]) -> Result<Run> {
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
        match data.split_first() {
            Some((&STDOUT, payload)) => {
                if !payload.is_empty() {
                    first_byte.get_or_insert_with(|| started.elapsed());
                }
                bytes += payload.len();
            }
            Some((&ERROR, payload)) => {
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

/// Runs `command` here with its stdout on a pipe read by the bench.
async fn on_a_pipe(command: &[&str]) -> Result<Run> {
    let started = Instant::now();
    let mut child = tokio::process::Command::new(command[0])
        .args(&command[1..])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("running {command:?}"))?;
    let mut stdout = child.stdout.take().context("stdout is piped")?;
    let mut buffer = vec![0; 64 * 1024];
    let (mut first_byte, mut bytes) = (None, 0);
    loop {
        let read = stdout.read(&mut buffer).await?;
        if read == 0 {
            break;
        }
        first_byte.get_or_insert_with(|| started.elapsed());
        bytes += read;
    }
    child.wait().await?;
    Ok(Run {
        first_byte: first_byte.context("the command printed nothing")?,
        bytes,
        took: started.elapsed(),
    })
}
