//! Quotas on claims (issue 14), on a real control plane with kube-controller-manager's
//! resource quota controller running: `battery-apiserver serve`, behind kube-apiserver's
//! aggregator, enforces the namespace's ResourceQuotas on claims atomically with the bind,
//! answers a refusal as kube-apiserver's quota plugin does, and writes what claims use
//! into each quota's status beside the controller, neither undoing the other's writes.
//! battery's own lease list is the proof that exactly the admitted claims hold MicroVMs.
//!
//! Who writes what (`docs/quotas.md`): the controller writes all of `status.hard` and
//! `status.used` of every resource it can count, `count/microvmclaims...` among them
//! (every claim object, from a metadata-only list), keeping the `used` of names it cannot
//! count; the server merge-patches only its three names, as the field manager
//! `battery-apiserver`, counting claims as the controller does.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use battery_e2e::apiserver::ApiServer;
use battery_e2e::{eventually, kube_client};
use battery_types::{ClaimPhase, MicroVMClaim, Pool};
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

const NAMESPACE: &str = "default";
const COUNT: &str = "count/microvmclaims.battery.liquidmetal-x.dev";
const VCPUS: &str = "battery.liquidmetal-x.dev/vcpus";
const MEMORY: &str = "battery.liquidmetal-x.dev/memory";
/// What the controller alone counts of ours: kube-apiserver's quota plugin never sees a
/// Pool's create, and the controller counts Pools only at its full resyncs (and deletes).
const POOLS: &str = "count/pools.battery.liquidmetal-x.dev";
/// The resource names the server writes.
const OURS: [&str; 3] = [COUNT, VCPUS, MEMORY];
/// Concurrent creates against a quota of [`LIMIT`] claims.
const CREATES: usize = 1000;
const LIMIT: usize = 10;
/// Above [`LIMIT`], so the quota, not the Pool, is what refuses; and one to spare for the
/// create after a release.
const POOL_SIZE: i32 = 12;
/// A lease that outlives the test (a Pool's default, 30 s, may not on a loaded machine):
/// its claims stay Bound until the test deletes them.
const LONG_LEASE: (&str, &str) = ("10s", "600s");
/// A lease that runs out within seconds (battery sweeps every 2 s).
const SHORT_LEASE: (&str, &str) = ("1s", "2s");
/// Pools filling, leases expiring and status writes, on a loaded 2-core machine in a
/// debug build.
const WAIT: Duration = Duration::from_secs(60);
/// How long one full resync of the quota controller may take to show: its period is 5 s
/// here (`--resource-quota-sync-period` in `battery_e2e::control_plane`), plus its
/// informer catching up, on a loaded machine.
const RESYNC_WAIT: Duration = Duration::from_secs(90);
/// Witnessed resyncs in the quiet period after the status settled: after the third, at
/// least two full resyncs of every quota have finished in it.
const RESYNCS: usize = 3;
/// How often a create whose connection failed is asked again.
const TRANSPORT_RETRIES: usize = 3;
/// How often the quiet period's checks run.
const POLL: Duration = Duration::from_millis(100);

