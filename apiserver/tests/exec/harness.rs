//! The harness of `exec.rs`: the server on a real socket, behind a front end that names
//! the caller by a header; one in-process agent per simulated Host; the agent's test
//! certificates (`battery_agent::testing`); and the two clients.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{self, CLAIMS, HOSTS, Harness, POOLS, claim, pool, settings};
use axum::extract::Request;
use axum::middleware::Next;
use battery_agent::flintlock::{FlintlockConfig, FlintlockTls};
use battery_agent::testing::{Ca, Signed};
use battery_api_machinery::request_info::RequestInfo;
use battery_api_machinery::status::ApiError;
use battery_apiserver::auth::{Authorizer, Decision, UserInfo};
use battery_apiserver::dev::pki::DEV_USER;
use battery_apiserver::relay::AgentRelayTls;
use battery_apiserver::server::Settings;
use battery_types::MicroVMClaim;
use battery_types::channel::{self, ERROR, STDERR, STDOUT};
use futures::future::BoxFuture;
use futures::{SinkExt, StreamExt};
use http::{HeaderName, HeaderValue, Request as HttpRequest, StatusCode};
use kube::api::{Api, AttachParams};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// The header the test front end reads the caller from (its authentication).
pub const USER_HEADER: &str = "x-test-user";
pub const OTHER_USER: &str = "system:serviceaccount:default:someone-else";
pub const DEADLINE: Duration = Duration::from_secs(60);

/// An agent in its own runtime, so that killing it ends its connections and sessions at
/// once, as a killed process would.
pub struct AgentProcess {
    pub runtime: Option<tokio::runtime::Runtime>,
    /// Its process table's directory.
    _state: tempfile::TempDir,
}

/// Sessions an agent of these tests relays at once, unless a test caps it.
const AGENT_SESSIONS: usize = 64;

impl AgentProcess {
    /// Serves on `listen` as the agent of a Host at `flintlock`, with `serving` as its
    /// certificate, accepting clients of `client_ca`.
    pub fn start(
        listen: SocketAddr,
        flintlock: SocketAddr,
        serving: &Signed,
        client_ca: &Ca,
    ) -> Self {
        Self::serve(None, listen, flintlock, serving, client_ca, AGENT_SESSIONS)
    }

    /// As [`AgentProcess::start`], relaying at most `max_sessions` at once.
    pub fn start_capped(
        listen: SocketAddr,
        flintlock: SocketAddr,
        serving: &Signed,
        client_ca: &Ca,
        max_sessions: usize,
    ) -> Self {
        Self::serve(None, listen, flintlock, serving, client_ca, max_sessions)
    }

    /// As [`AgentProcess::start`], on the address of a killed agent once it is free.
    pub async fn restart(
        listen: SocketAddr,
        flintlock: SocketAddr,
        serving: &Signed,
        client_ca: &Ca,
    ) -> Self {
        let listener = common::eventually(DEADLINE, "the agent's port free again", || async {
            std::net::TcpListener::bind(listen)
        })
        .await;
        Self::serve(
            Some(listener),
            listen,
            flintlock,
            serving,
            client_ca,
            AGENT_SESSIONS,
        )
    }

    pub fn serve(
        listener: Option<std::net::TcpListener>,
        listen: SocketAddr,
        flintlock: SocketAddr,
        serving: &Signed,
        client_ca: &Ca,
        max_sessions: usize,
    ) -> Self {
        let state = tempfile::tempdir().unwrap();
        let config = battery_agent::Config {
            listen,
            serving: battery_agent::Serving::Files {
                cert: serving.cert.clone().into_bytes(),
                key: serving.key.clone().into_bytes(),
            },
            client_ca: client_ca.pem.clone().into_bytes(),
            flintlock: FlintlockConfig::new(&flintlock.to_string(), FlintlockTls::Insecure)
                .unwrap(),
            registration: None,
            max_sessions: std::num::NonZeroUsize::new(max_sessions).unwrap(),
            state_dir: state.path().to_owned(),
        };
        let listener = listener.unwrap_or_else(|| std::net::TcpListener::bind(listen).unwrap());
        listener.set_nonblocking(true).unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let agent = battery_agent::build(config).unwrap();
            agent.serve(listener, std::future::pending()).await.unwrap();
        });
        Self {
            runtime: Some(runtime),
            _state: state,
        }
    }

    pub fn kill(mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Allows everyone everything, except `microvmclaims/exec` to `no-rbac`, and records
/// the verb each exec was authorized as.
#[derive(Default)]
pub struct RecordingAuthorizer {
    pub exec_verbs: Mutex<Vec<String>>,
}

impl Authorizer for RecordingAuthorizer {
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        request: &'a RequestInfo,
    ) -> BoxFuture<'a, Result<Decision, ApiError>> {
        let exec = request.subresource == "exec";
        if exec {
            self.exec_verbs.lock().unwrap().push(request.verb.clone());
        }
        let decision = if exec && user.name == "no-rbac" {
            Decision::Deny(String::new())
        } else {
            Decision::Allow
        };
        Box::pin(async move { Ok(decision) })
    }
}

