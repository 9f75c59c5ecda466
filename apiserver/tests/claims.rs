//! Claims through battery, in-process on the embedded battery: binding under contention,
//! expiry, release, renewal through the `lease` subresource, and pool deletion while a
//! claim is bound.

use battery_apiserver::testing as common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use battery_apiserver::dev::pki::DEV_USER;
use battery_apiserver::server::Settings;
use common::cluster::fake_kube_apiserver;
use common::{CLAIMS, DEADLINE, HOSTS, Harness, POOLS, condition, eventually, get, pool};
use http::{Request, StatusCode, header};
use serde_json::{Value, json};
use tower::ServiceExt as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_claims_on_a_pool_of_one_hundred() {
    let h = Arc::new(
        Harness::with_settings(Settings {
            bind_wait: Duration::from_millis(300),
            ..common::settings()
        })
        .await,
    );
    // ReplaceOnDelete keeps 100 MicroVMs in all: none is added while they are leased.
    h.create_pool_with_lease("hundred", 100, "ReplaceOnDelete", "60s")
        .await;
    h.wait_available("hundred", 100).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let h = h.clone();
        tasks.spawn(async move { h.claim(&format!("c{i}"), "hundred").await });
    }
    let mut bound = Vec::new();
    let mut refused = 0;
    while let Some(result) = tasks.join_next().await {
        let (status, headers, body) = result.unwrap();
        match status {
            StatusCode::CREATED => {
                assert_eq!(body["status"]["phase"], "Bound", "{body}");
                bound.push(
                    body["status"]["microVM"]["uid"]
                        .as_str()
                        .unwrap()
                        .to_owned(),
                );
            }
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(body["kind"], "Status");
                assert!(
                    body["message"]
                        .as_str()
                        .unwrap()
                        .contains("default/hundred"),
                    "{body}"
                );
                assert!(headers.contains_key(header::RETRY_AFTER));
                refused += 1;
            }
            other => panic!("unexpected {other}: {body}"),
        }
    }
    assert_eq!((bound.len(), refused), (100, 100));
    let distinct: HashSet<&String> = bound.iter().collect();
    assert_eq!(distinct.len(), 100, "no MicroVM leased twice");
    let (_, list) = h.get(CLAIMS).await;
    assert_eq!(
        list["items"].as_array().unwrap().len(),
        100,
        "refused creates left nothing behind"
    );
}

