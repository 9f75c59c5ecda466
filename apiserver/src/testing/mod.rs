//! For tests (the `test-util` feature): the in-process server the router-level tests
//! drive, the whole router on an embedded battery and an in-memory metadata store,
//! requests sent without a socket; the bodies they send, the one way every test waits
//! for something, and a battery proxy that loses answers on purpose ([`faults`]).

pub mod cluster;
pub mod faults;

use std::time::Duration;

use crate::auth::UserInfo;
use crate::battery::BatteryClient;
use crate::dev::pki::DEV_USER;
use crate::meta_store::MetaStore;
use crate::server::{self, App, Settings};
use axum::Router;
use axum::body::Body;
use battery_embedded::BatteryConfig;
use battery_embedded::local::{LocalBattery, LocalBatteryConfig};
use futures::StreamExt as _;
use futures::stream::BoxStream;
use http::{HeaderMap, Request, StatusCode, header};
use serde_json::{Value, json};
use tower::ServiceExt;

pub const POOLS: &str = "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/pools";
pub const CLAIMS: &str =
    "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/microvmclaims";
pub const HOSTS: &str = "/apis/battery.liquidmetal-x.dev/v1alpha1/hosts";

/// How long the harness polls: generous, as provisioning 100 simulated MicroVMs on a
/// loaded 2-core machine is slow.
pub const DEADLINE: Duration = Duration::from_secs(90);

// The workspace's one poll-until, here so every test file waits the same way.
pub use battery_telemetry::eventually;

/// The settings the harness starts with: binds wait half a second, the rest as served.
pub fn settings() -> Settings {
    Settings {
        bind_wait: Duration::from_millis(500),
        ..Settings::default()
    }
}

pub struct Harness {
    app: App,
    battery: LocalBattery,
    /// Where the server reaches battery: its address, or a proxy's in front of it.
    battery_url: String,
    settings: Settings,
}

impl Harness {
    pub async fn start() -> Self {
        Self::with_settings(settings()).await
    }

    pub async fn with_settings(settings: Settings) -> Self {
        Self::build(MetaStore::in_memory().unwrap(), settings).await
    }

    pub async fn with_store(store: MetaStore) -> Self {
        Self::build(store, settings()).await
    }

    /// On a battery of `config`'s, for tests of how the server copes with its timing.
    pub async fn with_battery(settings: Settings, config: LocalBatteryConfig) -> Self {
        let battery = LocalBattery::start(config).await.expect("embedded battery");
        let url = format!("http://{}", battery.address());
        Self::on(battery, url, MetaStore::in_memory().unwrap(), settings)
    }

    /// On a battery of `config`'s that the server reaches through a [`faults::FaultyBattery`].
    pub async fn behind_proxy(
        settings: Settings,
        config: LocalBatteryConfig,
    ) -> (Self, faults::FaultyBattery) {
        let battery = LocalBattery::start(config).await.expect("embedded battery");
        let proxy = faults::FaultyBattery::start(battery.address()).await;
        let harness = Self::on(
            battery,
            proxy.url(),
            MetaStore::in_memory().unwrap(),
            settings,
        );
        (harness, proxy)
    }

    async fn build(store: MetaStore, settings: Settings) -> Self {
        let battery = fast_battery().await;
        let url = format!("http://{}", battery.address());
        Self::on(battery, url, store, settings)
    }

    fn on(
        battery: LocalBattery,
        battery_url: String,
        store: MetaStore,
        settings: Settings,
    ) -> Self {
        let app = Self::app(&battery_url, store, &settings);
        Self {
            app,
            battery,
            battery_url,
            settings,
        }
    }

    fn app(battery_url: &str, store: MetaStore, settings: &Settings) -> App {
        let client = BatteryClient::connect_lazy(battery_url).unwrap();
        server::build(client, std::sync::Arc::new(store), settings).unwrap()
    }

    /// Stops the server and starts a new one on the same battery with an empty store, as
    /// a server installed beside a battery that has a history.
    pub fn replace_server(&mut self) {
        self.app = Self::app(
            &self.battery_url,
            MetaStore::in_memory().unwrap(),
            &self.settings,
        );
    }

    pub fn router(&self) -> Router {
        self.app.router.clone()
    }

    /// The embedded battery, for tests that act on it as another client would.
    pub fn battery(&self) -> &LocalBattery {
        &self.battery
    }

