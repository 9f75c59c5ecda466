//! DeletePool (§3.2, §4.7): refused while leased, forced deletes ending leases,
//! draining VMs in every phase, VM_DELETED_ON_POOL_DELETE, claims failed by it.

use battery_e2e::api::{ClaimVmRequest, EventType, PoolRef};
use battery_e2e::{EventLog, Gate, Options, Suite, expect_code, expect_ok};
use tonic::Code;

/// The deletion events (and hook failures, which also end a VM) of `uid`.
fn endings(log: &EventLog, uid: &str) -> Vec<EventType> {
    log.types_of(uid)
        .into_iter()
        .filter(|t| {
            matches!(
                t,
                EventType::VmDeletedOnRelease
                    | EventType::VmDeletedDueToExpiry
                    | EventType::VmDeletedOnPoolDelete
                    | EventType::VmHookFailed
            )
        })
        .collect()
}

/// Waits for `n` VM_DELETED_ON_POOL_DELETE events and returns their VMs. They are
/// emitted after everything else the pool did (its reconciler is stopped first), so by
/// then every VM ever provisioned must have ended exactly once.
async fn wait_pool_deleted(log: &mut EventLog, pool: &PoolRef, n: usize) -> Vec<String> {
    let deleted: Vec<String> = log
        .wait_vms(pool, EventType::VmDeletedOnPoolDelete, n)
        .await;
    for uid in log.vms_with(pool, EventType::VmProvisioned) {
        let ends = endings(log, &uid);
        assert_eq!(
            ends.len(),
            1,
            "VM {uid} ends exactly once:\n{}",
            log.describe()
        );
    }
    deleted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_pool_refused_while_leased_then_drains() {
    let suite = Suite::start().await;
    let pool = suite
        .create_ready_pool(suite.pool("busy").size(2).build())
        .await;
    let mut log = suite.subscribe(Some(&pool)).await;
    let lease = suite.claim_ok(&pool).await;
    for _ in 0..2 {
        expect_code(
            suite.delete_pool(&pool, false).await,
            Code::FailedPrecondition,
            "DeletePool while a VM is leased",
        );
    }
    expect_ok(
        suite.get_pool(&pool).await,
        "the pool survives a refused delete",
    );
    expect_ok(
        suite.heartbeat(&lease.lease_id).await,
        "the lease survives a refused delete",
    );
    suite.claim_ok(&pool).await;
    let second = suite.leases(Some(&pool)).await;
    assert_eq!(second.len(), 2);
    for l in &second {
        expect_ok(suite.release(&l.lease_id).await, "ReleaseVM");
    }
    // The refused delete left the reconciler running: both released VMs are replaced.
    suite.wait_counts(&pool, 2, 0).await;
    let available: Vec<String> = log.wait_vms(&pool, EventType::VmAvailable, 4).await;

    expect_ok(
        suite.delete_pool(&pool, false).await,
        "DeletePool without leases",
    );
    expect_code(
        suite.get_pool(&pool).await,
        Code::NotFound,
        "GetPool after delete",
    );
    expect_code(
        suite.delete_pool(&pool, false).await,
        Code::NotFound,
        "DeletePool twice",
    );
    let on_delete = wait_pool_deleted(&mut log, &pool, 2).await;
    let released: Vec<String> = second.iter().map(|l| l.vm_uid.clone()).collect();
    let mut expected: Vec<String> = available
        .into_iter()
        .filter(|u| !released.contains(u))
        .collect();
    let mut got = on_delete.clone();
    expected.sort();
    got.sort();
    assert_eq!(
        got, expected,
        "VM_DELETED_ON_POOL_DELETE for exactly the remaining VMs"
    );
    for uid in &released {
        assert_eq!(endings(&log, uid), vec![EventType::VmDeletedOnRelease]);
    }
    suite.wait_pool_vms_gone(&pool).await;
    assert!(suite.list_pools(Some(&pool.namespace)).await.is_empty());
    // The name is free again.
    suite.create_pool(suite.pool("busy").size(0).build()).await;
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_delete_pool_ends_leases() {
    let suite = Suite::start().await;
    let pool = suite
        .create_ready_pool(suite.pool("forced").size(3).build())
        .await;
    let mut log = suite.subscribe(Some(&pool)).await;
    let a = expect_ok(suite.claim(&pool, "forced-a").await, "ClaimVM a");
    let b = expect_ok(suite.claim(&pool, "forced-b").await, "ClaimVM b");
    suite.wait_counts(&pool, 1, 2).await;
    let all_vms: Vec<String> = log.wait_vms(&pool, EventType::VmAvailable, 3).await;

    expect_ok(suite.delete_pool(&pool, true).await, "forced DeletePool");
    expect_code(
        suite.get_pool(&pool).await,
        Code::NotFound,
        "GetPool after forced delete",
    );
    for lease in [&a, &b] {
        let id = &lease.lease_id;
        expect_code(
            suite.heartbeat(id).await,
            Code::NotFound,
            "Heartbeat of a forced-deleted lease",
        );
        expect_code(
            suite.release(id).await,
            Code::NotFound,
            "ReleaseVM of a forced-deleted lease",
        );
        assert!(
            suite.lease(id).await.is_none(),
            "lease {id} is gone from ListLeases"
        );
    }
    assert!(suite.leases(Some(&pool)).await.is_empty());
    expect_code(
        suite.claim(&pool, "forced-a").await,
        Code::NotFound,
        "replay after the pool is gone",
    );

    let mut on_delete = wait_pool_deleted(&mut log, &pool, 3).await;
    let mut expected = all_vms.clone();
    on_delete.sort();
    expected.sort();
    assert_eq!(
        on_delete, expected,
        "every VM, leased or not, gets VM_DELETED_ON_POOL_DELETE"
    );
    for uid in &all_vms {
        assert_eq!(endings(&log, uid), vec![EventType::VmDeletedOnPoolDelete]);
    }
    suite.wait_pool_vms_gone(&pool).await;
    let later = log.observe(suite.timing().settle()).await;
    assert!(
        later.is_empty(),
        "nothing happens in a deleted pool: {later:?}"
    );
    assert!(
        suite.pool_vms_on_hosts(&pool).await.is_empty(),
        "no VM provisioned after the delete"
    );
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_pool_drains_vms_still_being_created() {
    let Some(suite) =
        Suite::start_with(Options::new().embedded_only("gates create hooks on a local file")).await
    else {
        return;
    };
    let gate = Gate::new();
    let spec = suite
        .pool("drain")
        .size(2)
        .create_commands(&[gate.wait_command()]);
    let (pool, mut log, booting) = suite.create_booting(spec.build(), 2).await;
    expect_ok(
        suite.delete_pool(&pool, false).await,
        "DeletePool while VMs are provisioning",
    );
    // DeletePool waits for the pool's reconciler, whose cancelled provisions fail
    // through the policy (DELETE_AND_REPLACE): their rows are gone before the tombstone,
    // so they get VM_HOOK_FAILED and no VM_DELETED_ON_POOL_DELETE.
    suite.wait_hook_failed(&mut log, &booting).await;
    gate.open();
    log.observe(suite.timing().settle()).await;
    for uid in &booting {
        assert_eq!(
            endings(&log, uid),
            vec![EventType::VmHookFailed],
            "a VM cancelled by DeletePool ends once, hook-failed:\n{}",
            log.describe()
        );
        assert!(!log.types_of(uid).contains(&EventType::VmAvailable));
    }
    suite.wait_pool_vms_gone(&pool).await;
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_delete_fails_a_claim_in_its_pre_lease_hook() {
    let Some(suite) =
        Suite::start_with(Options::new().embedded_only("gates pre-lease hooks on a local file"))
            .await
    else {
        return;
    };
    let gate = Gate::new();
    let spec = suite
        .pool("abort")
        .pre_lease_commands(&[gate.wait_command()]);
    let pool = suite.create_ready_pool(spec.build()).await;
    let mut log = suite.subscribe(Some(&pool)).await;
    let uid = log.wait_nth_vm(&pool, EventType::VmAvailable, 1).await;
    let claiming = {
        let req = ClaimVmRequest {
            pool: Some(pool.clone()),
            request_id: "abort-1".into(),
        };
        let mut client = suite.lease_client();
        tokio::spawn(async move { client.claim_vm(req).await.map(|r| r.into_inner()) })
    };
    suite
        .wait_status(&pool, "the claim is in its pre-lease hook", |s| {
            s.leased_count == 1
        })
        .await;
    expect_code(
        suite.delete_pool(&pool, false).await,
        Code::FailedPrecondition,
        "DeletePool while a claim runs its pre-lease hook",
    );
    expect_ok(
        suite.delete_pool(&pool, true).await,
        "forced DeletePool during the claim",
    );
    // The drain deleted the MicroVM under the running hook, which poolmgrd takes as the
    // hook failing (its drain design accepts this): INTERNAL, and VM_HOOK_FAILED after
    // VM_DELETED_ON_POOL_DELETE.
    gate.open();
    let claimed = claiming.await.expect("claim task");
    expect_code(
        claimed,
        Code::Internal,
        "ClaimVM whose MicroVM was deleted under its pre-lease hook",
    );
    log.wait_vm(&uid, EventType::VmHookFailed).await;
    assert_eq!(
        log.types_of(&uid),
        [
            EventType::VmProvisioned,
            EventType::VmAvailable,
            EventType::VmDeletedOnPoolDelete,
            EventType::VmHookFailed
        ]
    );
    assert!(
        suite.leases(Some(&pool)).await.is_empty(),
        "no lease left on the deleted pool"
    );
    expect_code(
        suite.claim(&pool, "abort-1").await,
        Code::NotFound,
        "retry after the pool is gone",
    );
    suite.wait_pool_vms_gone(&pool).await;
    suite.finish().await;
}
