//! HTTPS serving: the serving certificate follows its files, HTTP/2 carries 1,000
//! concurrent streams per connection (the aggregator multiplexes every user's requests
//! and watches over few connections), and a request with many group headers is served.

use battery_apiserver::testing as common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use battery_apiserver::dev::pki::{DEV_USER, DevPki, write_dev_pki};
use battery_apiserver::http::serve::{TlsFiles, acceptor, serve};
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
    common::eventually(
        Duration::from_secs(15),
        "the new certificate served",
        || async {
            if served_certificate(&connector, addr).await == want {
                Ok(())
            } else {
                Err("the new certificate was never served")
            }
        },
    )
    .await;
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

/// A CA and certificates it signs, for the authentication table.
struct Ca {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
        let pem = params.self_signed(&key).unwrap().pem();
        Self {
            issuer: rcgen::Issuer::new(params, key),
            pem,
        }
    }

    /// A client certificate for `cn`, as (chain, key) for rustls.
    fn client(&self, cn: &str) -> Identity {
        self.certificate(cn, rcgen::CertificateParams::default())
    }

    /// A client certificate for `cn` that expired in 2020.
    fn expired_client(&self, cn: &str) -> Identity {
        let mut params = rcgen::CertificateParams::default();
        params.not_before = rcgen::date_time_ymd(2019, 1, 1);
        params.not_after = rcgen::date_time_ymd(2020, 1, 1);
        self.certificate(cn, params)
    }

    fn certificate(&self, cn: &str, mut params: rcgen::CertificateParams) -> Identity {
        let key = rcgen::KeyPair::generate().unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let der = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes())
            .unwrap();
        (vec![cert.der().clone()], der)
    }
}

