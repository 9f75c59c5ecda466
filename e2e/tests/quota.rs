//! Quotas on claims (issue 14): `battery-apiserver serve` behind the aggregator stand-in
//! enforces the namespace's ResourceQuotas on claims, atomically with the bind, answers a
//! refusal as kube-apiserver's quota plugin does, and shows what claims use in each
//! quota's status. battery's own lease list is the proof that exactly the admitted claims
//! hold MicroVMs.

use std::collections::BTreeSet;
use std::time::Duration;

use battery_e2e::apiserver::ApiServer;
use battery_e2e::{eventually, kube_client};
use battery_types::{MicroVMClaim, Pool};
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

const NAMESPACE: &str = "default";
const COUNT: &str = "count/microvmclaims.battery.liquidmetal-x.dev";
const VCPUS: &str = "battery.liquidmetal-x.dev/vcpus";
/// Concurrent creates against a quota of [`LIMIT`] claims.
const CREATES: usize = 1000;
const LIMIT: usize = 10;
/// Above [`LIMIT`], so the quota, not the Pool, is what refuses; and one to spare for the
/// create after a release.
const POOL_SIZE: i32 = 12;
/// Pools filling and status writes, on a loaded 2-core machine in a debug build.
const WAIT: Duration = Duration::from_secs(60);

/// A Pool of `size` MicroVMs of `vcpu` vCPUs each.
fn pool(name: &str, size: i32, vcpu: i32) -> Pool {
    let mut pool = battery_apiserver::dev::dev_pool(size);
    pool["metadata"]["name"] = json!(name);
    pool["spec"]["template"]["vcpu"] = json!(vcpu);
    serde_json::from_value(pool).unwrap()
}

fn claim(name: &str, pool: &str) -> MicroVMClaim {
    serde_json::from_value(json!({
        "apiVersion": battery_types::API_VERSION,
        "kind": "MicroVMClaim",
        "metadata": {"name": name},
        "spec": {"poolRef": {"name": pool}, "serviceAccountName": "dev"},
    }))
    .unwrap()
}

fn quota(name: &str, resource: &str, hard: &str) -> ResourceQuota {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": name},
        "spec": {"hard": {resource: hard}},
    }))
    .unwrap()
}

/// The message of kube-apiserver's quota refusal of claim `name`.
fn exceeded(name: &str, quota: &str, resource: &str, amounts: [&str; 3]) -> String {
    let [requested, used, limited] = amounts;
    format!(
        "microvmclaims.battery.liquidmetal-x.dev \"{name}\" is forbidden: exceeded quota: \
         {quota}, requested: {resource}={requested}, used: {resource}={used}, limited: \
         {resource}={limited}"
    )
}

/// Creates `claim`, answering the refusal's Status when it is refused.
async fn create(
    claims: &Api<MicroVMClaim>,
    claim: &MicroVMClaim,
) -> Result<MicroVMClaim, kube::core::Status> {
    claims
        .create(&PostParams::default(), claim)
        .await
        .map_err(|error| match error {
            kube::Error::Api(status) => *status,
            other => panic!("creating a claim: {other}"),
        })
}

/// battery's leases of the test's Pools, by request id.
async fn leases(server: &ApiServer) -> BTreeSet<String> {
    let leases = server.battery_leases().await;
    leases
        .into_iter()
        .filter(|l| {
            l.pool_namespace == NAMESPACE && ["quota", "wide"].contains(&l.pool_name.as_str())
        })
        .map(|l| l.request_id)
        .collect()
}

/// The request ids battery knows the Bound claims' leases by.
fn request_ids(claims: &[MicroVMClaim]) -> BTreeSet<String> {
    claims
        .iter()
        .map(|c| format!("microvmclaim/{}", c.metadata.uid.as_deref().unwrap()))
        .collect()
}

async fn wait_available(pools: &Api<Pool>, name: &str, size: i32) {
    eventually(WAIT, &format!("the Pool {name} to fill"), async || {
        let pool = pools.get(name).await.map_err(|e| e.to_string())?;
        let available = pool.status.map(|s| s.available).unwrap_or_default();
        (available == size)
            .then_some(())
            .ok_or_else(|| format!("{available} of {size} available"))
    })
    .await;
}