/// A Pool of `size` MicroVMs of `vcpu` vCPUs (and 1 GiB) each, leased for `lease`
/// (heartbeat interval, expiry threshold).
fn pool(name: &str, size: i32, vcpu: i32, lease: (&str, &str)) -> Pool {
    let mut pool = battery_apiserver::dev::dev_pool(size);
    pool["metadata"]["name"] = json!(name);
    pool["spec"]["template"]["vcpu"] = json!(vcpu);
    pool["spec"]["lease"] = json!({"heartbeatInterval": lease.0, "expiryThreshold": lease.1});
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

fn quota(name: &str, hard: &[(&str, &str)]) -> ResourceQuota {
    let hard: serde_json::Map<String, Value> = hard
        .iter()
        .map(|(r, h)| ((*r).to_owned(), json!(h)))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": name},
        "spec": {"hard": hard},
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

/// Creates `claim`, answering the refusal's Status when it is refused. As a client that
/// must know whether it did: kube's client asks again itself what kube-apiserver refused
/// before passing it on (429 from API Priority and Fairness, 503, 504), but not a request
/// whose connection failed, which kube-apiserver may have passed on (a create is not
/// idempotent; client-go does not retry it either). The claim's name tells: asked again,
/// `409 AlreadyExists` means the first went through, and the claim is read back.
async fn create(
    claims: &Api<MicroVMClaim>,
    claim: &MicroVMClaim,
) -> Result<MicroVMClaim, kube::core::Status> {
    let name = claim.metadata.name.as_deref().unwrap();
    let mut failures = 0;
    loop {
        match claims.create(&PostParams::default(), claim).await {
            Ok(created) => return Ok(created),
            Err(kube::Error::Api(status)) if failures > 0 && status.reason == "AlreadyExists" => {
                return Ok(claims
                    .get(name)
                    .await
                    .expect("the claim created unanswered"));
            }
            Err(kube::Error::Api(status)) => return Err(*status),
            Err(other) if failures < TRANSPORT_RETRIES => {
                failures += 1;
                eprintln!("creating claim {name}: {other:?}; asking again");
            }
            Err(other) => panic!("creating claim {name}: {other:?}"),
        }
    }
}

/// battery's leases of the test's Pools, by request id.
async fn leases(server: &ApiServer) -> BTreeSet<String> {
    let leases = server.battery_leases().await;
    leases
        .into_iter()
        .filter(|l| {
            l.pool_namespace == NAMESPACE
                && ["quota", "wide", "long", "short"].contains(&l.pool_name.as_str())
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

/// A quota's `status.used`.
fn used(quota: &ResourceQuota) -> BTreeMap<String, String> {
    quota
        .status
        .as_ref()
        .and_then(|s| s.used.as_ref())
        .map(|used| used.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
        .unwrap_or_default()
}

/// `used` restricted to `names`.
fn only(used: &BTreeMap<String, String>, names: &[&str]) -> BTreeMap<String, String> {
    used.iter()
        .filter(|(k, _)| names.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn expect(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
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

/// Waits until each quota's `status.used` of [`OURS`] is what `want` gives it, and
/// returns the quotas as they then are.
async fn wait_ours(
    quotas: &Api<ResourceQuota>,
    want: &BTreeMap<&str, BTreeMap<String, String>>,
    what: &str,
) -> BTreeMap<String, ResourceQuota> {
    eventually(WAIT, what, async || {
        let list = quotas
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let shown: BTreeMap<String, ResourceQuota> = list
            .items
            .into_iter()
            .map(|q| (q.metadata.name.clone().unwrap_or_default(), q))
            .collect();
        for (name, want) in want {
            let got = shown.get(*name).map(|q| only(&used(q), &OURS));
            if got.as_ref() != Some(want) {
                return Err(format!("quota {name} shows {got:?}, not {want:?}"));
            }
        }
        Ok(shown)
    })
    .await
}

/// How many requests kube-apiserver's API Priority and Fairness has refused with 429, by
/// priority level and reason (its `apiserver_flowcontrol_rejected_requests_total`).
async fn apf_rejections(server: &ApiServer) -> BTreeMap<String, f64> {
    let admin = server
        .cluster()
        .expect("a real control plane")
        .plane
        .admin()
        .await;
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let metrics = admin
        .request_text(request)
        .await
        .expect("kube-apiserver's /metrics");
    let mut rejected = BTreeMap::new();
    for line in metrics.lines() {
        let Some(sample) = line.strip_prefix("apiserver_flowcontrol_rejected_requests_total{")
        else {
            continue;
        };
        let Some((labels, value)) = sample.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|l| l.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let key = format!("{}/{}", label("priority_level"), label("reason"));
        *rejected.entry(key).or_default() += value.parse::<f64>().unwrap_or_default();
    }
    rejected
}

/// A server with kube-controller-manager beside it (the resource quota controller), and
/// the kubectl user's Pools, claims and ResourceQuotas of [`NAMESPACE`].
async fn start() -> (ApiServer, Api<Pool>, Api<MicroVMClaim>, Api<ResourceQuota>) {
    let server = ApiServer::aggregated_with_controllers().await;
    let client = kube_client(server.kubeconfig()).await;
    (
        server,
        Api::namespaced(client.clone(), NAMESPACE),
        Api::namespaced(client.clone(), NAMESPACE),
        Api::namespaced(client, NAMESPACE),
    )
}

#[tokio::test]
async fn quotas_hold_claims_to_their_limits_and_show_what_claims_use() {
    let (server, pools, claims, quotas) = start().await;
    let params = PostParams::default();
    for (name, size, vcpu) in [("quota", POOL_SIZE, 1), ("wide", 1, 2)] {
        pools
            .create(&params, &pool(name, size, vcpu, LONG_LEASE))
            .await
            .unwrap();
    }
    quotas
        .create(&params, &quota("claims", &[(COUNT, &LIMIT.to_string())]))
        .await
        .unwrap();
    quotas
        .create(&params, &quota("cpu", &[(VCPUS, &LIMIT.to_string())]))
        .await
        .unwrap();
    wait_available(&pools, "quota", POOL_SIZE).await;
    wait_available(&pools, "wide", 1).await;

    // 1,000 creates at once: exactly the quota's count bind, the rest are refused in the
    // quota plugin's words, naming the first quota exceeded. They come from one user
    // (a ServiceAccount: API Priority and Fairness's `workload-low`, one flow), so
    // kube-apiserver may refuse some with 429 and `Retry-After` before they reach us;
    // kube's client retries those (its default policy: 429, 503 and 504, honouring
    // `Retry-After`), as a real client of the API would, and a refused request never
    // reached us, so retrying it is safe.
    let rejected_before = apf_rejections(&server).await;
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
    let rejected_after = apf_rejections(&server).await;
    let rejected: BTreeMap<&String, f64> = rejected_after
        .iter()
        .map(|(k, v)| (k, v - rejected_before.get(k).copied().unwrap_or_default()))
        .filter(|(_, v)| *v > 0.0)
        .collect();
    eprintln!(
        "{CREATES} concurrent creates answered in {:?}; API Priority and Fairness refused \
         (429, retried by the client) by priority level/reason: {rejected:?}",
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

/// Which managers `managedFields` say own `status.used.<resource>` of a quota: the last
/// to change it.
fn owners_of_used(quota: &ResourceQuota, resource: &str) -> BTreeSet<String> {
    let key = format!("f:{resource}");
    quota
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|entry| {
            let fields = entry.fields_v1.as_ref().map(|f| &f.0);
            fields.is_some_and(|f| !f["f:status"]["f:used"][&key].is_null())
        })
        .filter_map(|entry| entry.manager.clone())
        .collect()
}

/// Each `managedFields` entry of a quota's status: its manager and the names of
/// `status.used` it owns.
fn used_by_manager(quota: &ResourceQuota) -> Vec<(String, Vec<String>)> {
    let entries = quota.metadata.managed_fields.iter().flatten();
    entries
        .filter(|entry| entry.subresource.as_deref() == Some("status"))
        .map(|entry| {
            let fields = entry.fields_v1.as_ref().map(|f| &f.0["f:status"]["f:used"]);
            let names = fields.and_then(Value::as_object).into_iter().flatten();
            let names = names.map(|(name, _)| name.trim_start_matches("f:").to_owned());
            let manager = entry.manager.clone().unwrap_or_default();
            (manager, names.filter(|name| name != ".").collect())
        })
        .collect()
}

/// The namespace's quotas by name.
async fn quotas_by_name(quotas: &Api<ResourceQuota>) -> BTreeMap<String, ResourceQuota> {
    quotas
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|q| (q.metadata.name.clone().unwrap_or_default(), q))
        .collect()
}

/// The controller and the server both write the status of one quota, for the same and
/// for different names, and do not fight. The controller counts every claim object
/// (Expired ones too, until deleted), and so does the server, for its refusals as for the
/// status; the controller keeps the vCPUs and memory the server writes, and the server
/// touches nothing else. Proved at the end, once the status has settled: the server's
/// refusal says what it counts, the same as the status shows (before the server counted
/// Expired claims, the controller's resync put them back in the status and this refusal
/// let the create through); across at least two of the controller's full resyncs, which
/// the test sees happen through a Pool count only a resync updates, no quota whose names
/// the controller counts only from claims is written at all (its `resourceVersion`
/// stays: one write undoing another, even undone again between two checks, would change
/// it), while the controller does write the one that counts Pools, each time keeping our
/// vCPUs; and `managedFields` give the vCPUs and memory to `battery-apiserver` alone.
#[tokio::test]
async fn the_quota_controller_and_the_server_agree_on_what_claims_use() {
    let (server, pools, claims, quotas) = start().await;
    let params = PostParams::default();
    pools
        .create(&params, &pool("long", 5, 1, LONG_LEASE))
        .await
        .unwrap();
    pools
        .create(&params, &pool("short", 2, 2, SHORT_LEASE))
        .await
        .unwrap();
    // `all` shares the count with the controller and has our names it cannot count;
    // `pools` mixes a name only the controller counts with one only we do.
    for (name, hard) in [
        ("all", &[(COUNT, "5"), (VCPUS, "10"), (MEMORY, "10Gi")][..]),
        ("claims", &[(COUNT, "5")]),
        ("cpu", &[(VCPUS, "10")]),
        ("pools", &[(POOLS, "100"), (VCPUS, "10")]),
    ] {
        quotas.create(&params, &quota(name, hard)).await.unwrap();
    }
    wait_available(&pools, "long", 5).await;
    wait_available(&pools, "short", 2).await;
    let want = |count: &str, vcpus: &str, memory: &str| {
        BTreeMap::from([
            (
                "all",
                expect(&[(COUNT, count), (VCPUS, vcpus), (MEMORY, memory)]),
            ),
            ("claims", expect(&[(COUNT, count)])),
            ("cpu", expect(&[(VCPUS, vcpus)])),
            ("pools", expect(&[(VCPUS, vcpus)])),
        ])
    };

    // Three claims that stay Bound and two whose leases run out.
    for name in ["l1", "l2", "l3"] {
        create(&claims, &claim(name, "long")).await.unwrap();
    }
    for name in ["s1", "s2"] {
        create(&claims, &claim(name, "short")).await.unwrap();
    }
    eventually(WAIT, "s1 and s2 to expire", async || {
        for name in ["s1", "s2"] {
            let claim = claims.get(name).await.map_err(|e| e.to_string())?;
            let phase = claim.status.and_then(|s| s.phase);
            if phase != Some(ClaimPhase::Expired) {
                return Err(format!("{name} is {phase:?}"));
            }
        }
        Ok(())
    })
    .await;
    // Expired claims still count, as the controller counts them; their MicroVMs do not.
    wait_ours(&quotas, &want("5", "3", "3Gi"), "the status after expiry").await;
    let refused = create(&claims, &claim("l4", "long")).await.unwrap_err();
    assert_eq!(refused.code, 403, "{refused:?}");
    assert_eq!(
        refused.message,
        exceeded("l4", "all", COUNT, ["1", "5", "5"])
    );

    // Deleting an Expired claim frees its count; deleting a Bound one, its MicroVM too.
    for name in ["s1", "l1"] {
        claims.delete(name, &DeleteParams::default()).await.unwrap();
    }
    wait_ours(&quotas, &want("3", "2", "2Gi"), "the status after deletes").await;
    let mut bound = Vec::new();
    for name in ["l2", "l3"] {
        bound.push(claims.get(name).await.unwrap());
    }
    for name in ["l4", "l5"] {
        bound.push(create(&claims, &claim(name, "long")).await.unwrap());
    }
    assert_eq!(
        leases(&server).await,
        request_ids(&bound),
        "battery leases exactly the Bound claims"
    );
    let end = want("5", "4", "4Gi");
    wait_ours(&quotas, &end, "the status at the end").await;
    // What the server counts (its refusal says) is what the status shows.
    let refused = create(&claims, &claim("l6", "long")).await.unwrap_err();
    assert_eq!(
        refused.message,
        exceeded("l6", "all", COUNT, ["1", "5", "5"])
    );

    // Quiet: no claim changes. Each witness Pool shows in the `pools` quota only once a
    // full resync of the controller has counted it. The quotas are taken as settled after
    // the first, when the controller has long seen the last claim change (a resync may
    // otherwise count from a list a moment behind it, and correct itself at the next).
    let quiet = ["all", "claims", "cpu"];
    let mut settled: Option<BTreeMap<String, ResourceQuota>> = None;
    for witness in 0..=RESYNCS {
        let name = format!("witness-{witness}");
        pools
            .create(&params, &pool(&name, 0, 1, LONG_LEASE))
            .await
            .unwrap();
        let count = pools.list(&Default::default()).await.unwrap().items.len();
        let what = format!("a resync of the quota controller to count the Pool {name}");
        let deadline = tokio::time::Instant::now() + RESYNC_WAIT;
        loop {
            let now = quotas_by_name(&quotas).await;
            if let Some(settled) = &settled {
                for name in quiet {
                    let (before, after) = (&settled[name], &now[name]);
                    assert_eq!(
                        (&after.metadata.resource_version, used(after)),
                        (&before.metadata.resource_version, used(before)),
                        "quota {name} was written while no claim changed (waiting for {what})"
                    );
                }
            }
            let canary = used(&now["pools"]);
            assert_eq!(
                only(&canary, &OURS),
                expect(&[(VCPUS, "4")]),
                "the controller's writes of quota pools keep our vCPUs (waiting for {what})"
            );
            if canary.get(POOLS) == Some(&count.to_string()) {
                if settled.is_none() {
                    for (name, want) in &end {
                        assert_eq!(&only(&used(&now[*name]), &OURS), want, "quota {name}");
                    }
                    settled = Some(now);
                }
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {RESYNC_WAIT:?} waiting for {what}: quota pools shows \
                 {canary:?}"
            );
            tokio::time::sleep(POLL).await;
        }
        eprintln!("resync {witness} seen: the controller counts {count} Pools");
    }

    // Who wrote what: our vCPUs and memory are ours alone, though the controller wrote
    // quota pools after we did; the Pool count is the controller's; the claim count is
    // whichever's changed it last.
    for (name, quota) in quotas_by_name(&quotas).await {
        eprintln!(
            "quota {name}: used {:?}; status.used by {:?}",
            used(&quota),
            used_by_manager(&quota)
        );
        for resource in [VCPUS, MEMORY] {
            if used(&quota).contains_key(resource) {
                assert_eq!(
                    owners_of_used(&quota, resource),
                    BTreeSet::from(["battery-apiserver".to_owned()]),
                    "quota {name}'s {resource}: {:#?}",
                    quota.metadata.managed_fields
                );
            }
        }
        if used(&quota).contains_key(COUNT) {
            assert_eq!(owners_of_used(&quota, COUNT).len(), 1, "quota {name}");
        }
        if used(&quota).contains_key(POOLS) {
            assert_eq!(
                owners_of_used(&quota, POOLS),
                BTreeSet::from(["kube-controller-manager".to_owned()]),
                "quota {name}"
            );
        }
    }
}
