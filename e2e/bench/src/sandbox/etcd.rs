//! What etcd wrote: its own counters, less what the cluster writes idle, and its history
//! by resource.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use base64::Engine as _;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::peer::POLL;

/// How long one request to etcd, or the read of its history, may take.
const ETCD_TIMEOUT: Duration = Duration::from_secs(30);
/// etcd is quiet once it has taken no write for this long: what a piece of work set off
/// (reconciles, Events) lands after it returns.
const QUIET: Duration = Duration::from_secs(1);
/// How long etcd may take to be quiet after the work.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// etcd's own account of what it was asked to write: its counters (`/metrics`) and its
/// history (a watch from a past revision), read on its client URL.
pub struct Etcd {
    /// `127.0.0.1:PORT`.
    address: String,
}

/// What etcd wrote while a piece of work ran and until it was quiet again.
pub struct Window {
    /// Puts and deletes, from etcd's counters.
    pub writes: f64,
    /// From the work's start until etcd was quiet.
    pub took: Duration,
    /// etcd's revision before and after.
    revisions: (u64, u64),
}

impl Window {
    /// The writes less what `idle` writes over as long: the work's own.
    pub fn net(&self, idle: &Window) -> f64 {
        self.writes - idle.writes * self.took.as_secs_f64() / idle.took.as_secs_f64()
    }
}

/// etcd's counters at one moment.
pub(super) struct Counters {
    writes: f64,
    revision: u64,
}

impl Etcd {
    /// The etcd at `url` (`http://127.0.0.1:PORT`).
    pub fn new(url: &str) -> Result<Self> {
        let address = url
            .strip_prefix("http://")
            .with_context(|| format!("etcd's URL {url} is not http://"))?;
        Ok(Self {
            address: address.to_owned(),
        })
    }

    /// Runs `work` and returns what it gave, and what etcd wrote from its start until
    /// etcd took no write for [`QUIET`] after it: the writes it set off land after it
    /// returns (reconciles, Events). Whatever else writes meanwhile is counted too;
    /// [`Window::net`] takes off an idle cluster's share.
    pub async fn around<T>(&self, work: impl Future<Output = Result<T>>) -> Result<(T, Window)> {
        let before = self.counters().await?;
        let started = Instant::now();
        let value = work.await?;
        let after = self.quiet().await?;
        Ok((
            value,
            Window {
                writes: after.writes - before.writes,
                took: started.elapsed(),
                revisions: (before.revision, after.revision),
            },
        ))
    }

    /// The counters once etcd has taken no write for [`QUIET`].
    pub(super) async fn quiet(&self) -> Result<Counters> {
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        let mut last = self.counters().await?;
        let mut since = Instant::now();
        loop {
            tokio::time::sleep(POLL).await;
            let now = self.counters().await?;
            if now.writes != last.writes {
                (last, since) = (now, Instant::now());
            } else if since.elapsed() >= QUIET {
                return Ok(last);
            }
            if Instant::now() > deadline {
                bail!(
                    "etcd was still taking writes {SETTLE_TIMEOUT:?} after the work ended \
                     (waiting for none in {QUIET:?}; revision {})",
                    last.revision
                );
            }
        }
    }

    /// Puts and deletes so far, and the revision, from etcd's `/metrics`.
    pub(super) async fn counters(&self) -> Result<Counters> {
        let request = http::Request::get("/metrics")
            .header(http::header::HOST, &self.address)
            .body(Full::new(Bytes::new()))?;
        let response = self.send(request).await?;
        let text = tokio::time::timeout(ETCD_TIMEOUT, response.into_body().collect())
            .await
            .context("etcd's /metrics did not end in time")??
            .to_bytes();
        let text = std::str::from_utf8(&text).context("etcd's /metrics is not UTF-8")?;
        let value = |name: &str| -> Result<f64> {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
                .with_context(|| format!("no {name} in etcd's /metrics"))?
                .trim()
                .parse()
                .with_context(|| format!("etcd's {name}"))
        };
        Ok(Counters {
            writes: value("etcd_mvcc_put_total")? + value("etcd_mvcc_delete_total")?,
            revision: value("etcd_debugging_mvcc_current_revision")? as u64,
        })
    }

