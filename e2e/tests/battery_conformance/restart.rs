//! A battery restart on its data directory (§4.1, §5, §9.5): pools, leases, hosts and
//! events survive; event ids continue; abandoned claims and pending deletions are
//! recovered; VMs in flight at the stop are hook-failed. Embedded only (the suite
//! restarts the battery itself).

use std::time::Duration;

use battery_e2e::api::{ClaimVmRequest, EventType, Host};
use battery_e2e::{Gate, Options, Suite, expect_code, expect_ok, ts_nanos};
use tonic::Code;

use EventType::{VmClaimed, VmDeletedDueToExpiry, VmDeletedOnRelease};

fn persistent() -> Options {
    Options::new().persistent()
}

/// The stored part of each listed Host (the version is an in-memory cache).
async fn stored_hosts(suite: &Suite) -> Vec<(Option<Host>, i32)> {
    suite
        .list_hosts()
        .await
        .into_iter()
        .map(|h| (h.host, h.vm_count))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_leases_hosts_and_events_survive_a_restart() {
    let Some(mut suite) = Suite::start_with(persistent()).await else {
        return;
    };
    let alias = suite.add_alias_host("kept", 0).await;
    expect_ok(
        suite.cordon(&alias.name, "kept across restarts").await,
        "CordonHost",
    );
    let a_spec = suite
        .pool("a")
        .size(2)
        .create_commands(&["echo a > marks"])
        .build();
    let b_spec = suite
        .pool("b")
        .immediate_on_lease()
        .expiry(Duration::from_secs(45))
        .build();
    let a = suite.create_ready_pool(a_spec).await;
    let b = suite.create_ready_pool(b_spec).await;
    let kept = expect_ok(suite.claim(&a, "kept-1").await, "ClaimVM");
    let other = suite.claim_ok(&b).await;
    suite.wait_counts(&b, 1, 1).await;
    let mut log = suite.subscribe(None).await;
    log.wait_vm(&other.vm_uid, VmClaimed).await;
    let events_before = log.history().to_vec();
    let pools_before = (
        suite.get_pool(&a).await.expect("a").spec,
        suite.get_pool(&b).await.expect("b").spec,
    );
    let mut leases_before = suite.leases(None).await;
    let hosts_before = stored_hosts(&suite).await;

    suite.restart().await;

    let pools_after = (
        suite.get_pool(&a).await.expect("a").spec,
        suite.get_pool(&b).await.expect("b").spec,
    );
    assert_eq!(pools_after, pools_before, "pool specs survive");
    let mut leases_after = suite.leases(None).await;
    leases_before.sort_by(|x, y| x.lease_id.cmp(&y.lease_id));
    leases_after.sort_by(|x, y| x.lease_id.cmp(&y.lease_id));
    assert_eq!(leases_after, leases_before, "leases survive unchanged");
    assert_eq!(
        stored_hosts(&suite).await,
        hosts_before,
        "hosts (and cordons) survive"
    );
    suite.wait_counts(&a, 1, 1).await;
    suite.wait_counts(&b, 1, 1).await;

    let old_expiry = ts_nanos(
        &leases_before
            .iter()
            .find(|l| l.lease_id == kept.lease_id)
            .expect("kept")
            .expires_at,
    );
    let renewed = expect_ok(
        suite.heartbeat(&kept.lease_id).await,
        "Heartbeat with a pre-restart lease",
    );
    assert!(renewed > old_expiry);
    let replay = expect_ok(
        suite.claim(&a, "kept-1").await,
        "replay of a pre-restart request_id",
    );
    assert_eq!(
        (replay.lease_id.as_str(), replay.vm_uid.as_str()),
        (kept.lease_id.as_str(), kept.vm_uid.as_str())
    );
    let out = suite.exec_in_vm(&kept.vm_uid, "cat marks").await;
    assert_eq!(out.stdout, "a\n");

    let mut replayed = suite.subscribe(None).await;
    let n = events_before.len();
    replayed
        .wait_until("the pre-restart events replayed", |h| {
            (h.len() >= n).then_some(())
        })
        .await;
    assert_eq!(
        &replayed.history()[..n],
        &events_before[..],
        "old events replay unchanged"
    );
    let last_old = events_before.last().expect("events").id;
    expect_ok(
        suite.release(&kept.lease_id).await,
        "ReleaseVM of a pre-restart lease",
    );
    let released = replayed.wait_vm(&kept.vm_uid, VmDeletedOnRelease).await;
    assert!(released.id > last_old, "event ids continue after a restart");
    suite.expect_vm_gone(&kept.vm_uid).await;
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_abandons_claims_in_their_pre_lease_hook() {
    let Some(mut suite) = Suite::start_with(persistent()).await else {
        return;
    };
    let gate = Gate::new();
    let spec = suite
        .pool("inflight")
        .pre_lease_commands(&[gate.wait_command()]);
    let pool = suite.create_ready_pool(spec.build()).await;
    let claiming = {
        let req = ClaimVmRequest {
            pool: Some(pool.clone()),
            request_id: "inflight-1".into(),
        };
        let mut client = suite.lease_client();
        tokio::spawn(async move { client.claim_vm(req).await })
    };
    suite
        .wait_status(&pool, "the claim is in its pre-lease hook", |s| {
            s.leased_count == 1
        })
        .await;
    let mut log = suite.subscribe(Some(&pool)).await;
    let uid = log.wait_nth_vm(&pool, EventType::VmAvailable, 1).await;

    suite.restart().await;
    gate.open();
    let claim = claiming.await.expect("claim task");
    assert!(
        claim.is_err(),
        "a claim cut by the restart does not succeed: {claim:?}"
    );

    // At startup the PRE_LEASE_HOOK_RUNNING VM is marked DELETING; the sweeper deletes
    // it, and without a lease row that reads as an expiry.
    let mut log = suite.subscribe(Some(&pool)).await;
    log.wait_vm(&uid, VmDeletedDueToExpiry).await;
    suite.wait_vm_gone(&uid).await;
    assert!(
        suite.leases(Some(&pool)).await.is_empty(),
        "no lease from the abandoned claim"
    );
    suite.wait_counts(&pool, 1, 0).await;
    let fresh = expect_ok(
        suite.claim(&pool, "inflight-1").await,
        "the request_id was never taken",
    );
    assert_ne!(fresh.vm_uid, uid);
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_hook_fails_vms_in_flight() {
    let Some(mut suite) = Suite::start_with(persistent()).await else {
        return;
    };
    let gate = Gate::new();
    let spec = suite
        .pool("booting")
        .size(2)
        .create_commands(&[gate.wait_command()]);
    let (pool, _, booting) = suite.create_booting(spec.build(), 2).await;

    // A graceful stop cancels every reconciler and waits for it: the VMs it was bringing
    // up fail through the pool's policy (deleted here) rather than stay PROVISIONING
    // and counted for good.
    suite.restart().await;
    gate.open();
    let mut log = suite.subscribe(Some(&pool)).await;
    suite.wait_hook_failed(&mut log, &booting).await;
    for uid in &booting {
        suite.wait_vm_gone(uid).await;
    }
    suite.wait_counts(&pool, 2, 0).await;
    let fresh = log.wait_vms(&pool, EventType::VmAvailable, 2).await;
    assert!(
        fresh.iter().all(|uid| !booting.contains(uid)),
        "the pool filled with new VMs: {fresh:?}"
    );
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_deletion_finishes_after_a_restart() {
    let Some(mut suite) = Suite::start_with(persistent().hosts(1)).await else {
        return;
    };
    let host = suite.hosts()[0].name.clone();
    let pool = suite.create_ready_pool(suite.pool("pending").build()).await;
    let claimed = suite.claim_ok(&pool).await;
    suite.sim_host(&host).faults().fail_deletes(true);
    let what = "ReleaseVM while the host cannot delete";
    expect_code(
        suite.release(&claimed.lease_id).await,
        Code::Unavailable,
        what,
    );

    suite.restart().await;
    suite.sim_host(&host).faults().fail_deletes(false);
    let mut log = suite.subscribe(Some(&pool)).await;
    log.wait_vm(&claimed.vm_uid, VmDeletedOnRelease).await;
    suite.expect_vm_gone(&claimed.vm_uid).await;
    expect_code(
        suite.release(&claimed.lease_id).await,
        Code::NotFound,
        "ReleaseVM once done",
    );
    suite.finish().await;
}
