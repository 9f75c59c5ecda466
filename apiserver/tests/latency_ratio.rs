//! Issue 9 item 8: a bind on the embedded battery must not wait on delayed ACKs. Without
//! `TCP_NODELAY`, a small HTTP/2 frame written after another waits for the peer's delayed
//! ACK (40 ms on Linux), and a serial bind cost ~100 ms instead of ~10. Timing alone would
//! flake on a loaded machine, so the bind, and a GET of the claim, are compared with a GET
//! measured in the same run on the same connection: the API group's discovery, which
//! crosses TLS, HTTP/2, authentication, authorization and the router but not battery.
//! All slow down together when the machine is busy; only those that call battery grow by
//! whole delayed-ACK periods when a socket to battery stalls. The margins are below one
//! such period, the ratios well above what a busy machine showed.

use battery_apiserver::testing as common;
mod dev_process;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use battery_apiserver::dev::DEV_POOL;
use dev_process::DevProcess;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};

const GROUP_VERSION: &str = "/apis/battery.liquidmetal-x.dev/v1alpha1";
/// Rounds of serial requests: enough for a stable median, done in a few seconds.
const SAMPLES: usize = 30;
/// A healthy bind (ClaimVM, the claim's reads and its store write) cost 10 to 27 GETs of
/// discovery (debug build, a loaded 2-core machine).
const BIND_RATIO: u32 = 20;
/// Under the two delayed-ACK periods (80 ms) a stalled bind adds: with the battery
/// server's sockets left without TCP_NODELAY, the median bind was 110-150 ms, not 38.
const BIND_MARGIN: Duration = Duration::from_millis(30);
/// A healthy GET of a claim (one battery call) cost 3 to 5 GETs of discovery.
const READ_RATIO: u32 = 8;
/// Under the one delayed-ACK period (40 ms) a stalled GET of a claim adds.
const READ_MARGIN: Duration = Duration::from_millis(15);

struct Client {
    sender: SendRequest<Full<Bytes>>,
    authority: String,
}

impl Client {
    /// One keep-alive HTTP/2 connection as the dev user, with the files `dev` wrote.
    async fn connect(dev: &DevProcess) -> Self {
        let kubeconfig = kube::config::Kubeconfig::read_from(dev.dir.join("kubeconfig")).unwrap();
        let cluster = kubeconfig.clusters[0].cluster.clone().unwrap();
        let user = kubeconfig.auth_infos[0].auth_info.clone().unwrap();
        let file = |path: Option<String>| PathBuf::from(path.expect("a file in the kubeconfig"));
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(file(cluster.certificate_authority)).unwrap())
            .unwrap();
        let chain = CertificateDer::pem_file_iter(file(user.client_certificate))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(file(user.client_key)).unwrap();
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let tcp = tokio::net::TcpStream::connect(&dev.address).await.unwrap();
        // The client's own writes must not stall either, or it measures itself.
        tcp.set_nodelay(true).unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();
        let (sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .unwrap();
        tokio::spawn(connection);
        Self {
            sender,
            authority: dev.address.clone(),
        }
    }

    /// Sends one request, checks its status and returns how long it took, with the body.
    async fn timed(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
        want: StatusCode,
    ) -> (Duration, Value) {
        let started = Instant::now();
        let (status, body) = self.call(method, path, body).await;
        let took = started.elapsed();
        assert_eq!(status, want, "{path}: {body}");
        (took, body)
    }

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let request = Request::builder()
            .method(method)
            .uri(format!("https://{}{path}", self.authority))
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(
                body.map(|b| b.to_string()).unwrap_or_default(),
            )))
            .unwrap();
        // A clone is a handle on the same connection.
        let response = self.sender.clone().send_request(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// Waits until the dev Pool has `size` MicroVMs ready, so no bind waits for a boot.
    async fn await_available(&self, size: usize) {
        let uri = format!("{GROUP_VERSION}/namespaces/default/pools/{DEV_POOL}");
        common::eventually(Duration::from_secs(60), "the dev Pool to fill", || async {
            let (status, pool) = self.call(Method::GET, &uri, None).await;
            if status == StatusCode::OK && pool["status"]["available"] == json!(size) {
                Ok(())
            } else {
                Err(format!("the dev Pool never filled: {pool}"))
            }
        })
        .await;
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Medians of the three requests each round makes, in the same run.
struct Medians {
    bind: Duration,
    read: Duration,
    discovery: Duration,
}

/// `SAMPLES` rounds of: bind a claim, GET it (one battery call), GET discovery (none).
async fn measure(client: &Client) -> Medians {
    let claims = format!("{GROUP_VERSION}/namespaces/default/microvmclaims");
    let (mut binds, mut reads, mut discoveries) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..SAMPLES {
        let claim = common::claim(&format!("c{i}"), DEV_POOL);
        let (took, bound) = client
            .timed(Method::POST, &claims, Some(claim), StatusCode::CREATED)
            .await;
        assert_eq!(bound["status"]["phase"], "Bound", "{bound}");
        binds.push(took);
        let claim = format!("{claims}/c{i}");
        reads.push(
            client
                .timed(Method::GET, &claim, None, StatusCode::OK)
                .await
                .0,
        );
        discoveries.push(
            client
                .timed(Method::GET, GROUP_VERSION, None, StatusCode::OK)
                .await
                .0,
        );
    }
    Medians {
        bind: median(binds),
        read: median(reads),
        discovery: median(discoveries),
    }
}

#[tokio::test]
async fn issue_9_a_serial_bind_costs_no_delayed_acks() {
    let dir = tempfile::tempdir().unwrap();
    let size = SAMPLES.to_string();
    let dev = DevProcess::start(
        dir.path(),
        &["--pool-size", &size],
        &[],
        std::process::Stdio::null(),
    );
    let client = Client::connect(&dev).await;
    client.await_available(SAMPLES).await;
    let Medians {
        bind,
        read,
        discovery,
    } = measure(&client).await;
    assert!(
        bind < discovery * BIND_RATIO + BIND_MARGIN,
        "a bind took {bind:?} (median of {SAMPLES}), more than {BIND_RATIO} GETs of discovery \
         ({discovery:?}) and {BIND_MARGIN:?}: is TCP_NODELAY off on a socket to battery?"
    );
    assert!(
        read < discovery * READ_RATIO + READ_MARGIN,
        "a GET of a claim took {read:?} (median of {SAMPLES}), more than {READ_RATIO} GETs of \
         discovery ({discovery:?}) and {READ_MARGIN:?}: is TCP_NODELAY off on a socket to battery?"
    );
    assert!(dev.stop().success());
}
