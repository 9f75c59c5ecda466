//! Issue 10: `microvmclaims/<name>/exec` end to end on a real socket: the embedded
//! battery's simulated Hosts (which run commands as flintlockd's exec API would), one
//! in-process `battery-agent` per Host over mTLS, and two clients: kube-rs's `ws` exec
//! and a hand-written `tokio-tungstenite` one speaking the channel protocol.

mod common;

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use battery_agent::flintlock::{FlintlockConfig, FlintlockTls};
use battery_api_machinery::request_info::RequestInfo;
use battery_api_machinery::status::ApiError;
use battery_apiserver::agent_relay::AgentRelayTls;
use battery_apiserver::api::UserInfo;
use battery_apiserver::dev::pki::DEV_USER;
use battery_apiserver::http::authz::{Authorizer, Decision};
use battery_apiserver::server::Settings;
use common::{CLAIMS, HOSTS, Harness, POOLS, claim, get, pool, settings};
use futures::future::BoxFuture;
use futures::{SinkExt, StreamExt};
use http::{HeaderName, HeaderValue, Request as HttpRequest, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, AttachParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// The header the test front end reads the caller from (its authentication).
const USER_HEADER: &str = "x-test-user";
const OTHER_USER: &str = "system:serviceaccount:default:someone-else";
const DEADLINE: Duration = Duration::from_secs(60);

/// A CA that signs one trust domain's certificates.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// A signed certificate and its key, PEM.
struct Signed {
    cert: String,
    key: String,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let pem = params.self_signed(&key).unwrap().pem();
        Self {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    fn sign(&self, mut params: CertificateParams, purpose: ExtendedKeyUsagePurpose) -> Signed {
        params.extended_key_usages = vec![purpose];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Signed {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// An agent's serving certificate for the Host `name`.
    fn serving(&self, name: &str) -> Signed {
        let params = CertificateParams::new(vec![name.to_owned()]).unwrap();
        self.sign(params, ExtendedKeyUsagePurpose::ServerAuth)
    }

    fn client(&self, cn: &str) -> Signed {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, cn);
        self.sign(params, ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// An agent in its own runtime, so that killing it ends its connections and sessions at
/// once, as a killed process would.
struct AgentProcess {
    runtime: Option<tokio::runtime::Runtime>,
}

impl AgentProcess {
    /// Serves on `listen` as the agent of a Host at `flintlock`, with `serving` as its
    /// certificate, accepting clients of `client_ca`.
    fn start(listen: SocketAddr, flintlock: SocketAddr, serving: &Signed, client_ca: &Ca) -> Self {
        Self::serve(None, listen, flintlock, serving, client_ca)
    }

    /// As [`AgentProcess::start`], on the address of a killed agent once it is free.
    async fn restart(
        listen: SocketAddr,
        flintlock: SocketAddr,
        serving: &Signed,
        client_ca: &Ca,
    ) -> Self {
        let listener =
            common::eventually(DEADLINE, || async { std::net::TcpListener::bind(listen) }).await;
        Self::serve(Some(listener), listen, flintlock, serving, client_ca)
    }

    fn serve(
        listener: Option<std::net::TcpListener>,
        listen: SocketAddr,
        flintlock: SocketAddr,
        serving: &Signed,
        client_ca: &Ca,
    ) -> Self {
        let config = battery_agent::Config {
            listen,
            identity: tonic::transport::Identity::from_pem(&serving.cert, &serving.key),
            client_ca: tonic::transport::Certificate::from_pem(&client_ca.pem),
            flintlock: FlintlockConfig::new(&flintlock.to_string(), FlintlockTls::Insecure)
                .unwrap(),
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
        }
    }

    fn kill(mut self) {
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
struct RecordingAuthorizer {
    exec_verbs: Mutex<Vec<String>>,
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
async fn test_user(mut request: Request, next: Next) -> axum::response::Response {
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
struct Exec {
    h: Harness,
    address: SocketAddr,
    authorizer: Arc<RecordingAuthorizer>,
    agent_ca: Ca,
    client_ca: Ca,
    agents: Vec<(String, SocketAddr, Option<AgentProcess>)>,
}

impl Exec {
    async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// As [`Exec::start`], with `tweak` applied to the server's settings.
    async fn start_with(tweak: impl FnOnce(&mut Settings)) -> Self {
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
            let listen = free_address();
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
    async fn register(&self, host: &str, agent: SocketAddr) {
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
    async fn claim(&self, name: &str) -> String {
        let bound = self.h.create(CLAIMS, &claim(name, "p")).await;
        bound["status"]["host"]["nodeName"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    fn agent_of(&self, host: &str) -> SocketAddr {
        self.agents.iter().find(|(n, ..)| n == host).unwrap().1
    }

    /// A kube-rs client of the server, as `user`.
    fn kube(&self, user: &str) -> kube::Client {
        let mut config = kube::Config::new(format!("http://{}", self.address).parse().unwrap());
        config.headers = vec![(
            HeaderName::from_static(USER_HEADER),
            HeaderValue::from_str(user).unwrap(),
        )];
        kube::Client::try_from(config).unwrap()
    }

    fn claims(&self, user: &str) -> Api<ClaimExec> {
        Api::namespaced(self.kube(user), "default")
    }

    /// Opens `query` on the claim's exec with the hand-written client, offering
    /// `protocol`, as `user`.
    async fn raw(
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
struct Output {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    status: Value,
}

struct Raw {
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
}

impl Raw {
    async fn send(&mut self, channel: u8, payload: &[u8]) {
        let mut frame = vec![channel];
        frame.extend_from_slice(payload);
        self.ws.send(Message::Binary(frame.into())).await.unwrap();
    }

    /// Reads until the server closes.
    async fn read_all(&mut self) -> Output {
        let mut output = Output::default();
        while let Some(message) = tokio::time::timeout(DEADLINE, self.ws.next())
            .await
            .unwrap()
        {
            let Ok(Message::Binary(data)) = message else {
                continue;
            };
            let (channel, payload) = data.split_first().unwrap();
            match channel {
                1 => output.stdout.extend_from_slice(payload),
                2 => output.stderr.extend_from_slice(payload),
                3 => output.status = serde_json::from_slice(payload).unwrap(),
                other => panic!("a frame on channel {other}"),
            }
        }
        output
    }
}

/// `MicroVMClaim` as kube-rs's exec takes it: kube-rs offers `exec` only on resources
/// marked `Execute`.
#[derive(Clone, Debug, serde::Deserialize)]
struct ClaimExec {
    metadata: ObjectMeta,
}

impl kube::Resource for ClaimExec {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "MicroVMClaim".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        battery_types::GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        battery_types::VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "microvmclaims".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl kube::api::Execute for ClaimExec {}

fn free_address() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// What kube-rs's exec of `command` printed, and its Status.
async fn kube_exec(api: &Api<ClaimExec>, claim: &str, command: &[&str]) -> (String, Value) {
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

#[tokio::test]
async fn kube_rs_execs_print_and_report_exit_codes_and_get_upgrades_are_authorized_as_create() {
    let exec = Exec::start().await;
    exec.claim("c").await;
    let api = exec.claims(DEV_USER);

    let (printed, status) = kube_exec(&api, "c", &["echo", "hi"]).await;
    assert_eq!(printed, "hi\n");
    assert_eq!(status["status"], "Success", "{status}");

    let (_, status) = kube_exec(&api, "c", &["sh", "-c", "exit 3"]).await;
    assert_eq!(status["status"], "Failure", "{status}");
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(
        status["details"]["causes"],
        json!([{"reason": "ExitCode", "message": "3"}]),
        "{status}"
    );

    // kube-rs upgrades with a GET; RBAC was asked for `create` every time.
    let verbs = exec.authorizer.exec_verbs.lock().unwrap().clone();
    assert_eq!(verbs, ["create", "create"]);
}

#[tokio::test]
async fn a_hand_written_client_keeps_stdout_and_stderr_apart_and_ends_stdin_with_v5_close() {
    let exec = Exec::start().await;
    exec.claim("c").await;

    let mut raw = exec
        .raw(
            DEV_USER,
            "c",
            "command=sh&command=-c&command=echo%20out%3B%20echo%20err%20%3E%262&stdout=true&stderr=true",
            "v5.channel.k8s.io",
        )
        .await
        .unwrap();
    let output = raw.read_all().await;
    assert_eq!(output.stdout, b"out\n");
    assert_eq!(output.stderr, b"err\n");
    assert_eq!(output.status, json!({"metadata": {}, "status": "Success"}));

    // A few MiB through stdin: the command sees end of file once v5 closes channel 0.
    let input: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let mut raw = exec
        .raw(
            DEV_USER,
            "c",
            "command=sha256sum&stdin=true&stdout=true&stderr=true",
            "v5.channel.k8s.io, v4.channel.k8s.io",
        )
        .await
        .unwrap();
    for chunk in input.chunks(64 * 1024) {
        raw.send(0, chunk).await;
    }
    raw.send(255, &[0]).await;
    let output = raw.read_all().await;
    let want = format!("{:x}  -\n", Sha256::digest(&input));
    assert_eq!(String::from_utf8_lossy(&output.stdout), want);
    assert_eq!(output.status["status"], "Success", "{}", output.status);

    // v4 has no close; a command that does not read stdin needs none.
    let mut raw = exec
        .raw(
            DEV_USER,
            "c",
            "&command=echo&command=v4&stdout=true",
            "v4.channel.k8s.io",
        )
        .await
        .unwrap();
    let output = raw.read_all().await;
    assert_eq!(output.stdout, b"v4\n");
    assert_eq!(output.status["status"], "Success", "{}", output.status);
}

#[tokio::test]
async fn refusals_are_statuses_before_the_upgrade() {
    let exec = Exec::start().await;
    let host = exec.claim("c").await;
    let refused = |status: StatusCode, reason: &str, got: Result<Raw, (StatusCode, Value)>| {
        let Err((code, body)) = got else {
            panic!("upgraded; wanted {status}");
        };
        assert_eq!(code, status, "{body}");
        assert_eq!(body["kind"], "Status", "{body}");
        assert_eq!(body["reason"], reason, "{body}");
        body
    };
    let v5 = "v5.channel.k8s.io";
    let tty = refused(
        StatusCode::BAD_REQUEST,
        "BadRequest",
        exec.raw(
            DEV_USER,
            "c",
            "command=sh&stdin=true&stdout=true&tty=true",
            v5,
        )
        .await,
    );
    assert!(
        tty["message"].as_str().unwrap().contains("no terminal"),
        "{tty}"
    );
    refused(
        StatusCode::BAD_REQUEST,
        "BadRequest",
        exec.raw(DEV_USER, "c", "stdout=true", v5).await,
    );
    refused(
        StatusCode::NOT_FOUND,
        "NotFound",
        exec.raw(DEV_USER, "nope", "command=true&stdout=true", v5)
            .await,
    );
    let holder = refused(
        StatusCode::FORBIDDEN,
        "Forbidden",
        exec.raw(OTHER_USER, "c", "command=true&stdout=true", v5)
            .await,
    );
    assert!(
        holder["message"].as_str().unwrap().contains("Holder"),
        "{holder}"
    );
    refused(
        StatusCode::FORBIDDEN,
        "Forbidden",
        exec.raw("no-rbac", "c", "command=true&stdout=true", v5)
            .await,
    );

    // An agent with a valid certificate for the other Host's name, on this Host's
    // address: the API server does not finish the handshake, so no session reaches it.
    let other = exec
        .agents
        .iter()
        .find(|(n, ..)| *n != host)
        .unwrap()
        .0
        .clone();
    let rogue_address = free_address();
    let _rogue = AgentProcess::start(
        rogue_address,
        exec.h.battery().host(&host).unwrap().address(),
        &exec.agent_ca.serving(&other),
        &exec.client_ca,
    );
    exec.register(&host, rogue_address).await;
    let rogue = refused(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        exec.raw(DEV_USER, "c", "command=true&stdout=true", v5)
            .await,
    );
    assert!(
        rogue["message"].as_str().unwrap().contains(&host)
            && rogue["message"].as_str().unwrap().contains("certificate"),
        "{rogue}"
    );

    // Nothing listening: unreachable is a 503 too.
    exec.register(&host, free_address()).await;
    refused(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        exec.raw(DEV_USER, "c", "command=true&stdout=true", v5)
            .await,
    );
}

#[tokio::test]
async fn an_agent_killed_mid_stream_fails_the_exec_and_its_successor_serves() {
    let mut exec = Exec::start().await;
    let host = exec.claim("c").await;
    let mut raw = exec
        .raw(
            DEV_USER,
            "c",
            "command=sh&command=-c&command=echo%20started%3B%20sleep%201000&stdout=true",
            "v5.channel.k8s.io",
        )
        .await
        .unwrap();
    // Wait for the command to run before killing its agent.
    let mut started = Vec::new();
    while !started.ends_with(b"started\n") {
        let Some(Ok(Message::Binary(data))) = raw.ws.next().await else {
            panic!("the session ended before the command printed");
        };
        started.extend_from_slice(&data[1..]);
    }
    let slot = exec.agents.iter_mut().find(|(n, ..)| *n == host).unwrap();
    slot.2.take().unwrap().kill();
    let output = raw.read_all().await;
    assert_eq!(output.status["status"], "Failure", "{}", output.status);
    assert!(
        output.status["message"]
            .as_str()
            .unwrap()
            .contains("did not finish"),
        "{}",
        output.status
    );

    let address = exec.agent_of(&host);
    let flintlock = exec.h.battery().host(&host).unwrap().address();
    let successor = AgentProcess::restart(
        address,
        flintlock,
        &exec.agent_ca.serving(&host),
        &exec.client_ca,
    )
    .await;
    exec.agents.iter_mut().find(|(n, ..)| *n == host).unwrap().2 = Some(successor);
    let api = exec.claims(DEV_USER);
    let (printed, status) = common::eventually(DEADLINE, || async {
        match api
            .exec(
                "c",
                ["echo", "back"],
                &AttachParams::default().stderr(false),
            )
            .await
        {
            Ok(mut attached) => {
                let mut out = String::new();
                let status = attached.take_status().unwrap();
                attached
                    .stdout()
                    .unwrap()
                    .read_to_string(&mut out)
                    .await
                    .unwrap();
                Ok((out, status.await))
            }
            Err(err) => Err(err.to_string()),
        }
    })
    .await;
    assert_eq!(printed, "back\n");
    let status = serde_json::to_value(status).unwrap();
    assert_eq!(status["status"], "Success", "{status}");
}

#[tokio::test]
async fn deleting_the_claim_ends_its_sessions_and_the_gauge_counts_them() {
    let exec = Exec::start().await;
    exec.claim("c").await;
    let mut raw = exec
        .raw(
            DEV_USER,
            "c",
            "command=sleep&command=1000&stdin=true&stdout=true",
            "v5.channel.k8s.io",
        )
        .await
        .unwrap();
    let metrics = || async {
        let (_, _, body) = exec.h.send(get("/metrics")).await;
        String::from_utf8(body).unwrap()
    };
    assert!(
        metrics()
            .await
            .contains("battery_apiserver_exec_sessions 1\n")
    );
    // stdin is still open: only the release can end this one.
    raw.send(0, b"ignored\n").await;
    let (status, body) = exec
        .h
        .json(
            HttpRequest::delete(format!("{CLAIMS}/c"))
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let output = raw.read_all().await;
    assert_eq!(output.status["status"], "Failure", "{}", output.status);
    assert!(
        output.status["message"]
            .as_str()
            .unwrap()
            .contains("released"),
        "{}",
        output.status
    );
    common::eventually(DEADLINE, || async {
        let text = metrics().await;
        if text.contains("battery_apiserver_exec_sessions 0\n") {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;
}

#[tokio::test]
async fn many_sessions_run_at_once_and_closing_the_websocket_ends_the_command() {
    let exec = Exec::start().await;
    exec.claim("a").await;
    exec.claim("b").await;
    let metrics = || async {
        let (_, _, body) = exec.h.send(get("/metrics")).await;
        String::from_utf8(body).unwrap()
    };
    // Two long sessions held open while sixteen short ones run on both claims.
    let mut long = Vec::new();
    for claim in ["a", "b"] {
        let query = "command=sleep&command=1000&stdin=true&stdout=true";
        long.push(
            exec.raw(DEV_USER, claim, query, "v5.channel.k8s.io")
                .await
                .unwrap(),
        );
    }
    let short = (0..16).map(|i| {
        let exec = &exec;
        async move {
            let claim = if i % 2 == 0 { "a" } else { "b" };
            let query = format!("command=echo&command={i}&stdout=true");
            let mut raw = exec
                .raw(DEV_USER, claim, &query, "v5.channel.k8s.io")
                .await
                .unwrap();
            let output = raw.read_all().await;
            assert_eq!(output.stdout, format!("{i}\n").into_bytes());
            assert_eq!(output.status["status"], "Success", "{}", output.status);
        }
    });
    futures::future::join_all(short).await;
    assert!(
        metrics()
            .await
            .contains("battery_apiserver_exec_sessions 2\n")
    );

    // The client going away drops the relay stream, which ends `sleep` in the MicroVM.
    for mut raw in long {
        raw.ws.close(None).await.unwrap();
    }
    common::eventually(DEADLINE, || async {
        let text = metrics().await;
        if text.contains("battery_apiserver_exec_sessions 0\n") {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;
}

#[tokio::test]
async fn the_session_cap_answers_429_and_no_relay_configuration_answers_503() {
    let exec = Exec::start_with(|s| s.max_exec_sessions = 1).await;
    exec.claim("c").await;
    let held = exec
        .raw(
            DEV_USER,
            "c",
            "command=sleep&command=1000&stdin=true&stdout=true",
            "v5.channel.k8s.io",
        )
        .await
        .unwrap();
    let Err((status, body)) = exec
        .raw(
            DEV_USER,
            "c",
            "command=true&stdout=true",
            "v5.channel.k8s.io",
        )
        .await
    else {
        panic!("a second session past the cap of one was upgraded");
    };
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["reason"], "TooManyRequests", "{body}");
    drop(held);

    let unconfigured = Exec::start_with(|s| s.agent_relay = None).await;
    unconfigured.claim("c").await;
    let Err((status, body)) = unconfigured
        .raw(
            DEV_USER,
            "c",
            "command=true&stdout=true",
            "v5.channel.k8s.io",
        )
        .await
    else {
        panic!("upgraded without a relay configuration");
    };
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.starts_with("exec is not configured"), "{body}");
    assert!(message.contains("--agent-ca-file"), "{body}");
}

#[tokio::test]
async fn an_expiring_claim_ends_its_sessions() {
    let exec = Exec::start().await;
    let mut body = pool("short", 1);
    body["spec"]["lease"] = json!({"heartbeatInterval": "100ms", "expiryThreshold": "1s"});
    exec.h.create(POOLS, &body).await;
    exec.h.wait_available("short", 1).await;
    exec.h.create(CLAIMS, &claim("expiring", "short")).await;
    let mut raw = exec
        .raw(
            DEV_USER,
            "expiring",
            "command=sleep&command=1000&stdin=true&stdout=true",
            "v5.channel.k8s.io",
        )
        .await
        .unwrap();
    // Never renewed: battery expires the lease, and with it the session.
    let output = raw.read_all().await;
    assert_eq!(output.status["status"], "Failure", "{}", output.status);
    exec.h
        .eventually(&format!("{CLAIMS}/expiring"), |_, claim| {
            claim["status"]["phase"] == "Expired"
        })
        .await;
    let (status, body) = exec
        .raw(
            DEV_USER,
            "expiring",
            "command=true&stdout=true",
            "v5.channel.k8s.io",
        )
        .await
        .err()
        .expect("an exec into an Expired claim was upgraded");
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
}
