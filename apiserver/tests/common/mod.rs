//! The in-process server the router-level tests drive: the whole router on an embedded
//! battery and an in-memory metadata store, requests sent without a socket.

// Each test crate that includes this module uses a different part of it.
#![allow(dead_code)]

pub mod faults;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use battery_apiserver::api::UserInfo;
use battery_apiserver::battery::BatteryClient;
use battery_apiserver::meta_store::MetaStore;
use battery_apiserver::server::{self, App, Settings};
use battery_embedded::BatteryConfig;
use battery_embedded::local::{LocalBattery, LocalBatteryConfig};
use http::{Request, StatusCode, header};
use serde_json::{Value, json};
use tower::ServiceExt;

pub const POOLS: &str = "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/pools";
pub const CLAIMS: &str =
    "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/microvmclaims";

pub struct Harness {
    app: App,
    battery: LocalBattery,
}

impl Harness {
    pub async fn start() -> Self {
        Self::with_store(MetaStore::in_memory().unwrap()).await
    }

    pub async fn with_settings(settings: Settings) -> Self {
        Self::build(MetaStore::in_memory().unwrap(), settings).await
    }

    pub async fn with_store(store: MetaStore) -> Self {
        Self::build(
            store,
            Settings {
                bind_wait: Duration::from_millis(500),
                cluster: None,
                limits: Default::default(),
                authentication: Default::default(),
                authorizer: None,
            },
        )
        .await
    }

    async fn build(store: MetaStore, settings: Settings) -> Self {
        let battery = fast_battery().await;
        let client = BatteryClient::connect_lazy(&format!("http://{}", battery.address())).unwrap();
        let app = server::build(client, std::sync::Arc::new(store), &settings).unwrap();
        Self { app, battery }
    }

    pub fn router(&self) -> Router {
        self.app.router.clone()
    }

    /// The embedded battery, for tests that act on it as another client would.
    pub fn battery(&self) -> &LocalBattery {
        &self.battery
    }

    /// GETs `uri` until `check` holds of the answer, which it returns; fails after 20 s.
    pub async fn eventually(&self, uri: &str, check: impl Fn(StatusCode, &Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let (status, body) = self.json(get(uri)).await;
            if check(status, &body) {
                return body;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{uri} never got there: {status} {body}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn send(&self, request: Request<Body>) -> (StatusCode, http::HeaderMap, Vec<u8>) {
        let response = self.router().oneshot(as_dev(request)).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, headers, body.to_vec())
    }

    pub async fn json(&self, request: Request<Body>) -> (StatusCode, Value) {
        let (status, _, body) = self.send(request).await;
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }
}

/// An embedded battery with two simulated Hosts, timed for tests: MicroVMs provision,
/// leases expire and sweeps run in milliseconds.
pub async fn fast_battery() -> LocalBattery {
    LocalBattery::start(LocalBatteryConfig {
        hosts: 2,
        provisioning_delay: Duration::from_millis(10),
        battery: BatteryConfig {
            sweep_interval: Duration::from_millis(100),
            create_poll_interval: Duration::from_millis(20),
            guest_agent_interval: Duration::from_millis(200),
            ..BatteryConfig::default()
        },
        ..LocalBatteryConfig::default()
    })
    .await
    .expect("embedded battery")
}

/// The request as the dev policy's user sends it, past authentication.
pub fn as_dev(mut request: Request<Body>) -> Request<Body> {
    request.extensions_mut().insert(UserInfo {
        name: "system:serviceaccount:default:dev".into(),
        groups: vec!["system:authenticated".into()],
        ..UserInfo::default()
    });
    request
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

pub fn post(uri: &str, body: &Value) -> Request<Body> {
    Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

pub fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}
