//! The CRD floor: what a CRD design writes to etcd per bind, on a real etcd started here.
//! agent-sandbox was measured making 18 writes per claim (the claim's create, its status
//! to Pending, the binding, its status to Bound, the Events); here 18 serial puts of
//! claim-sized values through etcd's HTTP/JSON gateway (`/v3/kv/put`) stand for one bind.
//! The floor leaves out everything else such a design does (controllers' watches and
//! reconcile loops, admission, kube-apiserver itself), so a real one is slower still.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use base64::Engine as _;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::json;

use super::report::{Row, Unit, millis, percentiles, quantile, rank};

pub const CRD_FLOOR: &str = "CRD floor (etcd)";
/// agent-sandbox v1.0.3's measured etcd writes per claim.
pub const PUTS_PER_BIND: usize = 18;
/// How long etcd may take to answer its first request.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// `etcd` on the PATH, if there is one.
pub fn find() -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("etcd"))
            .find(|path| path.is_file())
    })
}

/// Runs `binds` floors of [`PUTS_PER_BIND`] serial puts of `value` on a fresh etcd in
/// `dir`, and compares them with our serial binds `ours` of the same run.
pub async fn run(
    etcd: &Path,
    dir: &Path,
    binds: usize,
    value: &[u8],
    ours: &[Duration],
) -> Result<Vec<Row>> {
    let (client, peer) = (
        crate::apiserver::free_loopback_address(),
        crate::apiserver::free_loopback_address(),
    );
    let log = std::fs::File::create(dir.join("etcd.log"))?;
    let mut process = tokio::process::Command::new(etcd)
        .args(["--name", "bench", "--data-dir"])
        .arg(dir.join("etcd"))
        .arg(format!("--listen-client-urls=http://{client}"))
        .arg(format!("--advertise-client-urls=http://{client}"))
        .arg(format!("--listen-peer-urls=http://{peer}"))
        .arg(format!("--initial-advertise-peer-urls=http://{peer}"))
        .arg(format!("--initial-cluster=bench=http://{peer}"))
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", etcd.display()))?;
    let mut sender = connect(&client.to_string()).await?;
    let encode = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let value = encode(value);
    let mut floors = Vec::with_capacity(binds);
    for bind in 0..binds {
        let started = Instant::now();
        for put in 0..PUTS_PER_BIND {
            let key = encode(format!("/registry/bench/{bind}/{put}").as_bytes());
            let body = json!({"key": key, "value": value}).to_string();
            let request = http::Request::post("/v3/kv/put")
                .header(http::header::HOST, client.to_string())
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(body)))?;
            // HTTP/1.1: the connection takes the next request once the last is read.
            sender.ready().await.context("the etcd connection")?;
            let response = sender.send_request(request).await.context("an etcd put")?;
            let status = response.status();
            let text = response.into_body().collect().await?.to_bytes();
            if !status.is_success() {
                bail!("etcd put: {status}: {}", String::from_utf8_lossy(&text));
            }
        }
        floors.push(started.elapsed());
    }
    let _ = process.kill().await;
    let mut rows: Vec<Row> = percentiles(
        CRD_FLOOR,
        &format!("{PUTS_PER_BIND} serial puts of {} B", value.len() * 3 / 4),
        &floors,
    )
    .into_iter()
    .collect();
    for p in [0.5_f64, 0.99] {
        rows.push(Row::new(
            CRD_FLOOR,
            format!("ratio floor / our bind {}", rank(p)),
            millis(quantile(&floors, p)) / millis(quantile(ours, p)),
            Unit::Times,
        ));
    }
    Ok(rows)
}

/// A keep-alive HTTP/1.1 connection to etcd's gateway, once etcd answers on it.
async fn connect(address: &str) -> Result<SendRequest<Full<Bytes>>> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok(tcp) = tokio::net::TcpStream::connect(address).await {
            tcp.set_nodelay(true)?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
            tokio::spawn(connection);
            let health = http::Request::get("/health")
                .header(http::header::HOST, address)
                .body(Full::new(Bytes::new()))?;
            if let Ok(response) = sender.send_request(health).await
                && response.status().is_success()
            {
                response.into_body().collect().await?;
                return Ok(sender);
            }
        }
        if Instant::now() > deadline {
            bail!("etcd did not answer on {address} within {START_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
