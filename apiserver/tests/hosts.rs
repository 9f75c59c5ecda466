//! Hosts as battery sees them: Hosts another client adds or removes through battery's
//! HostAdmin show without a restart, and deleting a Host is a graceful deletion in
//! battery's order that keeps its Pools at size on the other Hosts.

use battery_apiserver::testing as common;

use battery_proto::poolmgr::v1alpha1 as pb;
use common::{CLAIMS, HOSTS, Harness, POOLS, claim, condition, get, pool};
use http::{Request, StatusCode, header};
use serde_json::{Value, json};

async fn host_admin(
    h: &Harness,
) -> pb::host_admin_client::HostAdminClient<tonic::transport::Channel> {
    pb::host_admin_client::HostAdminClient::connect(format!("http://{}", h.battery().address()))
        .await
        .unwrap()
}

fn names(list: &Value) -> Vec<&str> {
    list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i["metadata"]["name"].as_str())
                .collect()
        })
        .unwrap_or_default()
}

fn delete(uri: &str) -> Request<axum::body::Body> {
    Request::delete(uri)
        .body(axum::body::Body::empty())
        .unwrap()
}

fn merge_patch(uri: &str, body: &Value) -> Request<axum::body::Body> {
    Request::patch(uri)
        .header(header::CONTENT_TYPE, "application/merge-patch+json")
        .body(axum::body::Body::from(body.to_string()))
        .unwrap()
}

