//! A proxy in front of a battery that loses answers on purpose: ClaimVM is forwarded, so
//! battery really leases, and then answered with a chosen gRPC code, as when an answer is
//! lost to a timeout, a cut connection or a failure part way. It also counts UpdatePool
//! calls and can hold them, as a battery slow to restart a Pool. Every other call passes
//! through untouched, streams included.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use http::{Request, Response, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty};
use hyper::body::{Bytes, Incoming};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

const CLAIM_VM: &str = "/poolmgr.v1alpha1.Lease/ClaimVM";
const UPDATE_POOL: &str = "/poolmgr.v1alpha1.PoolAdmin/UpdatePool";

struct Faults {
    lose_claims_as: Mutex<Option<tonic::Code>>,
    lost: AtomicUsize,
    claims: Held,
    updates: Held,
}

/// The calls of one method: how many reached the proxy, and whether they wait there
/// before they reach battery.
pub struct Held {
    held: tokio::sync::watch::Sender<bool>,
    calls: AtomicUsize,
}

impl Held {
    fn new() -> Self {
        Self {
            held: tokio::sync::watch::Sender::new(false),
            calls: AtomicUsize::default(),
        }
    }

    /// From now on the calls wait here until [`Held::release`].
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// The calls held, and those to come, go on to battery.
    pub fn release(&self) {
        self.held.send_replace(false);
    }

    /// How many calls reached the proxy so far, held ones included.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Waits until exactly `want` calls reached the proxy; fails after
    /// [`super::DEADLINE`] otherwise.
    pub async fn reached(&self, want: usize) {
        super::eventually(
            super::DEADLINE,
            "calls at the test proxy",
            async || match self.calls() {
                calls if calls == want => Ok(()),
                calls => Err(format!("{calls} calls, waiting for {want}")),
            },
        )
        .await;
    }

    /// Counts a call, and lets it go on once it is not held.
    async fn pass(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut held = self.held.subscribe();
        // The sender lives as long as `self`: waiting cannot fail.
        let _ = held.wait_for(|held| !held).await;
    }
}

pub struct FaultyBattery {
    address: SocketAddr,
    faults: Arc<Faults>,
    task: JoinHandle<()>,
}

impl Drop for FaultyBattery {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FaultyBattery {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let faults = Arc::new(Faults {
            lose_claims_as: Mutex::default(),
            lost: AtomicUsize::default(),
            claims: Held::new(),
            updates: Held::new(),
        });
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client: Client<HttpConnector, Incoming> = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build(connector);
        let shared = faults.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let _ = stream.set_nodelay(true);
                let (client, faults) = (client.clone(), shared.clone());
                let service = hyper::service::service_fn(move |request| {
                    forward(client.clone(), upstream, faults.clone(), request)
                });
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        Self {
            address,
            faults,
            task,
        }
    }

    /// `http://` and the proxy's address, for `--battery-address`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// From now on every ClaimVM reaches battery, and its answer is replaced by `code`.
    pub fn lose_claim_answers_as(&self, code: tonic::Code) {
        *self
            .faults
            .lose_claims_as
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(code);
    }

    /// Answers pass through again.
    pub fn heal(&self) {
        *self
            .faults
            .lose_claims_as
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// How many ClaimVM answers were lost so far.
    pub fn lost_claim_answers(&self) -> usize {
        self.faults.lost.load(Ordering::SeqCst)
    }

    /// The ClaimVM calls, to hold and count.
    pub fn claims(&self) -> &Held {
        &self.faults.claims
    }

    /// The UpdatePool calls, to hold and count.
    pub fn updates(&self) -> &Held {
        &self.faults.updates
    }
}

async fn forward(
    client: Client<HttpConnector, Incoming>,
    upstream: SocketAddr,
    faults: Arc<Faults>,
    mut request: Request<Incoming>,
) -> Result<Response<BoxBody<Bytes, hyper::Error>>, Infallible> {
    let lose_as = (request.uri().path() == CLAIM_VM)
        .then(|| {
            *faults
                .lose_claims_as
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        })
        .flatten();
    match request.uri().path() {
        CLAIM_VM => faults.claims.pass().await,
        UPDATE_POOL => faults.updates.pass().await,
        _ => {}
    }
    let path = request.uri().path_and_query().cloned();
    let mut uri = Uri::builder()
        .scheme("http")
        .authority(upstream.to_string());
    if let Some(path) = path {
        uri = uri.path_and_query(path);
    }
    *request.uri_mut() = uri.build().unwrap();
    let response = match client.request(request).await {
        Ok(response) => response,
        Err(_) => return Ok(grpc_error(tonic::Code::Unavailable)),
    };
    match lose_as {
        None => Ok(response.map(BodyExt::boxed)),
        Some(code) => {
            // Let battery finish its answer (the lease is committed), then lose it.
            let _ = response.into_body().collect().await;
            faults.lost.fetch_add(1, Ordering::SeqCst);
            Ok(grpc_error(code))
        }
    }
}

/// A trailers-only gRPC answer: just the status, as a server that fails a call sends it.
fn grpc_error(code: tonic::Code) -> Response<BoxBody<Bytes, hyper::Error>> {
    Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", i32::from(code).to_string())
        .header("grpc-message", "injected%20by%20the%20test%20proxy")
        .body(Empty::new().map_err(|never| match never {}).boxed())
        .unwrap()
}
