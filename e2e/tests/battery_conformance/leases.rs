//! The Lease service (§3.1, §4.3-§4.5): ClaimVM answers and codes, idempotent replay,
//! heartbeats, expiry by the sweeper, VM_EXPIRING_SOON, ReleaseVM, ListLeases.

use std::collections::BTreeSet;
use std::time::Duration;

use battery_e2e::api::{ClaimVmResponse, EventType, LeaseRecord, PoolRef};
use battery_e2e::{
    Options, Suite, TEMPLATE_INTERFACE, expect_code, expect_ok, nanos, skip, ts_nanos,
};
use tonic::Code;

use EventType::{
    VmAvailable, VmClaimed, VmDeletedDueToExpiry, VmDeletedOnRelease, VmExpiringSoon, VmProvisioned,
};

async fn record(suite: &Suite, claim: &ClaimVmResponse) -> LeaseRecord {
    let lease = suite.lease(&claim.lease_id).await;
    lease.unwrap_or_else(|| panic!("lease {} is listed", claim.lease_id))
}

/// A pool with the same name in another namespace (which does not exist).
fn same_name_elsewhere(pool: &PoolRef) -> PoolRef {
    PoolRef {
        name: pool.name.clone(),
        namespace: format!("{}-elsewhere", pool.namespace),
    }
}

