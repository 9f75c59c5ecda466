//! `kubectl microvm port-forward` on `dev`, and through a real kube-apiserver, its
//! aggregator, `serve` and the agent, to a real sshd's `direct-tcpip` behind the simulated
//! Host's SSH proxy (ADR 33): an HTTP server started in the MicroVM, fetched through the forward, twenty
//! connections at once, and a closed guest port failing its connection with a line that
//! says so while the forward goes on.

use std::time::Duration;

use battery_e2e::apiserver::{ApiServer, Route, Stream};
use battery_telemetry::free_loopback_address;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::common::{hold, kubectl, path_with_plugin};

/// How long the HTTP server in the MicroVM may take to answer through the forward.
const SERVING_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections made at once.
const CONNECTIONS: usize = 20;

/// An HTTP/1.0 GET of `/` on `port` of this machine; its answer, whole.
async fn get(port: u16) -> Result<String, String> {
    let mut connection = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    connection
        .write_all(b"GET / HTTP/1.0\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    connection
        .read_to_end(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

#[tokio::test]
async fn port_forward_through_kube_apiserver_reaches_a_guest_http_server() {
    forwards_to_a_guest_http_server(ApiServer::aggregated_with_agents().await).await;
}

/// The same on `dev`, whose agents run in its process.
#[tokio::test]
async fn port_forward_on_dev_reaches_a_guest_http_server() {
    forwards_to_a_guest_http_server(ApiServer::start(Route::Direct).await).await;
}

async fn forwards_to_a_guest_http_server(server: ApiServer) {
    let kubectl = kubectl(&server);
    let _held = hold(&kubectl, "c").await;
    // The simulated guest's loopback is this machine's.
    let guest_port = free_loopback_address().port().to_string();
    let _http = kubectl
        .cmd(&[
            "microvm",
            "exec",
            "c",
            "--",
            "python3",
            "-m",
            "http.server",
            &guest_port,
            "--bind",
            "127.0.0.1",
        ])
        .env("PATH", path_with_plugin())
        .spawn();
    let local = free_loopback_address().port();
    let mapping = format!("{local}:{guest_port}");
    let mut forward = kubectl
        .cmd(&["microvm", "port-forward", "c", &mapping])
        .env("PATH", path_with_plugin())
        .spawn();
    let shown = format!("Forwarding from 127.0.0.1:{local} -> {guest_port}");
    forward
        .line(Stream::Stdout, "the forwarding line", |l| l == shown)
        .await;

    // The server in the MicroVM may still be starting: a failed connection is retried.
    let first = battery_e2e::eventually(
        SERVING_TIMEOUT,
        "an answer through the forward",
        async || {
            let answer = get(local).await?;
            if answer.starts_with("HTTP/1.0 200") {
                Ok(answer)
            } else {
                Err(answer)
            }
        },
    )
    .await;
    assert!(first.contains("Directory listing"), "{first}");
    let answers = futures::future::join_all((0..CONNECTIONS).map(|_| get(local))).await;
    for answer in answers {
        let answer = answer.expect("a connection through the forward");
        assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    }

    // Nothing listens on this guest port: the connection ends, the forward says why on
    // one line and keeps serving.
    let closed = free_loopback_address().port().to_string();
    let closed_local = free_loopback_address().port();
    let mut refused = kubectl
        .cmd(&[
            "microvm",
            "port-forward",
            "c",
            &format!("{closed_local}:{closed}"),
        ])
        .env("PATH", path_with_plugin())
        .spawn();
    refused
        .line(Stream::Stdout, "the forwarding line", |l| {
            l.starts_with("Forwarding from")
        })
        .await;
    let answer = get(closed_local).await.unwrap_or_default();
    assert_eq!(answer, "", "a closed port answered");
    let said = format!("connecting to port {closed} in the MicroVM");
    refused
        .line(Stream::Stderr, "the failed connection's line", |l| {
            l.starts_with("error: ") && l.contains(&said)
        })
        .await;
    // The first forward still serves.
    let again = get(local).await.expect("the forward still serves");
    assert!(again.starts_with("HTTP/1.0 200"), "{again}");
}