/// Puts the user named in [`USER_HEADER`] on the request, as authentication would.
pub async fn test_user(mut request: Request, next: Next) -> axum::response::Response {
    if let Some(name) = request
        .headers()
        .get(USER_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        let user = UserInfo {
            name: name.to_owned(),
            groups: vec!["system:authenticated".into()],
            ..UserInfo::default()
        };
        request.extensions_mut().insert(user);
    }
    next.run(request).await
}

/// The server on a socket, its agents, and what the tests need of them.
pub struct Exec {
    pub h: Harness,
    pub address: SocketAddr,
    pub authorizer: Arc<RecordingAuthorizer>,
    pub agent_ca: Ca,
    pub client_ca: Ca,
    pub agents: Vec<(String, SocketAddr, Option<AgentProcess>)>,
}

impl Exec {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// As [`Exec::start`], with `tweak` applied to the server's settings.
    pub async fn start_with(tweak: impl FnOnce(&mut Settings)) -> Self {
        let agent_ca = Ca::new("agent-ca");
        let client_ca = Ca::new("apiserver-relay-client-ca");
        let relay_client = client_ca.client("battery-apiserver");
        let authorizer = Arc::new(RecordingAuthorizer::default());
        let mut settings = Settings {
            agent_relay: Some(AgentRelayTls {
                ca_pem: agent_ca.pem.clone().into_bytes(),
                client_cert_pem: relay_client.cert.into_bytes(),
                client_key_pem: relay_client.key.into_bytes(),
            }),
            authorizer: Some(authorizer.clone()),
            ..settings()
        };
        tweak(&mut settings);
        let h = Harness::with_settings(settings).await;
        h.eventually(HOSTS, |_, list| {
            list["items"]
                .as_array()
                .is_some_and(|items| items.len() == 2)
        })
        .await;
        let mut agents = Vec::new();
        for host in h.battery().hosts() {
            let listen = battery_telemetry::free_loopback_address();
            let agent = AgentProcess::start(
                listen,
                host.address(),
                &agent_ca.serving(host.name()),
                &client_ca,
            );
            agents.push((host.name().to_owned(), listen, Some(agent)));
        }
        let this_agents: Vec<(String, SocketAddr)> =
            agents.iter().map(|(n, a, _)| (n.clone(), *a)).collect();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let router = h.router().layer(axum::middleware::from_fn(test_user));
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        let exec = Self {
            h,
            address,
            authorizer,
            agent_ca,
            client_ca,
            agents,
        };
        for (host, agent) in this_agents {
            exec.register(&host, agent).await;
        }
        let mut body = pool("p", 2);
        body["spec"]["replenishment"] = json!({"type": "ReplaceOnDelete"});
        exec.h.create(POOLS, &body).await;
        exec.h.wait_available("p", 2).await;
        exec
    }

