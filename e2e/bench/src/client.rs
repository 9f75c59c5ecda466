//! One keep-alive HTTP/2 connection to `battery-apiserver serve`, as the kubectl user
//! (its client certificate), the way kubectl holds one: what a user's request costs.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use serde_json::Value;

use battery_e2e::pki;

/// The API group's path.
pub const GROUP_VERSION: &str = "/apis/battery.liquidmetal-x.dev/v1alpha1";
/// The namespace the bench works in.
pub const NAMESPACE: &str = "default";
/// How long one request may take before the bench gives up on the run.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A handle on one HTTP/2 connection; clones share it.
#[derive(Clone)]
pub struct Client {
    sender: SendRequest<Full<Bytes>>,
    url: String,
}

impl Client {
    /// Connects to `url` (`https://ADDRESS:PORT`) trusting `ca` for `server_name`, as
    /// `cert`/`key`.
    pub async fn connect(
        url: &str,
        ca: &Path,
        server_name: &str,
        (cert, key): (&Path, &Path),
    ) -> Result<Self> {
        let config = pki::client_config(&[ca], Some((cert, key)), &[b"h2"])?;
        let authority = url.trim_start_matches("https://");
        let tcp = tokio::net::TcpStream::connect(authority)
            .await
            .with_context(|| format!("connecting to {authority}"))?;
        // The client's own writes must not wait for delayed ACKs, or it measures itself.
        tcp.set_nodelay(true)?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from(server_name.to_owned())?, tcp)
            .await
            .context("TLS handshake")?;
        let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            // Room for a thousand watches on a few connections.
            .max_concurrent_reset_streams(1024)
            .handshake(TokioIo::new(tls))
            .await
            .context("HTTP/2 handshake")?;
        tokio::spawn(connection);
        Ok(Self {
            sender,
            url: url.to_owned(),
        })
    }

    /// Sends a request and returns the response with its body unread.
    pub async fn open(
        &self,
        method: Method,
        path: &str,
        accept: &str,
        body: Option<&Value>,
    ) -> Result<http::Response<Incoming>> {
        let request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.url))
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, accept)
            .body(Full::new(Bytes::from(
                body.map(Value::to_string).unwrap_or_default(),
            )))?;
        let response =
            tokio::time::timeout(REQUEST_TIMEOUT, self.sender.clone().send_request(request))
                .await
                .with_context(|| format!("{path}: no answer within {REQUEST_TIMEOUT:?}"))?
                .with_context(|| format!("{path}: the request failed"))?;
        Ok(response)
    }

    /// A whole request: status and body.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        accept: &str,
        body: Option<&Value>,
    ) -> Result<(StatusCode, Bytes)> {
        let response = self.open(method, path, accept, body).await?;
        let status = response.status();
        let bytes = tokio::time::timeout(REQUEST_TIMEOUT, response.into_body().collect())
            .await
            .with_context(|| format!("{path}: the body did not end within {REQUEST_TIMEOUT:?}"))?
            .with_context(|| format!("{path}: reading the body"))?
            .to_bytes();
        Ok((status, bytes))
    }

    /// A JSON request that must answer `want`; returns the body.
    pub async fn json(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        want: StatusCode,
    ) -> Result<Value> {
        let (status, bytes) = self.send(method, path, "application/json", body).await?;
        if status != want {
            bail!(
                "{path}: {status}, not {want}: {}",
                String::from_utf8_lossy(&bytes)
            );
        }
        serde_json::from_slice(&bytes).with_context(|| format!("{path}: the body is not JSON"))
    }
}

/// The path of the claims of the bench's namespace.
pub fn claims_path() -> String {
    format!("{GROUP_VERSION}/namespaces/{NAMESPACE}/microvmclaims")
}

/// The path of the Pools of the bench's namespace.
pub fn pools_path() -> String {
    format!("{GROUP_VERSION}/namespaces/{NAMESPACE}/pools")
}

/// A claim on `pool`, held by the kubectl user's ServiceAccount (`default/dev`).
pub fn claim(name: &str, pool: &str) -> Value {
    serde_json::json!({
        "apiVersion": battery_types::API_VERSION, "kind": "MicroVMClaim",
        "metadata": {"name": name},
        "spec": {"poolRef": {"name": pool}, "serviceAccountName": "dev"}
    })
}

/// The ConfigMaps' path in the bench's namespace.
pub fn configmaps_path() -> String {
    format!("/api/v1/namespaces/{NAMESPACE}/configmaps")
}

/// Creates the small ConfigMap `name` through `kube`: the reference write the targets
/// name.
pub async fn create_config_map(kube: &Client, name: &str) -> Result<()> {
    let object = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name}, "data": {"key": "value"}
    });
    kube.json(
        Method::POST,
        &configmaps_path(),
        Some(&object),
        StatusCode::CREATED,
    )
    .await?;
    Ok(())
}