    /// The embedded battery, for tests that stop it.
    pub fn battery_mut(&mut self) -> &mut LocalBattery {
        &mut self.battery
    }

    /// GETs `uri` until `check` holds of the answer, which it returns; fails after
    /// [`DEADLINE`].
    pub async fn eventually(&self, uri: &str, check: impl Fn(StatusCode, &Value) -> bool) -> Value {
        eventually(DEADLINE, uri, || async {
            let (status, body) = self.get(uri).await;
            if check(status, &body) {
                Ok(body)
            } else {
                Err(format!("{uri} answered {status} {body}"))
            }
        })
        .await
    }

    /// Waits until the Pool `name` has `want` MicroVMs available.
    pub async fn wait_available(&self, name: &str, want: i64) {
        self.eventually(&format!("{POOLS}/{name}"), |_, pool| {
            pool["status"]["available"] == want
        })
        .await;
    }

    /// Sends `request` with the credentials it carries: none is anonymous.
    pub async fn send_as_is(&self, request: Request<Body>) -> (StatusCode, HeaderMap, Vec<u8>) {
        let response = self.router().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, headers, body.to_vec())
    }

    /// Sends `request` as the dev user.
    pub async fn send(&self, request: Request<Body>) -> (StatusCode, HeaderMap, Vec<u8>) {
        self.send_as_is(as_dev(request)).await
    }

    /// As [`Harness::send_as_is`], the body read as JSON (`Null` when it is not).
    pub async fn json_as_is(&self, request: Request<Body>) -> (StatusCode, Value) {
        let (status, _, body) = self.send_as_is(request).await;
        (status, json_or_null(&body))
    }

    /// As [`Harness::send`], the body read as JSON (`Null` when it is not).
    pub async fn json(&self, request: Request<Body>) -> (StatusCode, Value) {
        self.json_as_is(as_dev(request)).await
    }

    pub async fn get(&self, uri: &str) -> (StatusCode, Value) {
        self.json(get(uri)).await
    }

    /// `method` on `uri` as `user`, with `body` (if any) sent as `content_type`.
    pub async fn call_as(
        &self,
        user: &str,
        method: &str,
        uri: &str,
        content_type: &str,
        body: Option<Value>,
    ) -> (StatusCode, HeaderMap, Value) {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, content_type)
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
            .unwrap();
        let (status, headers, body) = self.send_as_is(as_user(user, request)).await;
        (status, headers, json_or_null(&body))
    }

    /// As [`Harness::call_as`], as the dev user.
    pub async fn call(
        &self,
        method: &str,
        uri: &str,
        content_type: &str,
        body: Option<Value>,
    ) -> (StatusCode, HeaderMap, Value) {
        self.call_as(DEV_USER, method, uri, content_type, body)
            .await
    }

    /// Creates the Pool `name` of `size` MicroVMs; the created object.
    pub async fn create_pool(&self, name: &str, size: i32) -> Value {
        self.create(POOLS, &pool(name, size)).await
    }

    /// Opens a watch as the dev user and returns its lines as they come.
    pub async fn watch(&self, uri: &str, accept: &str) -> BoxStream<'static, Value> {
        let request = Request::get(uri)
            .header(header::ACCEPT, accept)
            .body(Body::empty())
            .unwrap();
        let response = self.router().oneshot(as_dev(request)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let mut buffer = Vec::new();
        response
            .into_body()
            .into_data_stream()
            .flat_map(move |chunk| {
                buffer.extend_from_slice(&chunk.unwrap());
                let mut lines = Vec::new();
                while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buffer.drain(..=end).collect();
                    lines.push(serde_json::from_slice(&line).unwrap());
                }
                futures::stream::iter(lines)
            })
            .boxed()
    }

    /// A request that authenticates with a bearer token, as a client in a pod would.
    pub async fn call_with_token(
        &self,
        token: &str,
        method: &str,
        uri: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, "application/merge-patch+json")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
            .unwrap();
        self.json_as_is(request).await
    }

    /// A Pool whose leases beat every 100 ms and expire after `expiry` unrenewed.
    pub async fn create_pool_with_lease(
        &self,
        name: &str,
        size: i32,
        replenishment: &str,
        expiry: &str,
    ) {
        let mut body = pool(name, size);
        body["spec"]["replenishment"] = json!({"type": replenishment});
        body["spec"]["lease"] = json!({"heartbeatInterval": "100ms", "expiryThreshold": expiry});
        self.create(POOLS, &body).await;
    }

    /// POSTs `body` to `uri`, which must create it; the created object.
    pub async fn create(&self, uri: &str, body: &Value) -> Value {
        let (status, created) = self.json(post(uri, body)).await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        created
    }

    /// Releases the lease of the claim whose uid is `claim_uid` straight through battery,
    /// as another client of battery might: its release's event is not one the follower
    /// applies (our own releases record first), so the claim's record still holds it.
    pub async fn release_behind_our_back(&self, claim_uid: &str) {
        use battery_proto::poolmgr::v1alpha1::lease_client::LeaseClient;
        use battery_proto::poolmgr::v1alpha1::{ListLeasesRequest, ReleaseVmRequest};
        let mut battery = LeaseClient::connect(format!("http://{}", self.battery().address()))
            .await
            .unwrap();
        let leases = battery
            .list_leases(ListLeasesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .leases;
        let lease = leases
            .iter()
            .find(|l| l.request_id == format!("microvmclaim/{claim_uid}"))
            .expect("the claim's lease");
        battery
            .release_vm(ReleaseVmRequest {
                lease_id: lease.lease_id.clone(),
            })
            .await
            .unwrap();
    }

    /// Creates the claim `name` on `pool` as the dev user, however it is answered.
    pub async fn claim(&self, name: &str, pool: &str) -> (StatusCode, HeaderMap, Value) {
        self.call("POST", CLAIMS, "application/json", Some(claim(name, pool)))
            .await
    }
}