/// Waits until the quota's status shows `resource` used `used` of `hard`.
async fn wait_status(
    quotas: &Api<ResourceQuota>,
    name: &str,
    resource: &str,
    used: &str,
    hard: &str,
) {
    eventually(WAIT, &format!("quota {name}'s status"), async || {
        let quota = quotas.get(name).await.map_err(|e| e.to_string())?;
        let status = serde_json::to_value(&quota.status).unwrap();
        let shown = |field: &str| status[field][resource].as_str().map(str::to_owned);
        if shown("used").as_deref() == Some(used) && shown("hard").as_deref() == Some(hard) {
            Ok(())
        } else {
            Err(format!("status {status}"))
        }
    })
    .await;
}

#[tokio::test]
async fn quotas_hold_claims_to_their_limits_and_show_what_claims_use() {
    let server = ApiServer::aggregated_with(&[]).await;
    let client = kube_client(server.kubeconfig()).await;
    let pools: Api<Pool> = Api::namespaced(client.clone(), NAMESPACE);
    let claims: Api<MicroVMClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), NAMESPACE);
    let params = PostParams::default();
    for (name, size, vcpu) in [("quota", POOL_SIZE, 1), ("wide", 1, 2)] {
        pools
            .create(&params, &pool(name, size, vcpu))
            .await
            .unwrap();
    }
    quotas
        .create(&params, &quota("claims", COUNT, &LIMIT.to_string()))
        .await
        .unwrap();
    quotas
        .create(&params, &quota("cpu", VCPUS, &LIMIT.to_string()))
        .await
        .unwrap();
    wait_available(&pools, "quota", POOL_SIZE).await;
    wait_available(&pools, "wide", 1).await;

    // 1,000 creates at once: exactly the quota's count bind, the rest are refused in the
    // quota plugin's words, naming the first quota exceeded.
    let started = std::time::Instant::now();
    let attempts = (0..CREATES).map(|i| {
        let claims = claims.clone();
        async move {
            let name = format!("c{i}");
            (name.clone(), create(&claims, &claim(&name, "quota")).await)
        }
    });
    let mut bound = Vec::new();
    let mut refused = Vec::new();
    for (name, outcome) in futures::future::join_all(attempts).await {
        match outcome {
            Ok(claim) => bound.push(claim),
            Err(status) => refused.push((name, status)),
        }
    }
    eprintln!(
        "{CREATES} concurrent creates answered in {:?}",
        started.elapsed()
    );
    let names = |claims: &[MicroVMClaim]| -> BTreeSet<String> {
        claims
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect()
    };
    let listed = claims.list(&Default::default()).await.unwrap();
    assert_eq!(
        names(&listed.items),
        names(&bound),
        "the claims that exist are those answered 201"
    );
    assert_eq!(bound.len(), LIMIT, "the quota's count binds");
    let limit = LIMIT.to_string();
    for (name, status) in &refused {
        assert_eq!(
            (status.code, status.reason.as_str()),
            (403, "Forbidden"),
            "{status:?}"
        );
        assert_eq!(
            status.message,
            exceeded(name, "claims", COUNT, ["1", &limit, &limit])
        );
    }
    assert_eq!(bound.len(), LIMIT, "the quota's count binds");
    assert_eq!(
        leases(&server).await,
        request_ids(&bound),
        "battery leases exactly the Bound claims"
    );
    wait_status(&quotas, "claims", COUNT, "10", "10").await;
    wait_status(&quotas, "cpu", VCPUS, "10", "10").await;

    // A release gives its share back; a MicroVM of 2 vCPUs is then one too many for the
    // vCPU quota, though the count allows it.
    let released = bound.pop().unwrap();
    claims
        .delete(
            released.metadata.name.as_deref().unwrap(),
            &DeleteParams::default(),
        )
        .await
        .unwrap();
    wait_status(&quotas, "claims", COUNT, "9", "10").await;
    wait_status(&quotas, "cpu", VCPUS, "9", "10").await;
    let status = create(&claims, &claim("wide", "wide")).await.unwrap_err();
    assert_eq!(status.code, 403, "{status:?}");
    assert_eq!(
        status.message,
        exceeded("wide", "cpu", VCPUS, ["2", "9", "10"])
    );
    bound.push(
        create(&claims, &claim("after-release", "quota"))
            .await
            .unwrap(),
    );
    assert_eq!(
        leases(&server).await,
        request_ids(&bound),
        "battery leases exactly the Bound claims"
    );
    wait_status(&quotas, "claims", COUNT, "10", "10").await;
    wait_status(&quotas, "cpu", VCPUS, "10", "10").await;
    // Only what the quota limits is shown.
    let described: Value = serde_json::to_value(quotas.get("cpu").await.unwrap()).unwrap();
    assert_eq!(
        described["status"]["used"],
        json!({VCPUS: "10"}),
        "{described}"
    );
}
