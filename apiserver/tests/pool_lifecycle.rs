//! How the server copes with poolmgrd's lifecycle (issue 39), on the embedded battery,
//! which behaves as poolmgrd does: UpdatePool restarts the Pool's reconciler and cancels
//! the MicroVMs still booting (battery reports each as a failed hook), and DeletePool
//! waits for that cleanup, however long it takes.

use std::sync::Arc;
use std::time::Duration;

use battery_apiserver::battery::BatteryClient;
use battery_apiserver::server::Settings;
use battery_apiserver::testing::{self as common, DEADLINE, Harness, POOLS, eventually, pool};
use common::cluster::fake_kube_apiserver;
use http::StatusCode;
use serde_json::{Value, json};

const MERGE_PATCH: &str = "application/merge-patch+json";

/// The harness's battery, its reconciler ticking fast: poolmgrd replaces a cancelled
/// MicroVM at its next tick, not at once.
fn battery() -> battery_embedded::local::LocalBatteryConfig {
    let mut config = common::fast_battery_config();
    config.battery.reconcile_interval = Duration::from_millis(200);
    config
}

/// A Pool whose MicroVMs boot for a while: their create hook sleeps `seconds`.
fn slow_pool(name: &str, size: i32, seconds: u32) -> Value {
    let mut pool = pool(name, size);
    pool["spec"]["hooks"] = json!({"create": [format!("sleep {seconds}")]});
    pool
}