/// Lets the clock move on, so a timestamp that was (wrongly) rewritten would differ.
async fn let_clock_advance() {
    tokio::time::sleep(Duration::from_millis(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_returns_the_lease_host_and_interfaces() {
    let suite = Suite::start().await;
    let threshold = Duration::from_secs(30);
    let pool = suite
        .create_ready_pool(suite.pool("claim").expiry(threshold).build())
        .await;
    let mut log = suite.subscribe(Some(&pool)).await;
    let available = log.wait_nth_vm(&pool, VmAvailable, 1).await;

    let claimed = expect_ok(suite.claim(&pool, "claim-1").await, "ClaimVM");
    assert!(!claimed.lease_id.is_empty());
    assert_eq!(
        claimed.vm_uid, available,
        "the only available VM is claimed"
    );
    let host = claimed.host.clone().expect("ClaimVMResponse.host");
    assert!(
        suite.host_names().contains(&host.name),
        "host {} is one of the pool's",
        host.name
    );
    let registered = expect_ok(suite.get_host(&host.name).await, "GetHost");
    assert_eq!(host.address, registered.host.expect("host").address);
    let keys: Vec<&String> = claimed.network_interfaces.keys().collect();
    assert_eq!(
        keys,
        vec![TEMPLATE_INTERFACE],
        "one interface per template interface"
    );
    for (name, iface) in &claimed.network_interfaces {
        assert!(
            !iface.host_device_name.is_empty(),
            "{name}: host_device_name"
        );
        assert!(!iface.mac_address.is_empty(), "{name}: mac_address");
    }
    let (_, vm) = suite.expect_vm(&claimed.vm_uid).await;
    let status = vm.status.expect("status");
    assert_eq!(
        claimed.network_interfaces, status.network_interfaces,
        "as flintlock reports"
    );

    let lease = record(&suite, &claimed).await;
    assert_eq!(lease.vm_uid, claimed.vm_uid);
    assert_eq!(
        (lease.pool_name.as_str(), lease.pool_namespace.as_str()),
        (pool.name.as_str(), pool.namespace.as_str())
    );
    assert_eq!(lease.request_id, "claim-1");
    assert_eq!(lease.claimed_at, lease.last_heartbeat_at);
    assert_eq!(
        ts_nanos(&lease.expires_at) - ts_nanos(&lease.claimed_at),
        nanos(threshold),
        "expires_at = claimed_at + heartbeat_expiry_threshold"
    );
    log.wait_vm(&claimed.vm_uid, VmClaimed).await;
    assert_eq!(
        log.types_of(&claimed.vm_uid),
        vec![VmProvisioned, VmAvailable, VmClaimed]
    );
    suite.wait_counts(&pool, 0, 1).await;
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_error_codes() {
    let suite = Suite::start().await;
    let too_long = "x".repeat(256);
    let too_long_wide = "é".repeat(128); // 128 characters, 256 bytes
    let longest = "y".repeat(255);
    let missing = suite.pool_ref("missing");
    expect_code(
        suite.claim(&missing, &too_long).await,
        Code::InvalidArgument,
        "a 256-byte request_id is refused before the pool is looked up",
    );
    expect_code(
        suite.claim(&missing, "").await,
        Code::NotFound,
        "ClaimVM on a missing pool",
    );

    let a = suite.create_ready_pool(suite.pool("a").build()).await;
    let b = suite.create_ready_pool(suite.pool("b").build()).await;
    let empty = suite.create_pool(suite.pool("empty").size(0).build()).await;
    for (what, id) in [
        ("256 bytes", &too_long),
        ("256 bytes in 128 chars", &too_long_wide),
    ] {
        expect_code(suite.claim(&a, id).await, Code::InvalidArgument, what);
    }
    let elsewhere = same_name_elsewhere(&a);
    expect_code(
        suite.claim(&elsewhere, "").await,
        Code::NotFound,
        "same name, other namespace",
    );
    expect_code(
        suite.claim(&empty, "").await,
        Code::ResourceExhausted,
        "no available VM",
    );

    let claimed = expect_ok(suite.claim(&a, &longest).await, "a 255-byte request_id");
    assert_eq!(record(&suite, &claimed).await.request_id, longest);
    expect_code(
        suite.claim(&b, &longest).await,
        Code::InvalidArgument,
        "a request_id already used in another pool",
    );
    assert!(suite.leases(Some(&b)).await.is_empty());
    suite.hold_counts(&b, 1, 0).await;
    expect_code(
        suite.claim(&a, "").await,
        Code::ResourceExhausted,
        "the only VM is leased",
    );
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_replays_by_request_id() {
    let suite = Suite::start().await;
    let pool = suite
        .create_ready_pool(suite.pool("replay").size(2).build())
        .await;
    let mut log = suite.subscribe(Some(&pool)).await;
    let first = expect_ok(suite.claim(&pool, "replay-1").await, "ClaimVM");
    let before = record(&suite, &first).await;
    let_clock_advance().await;
    for _ in 0..3 {
        let again = expect_ok(suite.claim(&pool, "replay-1").await, "ClaimVM replay");
        assert_eq!(
            again, first,
            "a replay answers the same lease, VM, host and interfaces"
        );
    }
    assert_eq!(
        record(&suite, &first).await,
        before,
        "a replay is not a heartbeat"
    );
    assert_eq!(suite.leases(Some(&pool)).await.len(), 1);
    suite.hold_counts(&pool, 1, 1).await;

    expect_ok(suite.release(&first.lease_id).await, "ReleaseVM");
    log.wait_vm(&first.vm_uid, VmDeletedOnRelease).await;
    let claims = log
        .types_of(&first.vm_uid)
        .into_iter()
        .filter(|t| *t == VmClaimed)
        .count();
    assert_eq!(claims, 1, "replays emit no VM_CLAIMED");
    // Once the lease is gone the request_id is free again.
    let fresh = expect_ok(
        suite.claim(&pool, "replay-1").await,
        "ClaimVM after release",
    );
    assert_ne!(fresh.lease_id, first.lease_id);
    assert_ne!(
        fresh.vm_uid, first.vm_uid,
        "a released VM is never handed out again"
    );
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_moves_expires_at() {
    let suite = Suite::start().await;
    let threshold = Duration::from_secs(30);
    let pool = suite
        .create_ready_pool(suite.pool("hb").expiry(threshold).build())
        .await;
    let claimed = suite.claim_ok(&pool).await;
    let mut previous = record(&suite, &claimed).await;
    for _ in 0..2 {
        let_clock_advance().await;
        let expires_at = expect_ok(suite.heartbeat(&claimed.lease_id).await, "Heartbeat");
        let now = record(&suite, &claimed).await;
        assert_eq!(
            ts_nanos(&now.expires_at),
            expires_at,
            "Heartbeat returns the new expires_at"
        );
        assert!(
            expires_at > ts_nanos(&previous.expires_at),
            "a heartbeat extends the lease"
        );
        assert_eq!(
            expires_at - ts_nanos(&now.last_heartbeat_at),
            nanos(threshold),
            "expires_at = last_heartbeat_at + threshold"
        );
        assert_eq!(now.claimed_at, previous.claimed_at);
        previous = now;
    }
    for id in ["no-such-lease", ""] {
        expect_code(
            suite.heartbeat(id).await,
            Code::NotFound,
            "Heartbeat of an unknown lease",
        );
    }
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_lives_until_the_sweeper_runs() {
    let options = Options::new().sweep_interval(Duration::from_secs(3600));
    let Some(suite) = Suite::start_with(options).await else {
        return;
    };
    let threshold = Duration::from_millis(200);
    let pool = suite
        .create_ready_pool(suite.pool("late").expiry(threshold).build())
        .await;
    let claimed = expect_ok(suite.claim(&pool, "late-1").await, "ClaimVM");
    let expires_at = ts_nanos(&record(&suite, &claimed).await.expires_at);
    battery_e2e::eventually(
        suite.timing().timeout,
        "the lease's expires_at to pass",
        async || {
            let now = nanos(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .expect("clock"),
            );
            if now > expires_at {
                Ok(())
            } else {
                Err(format!("{} ns to go", expires_at - now))
            }
        },
    )
    .await;
    let replay = expect_ok(
        suite.claim(&pool, "late-1").await,
        "replay of an expired, unswept lease",
    );
    assert_eq!(
        replay, claimed,
        "a replay does not check the lease's expiry"
    );
    let renewed = expect_ok(
        suite.heartbeat(&claimed.lease_id).await,
        "Heartbeat after expires_at",
    );
    assert!(renewed > expires_at);
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expires_without_heartbeats() {
    let Some(suite) = Suite::start_with(Options::new().fast_sweep()).await else {
        return;
    };
    let threshold = (3 * suite.timing().sweep_interval).max(Duration::from_millis(300));
    let pool = suite
        .create_ready_pool(suite.pool("expire").expiry(threshold).build())
        .await;
    let mut log = suite.subscribe(Some(&pool)).await;
    let claimed = expect_ok(suite.claim(&pool, "expire-1").await, "ClaimVM");
    let expires_at = ts_nanos(&record(&suite, &claimed).await.expires_at);
    let uid = claimed.vm_uid.clone();

    let expired = log.wait_vm(&uid, VmDeletedDueToExpiry).await;
    assert!(
        ts_nanos(&expired.created_at) >= expires_at,
        "never expired before expires_at"
    );
    suite.expect_vm_gone(&uid).await;
    let types = log.types_of(&uid);
    assert_eq!(types[..3], [VmProvisioned, VmAvailable, VmClaimed]);
    assert_eq!(types.last(), Some(&VmDeletedDueToExpiry));
    let between = &types[3..types.len() - 1];
    assert!(
        between.len() <= 1 && between.iter().all(|t| *t == VmExpiringSoon),
        "{types:?}"
    );

    let id = &claimed.lease_id;
    expect_code(
        suite.heartbeat(id).await,
        Code::NotFound,
        "Heartbeat after expiry",
    );
    expect_code(
        suite.release(id).await,
        Code::NotFound,
        "ReleaseVM after expiry",
    );
    assert!(suite.lease(id).await.is_none());
    suite.wait_counts(&pool, 1, 0).await; // REPLACE_ON_DELETE replaces the expired VM
    let again = expect_ok(
        suite.claim(&pool, "expire-1").await,
        "the request_id is free again",
    );
    assert_ne!(again.lease_id, claimed.lease_id);
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiring_soon_once_per_expires_at() {
    let Some(suite) = Suite::start_with(Options::new().fast_sweep()).await else {
        return;
    };
    let timing = suite.timing();
    let threshold = (10 * timing.sweep_interval).max(Duration::from_secs(3));
    if timing.warning_window <= threshold {
        skip(&format!(
            "needs a warning window above {threshold:?}, have {:?}",
            timing.warning_window
        ));
        return;
    }
    let pool = suite
        .create_ready_pool(suite.pool("warn").expiry(threshold).build())
        .await;
    let mut log = suite.subscribe(Some(&pool)).await;
    let claimed = suite.claim_ok(&pool).await;
    let uid = claimed.vm_uid.clone();
    for warnings in 1..=3 {
        let what = format!("{warnings} VM_EXPIRING_SOON for {uid}");
        log.wait_until(&what, |h| {
            let n = h
                .iter()
                .filter(|e| e.vm_uid == uid && e.r#type == VmExpiringSoon as i32)
                .count();
            (n >= warnings).then_some(())
        })
        .await;
        if warnings < 3 {
            expect_ok(suite.heartbeat(&claimed.lease_id).await, "Heartbeat");
        }
    }
    log.wait_vm(&uid, VmDeletedDueToExpiry).await;
    // The lease is inside the warning window from its start, and battery emits
    // VM_CLAIMED after committing it (§4.3 step 6): a sweep in between warns first.
    let (warnings, others): (Vec<_>, Vec<_>) = log
        .types_of(&uid)
        .into_iter()
        .partition(|t| *t == VmExpiringSoon);
    assert_eq!(
        warnings.len(),
        3,
        "exactly one warning per distinct expires_at, however many sweeps see it"
    );
    assert_eq!(
        others,
        [VmProvisioned, VmAvailable, VmClaimed, VmDeletedDueToExpiry]
    );
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_destroys_the_vm() {
    let suite = Suite::start().await;
    let pool = suite.create_ready_pool(suite.pool("release").build()).await;
    let mut log = suite.subscribe(Some(&pool)).await;
    let claimed = suite.claim_ok(&pool).await;
    let uid = claimed.vm_uid.clone();
    suite.expect_vm(&uid).await;
    expect_ok(suite.release(&claimed.lease_id).await, "ReleaseVM");
    suite.expect_vm_gone(&uid).await;
    if suite.is_embedded() {
        let host = claimed.host.as_ref().expect("host").name.clone();
        assert!(!suite.sim_host(&host).microvm_uids().contains(&uid));
    }
    log.wait_vm(&uid, VmDeletedOnRelease).await;
    assert_eq!(
        log.types_of(&uid),
        vec![VmProvisioned, VmAvailable, VmClaimed, VmDeletedOnRelease]
    );
    let id = &claimed.lease_id;
    expect_code(
        suite.release(id).await,
        Code::NotFound,
        "a second ReleaseVM",
    );
    expect_code(
        suite.heartbeat(id).await,
        Code::NotFound,
        "Heartbeat after release",
    );
    assert!(suite.lease(id).await.is_none());
    suite.wait_counts(&pool, 1, 0).await;
    assert_ne!(
        suite.claim_ok(&pool).await.vm_uid,
        uid,
        "released VMs never return to the pool"
    );
    suite.finish().await;
}

/// Claims a VM on the only Host and makes its release fail: the VM is left DELETING.
async fn failed_release(
    suite: &Suite,
    request_id: &str,
) -> (battery_e2e::EventLog, ClaimVmResponse) {
    let pool = suite.create_ready_pool(suite.pool("stuck").build()).await;
    let log = suite.subscribe(Some(&pool)).await;
    let claimed = expect_ok(suite.claim(&pool, request_id).await, "ClaimVM");
    suite
        .sim_host(&suite.hosts()[0].name)
        .faults()
        .fail_deletes(true);
    expect_code(
        suite.release(&claimed.lease_id).await,
        Code::Unavailable,
        "ReleaseVM while the Host cannot delete",
    );
    assert!(
        suite.lease(&claimed.lease_id).await.is_some(),
        "the lease row is kept"
    );
    suite.expect_vm(&claimed.vm_uid).await;
    (log, claimed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_is_unavailable_until_the_host_deletes() {
    let options = Options::new()
        .embedded_only("injects host faults")
        .hosts(1)
        .sweep_interval(Duration::from_secs(3600));
    let Some(suite) = Suite::start_with(options).await else {
        return;
    };
    let (mut log, claimed) = failed_release(&suite, "stuck-1").await;
    let pool = suite.pool_ref("stuck");
    expect_code(
        suite.claim(&pool, "stuck-1").await,
        Code::Aborted,
        "replaying a lease whose VM is being deleted",
    );
    // DELETING counts toward nothing, so REPLACE_ON_DELETE already replaces it.
    suite.wait_counts(&pool, 1, 0).await;

    suite
        .sim_host(&suite.hosts()[0].name)
        .faults()
        .fail_deletes(false);
    expect_ok(suite.release(&claimed.lease_id).await, "ReleaseVM retried");
    suite.expect_vm_gone(&claimed.vm_uid).await;
    log.wait_vm(&claimed.vm_uid, VmDeletedOnRelease).await;
    assert_eq!(
        log.types_of(&claimed.vm_uid),
        vec![VmProvisioned, VmAvailable, VmClaimed, VmDeletedOnRelease]
    );
    expect_code(
        suite.release(&claimed.lease_id).await,
        Code::NotFound,
        "ReleaseVM once done",
    );
    assert!(suite.lease(&claimed.lease_id).await.is_none());
    let again = expect_ok(
        suite.claim(&pool, "stuck-1").await,
        "the request_id is free again",
    );
    assert_ne!(again.lease_id, claimed.lease_id);
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeper_finishes_a_failed_release() {
    let options = Options::new().embedded_only("injects host faults").hosts(1);
    let Some(suite) = Suite::start_with(options).await else {
        return;
    };
    let (mut log, claimed) = failed_release(&suite, "").await;
    suite
        .sim_host(&suite.hosts()[0].name)
        .faults()
        .fail_deletes(false);
    log.wait_vm(&claimed.vm_uid, VmDeletedOnRelease).await;
    suite.expect_vm_gone(&claimed.vm_uid).await;
    assert!(
        suite.lease(&claimed.lease_id).await.is_none(),
        "the sweeper removed the lease"
    );
    expect_code(
        suite.release(&claimed.lease_id).await,
        Code::NotFound,
        "ReleaseVM once done",
    );
    let types = log.types_of(&claimed.vm_uid);
    assert_eq!(
        types,
        vec![VmProvisioned, VmAvailable, VmClaimed, VmDeletedOnRelease]
    );
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_leases_filters_by_pool() {
    let suite = Suite::start().await;
    let a = suite
        .create_ready_pool(suite.pool("a").size(2).build())
        .await;
    let b = suite.create_ready_pool(suite.pool("b").build()).await;
    let a1 = expect_ok(suite.claim(&a, "a-1").await, "ClaimVM a-1");
    let a2 = suite.claim_ok(&a).await;
    let b1 = suite.claim_ok(&b).await;
    let ids = |leases: &[LeaseRecord]| -> BTreeSet<String> {
        leases.iter().map(|l| l.lease_id.clone()).collect()
    };
    let set = |claims: &[&ClaimVmResponse]| -> BTreeSet<String> {
        claims.iter().map(|c| c.lease_id.clone()).collect()
    };

    let in_a = suite.leases(Some(&a)).await;
    assert_eq!(ids(&in_a), set(&[&a1, &a2]));
    for lease in &in_a {
        assert_eq!(
            (lease.pool_name.as_str(), lease.pool_namespace.as_str()),
            (a.name.as_str(), a.namespace.as_str())
        );
        let expected = if lease.lease_id == a1.lease_id {
            "a-1"
        } else {
            ""
        };
        assert_eq!(
            lease.request_id, expected,
            "request_id is empty when none was given"
        );
    }
    assert_eq!(ids(&suite.leases(Some(&b)).await), set(&[&b1]));
    let listed: Vec<String> = suite
        .leases(None)
        .await
        .into_iter()
        .map(|l| l.lease_id)
        .collect();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(listed, sorted, "ListLeases orders by lease_id");
    let all: BTreeSet<String> = listed.into_iter().collect();
    assert!(
        all.is_superset(&set(&[&a1, &a2, &b1])),
        "no pool_ref lists every pool's leases"
    );
    assert!(
        suite
            .leases(Some(&suite.pool_ref("missing")))
            .await
            .is_empty()
    );
    let elsewhere = same_name_elsewhere(&a);
    assert!(
        suite.leases(Some(&elsewhere)).await.is_empty(),
        "the filter is (name, namespace)"
    );
    suite.finish().await;
}