    /// Sets the Host's `agentAddress`, as an admin (or its agent) would.
    pub async fn register(&self, host: &str, agent: SocketAddr) {
        let request = HttpRequest::patch(format!("{HOSTS}/{host}"))
            .header(http::header::CONTENT_TYPE, "application/merge-patch+json")
            .body(axum::body::Body::from(
                json!({"spec": {"agentAddress": agent.to_string()}}).to_string(),
            ))
            .unwrap();
        let (status, body) = self.h.json(request).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    /// Claims a MicroVM as the dev user's ServiceAccount; the claim's Host.
    pub async fn claim(&self, name: &str) -> String {
        let bound = self.h.create(CLAIMS, &claim(name, "p")).await;
        bound["status"]["host"]["nodeName"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    pub fn agent_of(&self, host: &str) -> SocketAddr {
        self.agents.iter().find(|(n, ..)| n == host).unwrap().1
    }

    /// A kube-rs client of the server, as `user`.
    pub fn kube(&self, user: &str) -> kube::Client {
        let mut config = kube::Config::new(format!("http://{}", self.address).parse().unwrap());
        config.headers = vec![(
            HeaderName::from_static(USER_HEADER),
            HeaderValue::from_str(user).unwrap(),
        )];
        kube::Client::try_from(config).unwrap()
    }

    pub fn claims(&self, user: &str) -> Api<MicroVMClaim> {
        Api::namespaced(self.kube(user), "default")
    }

    /// Runs `query` on claim `c`'s exec as the dev user, offering `protocol`, with
    /// nothing on stdin: all it printed and its Status.
    pub async fn output(&self, query: &str, protocol: &str) -> Output {
        let mut raw = self.raw(DEV_USER, "c", query, protocol).await.unwrap();
        raw.read_all().await
    }

    /// Opens `query` on the claim's exec with the hand-written client, offering
    /// `protocol`, as `user`.
    pub async fn raw(
        &self,
        user: &str,
        claim: &str,
        query: &str,
        protocol: &str,
    ) -> Result<Raw, (StatusCode, Value)> {
        let url = format!("ws://{}{CLAIMS}/{claim}/exec?{query}", self.address);
        let mut request = url.into_client_request().unwrap();
        request.headers_mut().insert(
            "sec-websocket-protocol",
            HeaderValue::from_str(protocol).unwrap(),
        );
        request
            .headers_mut()
            .insert(USER_HEADER, HeaderValue::from_str(user).unwrap());
        match tokio_tungstenite::connect_async(request).await {
            Ok((ws, response)) => {
                assert_eq!(
                    response.headers()["sec-websocket-protocol"],
                    protocol.split(',').next().unwrap().trim()
                );
                Ok(Raw { ws })
            }
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                let status = response.status();
                let body = response.into_body().unwrap_or_default();
                Err((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
            }
            Err(other) => panic!("connecting: {other}"),
        }
    }
}

/// What the hand-written client read of a session.
#[derive(Debug, Default)]
pub struct Output {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub status: Value,
    /// The most output one frame carried.
    pub largest_frame: usize,
}

pub struct Raw {
    pub ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
}

impl Raw {
    pub async fn send(&mut self, channel: u8, payload: &[u8]) {
        let frame = channel::frame(channel, payload);
        self.ws.send(Message::Binary(frame.into())).await.unwrap();
    }

    /// Reads until the server closes.
    pub async fn read_all(&mut self) -> Output {
        let mut output = Output::default();
        while let Some(message) = tokio::time::timeout(DEADLINE, self.ws.next())
            .await
            .unwrap()
        {
            let (channel, payload) = match message {
                Ok(Message::Binary(data)) => channel::decode_binary(&data)
                    .map(|(channel, payload)| (channel, payload.to_vec()))
                    .expect("a binary frame has a channel"),
                // v4.base64: the channel's digit, then base64.
                Ok(Message::Text(text)) => {
                    channel::decode_text(&text).expect("a text frame is base64")
                }
                _ => continue,
            };
            output.largest_frame = output.largest_frame.max(payload.len());
            match channel {
                STDOUT => output.stdout.extend_from_slice(&payload),
                STDERR => output.stderr.extend_from_slice(&payload),
                ERROR => output.status = serde_json::from_slice(&payload).unwrap(),
                other => panic!("a frame on channel {other}"),
            }
        }
        output
    }
}

/// What kube-rs's exec of `command` printed, and its Status.
pub async fn kube_exec(api: &Api<MicroVMClaim>, claim: &str, command: &[&str]) -> (String, Value) {
    let mut attached = api
        .exec(
            claim,
            command.to_vec(),
            &AttachParams::default().stderr(false),
        )
        .await
        .unwrap();
    let mut stdout = attached.stdout().unwrap();
    let status = attached.take_status().unwrap();
    let mut printed = String::new();
    stdout.read_to_string(&mut printed).await.unwrap();
    let status = status.await.expect("a Status on the error channel");
    attached.join().await.unwrap();
    (printed, serde_json::to_value(status).unwrap())
}
