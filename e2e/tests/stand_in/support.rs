//! What the stand-in's tests share: a tiny backend that plays battery-apiserver (it
//! echoes what reached it), and an HTTPS client that speaks as a chosen identity.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse as _, Response};
use axum::routing::{any, get};
use battery_e2e::https::{Client, Identity};
use battery_e2e::stand_in::{StandIn, pki};
use http::{HeaderMap, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, UnixTime};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::Notify;

/// A stand-in in its own temporary directory; the directory goes with it.
pub struct Setup {
    pub stand_in: StandIn,
    pub backend: Backend,
    _dir: tempfile::TempDir,
}

impl Setup {
    /// A stand-in with the default policy, forwarding to a new [`Backend`].
    pub async fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("stand-in-test-")
            .tempdir()
            .unwrap();
        let stand_in = StandIn::start(&dir.path().join("pki"), None).await;
        let backend = Backend::start(&stand_in).await;
        stand_in.set_backend(&backend.url).await;
        Self {
            stand_in,
            backend,
            _dir: dir,
        }
    }

    /// The kubectl user's certificate.
    pub fn kubectl(&self) -> Identity {
        let (cert, key) = self.stand_in.layout().kubectl();
        Identity::Cert(cert, key)
    }

    /// battery-apiserver's bearer token (from its kubeconfig).
    pub fn apiserver(&self) -> Identity {
        let config: Value = serde_json::from_str(
            &std::fs::read_to_string(self.stand_in.apiserver_kubeconfig()).unwrap(),
        )
        .unwrap();
        Identity::Token(
            config["users"][0]["user"]["token"]
                .as_str()
                .unwrap()
                .to_owned(),
        )
    }

    pub fn client(&self, identity: Identity) -> Client {
        Client::new(self.stand_in.url(), &self.stand_in.serving_ca(), identity)
    }

    /// Rewrites the policy file through `edit`.
    pub fn edit_policy(&self, edit: impl FnOnce(&mut Value)) {
        self.stand_in.edit_policy(edit);
    }
}

/// A stand-in for battery-apiserver: HTTPS with a serving certificate of the stand-in's
/// serving CA; it checks the front-proxy client certificate against the front-proxy CA
/// *file as it is now* (so it follows rotations) and echoes what it was sent.
pub struct Backend {
    pub url: String,
    state: Arc<BackendState>,
}

struct BackendState {
    front_proxy_ca: PathBuf,
    /// Requests that reached it.
    requests: AtomicUsize,
    /// Opened by the test to let `/stream` send its second line.
    next_line: Notify,
}

/// The client certificate of the connection a request came on.
#[derive(Clone)]
struct PeerChain(Option<Arc<Vec<CertificateDer<'static>>>>);

impl Backend {
    pub async fn start(stand_in: &StandIn) -> Self {
        let state = Arc::new(BackendState {
            front_proxy_ca: stand_in.front_proxy_ca(),
            requests: AtomicUsize::new(0),
            next_line: Notify::new(),
        });
        let app = Router::new()
            .route("/apis/test/v1/stream", get(stream))
            .route("/apis/test/v1/upgrade", get(upgrade))
            .route(
                "/apis/test/v1/upgrade-refused",
                get(|| async { (StatusCode::FORBIDDEN, "not you") }),
            )
            .route(
                "/apis/test/v1/upgrade-ignored",
                get(|| async { "no upgrade here" }),
            )
            .fallback(any(echo))
            .layer(axum::middleware::from_fn_with_state(
                state.clone(),
                front_proxy_only,
            ))
            .with_state(state.clone());
        let config = Arc::new(
            pki::server_config(&stand_in.apiserver_cert(), &stand_in.apiserver_key()).unwrap(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let acceptor = tokio_rustls::TlsAcceptor::from(config.clone());
                let app = app.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let chain = PeerChain(
                        tls.get_ref()
                            .1
                            .peer_certificates()
                            .map(|c| Arc::new(c.iter().map(|c| c.clone().into_owned()).collect())),
                    );
                    let service = hyper::service::service_fn(
                        move |mut request: http::Request<Incoming>| {
                            request.extensions_mut().insert(chain.clone());
                            let app = app.clone();
                            async move { tower::ServiceExt::oneshot(app, request.map(Body::new)).await }
                        },
                    );
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self { url, state }
    }

    /// How many requests reached the backend.
    pub fn requests(&self) -> usize {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// Lets `/stream` send its next line.
    pub fn release_line(&self) {
        self.state.next_line.notify_one();
    }
}

/// battery-apiserver answers 401 to a client that is not the front proxy (for these
/// tests: every request needs the front-proxy certificate, CN `front-proxy-client`).
async fn front_proxy_only(
    State(state): State<Arc<BackendState>>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let chain = request
        .extensions()
        .get::<PeerChain>()
        .and_then(|c| c.0.clone());
    let verified = chain.as_ref().is_some_and(|chain| {
        pki::client_verifier(&state.front_proxy_ca)
            .unwrap()
            .verify_client_cert(&chain[0], &chain[1..], UnixTime::now())
            .is_ok()
    });
    if !verified {
        return (StatusCode::UNAUTHORIZED, "not the front proxy").into_response();
    }
    next.run(request).await
}

/// Echoes the method, path, headers and body it received.
async fn echo(request: Request) -> axum::Json<Value> {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    axum::Json(json!({
        "method": parts.method.as_str(),
        "path": parts.uri.path_and_query().map(|p| p.as_str()),
        "headers": headers(&parts.headers),
        "body": String::from_utf8_lossy(&body),
    }))
}

/// Headers as a map of lowercase name to every value, in order.
pub fn headers(map: &HeaderMap) -> Value {
    let mut out = serde_json::Map::new();
    for name in map.keys() {
        let values: Vec<&str> = map
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        out.insert(name.as_str().to_owned(), json!(values));
    }
    Value::Object(out)
}

/// Two lines, the second only when the test says so: a proxy that buffers shows no
/// first line until the second exists.
async fn stream(State(state): State<Arc<BackendState>>) -> Response {
    let (sender, receiver) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(1);
    tokio::spawn(async move {
        sender.send(Ok("{\"line\":1}\n".to_owned())).await.unwrap();
        state.next_line.notified().await;
        let _ = sender.send(Ok("{\"line\":2}\n".to_owned())).await;
    });
    Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(receiver)).into_response()
}

/// Upgrades to protocol `echo`, then sends back every byte it gets. The 101 says who
/// the request was from.
async fn upgrade(mut request: Request) -> Response {
    let user = request
        .headers()
        .get("x-remote-user")
        .cloned()
        .unwrap_or(http::HeaderValue::from_static(""));
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let mut io = TokioIo::new(upgrade.await.unwrap());
        let mut buffer = [0u8; 1024];
        loop {
            let n = io.read(&mut buffer).await.unwrap_or(0);
            if n == 0 || io.write_all(&buffer[..n]).await.is_err() {
                return;
            }
        }
    });
    http::Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "echo")
        .header("x-seen-user", user)
        .body(Body::empty())
        .unwrap()
}

/// Reads a PEM file.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}