#[tokio::test]
async fn an_unrenewed_claim_expires_and_a_renewed_one_does_not() {
    let h = Harness::start().await;
    h.create_pool_with_lease("short", 2, "ImmediateOnLease", "1s")
        .await;
    h.wait_available("short", 2).await;
    let (status, _, renewed) = h.claim("renewed", "short").await;
    assert_eq!(status, StatusCode::CREATED, "{renewed}");
    let (status, _, expiring) = h.claim("expiring", "short").await;
    assert_eq!(status, StatusCode::CREATED, "{expiring}");
    let vm = expiring["status"]["microVM"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();

    // Renew one through the lease subresource while the other runs out.
    let lease_uri = format!("{CLAIMS}/renewed/lease");
    let first_expiry = renewed["status"]["leaseExpiresAt"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut last = Value::Null;
    while tokio::time::Instant::now() < deadline {
        let (status, _, lease) = h
            .call(
                "PATCH",
                &lease_uri,
                "application/merge-patch+json",
                Some(json!({})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{lease}");
        assert_eq!(lease["kind"], "Lease");
        assert_eq!(lease["spec"]["holderIdentity"], DEV_USER);
        last = lease;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let expired = h
        .eventually(&format!("{CLAIMS}/expiring"), |_, c| {
            c["status"]["phase"] == "Expired"
        })
        .await;
    let bound = condition(&expired, "Bound").unwrap();
    assert_eq!(
        (bound["status"].as_str(), bound["reason"].as_str()),
        (Some("False"), Some("LeaseExpired"))
    );
    assert!(
        h.battery()
            .hosts()
            .iter()
            .all(|host| !host.microvm_uids().contains(&vm)),
        "battery destroyed the expired claim's MicroVM"
    );
    let (_, still) = h.get(&format!("{CLAIMS}/renewed")).await;
    assert_eq!(still["status"]["phase"], "Bound");
    assert_ne!(
        still["status"]["leaseExpiresAt"].as_str().unwrap(),
        first_expiry,
        "renewal moved the expiry"
    );
    assert_eq!(still["status"]["renewTime"], last["spec"]["renewTime"]);

    // Renewing an expired lease is a clear 410; the expired claim stays until deleted.
    let (status, _, gone) = h
        .call(
            "PATCH",
            &format!("{CLAIMS}/expiring/lease"),
            "application/merge-patch+json",
            Some(json!({})),
        )
        .await;
    assert_eq!(status, StatusCode::GONE, "{gone}");
    let (status, _, _) = h
        .call(
            "DELETE",
            &format!("{CLAIMS}/expiring"),
            "application/json",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn a_create_whose_client_goes_away_while_battery_leases_still_binds() {
    let (h, proxy) = Harness::behind_proxy(common::settings(), common::fast_battery_config()).await;
    h.create_pool("gone", 1).await;
    h.wait_available("gone", 1).await;
    proxy.claims().hold();
    let request = common::as_dev(common::post(CLAIMS, &common::claim("c", "gone")));
    let create = tokio::spawn(h.router().oneshot(request));
    // The create's ClaimVM, held.
    proxy.claims().reached(1).await;
    // The client gives up: its request is dropped mid-bind.
    create.abort();
    assert!(create.await.unwrap_err().is_cancelled());
    proxy.claims().release();
    let claim = h
        .eventually(&format!("{CLAIMS}/c"), |status, _| status == StatusCode::OK)
        .await;
    assert_eq!(claim["status"]["phase"], "Bound", "{claim}");
    assert_eq!(
        proxy.claims().calls(),
        1,
        "bound by the create's own ClaimVM"
    );
}

#[tokio::test]
async fn deleting_a_claim_releases_its_microvm() {
    let h = Harness::start().await;
    h.create_pool_with_lease("rel", 1, "ReplaceOnDelete", "60s")
        .await;
    h.wait_available("rel", 1).await;
    let (_, _, claim) = h.claim("c", "rel").await;
    let vm = claim["status"]["microVM"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, _, _) = h
        .call("DELETE", &format!("{CLAIMS}/c"), "application/json", None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        h.battery()
            .hosts()
            .iter()
            .all(|host| !host.microvm_uids().contains(&vm)),
        "the MicroVM was destroyed"
    );
    let (status, _) = h.get(&format!("{CLAIMS}/c")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // ReplaceOnDelete provisions a replacement.
    h.wait_available("rel", 1).await;
}

#[tokio::test]
async fn a_pool_with_a_bound_claim_waits_for_it_before_going() {
    let h = Harness::start().await;
    h.create_pool_with_lease("doomed", 2, "ReplaceOnDelete", "60s")
        .await;
    h.wait_available("doomed", 2).await;
    let (status, _, _) = h.claim("holder", "doomed").await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, pool) = h
        .call(
            "DELETE",
            &format!("{POOLS}/doomed"),
            "application/json",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{pool}");
    assert!(pool["metadata"]["deletionTimestamp"].is_string(), "{pool}");
    let ready = condition(&pool, "Ready").unwrap();
    assert_eq!(ready["reason"], "DeletionBlocked");
    assert!(
        ready["message"].as_str().unwrap().contains('1'),
        "names the leased count: {ready}"
    );

    let (status, _, refused) = h.claim("late", "doomed").await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["reason"], "PoolDeleting");

    let (status, _, _) = h
        .call(
            "DELETE",
            &format!("{CLAIMS}/holder"),
            "application/json",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    // The Pool goes once its last claim has.
    h.eventually(&format!("{POOLS}/doomed"), |status, _| {
        status == StatusCode::NOT_FOUND
    })
    .await;
}

#[tokio::test]
async fn a_failing_pre_lease_hook_is_a_500_with_batterys_message() {
    let h = Harness::start().await;
    let mut hooked = pool("hooked", 1);
    hooked["spec"]["hooks"] = json!({"preLease": ["exit 3"]});
    h.create(POOLS, &hooked).await;
    h.wait_available("hooked", 1).await;
    let (status, _, body) = h.claim("c", "hooked").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert_eq!(body["kind"], "Status");
    assert!(
        body["message"].as_str().unwrap().contains("pre-lease hook"),
        "{body}"
    );
    let (status, _) = h.get(&format!("{CLAIMS}/c")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing left behind");
}

#[tokio::test]
async fn a_claim_on_a_missing_pool_is_a_404_naming_the_pool() {
    let h = Harness::start().await;
    let (status, _, body) = h.claim("c", "nowhere").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(
        body["message"],
        "pools.battery.liquidmetal-x.dev \"nowhere\" not found"
    );
}

#[tokio::test]
async fn battery_unreachable_is_a_503_with_retry_after_and_discovery_still_answers() {
    let mut h = Harness::start().await;
    // Ready once battery answers and the start-up work (adopting battery's objects,
    // releasing the leases binds left) is done.
    h.eventually("/readyz", |status, _| status == StatusCode::OK)
        .await;
    h.battery_mut().stop_battery().await;
    let (status, headers, body) = h.call("GET", POOLS, "application/json", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["kind"], "Status");
    assert!(headers.contains_key(header::RETRY_AFTER));
    let (status, _) = h.get("/apis/battery.liquidmetal-x.dev/v1alpha1").await;
    assert_eq!(status, StatusCode::OK, "discovery does not need battery");
    let (status, _, body) = h.send(get("/readyz")).await;
    let body = String::from_utf8_lossy(&body);
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert!(
        body.starts_with("[-]battery failed: battery is not serving: ")
            && body.ends_with("\nreadyz check failed\n"),
        "not ready without battery, and says why: {body}"
    );
}

fn ready_reason(pool: &Value) -> Option<&str> {
    condition(pool, "Ready")?["reason"].as_str()
}

#[tokio::test]
async fn a_node_selector_follows_host_labels() {
    let h = Harness::start().await;
    // The embedded battery's Hosts are adopted with their metadata.
    h.eventually(HOSTS, |_, list| {
        list["items"].as_array().is_some_and(|i| i.len() == 2)
    })
    .await;
    let mut zoned = pool("zoned", 1);
    zoned["spec"]["placement"] = json!({"nodeSelector": {"zone": "b"}});
    let created = h.create(POOLS, &zoned).await;
    assert_eq!(ready_reason(&created), Some("NoEligibleHost"));

    let (status, _, host) = h
        .call(
            "PATCH",
            &format!("{HOSTS}/host-1"),
            "application/merge-patch+json",
            Some(json!({"metadata": {"labels": {"zone": "b"}}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{host}");
    h.wait_available("zoned", 1).await;
    let uids = h.battery().host("host-1").unwrap().microvm_uids();
    assert_eq!(
        uids.len(),
        1,
        "the MicroVM runs on the only Host labelled zone=b"
    );
    assert!(
        h.battery()
            .host("host-0")
            .unwrap()
            .microvm_uids()
            .is_empty()
    );
    let pool = h
        .eventually(&format!("{POOLS}/zoned"), |_, p| {
            ready_reason(p) == Some("AtSize")
        })
        .await;
    assert_eq!(pool["spec"]["placement"]["nodeSelector"]["zone"], "b");

    // Deleting the Host is accepted at once; it stays, draining, while a MicroVM is on it
    // (the rest of its deletion is in tests/hosts.rs).
    let (status, _, deleting) = h
        .call(
            "DELETE",
            &format!("{HOSTS}/host-1"),
            "application/json",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{deleting}");
    assert!(
        deleting["metadata"]["deletionTimestamp"].is_string(),
        "{deleting}"
    );
}

#[tokio::test]
async fn deleting_every_claim_of_a_namespace_releases_every_microvm() {
    // What the namespace controller does when a namespace goes: one deletecollection.
    let h = Harness::start().await;
    h.create_pool_with_lease("ns", 3, "ReplaceOnDelete", "60s")
        .await;
    h.wait_available("ns", 3).await;
    let mut vms = Vec::new();
    for name in ["a", "b", "c"] {
        let (status, _, claim) = h.claim(name, "ns").await;
        assert_eq!(status, StatusCode::CREATED, "{claim}");
        vms.push(
            claim["status"]["microVM"]["uid"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let (status, _, deleted) = h
        .call("DELETE", CLAIMS, "application/json", Some(json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"})))
        .await;
    assert_eq!(status, StatusCode::OK, "{deleted}");
    assert_eq!(deleted["items"].as_array().unwrap().len(), 3);
    let (_, list) = h.get(CLAIMS).await;
    assert!(list["items"].as_array().unwrap().is_empty());
    for vm in vms {
        assert!(
            h.battery()
                .hosts()
                .iter()
                .all(|host| !host.microvm_uids().contains(&vm)),
            "{vm} released"
        );
    }
}

#[tokio::test]
async fn creates_in_missing_or_terminating_namespaces_are_refused_and_hook_failures_become_events()
{
    let (client, events) = fake_kube_apiserver().await;
    let h = Harness::with_settings(Settings {
        cluster: Some(Arc::new(battery_apiserver::cluster::Cluster::new(client))),
        ..common::settings()
    })
    .await;
    for (namespace, code, message) in [
        (
            "dying",
            StatusCode::FORBIDDEN,
            "unable to create new content in namespace dying because it is being terminated",
        ),
        (
            "ghost",
            StatusCode::NOT_FOUND,
            "namespaces \"ghost\" not found",
        ),
    ] {
        let uri = format!("/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/{namespace}/pools");
        let (status, body) = h.json(common::post(&uri, &pool("p", 0))).await;
        assert_eq!(
            (status, body["message"].as_str()),
            (code, Some(message)),
            "{body}"
        );
    }

    // A create hook that always fails: battery reports VM_HOOK_FAILED for each MicroVM.
    let mut broken = pool("broken", 1);
    broken["spec"]["hooks"] = json!({"create": ["exit 1"]});
    let created = h.create(POOLS, &broken).await;
    let recorded = eventually(DEADLINE, "a HookFailed Event", || async {
        let recorded = events.lock().unwrap().clone();
        if recorded.is_empty() {
            Err("no HookFailed Event")
        } else {
            Ok(recorded)
        }
    })
    .await;
    let event = &recorded[0];
    assert!(
        event.get("review").is_none(),
        "no authorizer here: nothing was reviewed"
    );
    assert_eq!(event["reason"], "HookFailed");
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["involvedObject"]["kind"], "Pool");
    assert_eq!(event["involvedObject"]["name"], "broken");
    assert_eq!(event["involvedObject"]["uid"], created["metadata"]["uid"]);
    let names: HashSet<&str> = recorded
        .iter()
        .map(|e| e["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names.len(),
        recorded.len(),
        "one Event per battery event id"
    );
}

#[tokio::test]
async fn every_resource_request_and_metrics_are_authorized_by_subject_access_review() {
    let (client, recorded) = fake_kube_apiserver().await;
    let h = Harness::with_settings(Settings {
        authorizer: Some(Arc::new(
            battery_apiserver::http::authz::SubjectAccessReviewer::new(client),
        )),
        ..common::settings()
    })
    .await;
    let reviews = || {
        recorded
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.get("review").is_some())
            .count()
    };
    h.create_pool_with_lease("p", 0, "ImmediateOnLease", "60s")
        .await;
    let (status, _, _) = h
        .call_as("viewer", "GET", POOLS, "application/json", None)
        .await;
    assert_eq!(status, StatusCode::OK, "viewer may list pools");
    let before = reviews();
    let (status, _, _) = h
        .call_as("viewer", "GET", POOLS, "application/json", None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        reviews(),
        before,
        "a repeated decision comes from the cache"
    );
    let (status, _, refused) = h
        .call_as(
            "viewer",
            "DELETE",
            &format!("{POOLS}/p"),
            "application/json",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert_eq!(
        refused["message"],
        "pools.battery.liquidmetal-x.dev \"p\" is forbidden: User \"viewer\" cannot delete resource \"pools\" in API group \"battery.liquidmetal-x.dev\" in the namespace \"default\": no RBAC policy matched"
    );
    let (status, _) = h.get(&format!("{POOLS}/p")).await;
    assert_eq!(status, StatusCode::OK, "the refused delete changed nothing");
    let (status, _, _) = h
        .call_as("viewer", "GET", "/metrics", "text/plain", None)
        .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "/metrics needs authorization"
    );
    let (status, _, _) = h
        .call_as(
            "system:anonymous",
            "GET",
            "/apis/battery.liquidmetal-x.dev/v1alpha1",
            "application/json",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "discovery is always allowed");
    let (status, _, _) = h
        .call_as("system:anonymous", "GET", "/healthz", "text/plain", None)
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn bearer_tokens_are_reviewed_and_only_the_holder_renews() {
    let (client, _) = fake_kube_apiserver().await;
    let h = Harness::with_settings(Settings {
        authentication: Arc::new(battery_apiserver::http::authn::Authentication::new(
            Default::default(),
            Some(battery_apiserver::http::authn::TokenReviewer::new(client)),
        )),
        ..common::settings()
    })
    .await;
    h.create_pool_with_lease("tok", 1, "ImmediateOnLease", "60s")
        .await;
    h.wait_available("tok", 1).await;
    let (status, _, claim) = h.claim("held", "tok").await;
    assert_eq!(status, StatusCode::CREATED, "{claim}");
    let lease = format!("{CLAIMS}/held/lease");
    let (status, renewed) = h
        .call_with_token("sa-token", "PATCH", &lease, Some(json!({})))
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the Holder's own token renews: {renewed}"
    );
    let (status, refused) = h
        .call_with_token("bob-token", "PATCH", &lease, Some(json!({})))
        .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "someone else's token does not: {refused}"
    );
    let (status, refused) = h
        .call_with_token("deleted-sa-token", "PATCH", &lease, Some(json!({})))
        .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a token the cluster refuses is a 401: {refused}"
    );
    assert_eq!(refused["kind"], "Status");
    // Go answers a TokenReview that fails with 401 too, telling the caller nothing more.
    let (status, refused) = h
        .call_with_token("breaks-the-webhook", "PATCH", &lease, Some(json!({})))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{refused}");
    assert_eq!(refused["message"], "Unauthorized", "{refused}");

    // A WebSocket carries its token as a sub-protocol (browsers cannot set Authorization).
    let websocket = |token: &str| {
        use base64::Engine as _;
        let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token);
        Request::get(format!("{CLAIMS}/held"))
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "websocket")
            .header(
                header::SEC_WEBSOCKET_PROTOCOL,
                format!("v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.{encoded}"),
            )
            .body(Body::empty())
            .unwrap()
    };
    let (status, claim) = h.json_as_is(websocket("sa-token")).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a sub-protocol token is reviewed: {claim}"
    );
    let (status, refused) = h.json_as_is(websocket("deleted-sa-token")).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "and refused like any other: {refused}"
    );
}

/// Lists in compact JSON, kubectl's, copy each claim's JSON from its record; a pretty
/// list decodes every claim and encodes it again. Both answer alike in every form, with
/// selectors and pages, for a Bound claim, a labelled one and one whose lease battery let
/// go unseen (released by another client of battery), whose record still says Bound.
#[tokio::test]
async fn a_list_copied_from_the_records_answers_as_a_decoded_one() {
    const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
    const METADATA: &str = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io";
    let h = Harness::start().await;
    h.create_pool_with_lease("short", 1, "ImmediateOnLease", "1s")
        .await;
    h.create_pool_with_lease("long", 2, "ImmediateOnLease", "60s")
        .await;
    h.wait_available("short", 1).await;
    h.wait_available("long", 2).await;
    let (status, _, gone) = h.claim("gone", "short").await;
    assert_eq!(status, StatusCode::CREATED, "{gone}");
    let (status, _, plain) = h.claim("plain", "long").await;
    assert_eq!(status, StatusCode::CREATED, "{plain}");
    let mut labelled = common::claim("labelled", "long");
    labelled["metadata"]["labels"] = json!({"app": "ci"});
    let (status, _, labelled) = h
        .call("POST", CLAIMS, "application/json", Some(labelled))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{labelled}");
    // Listed as Bound from its record while its recorded expiry is ahead; then battery
    // is asked, and the list shows it Expired.
    h.release_behind_our_back(gone["metadata"]["uid"].as_str().unwrap())
        .await;
    h.eventually(
        &format!("{CLAIMS}?fieldSelector=status.phase%3DExpired"),
        |_, list| list["items"][0]["metadata"]["name"] == "gone",
    )
    .await;
    let (_, record) = h.get(&format!("{CLAIMS}/gone")).await;
    assert_eq!(record["status"]["phase"], "Expired", "{record}");

    let list = |query: &'static str, accept: &'static str, pretty: bool| {
        let h = &h;
        async move {
            let separator = if query.is_empty() { "?" } else { "&" };
            let pretty = if pretty {
                format!("{separator}pretty=true")
            } else {
                String::new()
            };
            let request = Request::get(format!("{CLAIMS}{query}{pretty}"))
                .header(header::ACCEPT, accept)
                .body(Body::empty())
                .unwrap();
            let (status, mut body) = h.json(request).await;
            assert_eq!(status, StatusCode::OK, "{query} as {accept}: {body}");
            // A row's last cell is its age, which moves on between two lists.
            for row in body["rows"].as_array_mut().into_iter().flatten() {
                row["cells"].as_array_mut().unwrap().pop();
            }
            body
        }
    };
    let cases = [
        ("", "application/json"),
        ("", TABLE),
        ("?includeObject=Object", TABLE),
        ("?includeObject=None", TABLE),
        ("", METADATA),
        ("?labelSelector=app%3Dci", "application/json"),
        ("?fieldSelector=status.phase%3DExpired", TABLE),
        (
            "?fieldSelector=spec.poolRef.name%3Dlong",
            "application/json",
        ),
        ("?limit=2", "application/json"),
    ];
    for (query, accept) in cases {
        // Compared at one resourceVersion: the Host readiness pass may update the claims
        // between the two lists. Until the follower records `gone` Expired, each read
        // decides it is, with its own time for the change: two lists a second apart differ
        // there, so they are asked again; a difference that stays fails.
        let copied = eventually(DEADLINE, "two lists alike at one resourceVersion", || async {
            let copied = list(query, accept, false).await;
            let decoded = list(query, accept, true).await;
            let version = |list: &Value| list["metadata"]["resourceVersion"].clone();
            if version(&copied) != version(&decoded) {
                Err(format!("{query} as {accept}: a write came between the two lists"))
            } else if copied != decoded {
                Err(format!(
                    "{query} as {accept}: the copied list {copied} is not the decoded one {decoded}"
                ))
            } else {
                Ok(copied)
            }
        })
        .await;
        let items = copied["items"].as_array().or(copied["rows"].as_array());
        let expected = match query {
            "?labelSelector=app%3Dci" | "?fieldSelector=status.phase%3DExpired" => 1,
            "?fieldSelector=spec.poolRef.name%3Dlong" | "?limit=2" => 2,
            _ => 3,
        };
        assert_eq!(items.map(Vec::len), Some(expected), "{query}: {copied}");
    }
    let (_, all) = h.get(CLAIMS).await;
    let phases: Vec<_> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["metadata"]["name"].clone(), c["status"]["phase"].clone()))
        .collect();
    assert_eq!(
        phases,
        [
            (json!("gone"), json!("Expired")),
            (json!("labelled"), json!("Bound")),
            (json!("plain"), json!("Bound")),
        ]
    );
    assert_eq!(
        all["items"][2], plain,
        "a listed claim is the claim created"
    );
}