/// Each row: who connects, what headers it sends, and who the server must take it for —
/// or the 401 it must answer. What each row proves is in its name. Then the trust is
/// swapped, as a rotation of the front proxy's CA does, without a restart.
#[tokio::test]
async fn only_the_front_proxy_may_say_who_a_request_is_from() {
    use battery_apiserver::auth::UserInfo;
    use battery_apiserver::http::authn::{
        Authentication, RequestHeaderConfig, RequestHeaderNames, Trust, TrustConfig,
        TrustHolder as _, authenticate,
    };

    let dir = tempfile::tempdir().unwrap();
    let pki = write_dev_pki(dir.path()).unwrap();
    let front_ca = Ca::new("front-proxy-ca");
    let other_ca = Ca::new("someone-else");
    let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let trusting = |front_ca: &Ca| TrustConfig {
        client_ca: Some(std::fs::read(&pki.ca_cert).unwrap()),
        request_header: Some(RequestHeaderConfig {
            ca: front_ca.pem.clone().into_bytes(),
            names: RequestHeaderNames {
                allowed_names: strings(&["front-proxy-client"]),
                username_headers: strings(&["X-Remote-User"]),
                uid_headers: strings(&["X-Remote-Uid"]),
                group_headers: strings(&["X-Remote-Group"]),
                extra_prefixes: strings(&["X-Remote-Extra-"]),
            },
        }),
    };
    let authentication = Arc::new(Authentication::new(
        Trust::new(&trusting(&front_ca)).unwrap(),
        None,
    ));
    // Echoes who the server took the request for, and whether identity headers got through.
    let app = Router::new()
        .route(
            "/whoami",
            get(|axum::Extension(user): axum::Extension<UserInfo>, headers: http::HeaderMap| async move {
                let leaked = headers.keys().any(|k| k.as_str().starts_with("x-remote-"));
                let extra: Vec<String> = user
                    .extra
                    .iter()
                    .map(|(key, values)| format!("{key}={}", values.join(",")))
                    .collect();
                format!("{}|{}|{}|{leaked}", user.name, user.groups.join(","), extra.join(";"))
            }),
        )
        .layer(axum::middleware::from_fn_with_state(authentication.clone(), authenticate));
    let (addr, _reloader) = start(&files(&pki), app).await;

    let dev_cert = {
        let chain = vec![CertificateDer::from_pem_file(&pki.client_cert).unwrap()];
        let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&pki.client_key).unwrap();
        (chain, key)
    };
    let dev_fingerprint: String = {
        use sha2::Digest as _;
        sha2::Sha256::digest(&dev_cert.0[0])
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let dev_user = format!(
        "{DEV_USER}|system:serviceaccounts,system:serviceaccounts:default,system:authenticated|authentication.kubernetes.io/credential-id=X509SHA256={dev_fingerprint}|false"
    );
    let forged = [
        ("X-Remote-User", "system:admin"),
        ("X-Remote-Group", "system:masters"),
        ("X-Remote-Extra-Scopes", "all"),
    ];
    let aggregator = [
        ("X-Remote-User", "alice"),
        ("X-Remote-Uid", "a-1"),
        ("X-Remote-Group", "devs"),
        ("X-Remote-Group", "ops"),
        (
            "X-Remote-Extra-Authentication.kubernetes.io%2fcredential-Id",
            "JTI=1",
        ),
    ];
    let cases: Vec<Row> = vec![
        (
            "the aggregator's certificate vouches for its headers",
            Some(front_ca.client("front-proxy-client")),
            &aggregator,
            Ok(
                "alice|devs,ops,system:authenticated|authentication.kubernetes.io/credential-id=JTI=1|false",
            ),
        ),
        (
            "headers without a certificate are ignored and stripped",
            None,
            &forged,
            Ok("system:anonymous|system:unauthenticated||false"),
        ),
        (
            "a client certificate is its own user; forged headers are stripped",
            Some(dev_cert),
            &forged,
            Ok(&dev_user),
        ),
        (
            "a front-proxy certificate of a CN not allowed is refused, not anonymous",
            Some(front_ca.client("intruder")),
            &forged,
            Err(401),
        ),
        (
            "a certificate of a CA the server does not trust is refused, not anonymous",
            Some(other_ca.client("front-proxy-client")),
            &forged,
            Err(401),
        ),
        (
            "an expired front-proxy certificate is refused",
            Some(front_ca.expired_client("front-proxy-client")),
            &forged,
            Err(401),
        ),
    ];
    for (what, identity, headers, want) in cases {
        let response = whoami(addr, &[&pki.ca_cert], identity, headers).await;
        match want {
            Ok(body) => assert_eq!(response, Ok(body.to_owned()), "{what}"),
            Err(code) => {
                let (got, body) = response.expect_err(what);
                assert_eq!(got, code, "{what}: {body}");
                assert!(body.contains(r#""kind":"Status""#), "{what}: {body}");
            }
        }
    }

    // The front proxy's CA rotates: its old certificate is refused from now on, on the
    // same server, and the new one is trusted.
    let rotated_ca = Ca::new("front-proxy-ca-2");
    authentication.set_trust(Trust::new(&trusting(&rotated_ca)).unwrap());
    let old = whoami(
        addr,
        &[&pki.ca_cert],
        Some(front_ca.client("front-proxy-client")),
        &aggregator,
    )
    .await;
    assert_eq!(
        old.map_err(|(code, _)| code),
        Err(401),
        "the old front proxy"
    );
    let new = whoami(
        addr,
        &[&pki.ca_cert],
        Some(rotated_ca.client("front-proxy-client")),
        &aggregator,
    )
    .await;
    assert!(
        new.as_deref().is_ok_and(|body| body.starts_with("alice|")),
        "the new front proxy: {new:?}"
    );
}

type Identity = (
    Vec<CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
);

/// One row of the authentication table: what it proves, the client certificate, the
/// headers sent, and the user the server must see (or the code it must answer).
type Row<'a> = (
    &'a str,
    Option<Identity>,
    &'a [(&'a str, &'a str)],
    Result<&'a str, u16>,
);

fn client_connector(cas: &[&Path], identity: Option<Identity>) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        roots
            .add(CertificateDer::from_pem_file(ca).unwrap())
            .unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut config = match identity {
        Some((chain, key)) => builder.with_client_auth_cert(chain, key).unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    TlsConnector::from(Arc::new(config))
}

/// GET /whoami as `identity` with `headers`: the body, or the status code and body.
async fn whoami(
    addr: std::net::SocketAddr,
    cas: &[&Path],
    identity: Option<Identity>,
    headers: &[(&str, &str)],
) -> Result<String, (u16, String)> {
    let connector = client_connector(cas, identity);
    let stream = connect(&connector, addr).await;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut request = http::Request::get("/whoami").header(http::header::HOST, "localhost");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = sender
        .send_request(request.body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    if status == 200 {
        Ok(body)
    } else {
        Err((status, body))
    }
}
