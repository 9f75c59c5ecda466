//! Terminals and ports (ADR 33), as a user's program meets them: with the Rust SDK,
//! through kube-apiserver. A terminal's first byte beside a pipe's (a terminal is an SSH
//! session into the guest, a pipe is flintlock's `MicroVMExec`), a keystroke's echo round
//! trip beside one through a local `cat`, and a port-forward's throughput beside a local
//! pipe and a local TCP connection to the same server.
//!
//! The simulated guest's loopback is this machine's, so the server the forward reaches
//! is one the bench runs: every byte still goes through kube-apiserver, `serve`, the agent,
//! the Host's SSH proxy and sshd's `direct-tcpip`.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use battery_sdk::{Claim, TerminalSize};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use super::exec::{MB, THROUGHPUT_ROUNDS, median, on_a_pipe, read_to_end};
use super::report::{Row, Unit, millis, percentiles, quantile};
use super::rig::Rig;

pub const TERMINAL: &str = "terminal";

const SIZE: TerminalSize = TerminalSize::new(80, 24);

/// How big each part is.
#[derive(Clone, Copy)]
pub struct Sizes {
    /// Commands started on a terminal, and as many on pipes.
    pub starts: usize,
    /// Keystrokes typed, one at a time, each waited for.
    pub keystrokes: usize,
    /// Bytes read through the forward in each throughput round.
    pub forwarded_bytes: usize,
}

/// Claims a MicroVM of `pool` and measures it.
pub async fn run(rig: &Rig, pool: &str, sizes: Sizes) -> Result<Vec<Row>> {
    let client = rig.sdk_client().await?;
    let claim = client.claim(pool).send().await.context("claiming")?;
    let mut rows = first_bytes(&claim, sizes.starts).await?;
    rows.extend(keystroke_echo(&claim, sizes.keystrokes).await?);
    rows.extend(forward_throughput(&claim, sizes.forwarded_bytes).await?);
    claim.release().await.context("releasing the claim")?;
    Ok(rows)
}

/// `echo` started `starts` times on pipes, then as many on a terminal, each timed to
/// its first byte of output.
async fn first_bytes(claim: &Claim, starts: usize) -> Result<Vec<Row>> {
    let (mut on_terminal, mut on_pipes) = (Vec::new(), Vec::new());
    for _ in 0..starts {
        on_pipes.push(first_byte(claim, None).await?);
    }
    for _ in 0..starts {
        on_terminal.push(first_byte(claim, Some(SIZE)).await?);
    }
    let [p50, _, p99] = percentiles(TERMINAL, "first byte of echo on a terminal", &on_terminal);
    let mut rows = vec![p50, p99];
    let [p50, _, p99] = percentiles(TERMINAL, "first byte of echo on pipes", &on_pipes);
    rows.extend([p50, p99]);
    rows.push(Row::new(
        TERMINAL,
        "first byte, terminal / pipes p50",
        millis(quantile(&on_terminal, 0.5)) / millis(quantile(&on_pipes, 0.5)),
        Unit::Times,
    ));
    Ok(rows)
}

/// How long `echo` took to print, timed from before the session opened.
async fn first_byte(claim: &Claim, tty: Option<TerminalSize>) -> Result<Duration> {
    let started = Instant::now();
    let mut command = claim.command(["echo", "battery"]).stdin(false);
    if let Some(size) = tty {
        command = command.tty(size);
    }
    let mut process = command.spawn().await.context("starting echo")?;
    let mut stdout = process.stdout().context("echo's stdout")?;
    let mut first = [0_u8; 1];
    ensure!(
        stdout.read(&mut first).await.context("echo's output")? == 1,
        "echo ended without output"
    );
    let took = started.elapsed();
    drop(stdout);
    let code = process.wait().await.context("echo's exit")?;
    ensure!(code == 0, "echo exited {code}");
    Ok(took)
}