fn reasons(events: &[Value]) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e["involvedObject"]["kind"] == "Pool")
        .map(|e| {
            (
                e["type"].as_str().unwrap_or_default().to_owned(),
                e["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_pool_edited_and_scaled_while_it_boots_fills_and_blames_no_hook() {
    let (client, events) = fake_kube_apiserver().await;
    let h = Harness::with_battery(
        Settings {
            cluster: Some(Arc::new(battery_apiserver::cluster::Cluster::new(client))),
            ..common::settings()
        },
        battery(),
    )
    .await;
    let uri = format!("{POOLS}/filling");
    h.create(POOLS, &slow_pool("filling", 2, 2)).await;
    h.eventually(&uri, |_, pool| pool["status"]["provisioning"] == 2)
        .await;
    // Three changes while both boot: each restarts battery's reconciler.
    for patch in [
        json!({"spec": {"size": 3}}),
        json!({"spec": {"lease": {"expiryThreshold": "45s"}}}),
        json!({"spec": {"size": 4}}),
    ] {
        let (status, _, body) = h.call("PATCH", &uri, MERGE_PATCH, Some(patch)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    // A change to nothing battery holds (a label) calls no UpdatePool: nothing cancelled.
    let labelled = json!({"metadata": {"labels": {"tier": "gold"}}});
    let (status, _, body) = h.call("PATCH", &uri, MERGE_PATCH, Some(labelled)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    h.wait_available("filling", 4).await;

    let seen = eventually(DEADLINE, "a BootCancelled Event", || async {
        let seen = reasons(&events.lock().unwrap());
        if seen.iter().any(|(_, reason)| reason == "BootCancelled") {
            Ok(seen)
        } else {
            Err(format!("{seen:?}"))
        }
    })
    .await;
    assert!(
        seen.iter()
            .all(|(kind, reason)| kind == "Normal" && reason == "BootCancelled"),
        "the boots our changes cancelled are not the Pool's hooks failing: {seen:?}"
    );
}

#[tokio::test]
async fn changes_that_arrive_while_battery_restarts_a_pool_reach_it_as_one() {
    let (h, proxy) = Harness::behind_proxy(common::settings(), battery()).await;
    let h = Arc::new(h);
    let uri = format!("{POOLS}/burst");
    h.create(POOLS, &pool("burst", 1)).await;
    h.wait_available("burst", 1).await;
    // battery is slow to take the first change: it is in flight while the others arrive.
    proxy.updates().hold();
    let patch = |body: Value| {
        let (h, uri) = (h.clone(), uri.clone());
        tokio::spawn(async move { h.call("PATCH", &uri, MERGE_PATCH, Some(body)).await })
    };
    let first = patch(json!({"spec": {"size": 2}}));
    // The first UpdatePool in flight.
    proxy.updates().reached(1).await;
    let later = [
        json!({"spec": {"size": 3}}),
        json!({"spec": {"lease": {"expiryThreshold": "45s"}}}),
        json!({"spec": {"lease": {"heartbeatInterval": "15s"}}}),
    ]
    .map(patch);
    // Each is recorded, and shown, before battery has taken any of them.
    h.eventually(&uri, |_, pool| {
        pool["spec"]["size"] == 3
            && pool["spec"]["lease"]["expiryThreshold"] == "45s"
            && pool["spec"]["lease"]["heartbeatInterval"] == "15s"
    })
    .await;
    assert_eq!(
        proxy.updates().calls(),
        1,
        "none of the later ones sent yet"
    );
    proxy.updates().release();
    for request in std::iter::once(first).chain(later) {
        let (status, _, body) = request.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    assert_eq!(
        proxy.updates().calls(),
        2,
        "the three that waited reached battery in one UpdatePool"
    );
    let battery =
        BatteryClient::connect_lazy(&format!("http://{}", h.battery().address())).unwrap();
    let held = battery.pool("default", "burst").await.unwrap().spec;
    assert_eq!(held.size, Some(3), "{held:?}");
    let lease = serde_json::to_value(&held.lease).unwrap();
    assert_eq!(lease["expiryThreshold"], "45s", "{held:?}");
    h.wait_available("burst", 3).await;
    let (_, settled) = h.get(&uri).await;
    assert_eq!(
        settled["spec"]["lease"]["expiryThreshold"], "45s",
        "{settled}"
    );
    assert_eq!(
        settled["spec"]["lease"]["heartbeatInterval"], "15s",
        "{settled}"
    );
}

#[tokio::test]
async fn deleting_a_pool_while_it_boots_finishes_though_battery_outlasts_the_request() {
    let h = Harness::with_battery(common::settings(), battery()).await;
    let uri = format!("{POOLS}/doomed");
    h.create(POOLS, &slow_pool("doomed", 2, 600)).await;
    h.eventually(&uri, |_, pool| pool["status"]["provisioning"] == 2)
        .await;
    // battery's DeletePool cancels both boots and waits for their MicroVMs to be
    // deleted, which flintlockd now holds.
    for host in h.battery().hosts() {
        host.faults().hold_deletes(true);
    }
    let (status, _, body) = h.call("DELETE", &uri, "application/json", None).await;
    assert!(
        matches!(status, StatusCode::OK | StatusCode::ACCEPTED),
        "not cut short with an error: {status} {body}"
    );
    assert!(
        body["metadata"]["deletionTimestamp"].is_string(),
        "the Pool says it is being deleted: {body}"
    );
    let ready = common::condition(&body, "Ready").expect("a Ready condition");
    assert_eq!(ready["reason"], "Deleting", "{body}");
    for host in h.battery().hosts() {
        host.faults().hold_deletes(false);
    }
    h.eventually(&uri, |status, _| status == StatusCode::NOT_FOUND)
        .await;
    for host in h.battery().hosts() {
        assert_eq!(host.microvm_uids(), Vec::<String>::new(), "{}", host.name());
    }
}

/// A sample of `/metrics`: the battery events applied, and whether the follower follows.
async fn follower_state(h: &Harness) -> (u64, bool) {
    let (status, _, body) = h.send(common::get("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(body).unwrap();
    let value = |name: &str| -> u64 {
        text.lines()
            .find_map(|line| {
                line.strip_prefix(name)?
                    .strip_prefix(' ')?
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
            .round() as u64
    };
    (
        value("battery_apiserver_battery_events_total"),
        value("battery_apiserver_battery_events_following") == 1,
    )
}

#[tokio::test]
async fn the_follower_does_not_follow_until_a_stalled_replay_is_over() {
    let mut config = battery();
    // poolmgrd replays in batches of 100; this one stalls after each full batch, longer
    // than any quiet spell the follower could take for the replay's end.
    config.battery.replay_batch_pause = Duration::from_secs(5);
    let mut h = Harness::with_battery(common::settings(), config).await;
    // More than a batch of history: each MicroVM is provisioned, then available.
    h.create(POOLS, &pool("history", 60)).await;
    h.wait_available("history", 60).await;
    let history = eventually(
        DEADLINE,
        "the whole history applied",
        async || match follower_state(&h).await {
            (applied, true) if applied >= 120 => Ok(applied),
            state => Err(format!("{state:?}")),
        },
    )
    .await;

    // A new server, as one installed beside a battery with a history: it replays it all.
    h.replace_server();
    let mut during_replay = 0;
    eventually(DEADLINE, "the replay applied", async || {
        let (applied, following) = follower_state(&h).await;
        if applied < history {
            assert!(!following, "following after {applied} of {history} events");
            if applied > 0 {
                during_replay += 1;
            }
            return Err(format!("{applied} of {history} applied"));
        }
        Ok(())
    })
    .await;
    assert!(
        during_replay > 0,
        "no sample fell inside the replay's stall"
    );
    // Still not following: nothing happened after it subscribed. An event does.
    let (status, _, body) = h.claim("after-replay", "history").await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    eventually(
        DEADLINE,
        "following after a new event",
        async || match follower_state(&h).await {
            (_, true) => Ok(()),
            state => Err(format!("{state:?}")),
        },
    )
    .await;
}
