//! Events.Subscribe (§1.4, §4.6): one global increasing id across pools, full replay
//! from the start on every subscription followed by live events, the pool filter, and
//! the VM lifecycle in order.

use battery_e2e::api::{Event, EventType, PoolRef};
use battery_e2e::{EventLog, Suite, expect_ok, ts_nanos};

use EventType::{VmAvailable, VmClaimed, VmDeletedOnRelease, VmProvisioned};

fn of(events: &[Event], pool: &PoolRef) -> Vec<Event> {
    events
        .iter()
        .filter(|e| e.pool_name == pool.name && e.pool_namespace == pool.namespace)
        .cloned()
        .collect()
}

/// Waits until `log` has replayed at least `n` events and checks they equal `expected`.
async fn expect_replay(log: &mut EventLog, expected: &[Event], what: &str) {
    let n = expected.len();
    log.wait_until(what, |h| (h.len() >= n).then_some(())).await;
    assert_eq!(
        &log.history()[..n],
        expected,
        "{what}: same events, same ids, same order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vm_lifecycle_events_in_order() {
    let suite = Suite::start().await;
    let pool = suite.create_ready_pool(suite.pool("life").build()).await;
    let mut log = suite.subscribe(Some(&pool)).await;
    let uid = log.wait_nth_vm(&pool, VmAvailable, 1).await;
    let claimed = suite.claim_ok(&pool).await;
    assert_eq!(claimed.vm_uid, uid);
    expect_ok(suite.release(&claimed.lease_id).await, "ReleaseVM");
    log.wait_vm(&uid, VmDeletedOnRelease).await;
    assert_eq!(
        log.types_of(&uid),
        vec![VmProvisioned, VmAvailable, VmClaimed, VmDeletedOnRelease]
    );
    let mine: Vec<&Event> = log.history().iter().filter(|e| e.vm_uid == uid).collect();
    for pair in mine.windows(2) {
        assert!(
            ts_nanos(&pair[0].created_at) <= ts_nanos(&pair[1].created_at),
            "created_at follows id order: {pair:?}"
        );
    }
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_ids_are_global_and_every_subscription_replays_all() {
    let suite = Suite::start().await;
    let mut all = suite.subscribe(None).await;
    let a = suite.create_pool(suite.pool("a").build()).await;
    let b = suite.create_pool(suite.pool("b").build()).await;
    suite.wait_counts(&a, 1, 0).await;
    suite.wait_counts(&b, 1, 0).await;
    for pool in [&a, &b] {
        let claimed = suite.claim_ok(pool).await;
        expect_ok(suite.release(&claimed.lease_id).await, "ReleaseVM");
        all.wait_vm(&claimed.vm_uid, VmDeletedOnRelease).await;
    }
    let history = all.history().to_vec();

    // Per-pool subscriptions see their pool's part of the one sequence.
    let (a_events, b_events) = (of(&history, &a), of(&history, &b));
    let mut only_a = suite.subscribe(Some(&a)).await;
    expect_replay(&mut only_a, &a_events, "pool a's subscription").await;
    let mut only_b = suite.subscribe(Some(&b)).await;
    expect_replay(&mut only_b, &b_events, "pool b's subscription").await;
    let mut merged: Vec<i64> = a_events.iter().chain(&b_events).map(|e| e.id).collect();
    merged.sort_unstable();
    let ids: Vec<i64> = history.iter().map(|e| e.id).collect();
    assert_eq!(
        merged, ids,
        "pools share one id sequence: no id is used twice"
    );

    // A new subscription replays everything from the start, then goes live.
    let mut again = suite.subscribe(None).await;
    expect_replay(&mut again, &history, "a second subscription").await;
    let last = again.last_id();
    suite.wait_counts(&a, 1, 0).await; // the released VM's replacement
    let claimed = suite.claim_ok(&a).await;
    for log in [&mut again, &mut all, &mut only_a] {
        let live = log.wait_vm(&claimed.vm_uid, VmClaimed).await;
        assert!(live.id > last, "live events continue the sequence");
    }
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_filters_by_pool_name_and_namespace() {
    let suite = Suite::start().await;
    let other_ns = format!("{}-other", suite.namespace());
    let p = suite.create_pool(suite.pool("p").build()).await;
    let p_elsewhere = suite
        .create_pool(suite.pool("p").namespace(&other_ns).build())
        .await;
    let q = suite.create_pool(suite.pool("q").build()).await;
    for pool in [&p, &p_elsewhere, &q] {
        suite.wait_counts(pool, 1, 0).await;
    }
    let mut all = suite.subscribe(None).await;
    for pool in [&p, &p_elsewhere, &q] {
        all.wait_pool_n(pool, VmAvailable, 1).await;
    }
    // The log checks that every event on a pool subscription is that pool's.
    let mut only_p = suite.subscribe(Some(&p)).await;
    expect_replay(&mut only_p, &of(all.history(), &p), "pool p's replay").await;
    suite.claim_ok(&p_elsewhere).await;
    suite.claim_ok(&q).await;
    let claimed = suite.claim_ok(&p).await;
    only_p.wait_vm(&claimed.vm_uid, VmClaimed).await;
    let claims: Vec<&Event> = only_p
        .history()
        .iter()
        .filter(|e| e.r#type == VmClaimed as i32)
        .collect();
    assert_eq!(claims.len(), 1, "only p's claim: {claims:?}");
    suite.finish().await;
}
