//! HTTPS serving: the serving certificate follows its files, HTTP/2 carries 1,000
//! concurrent streams per connection (the aggregator multiplexes every user's requests
//! and watches over few connections), and a request with many group headers is served.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use battery_apiserver::dev::pki::{DevPki, write_dev_pki};
use battery_apiserver::serve::{TlsFiles, acceptor, serve};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Barrier;
use tokio_rustls::TlsConnector;

const STREAMS: usize = 300;

fn files(pki: &DevPki) -> TlsFiles {
    TlsFiles {
        cert: pki.serving_cert.clone(),
        key: pki.serving_key.clone(),
        client_ca: Some(pki.ca_cert.clone()),
    }
}

async fn start(
    files: &TlsFiles,
    app: Router,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let (acceptor, reloader) = acceptor(files).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, acceptor, app, std::future::pending()));
    (addr, reloader)
}

fn connector(cas: &[&Path], alpn: &[u8]) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots
            .add(CertificateDer::from_pem_file(ca).unwrap())
            .unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    TlsConnector::from(Arc::new(config))
}

async fn connect(
    connector: &TlsConnector,
    addr: std::net::SocketAddr,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

async fn served_certificate(connector: &TlsConnector, addr: std::net::SocketAddr) -> Vec<u8> {
    let stream = connect(connector, addr).await;
    stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

#[tokio::test]
async fn a_rotated_serving_certificate_is_served_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let old = write_dev_pki(dir.path()).unwrap();
    let next_dir = tempfile::tempdir().unwrap();
    let next = write_dev_pki(next_dir.path()).unwrap();
    let (addr, _reloader) = start(
        &files(&old),
        Router::new().route("/healthz", get(|| async { "ok" })),
    )
    .await;
    let connector = connector(&[&old.ca_cert, &next.ca_cert], b"http/1.1");
    let before = served_certificate(&connector, addr).await;
    assert_eq!(
        before,
        std::fs::read(&old.serving_cert)
            .map(|pem| CertificateDer::from_pem_slice(&pem).unwrap().to_vec())
            .unwrap()
    );

    std::fs::copy(&next.serving_cert, &old.serving_cert).unwrap();
    std::fs::copy(&next.serving_key, &old.serving_key).unwrap();
    let want = CertificateDer::from_pem_file(&next.serving_cert)
        .unwrap()
        .to_vec();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while served_certificate(&connector, addr).await != want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn one_http2_connection_carries_hundreds_of_concurrent_streams() {
    let dir = tempfile::tempdir().unwrap();
    let pki = write_dev_pki(dir.path()).unwrap();
    // Every request waits until all of them have arrived: with fewer streams allowed than
    // requests, the barrier is never reached and the test times out.
    let barrier = Arc::new(Barrier::new(STREAMS));
    let app = Router::new().route(
        "/wait",
        get(move || {
            let barrier = barrier.clone();
            async move {
                barrier.wait().await;
                "ok"
            }
        }),
    );
    let (addr, _reloader) = start(&files(&pki), app).await;
    let stream = connect(&connector(&[&pki.ca_cert], b"h2"), addr).await;
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..STREAMS {
        let mut sender = sender.clone();
        requests.spawn(async move {
            let request = http::Request::get(format!("https://localhost:{}/wait", addr.port()))
                .body(Empty::<Bytes>::new())
                .unwrap();
            sender.send_request(request).await.unwrap().status()
        });
    }
    let all = tokio::time::timeout(Duration::from_secs(20), async {
        let mut ok = 0;
        while let Some(status) = requests.join_next().await {
            assert_eq!(status.unwrap(), http::StatusCode::OK);
            ok += 1;
        }
        ok
    })
    .await
    .expect("every stream was in flight at once");
    assert_eq!(all, STREAMS);
}

#[tokio::test]
async fn a_request_with_many_group_headers_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let pki = write_dev_pki(dir.path()).unwrap();
    let (addr, _reloader) = start(
        &files(&pki),
        Router::new().route("/healthz", get(|| async { "ok" })),
    )
    .await;
    let stream = connect(&connector(&[&pki.ca_cert], b"http/1.1"), addr).await;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut request = http::Request::get("/healthz").header(http::header::HOST, "localhost");
    // One header line per group, as the aggregator sends X-Remote-Group: 500 lines, ~20 KiB.
    for i in 0..500 {
        request = request.header(
            "X-Remote-Group",
            format!("team-{i:04}-with-a-long-group-name"),
        );
    }
    let response = sender
        .send_request(request.body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), http::StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"ok");
}