/// A size-2 Pool selecting every Host (an empty selector), once both MicroVMs are up.
/// A Pool of two MicroVMs, one on each Host. battery puts every MicroVM of one pass on
/// the Host with fewest of the Pool's (it counts no placement in flight), so the Pool
/// grows one MicroVM a pass.
async fn pool_over_both_hosts(h: &Harness, name: &str) {
    let mut body = pool(name, 1);
    body["spec"]["replenishment"] = json!({"type": "ReplaceOnDelete"});
    h.create(POOLS, &body).await;
    h.wait_available(name, 1).await;
    let (status, _, grown) = h
        .call(
            "PATCH",
            &format!("{POOLS}/{name}"),
            "application/merge-patch+json",
            Some(json!({"spec": {"size": 2}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{grown}");
    h.wait_available(name, 2).await;
}

#[tokio::test]
async fn hosts_added_and_removed_through_battery_show_without_a_restart() {
    let h = Harness::start().await;
    h.eventually(HOSTS, |_, list| names(list) == ["host-0", "host-1"])
        .await;
    let mut admin = host_admin(&h).await;
    admin
        .add_host(pb::AddHostRequest {
            host: Some(pb::Host {
                name: "host-extra".into(),
                address: "127.0.0.1:9".into(),
                tls: Some(pb::HostTls {
                    insecure: true,
                    ..pb::HostTls::default()
                }),
                ..pb::Host::default()
            }),
            skip_validation: true,
        })
        .await
        .unwrap();
    // Lists read battery live, so it shows at once; within a sync it is adopted too
    // (its metadata recorded, with a resourceVersion watchers saw as ADDED).
    let (_, list) = h.json(get(HOSTS)).await;
    assert!(names(&list).contains(&"host-extra"), "{list}");
    let added = h
        .eventually(&format!("{HOSTS}/host-extra"), |_, host| {
            host["metadata"]["creationTimestamp"].is_string()
        })
        .await;
    assert_ne!(
        added["metadata"]["resourceVersion"], "0",
        "adopted: {added}"
    );

    // A cordon by another client is a change with a new resourceVersion.
    admin
        .cordon_host(pb::CordonHostRequest {
            name: "host-extra".into(),
            reason: "maintenance".into(),
        })
        .await
        .unwrap();
    let added_rv: u64 = added["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let cordoned = h
        .eventually(&format!("{HOSTS}/host-extra"), |_, host| {
            host["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|rv| rv.parse::<u64>().ok())
                .is_some_and(|rv| rv > added_rv)
        })
        .await;
    assert_eq!(cordoned["spec"]["unschedulable"], true, "{cordoned}");
    assert_eq!(cordoned["status"]["cordonedReason"], "maintenance");

    admin
        .remove_host(pb::RemoveHostRequest {
            name: "host-extra".into(),
        })
        .await
        .unwrap();
    h.eventually(HOSTS, |_, list| names(list) == ["host-0", "host-1"])
        .await;
    let (status, _) = h.json(get(&format!("{HOSTS}/host-extra"))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn deleting_a_host_drains_it_and_the_pool_keeps_its_size_elsewhere() {
    let h = Harness::start().await;
    h.eventually(HOSTS, |_, list| names(list).len() == 2).await;
    pool_over_both_hosts(&h, "spread").await;
    let on = |host: &str| h.battery().host(host).unwrap().microvm_uids().len();
    assert_eq!(
        (on("host-0"), on("host-1")),
        (1, 1),
        "one MicroVM on each Host"
    );

    let (status, deleting) = h.json(delete(&format!("{HOSTS}/host-1"))).await;
    assert_eq!(status, StatusCode::OK, "accepted at once: {deleting}");
    assert!(
        deleting["metadata"]["deletionTimestamp"].is_string(),
        "{deleting}"
    );
    assert_eq!(
        deleting["spec"]["unschedulable"], true,
        "cordoned: {deleting}"
    );
    let draining = condition(&deleting, "Draining").expect("a Draining condition");
    assert_eq!(draining["reason"], "MicroVMsRemain");
    assert!(
        draining["message"]
            .as_str()
            .unwrap()
            .starts_with("1 MicroVM(s) remain"),
        "{draining}"
    );

    // The idle MicroVM on host-1 is retired and replaced on host-0; then host-1 goes.
    h.eventually(&format!("{HOSTS}/host-1"), |status, _| {
        status == StatusCode::NOT_FOUND
    })
    .await;
    h.wait_available("spread", 2).await;
    assert_eq!(on("host-1"), 0);
    assert_eq!(on("host-0"), 2, "the Pool keeps its size on the other Host");
    let (_, list) = h.json(get(HOSTS)).await;
    assert_eq!(names(&list), ["host-0"]);
    // Re-resolution placed the Pool on host-0 alone: battery names no removed Host.
    let mut pools = pb::pool_admin_client::PoolAdminClient::connect(format!(
        "http://{}",
        h.battery().address()
    ))
    .await
    .unwrap();
    let spec = pools
        .get_pool(pb::GetPoolRequest {
            r#ref: Some(pb::PoolRef {
                name: "spread".into(),
                namespace: "default".into(),
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .spec
        .unwrap();
    assert_eq!(spec.flintlock_hosts, ["host-0"]);
}

#[tokio::test]
async fn a_deleted_host_waits_for_the_claims_that_hold_its_microvms() {
    let h = Harness::start().await;
    h.eventually(HOSTS, |_, list| names(list).len() == 2).await;
    for (host, agent) in [("host-0", "127.0.0.1:7100"), ("host-1", "127.0.0.1:7101")] {
        let (status, body) = h
            .json(merge_patch(
                &format!("{HOSTS}/{host}"),
                &json!({"spec": {"agentAddress": agent}}),
            ))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    pool_over_both_hosts(&h, "held").await;
    let bound = h.create(CLAIMS, &claim("mine", "held")).await;
    let host = bound["status"]["host"]["nodeName"]
        .as_str()
        .unwrap()
        .to_owned();
    let agent = if host == "host-0" {
        "127.0.0.1:7100"
    } else {
        "127.0.0.1:7101"
    };
    assert_eq!(bound["status"]["host"]["agentAddress"], agent, "{bound}");

    let (status, deleting) = h.json(delete(&format!("{HOSTS}/{host}"))).await;
    assert_eq!(status, StatusCode::OK, "{deleting}");
    // Its idle MicroVMs go; the claimed one stays, named, until the claim lets it go.
    let waiting = h
        .eventually(&format!("{HOSTS}/{host}"), |_, host| {
            host["status"]["vmCount"] == 1
                && condition(host, "Draining").is_some_and(|c| {
                    c["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("default/mine"))
                })
        })
        .await;
    assert!(waiting["metadata"]["deletionTimestamp"].is_string());
    // The agent's report replaces its own conditions, never the API server's Draining.
    let report = json!({"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "AgentReady", "message": "all checks pass",
        "lastTransitionTime": "2026-01-01T00:00:00Z"
    }]}});
    let (status, reported) = h
        .json(merge_patch(&format!("{HOSTS}/{host}/status"), &report))
        .await;
    assert_eq!(status, StatusCode::OK, "{reported}");
    assert!(condition(&reported, "Ready").is_some(), "{reported}");
    assert!(condition(&reported, "Draining").is_some(), "{reported}");
    let (status, body) = h.json(delete(&format!("{CLAIMS}/mine"))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    h.eventually(&format!("{HOSTS}/{host}"), |status, _| {
        status == StatusCode::NOT_FOUND
    })
    .await;
    h.wait_available("held", 2).await;
}
