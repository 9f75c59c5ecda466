//! What only a real control plane shows: kube-controller-manager's namespace controller
//! and garbage collector acting on our resources through our API, and kube-apiserver's
//! aggregator noticing `serve` go and come back. Each test starts its own cluster
//! (`battery_e2e::control_plane`) with `serve` installed from `deploy/` behind it.

use std::time::Duration;

use battery_e2e::apiserver::ApiServer;
use battery_e2e::control_plane::install::{self, API_SERVICE};
use battery_e2e::eventually;
use battery_e2e::https::Client;
use battery_types::{ClaimPhase, MicroVMClaim, Pool};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use serde_json::json;

/// The size of each test's Pool: room for every claim it makes.
const POOL_SIZE: i32 = 2;
/// How long the namespace controller and the garbage collector may take to finish what
/// they were asked on a loaded machine: both requeue failures with a backoff that grows
/// to a minute (so after `serve` was down a while, the next try may be a minute away),
/// and the namespace controller first rediscovers and lists every resource of the cluster.
const CONTROLLER_TIMEOUT: Duration = Duration::from_secs(180);

/// Makes the namespace `namespace` as the admin, a Pool of [`POOL_SIZE`] in it, waits
/// until its MicroVMs are available, and claims `claims` of them (each Bound on create).
async fn claims_in(server: &ApiServer, namespace: &str, claims: &[&str]) {
    let cluster = server.cluster().expect("a real control plane");
    let admin = cluster.plane.admin().await;
    let namespaces: Api<Namespace> = Api::all(admin);
    let object = Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create the namespace {namespace}: {e}"));
    let client = battery_e2e::kube_client(server.kubeconfig()).await;
    let pools: Api<Pool> = Api::namespaced(client.clone(), namespace);
    let mut pool: Pool = serde_json::from_value(battery_apiserver::dev::dev_pool(POOL_SIZE))
        .expect("the dev Pool is a Pool");
    pool.metadata.namespace = Some(namespace.to_owned());
    pools
        .create(&PostParams::default(), &pool)
        .await
        .expect("create the Pool");
    eventually(CONTROLLER_TIMEOUT, "the Pool's MicroVMs", async || {
        let pool = pools.get("dev").await.map_err(|e| e.to_string())?;
        match pool.status.as_ref().map(|s| s.available) {
            Some(available) if available >= POOL_SIZE => Ok(()),
            other => Err(format!("available {other:?}")),
        }
    })
    .await;
    let api: Api<MicroVMClaim> = Api::namespaced(client, namespace);
    for name in claims {
        let claim = claim(name, None);
        let created = api
            .create(&PostParams::default(), &claim)
            .await
            .unwrap_or_else(|e| panic!("create the claim {name}: {e}"));
        assert_eq!(
            created.status.and_then(|s| s.phase),
            Some(ClaimPhase::Bound)
        );
    }
}

/// A claim on the Pool `dev`, held by the kubectl user's ServiceAccount, owned by `owner`
/// (`ownerReferences` JSON) when given.
fn claim(name: &str, owner: Option<serde_json::Value>) -> MicroVMClaim {
    let mut metadata = json!({"name": name});
    if let Some(owner) = owner {
        metadata["ownerReferences"] = json!([owner]);
    }
    serde_json::from_value(json!({
        "apiVersion": battery_types::API_VERSION,
        "kind": "MicroVMClaim",
        "metadata": metadata,
        "spec": {"poolRef": {"name": "dev"}, "serviceAccountName": "dev"},
    }))
    .expect("a MicroVMClaim")
}

/// Waits until battery holds exactly `count` leases.
async fn wait_leases(server: &ApiServer, count: usize, what: &str) {
    eventually(CONTROLLER_TIMEOUT, what, async || {
        let leases = server.battery_leases().await;
        if leases.len() == count {
            Ok(())
        } else {
            Err(format!("{} leases", leases.len()))
        }
    })
    .await;
}

/// Deletes `name` through `api` as the caller of `api`.
async fn delete<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete {name}: {e}"));
}

/// Waits until `name` is gone from `api`, as a controller finishes deleting it.
async fn wait_gone<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(
        CONTROLLER_TIMEOUT,
        &format!("{name} to go"),
        async || match api.get_opt(name).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(object) => Err(format!("{object:?}")),
        },
    )
    .await;
}