/// An embedded battery with two simulated Hosts, timed for tests: MicroVMs provision,
/// leases expire and sweeps run in milliseconds.
pub async fn fast_battery() -> LocalBattery {
    LocalBattery::start(fast_battery_config())
        .await
        .expect("embedded battery")
}

/// The harness's battery: two Hosts, fast boots and sweeps.
pub fn fast_battery_config() -> LocalBatteryConfig {
    LocalBatteryConfig {
        hosts: 2,
        provisioning_delay: Duration::from_millis(10),
        battery: BatteryConfig {
            sweep_interval: Duration::from_millis(100),
            create_poll_interval: Duration::from_millis(20),
            guest_agent_interval: Duration::from_millis(200),
            ..BatteryConfig::default()
        },
        ..LocalBatteryConfig::default()
    }
}

/// The request as `user` sends it, past authentication.
pub fn as_user(user: &str, mut request: Request<Body>) -> Request<Body> {
    request.extensions_mut().insert(UserInfo {
        name: user.into(),
        groups: vec!["system:authenticated".into()],
        ..UserInfo::default()
    });
    request
}

/// The request as the dev policy's user sends it, past authentication.
pub fn as_dev(request: Request<Body>) -> Request<Body> {
    as_user(DEV_USER, request)
}

fn json_or_null(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or(Value::Null)
}

/// A valid Pool body.
pub fn pool(name: &str, size: i32) -> Value {
    json!({
        "apiVersion": "battery.liquidmetal-x.dev/v1alpha1", "kind": "Pool",
        "metadata": {"name": name, "labels": {"team": "ci"}},
        "spec": {"size": size, "template": {"vcpu": 1, "memoryInMb": 1024,
            "kernel": {"image": "k"}, "rootVolume": {"id": "root", "containerSource": "r"},
            "interfaces": [{"deviceId": "eth1"}]}}
    })
}

/// The dev user's ServiceAccount (`system:serviceaccount:default:<name>`): a claim's
/// holder, so that the dev user may renew it.
pub fn dev_service_account() -> &'static str {
    DEV_USER.rsplit(':').next().unwrap()
}

/// A claim body on `pool`, held by the dev user's ServiceAccount.
pub fn claim(name: &str, pool: &str) -> Value {
    json!({
        "apiVersion": "battery.liquidmetal-x.dev/v1alpha1", "kind": "MicroVMClaim",
        "metadata": {"name": name},
        "spec": {"poolRef": {"name": pool}, "serviceAccountName": dev_service_account()}
    })
}

/// The condition of `type_` in the object's status, if it has one.
pub fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

pub fn post(uri: &str, body: &Value) -> Request<Body> {
    Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

pub fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}
