//! Events.Subscribe (§1.4, §4.6): one global increasing id across pools, full replay
//! from the start on every subscription followed by live events, the pool filter, the
//! VM lifecycle in order, and replays longer than one batch of 100.

use std::time::Duration;

use battery_e2e::api::{Event, EventType, PoolRef};
use battery_e2e::{EventLog, Options, Suite, expect_ok, ts_nanos};

use EventType::{VmAvailable, VmClaimed, VmDeletedOnRelease, VmProvisioned};

/// poolmgrd reads the outbox this many events at a time.
const BATCH: usize = 100;

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

/// Claims and releases every VM of `pool` (of `size`), round after round, until `live`
/// has read more than `more_than` events, ending with every VM available.
async fn churn(suite: &Suite, live: &mut EventLog, pool: &PoolRef, size: i32, more_than: usize) {
    let size = usize::try_from(size).expect("a pool size");
    let mut vms = size;
    loop {
        live.wait_pool_n(pool, VmAvailable, vms).await;
        if live.history().len() > more_than {
            return;
        }
        let mut claimed = Vec::new();
        for _ in 0..size {
            claimed.push(suite.claim_ok(pool).await);
        }
        for lease in &claimed {
            expect_ok(suite.release(&lease.lease_id).await, "ReleaseVM");
        }
        for lease in &claimed {
            live.wait_vm(&lease.vm_uid, VmDeletedOnRelease).await;
        }
        vms += size;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_longer_than_a_batch_is_whole_and_in_id_order() {
    let Some(suite) = Suite::start_with(Options::new().poolmgrd_events()).await else {
        return;
    };
    let mut live = suite.subscribe(None).await;
    let pool = suite
        .create_ready_pool(suite.pool("churn").size(4).build())
        .await;
    churn(&suite, &mut live, &pool, 4, BATCH).await;
    let history = live.history().to_vec();

    // A fresh subscription reads it all again from id 0, a batch at a time: the same
    // events, ids only increasing (the log checks), none missing.
    let mut replay = suite.subscribe(None).await;
    expect_replay(&mut replay, &history, "a replay of more than one batch").await;
    if suite.is_embedded() {
        // The battery is this test's alone, so its ids are all here, from 1.
        let ids: Vec<i64> = history.iter().map(|e| e.id).collect();
        let expected: Vec<i64> = (1..).take(ids.len()).collect();
        assert_eq!(ids, expected, "no id skipped");
    }
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_pauses_between_batches_of_100() {
    let pause = Duration::from_secs(3600);
    let Some(suite) = Suite::start_with(Options::new().replay_batch_pause(pause)).await else {
        return;
    };
    let pool = suite
        .create_ready_pool(suite.pool("churn").size(4).build())
        .await;
    // A live stream sees a full batch only while the outbox grows by 100 between two
    // reads, which churning does not do; the one before the pause matters here.
    let mut live = suite.subscribe(None).await;
    churn(&suite, &mut live, &pool, 4, BATCH).await;

    let mut replay = suite.subscribe(None).await;
    replay
        .wait_until("the replay's first batch", |h| {
            (h.len() >= BATCH).then_some(())
        })
        .await;
    let more = replay.observe(suite.timing().settle()).await;
    assert!(
        more.is_empty(),
        "the replay stalls after its first batch: {more:?}"
    );
    let ids: Vec<i64> = replay.history().iter().map(|e| e.id).collect();
    let first_batch: Vec<i64> = (1..).take(BATCH).collect();
    assert_eq!(ids, first_batch);
    suite.finish().await;
}