/// The namespace controller deletes a namespace's claims and Pools through our API (it
/// discovers our resources and deletes their collections), battery releases the leases,
/// and the namespace goes; without our `deletecollection` and the lists it re-checks, the
/// namespace would stay Terminating for ever.
#[tokio::test]
async fn deleting_a_namespace_deletes_its_claims_and_releases_their_leases() {
    let server = ApiServer::aggregated_with_controllers().await;
    claims_in(&server, "doomed", &["one", "two"]).await;
    wait_leases(&server, 2, "two leases").await;

    let admin = server.cluster().expect("a cluster").plane.admin().await;
    let namespaces: Api<Namespace> = Api::all(admin);
    delete(&namespaces, "doomed").await;
    wait_gone(&namespaces, "doomed").await;
    wait_leases(&server, 0, "every lease released").await;
}

/// `serve` down and back, as the cluster sees it. Down: the aggregator's own availability
/// check turns the APIService `Available=False` and requests for our group get its 503;
/// the namespace controller cannot discover our group, so it keeps a namespace being
/// deleted Terminating (condition `NamespaceDeletionDiscoveryFailure`) instead of
/// finishing without deleting our objects. Back: `Available=True`, a claim made right
/// after is Bound, and the namespace controller deletes the namespace's claims and
/// finishes; no lease of it is left.
#[tokio::test]
async fn serve_down_and_back_holds_a_namespace_deletion_and_the_apiservice() {
    let mut server = ApiServer::aggregated_with_controllers().await;
    claims_in(&server, "doomed", &["one"]).await;
    wait_leases(&server, 1, "one lease").await;
    let client = battery_e2e::kube_client(server.kubeconfig()).await;
    let claims: Api<MicroVMClaim> = Api::namespaced(client, "default");

    server.stop_serve().await;
    let cluster = server.cluster().expect("a cluster");
    let service = install::wait_available(&cluster.plane, "False").await;
    eprintln!("{API_SERVICE} while serve is down: {:?}", service.status);
    // Asked once, by hand: kube's client would retry a 503 for a while.
    let kube_apiserver = Client::new(cluster.url(), &cluster.ca(), cluster.kubectl_identity());
    let path = format!(
        "/apis/{}/namespaces/default/microvmclaims",
        battery_types::API_VERSION
    );
    let (code, body) = kube_apiserver.get(&path).await;
    assert_eq!(code, 503, "a list while serve is down: {body}");
    let namespaces: Api<Namespace> = Api::all(cluster.plane.admin().await);
    delete(&namespaces, "doomed").await;
    eventually(
        CONTROLLER_TIMEOUT,
        "the namespace controller to report our group undiscoverable",
        async || {
            let namespace = namespaces.get("doomed").await.map_err(|e| e.to_string())?;
            let failed = namespace
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "NamespaceDeletionDiscoveryFailure" && c.status == "True");
            if failed {
                Ok(())
            } else {
                Err(format!("{:?}", namespace.status))
            }
        },
    )
    .await;
    assert_eq!(
        server.battery_leases().await.len(),
        1,
        "the claim's lease is untouched while serve is down"
    );

    server.start_serve().await;
    let cluster = server.cluster().expect("a cluster");
    install::wait_available(&cluster.plane, "True").await;
    let created = claims
        .create(&PostParams::default(), &claim("after", None))
        .await
        .expect("a claim right after the APIService is Available again");
    assert_eq!(
        created.status.and_then(|s| s.phase),
        Some(ClaimPhase::Bound)
    );
    wait_gone(&namespaces, "doomed").await;
    wait_leases(&server, 1, "only the new claim's lease").await;
}

/// The garbage collector watches our claims as metadata only and deletes one whose owner
/// (here a ConfigMap) is gone; deleting the claim releases its lease.
#[tokio::test]
async fn the_garbage_collector_deletes_a_claim_whose_owner_goes() {
    let server = ApiServer::aggregated_with_controllers().await;
    claims_in(&server, "owned", &[]).await;
    let client = battery_e2e::kube_client(server.kubeconfig()).await;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "owned");
    let owner = config_maps
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("owner".to_owned()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("create the owner");
    let owner_reference = json!({
        "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
        "uid": owner.metadata.uid.expect("a uid"),
    });
    let claims: Api<MicroVMClaim> = Api::namespaced(client, "owned");
    claims
        .create(
            &PostParams::default(),
            &claim("owned", Some(owner_reference)),
        )
        .await
        .expect("create the owned claim");
    claims
        .create(&PostParams::default(), &claim("free", None))
        .await
        .expect("create a claim with no owner");
    wait_leases(&server, 2, "two leases").await;

    delete(&config_maps, "owner").await;
    wait_gone(&claims, "owned").await;
    wait_leases(&server, 1, "the owned claim's lease released").await;
    claims
        .get("free")
        .await
        .expect("the claim with no owner stays");
}