    /// How many of the window's writes went to each resource (`pods`,
    /// `extensions.agents.x-k8s.io/sandboxclaims`), from etcd's history: a watch of every
    /// key from the window's first revision, read up to its last.
    pub async fn by_resource(&self, window: &Window) -> Result<BTreeMap<String, u64>> {
        let (from, to) = window.revisions;
        let mut writes = BTreeMap::new();
        if to <= from {
            return Ok(writes);
        }
        // "\0" to "\0": every key.
        let every = base64::engine::general_purpose::STANDARD.encode([0]);
        let watch = json!({"create_request": {
            "key": every, "range_end": every, "start_revision": (from + 1).to_string(),
        }});
        let request = http::Request::post("/v3/watch")
            .header(http::header::HOST, &self.address)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(watch.to_string())))?;
        let mut body = self.send(request).await?.into_body();
        let deadline = tokio::time::Instant::now() + ETCD_TIMEOUT;
        let (mut pending, mut read) = (Vec::new(), from);
        while read < to {
            let frame = tokio::time::timeout_at(deadline, body.frame())
                .await
                .with_context(|| {
                    format!("etcd's history from {from} to {to} was not read in time (at {read})")
                })?
                .context("etcd ended its watch")??;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            // One watch response a line.
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let message: Value = serde_json::from_slice(&line)
                    .with_context(|| format!("etcd's watch: {}", String::from_utf8_lossy(&line)))?;
                let result = &message["result"];
                if result["canceled"] == true {
                    bail!("etcd cancelled the watch of its history from {from}: {result}");
                }
                for event in result["events"].as_array().into_iter().flatten() {
                    let kv = &event["kv"];
                    let revision: u64 = kv["mod_revision"]
                        .as_str()
                        .and_then(|r| r.parse().ok())
                        .with_context(|| format!("an event of etcd's watch: {event}"))?;
                    if revision > to {
                        continue;
                    }
                    read = read.max(revision);
                    let key = base64::engine::general_purpose::STANDARD
                        .decode(kv["key"].as_str().unwrap_or_default())
                        .context("a key of etcd's watch")?;
                    *writes.entry(resource(&key)).or_default() += 1;
                }
            }
        }
        Ok(writes)
    }

    /// Sends `request` on a new connection, answered in [`ETCD_TIMEOUT`] with a success.
    pub(super) async fn send(
        &self,
        request: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<hyper::body::Incoming>> {
        let path = request.uri().path().to_owned();
        let exchange = async {
            let tcp = tokio::net::TcpStream::connect(&self.address).await?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
            tokio::spawn(connection);
            anyhow::Ok(sender.send_request(request).await?)
        };
        let response = tokio::time::timeout(ETCD_TIMEOUT, exchange)
            .await
            .with_context(|| format!("etcd did not answer {path} in time"))?
            .with_context(|| format!("etcd at {}: {path}", self.address))?;
        if !response.status().is_success() {
            bail!("etcd at {}: {path}: {}", self.address, response.status());
        }
        Ok(response)
    }
}

/// The resource a key of kube-apiserver's holds: `/registry/pods/NS/NAME` is `pods`,
/// `/registry/GROUP/RESOURCE/...` is `GROUP/RESOURCE`; a key of its own is itself.
pub(super) fn resource(key: &[u8]) -> String {
    let key = String::from_utf8_lossy(key);
    let Some(path) = key.strip_prefix("/registry/") else {
        return key.into_owned();
    };
    let mut parts = path.split('/');
    let first = parts.next().unwrap_or_default();
    if first.contains('.') {
        format!("{first}/{}", parts.next().unwrap_or_default())
    } else {
        first.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn keys_name_their_resources() {
        assert_eq!(resource(b"/registry/pods/agent-sandbox/a"), "pods");
        assert_eq!(
            resource(b"/registry/extensions.agents.x-k8s.io/sandboxclaims/agent-sandbox/a"),
            "extensions.agents.x-k8s.io/sandboxclaims"
        );
        assert_eq!(resource(b"compact_rev_key"), "compact_rev_key");
    }
}
