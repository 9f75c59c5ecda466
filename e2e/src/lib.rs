//! The end-to-end suites' shared harness.
//!
//! - [`apiserver`]: the real `battery-apiserver` reached by the real kubectl, straight
//!   (`dev`) or through a real kube-apiserver (`serve` behind its APIService);
//! - [`control_plane`]: that kube-apiserver, with etcd and kube-controller-manager, built
//!   from their Go modules, and battery-apiserver installed into it from `deploy/`;
//! - [`pki`]: certificates for the control plane and the attack table;
//! - [`https`]: a client that sends exactly the certificate and headers a test chooses;
//! - [`channel_exec`]: an exec client written from the WebSocket channel protocol, the
//!   second client beside kube-rs's;
//! - [`process`]: the processes they start, each logging to a file and stopped with the
//!   test.
//!
//! `bench` (`e2e/bench/`, crate `battery-bench`) measures on the same harness.
//!
//! The rest serves the battery conformance suite. The tests in `tests/battery_conformance/` check battery's gRPC API
//! (`poolmgr.v1alpha1`, see `reference/battery-api.md`) against either a real poolmgrd
//! (`BATTERY_CONFORMANCE_ADDRESS` set) or the embedded battery started in-process through
//! [`battery_embedded::local::LocalBattery`]. Everything a test needs lives here so the
//! tests themselves read as the behaviour they check:
//!
//! - [`Suite`]: one battery (embedded or external), its clients, the test's private
//!   namespace and the timing to expect; [`Options`] chooses what a test needs.
//! - [`PoolBuilder`]: pool specs with sensible defaults.
//! - [`EventLog`]: an `Events.Subscribe` stream that remembers what it saw and checks the
//!   stream's invariants on every event.
//! - [`eventually`] / [`consistently`]: waits with deadlines instead of sleeps
//!   (`battery_telemetry`'s, the workspace's one poll-until).
//! - [`flintlock`]: looks at the Hosts directly through flintlock's API (MicroVM, exec).
//! - [`Gate`]: a hook command that blocks until the test opens it (embedded only).

pub mod apiserver;
mod assert;
mod battery_access;
mod binaries;
pub mod channel_exec;
pub mod control_plane;
mod env;
mod events;
pub mod flintlock;
mod gate;
pub mod https;
mod ops;
pub mod pki;
pub mod process;
mod spec;
mod suite;

pub use assert::{expect_code, expect_ok, nanos, ts_nanos};
pub use battery_access::{BasicAuth, BatteryAccess, BatteryChannel, BatteryPki, Credential};
pub use battery_embedded::local::insecure_host;
pub use battery_telemetry::{consistently, eventually};
pub use env::{
    ADDRESS_VAR, HOSTS_VAR, KERNEL_IMAGE_VAR, LOG_VAR, ROOT_IMAGE_VAR, SWEEP_VAR, TIMEOUT_VAR,
    WARNING_WINDOW_VAR, parse_duration,
};
pub use events::{EventLog, event_type};
pub use gate::Gate;
pub use spec::{PoolBuilder, TEMPLATE_INTERFACE, default_template, proto_duration};
pub use suite::{HostRef, Options, Suite, Timing, skip};

/// A kube-rs client for the user of `kubeconfig`.
pub async fn kube_client(kubeconfig: &std::path::Path) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)
        .unwrap_or_else(|e| panic!("read {}: {e}", kubeconfig.display()));
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("a client configuration from the kubeconfig");
    kube::Client::try_from(config).expect("a kube client")
}

/// The Event `reason` on the object of `uid` in `namespace`, waited for up to `within`:
/// what a server recorded for `kubectl describe`.
pub async fn kube_event(
    client: &kube::Client,
    namespace: &str,
    uid: Option<&str>,
    reason: &str,
    within: std::time::Duration,
) -> k8s_openapi::api::core::v1::Event {
    let events: kube::Api<k8s_openapi::api::core::v1::Event> =
        kube::Api::namespaced(client.clone(), namespace);
    eventually(within, &format!("the {reason} Event"), async || {
        let list = events
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .into_iter()
            .find(|e| {
                e.involved_object.uid.as_deref() == uid && e.reason.as_deref() == Some(reason)
            })
            .ok_or_else(|| format!("no {reason} Event yet"))
    })
    .await
}

/// A claim `name` on the `dev` Pool held by the ServiceAccount `holder` of its namespace.
pub fn dev_claim(name: &str, holder: &str) -> battery_types::MicroVMClaim {
    serde_json::from_value(serde_json::json!({
        "apiVersion": battery_types::API_VERSION,
        "kind": "MicroVMClaim",
        "metadata": {"name": name},
        "spec": {"poolRef": {"name": "dev"}, "serviceAccountName": holder},
    }))
    .expect("a MicroVMClaim")
}

/// flintlock's types (the MicroVM template).
pub use battery_proto::flintlock::types as fl;
/// The generated battery API, re-exported for the tests.
pub use battery_proto::poolmgr::v1alpha1 as api;