/// Keys typed one at a time into `cat` on a terminal, each timed until the terminal
/// echoes it; beside the same through `cat` here on pipes.
async fn keystroke_echo(claim: &Claim, keystrokes: usize) -> Result<Vec<Row>> {
    let mut process = claim
        .command(["cat"])
        .tty(SIZE)
        .spawn()
        .await
        .context("starting cat on a terminal")?;
    let mut stdin = process.stdin().context("cat's terminal input")?;
    let mut stdout = process.stdout().context("cat's terminal")?;
    let remote = echoes(&mut stdin, &mut stdout, keystrokes).await?;
    // Ctrl-D on an empty line: end of file to cat, which exits 0.
    stdin.write_all(b"\r\x04").await?;
    drop(stdin);
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).await?;
    drop(stdout);
    let code = process.wait().await.context("cat's exit")?;
    ensure!(code == 0, "cat on a terminal exited {code}");

    let mut local = tokio::process::Command::new("cat")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("running cat here")?;
    let (mut stdin, mut stdout) = (
        local.stdin.take().context("cat's stdin")?,
        local.stdout.take().context("cat's stdout")?,
    );
    let piped = echoes(&mut stdin, &mut stdout, keystrokes).await?;
    drop(stdin);
    local.wait().await?;

    let [p50, _, p99] = percentiles(TERMINAL, "keystroke echo round trip", &remote);
    let mut rows = vec![p50, p99];
    rows.push(Row::millis(
        TERMINAL,
        "keystroke echo through cat here on pipes p50",
        quantile(&piped, 0.5),
    ));
    Ok(rows)
}

/// Writes `keystrokes` letters one at a time, each timed until it is read back.
async fn echoes(
    stdin: &mut (impl tokio::io::AsyncWrite + Unpin),
    stdout: &mut (impl AsyncRead + Unpin),
    keystrokes: usize,
) -> Result<Vec<Duration>> {
    let mut round_trips = Vec::with_capacity(keystrokes);
    let mut echoed = [0_u8; 1];
    for key in (b'a'..=b'z').cycle().take(keystrokes) {
        let started = Instant::now();
        stdin.write_all(&[key]).await?;
        stdin.flush().await?;
        // Skip whatever else the terminal shows (nothing, in cat's case) until the key.
        loop {
            ensure!(
                stdout.read(&mut echoed).await? == 1,
                "the echo of {:?} never came",
                key as char
            );
            if echoed[0] == key {
                break;
            }
        }
        round_trips.push(started.elapsed());
    }
    Ok(round_trips)
}

/// A server here that writes `bytes` zeros to each connection, read through the claim's
/// forward and straight, interleaved, beside `head` on a local pipe; each rate the median
/// of its rounds.
async fn forward_throughput(claim: &Claim, bytes: usize) -> Result<Vec<Row>> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let port = listener.local_addr()?.port();
    let server = tokio::spawn(async move {
        let zeros = vec![0_u8; 64 * 1024];
        while let Ok((mut connection, _)) = listener.accept().await {
            let zeros = zeros.clone();
            tokio::spawn(async move {
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(zeros.len());
                    if connection.write_all(&zeros[..n]).await.is_err() {
                        return;
                    }
                    left -= n;
                }
            });
        }
    });
    let size = bytes.to_string();
    let head = ["head", "-c", size.as_str(), "/dev/zero"];
    let mut rates = [const { Vec::new() }; 3];
    let mut first_bytes = Vec::with_capacity(THROUGHPUT_ROUNDS);
    for _ in 0..THROUGHPUT_ROUNDS {
        let started = Instant::now();
        let forwarded = claim
            .connect_port(port)
            .await
            .context("connecting through the forward")?;
        let through = read_to_end(forwarded, started).await?;
        first_bytes.push(through.first_byte);
        let started = Instant::now();
        let local = TcpStream::connect(("127.0.0.1", port)).await?;
        let straight = read_to_end(local, started).await?;
        for (rates, run) in rates.iter_mut().zip([through, straight]) {
            ensure!(run.bytes == bytes, "read {} bytes, not {bytes}", run.bytes);
            rates.push(bytes as f64 / MB / run.took.as_secs_f64());
        }
        let piped = on_a_pipe(&head).await?;
        rates[2].push(bytes as f64 / MB / piped.took.as_secs_f64());
    }
    server.abort();
    let [forwarded, tcp, piped] = rates.map(median);
    let mut rows = vec![Row::millis(
        TERMINAL,
        "port-forward connect to first byte p50",
        quantile(&first_bytes, 0.5),
    )];
    for (path, rate) in [
        ("through the port-forward", forwarded),
        ("on a local TCP connection", tcp),
        ("on a local pipe", piped),
    ] {
        rows.push(Row::new(
            TERMINAL,
            format!(
                "MB/s {path} ({} MB, median of {THROUGHPUT_ROUNDS})",
                bytes / 1_000_000
            ),
            rate,
            Unit::MegabytesPerSecond,
        ));
    }
    rows.push(Row::new(
        TERMINAL,
        "throughput ratio port-forward / pipe",
        forwarded / piped,
        Unit::Times,
    ));
    Ok(rows)
}
