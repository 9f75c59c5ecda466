//! VMs in flight (§4.2, §4.7), as poolmgrd handles them: UpdatePool and DeletePool stop
//! the pool's reconciler, and each VM it was still bringing up fails through the
//! hook-failure policy of the spec it was started with (VM_HOOK_FAILED); UpdatePool
//! does not wait for that, DeletePool does, for as long as the caller's deadline allows.

use std::time::Duration;

use battery_e2e::api::{DeletePoolRequest, EventType, HookFailurePolicy};
use battery_e2e::{Options, Suite, eventually, expect_code, expect_ok};
use tonic::{Code, Request};

use EventType::{VmAvailable, VmDeletedOnPoolDelete, VmHookFailed, VmProvisioned};

/// A create command that outlasts any test: its VMs stay in flight until cancelled.
const FOREVER: &str = "sleep 600";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_and_editing_a_filling_pool_cancels_its_vms_in_flight() {
    let suite = Suite::start().await;
    let v1 = suite
        .pool("filling")
        .size(2)
        .create_commands(&[FOREVER])
        .quarantine();
    // Both in flight before the update: one still to start would start under whichever
    // reconciler runs then, and a loaded machine decides which.
    let (pool, mut log, first) = suite.create_booting(v1.clone().build(), 2).await;

    // Scaled up while its VMs boot: the reconciler is replaced, and the VMs the old one
    // was bringing up fail under the old spec's policy (QUARANTINE), not the new one's.
    let v2 = v1.size(3).policy(HookFailurePolicy::DeleteAndReplace);
    suite.update_pool(v2.clone().build()).await;
    suite.wait_hook_failed(&mut log, &first).await;
    let second = suite.wait_in_flight(&mut log, &pool).await;

    // Edited while their replacements boot: those fail too, deleted, and the new create
    // command is what the pool's VMs run from now on.
    let v3 = v2.create_commands(&["echo edited > marks"]);
    suite.update_pool(v3.build()).await;
    suite.wait_hook_failed(&mut log, &second).await;
    let status = suite.wait_counts(&pool, 3, 0).await;
    assert_eq!(
        usize::try_from(status.quarantined_count),
        Ok(first.len()),
        "{status:?}"
    );
    let available = log.wait_vms(&pool, VmAvailable, 3).await;
    for uid in &available {
        let out = suite.exec_in_vm(uid, "cat marks").await;
        assert_eq!(
            out.stdout, "edited\n",
            "{uid} ran the edited create command"
        );
    }
    for uid in &first {
        suite.expect_vm(uid).await;
    }
    for uid in &second {
        suite.wait_vm_gone(uid).await;
    }
    for uid in log.vms_with(&pool, VmProvisioned) {
        let types = log.types_of(&uid);
        assert!(
            types == [VmProvisioned, VmAvailable] || types == [VmProvisioned, VmHookFailed],
            "each VM either came up or was hook-failed, once: {uid} {types:?}"
        );
    }
    let expected = 3 + first.len();
    eventually(
        suite.timing().timeout,
        "the kept VMs alone on the Hosts",
        async || {
            let n = suite.pool_vms_on_hosts(&pool).await.len();
            if n == expected {
                Ok(())
            } else {
                Err(format!("{n} MicroVMs, {expected} expected"))
            }
        },
    )
    .await;
    suite.finish().await;
}

/// DeletePool while every VM of the pool is still in its create hook.
async fn delete_while_filling(policy: HookFailurePolicy) {
    let suite = Suite::start().await;
    let name = format!(
        "filling-{}",
        policy.as_str_name().to_lowercase().replace('_', "-")
    );
    let spec = suite
        .pool(&name)
        .size(3)
        .create_commands(&[FOREVER])
        .policy(policy);
    let (pool, mut log, booting) = suite.create_booting(spec.build(), 3).await;
    expect_ok(
        suite.delete_pool(&pool, false).await,
        "DeletePool while its VMs boot",
    );
    expect_code(
        suite.get_pool(&pool).await,
        Code::NotFound,
        "GetPool after delete",
    );
    // DeletePool waited for the reconciler: each VM was hook-failed before the
    // tombstone. A deleted one has no row left to mark; a quarantined one is drained.
    suite.wait_hook_failed(&mut log, &booting).await;
    let expected = if policy == HookFailurePolicy::Quarantine {
        for uid in &booting {
            log.wait_vm(uid, VmDeletedOnPoolDelete).await;
        }
        vec![VmProvisioned, VmHookFailed, VmDeletedOnPoolDelete]
    } else {
        log.observe(suite.timing().settle()).await;
        vec![VmProvisioned, VmHookFailed]
    };
    for uid in &booting {
        assert_eq!(log.types_of(uid), expected, "{}", log.describe());
    }
    assert!(suite.leases(Some(&pool)).await.is_empty());
    suite.wait_pool_vms_gone(&pool).await;
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_filling_pool_deletes_its_vms_in_flight() {
    delete_while_filling(HookFailurePolicy::DeleteAndReplace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_filling_pool_quarantines_then_drains_its_vms_in_flight() {
    delete_while_filling(HookFailurePolicy::Quarantine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_pool_cut_short_by_its_deadline_keeps_the_pool() {
    let options = Options::new()
        .embedded_only("holds a simulated Host's deletes")
        .hosts(1);
    let Some(suite) = Suite::start_with(options).await else {
        return;
    };
    let host = suite.hosts()[0].name.clone();
    let spec = suite.pool("slow").create_commands(&[FOREVER]);
    let pool = suite.create_pool(spec.build()).await;
    let mut log = suite.subscribe(Some(&pool)).await;
    let booting = suite.wait_in_flight(&mut log, &pool).await;

    // The Host holds its deletes, so the cancelled VM's cleanup (its DeleteMicroVM)
    // waits, and DeletePool with it, until the caller's deadline ends the call.
    suite.sim_host(&host).faults().hold_deletes(true);
    let mut request = Request::new(DeletePoolRequest {
        r#ref: Some(pool.clone()),
        force: false,
    });
    request.set_timeout(Duration::from_secs(1));
    let cut = suite.pool_admin().delete_pool(request).await;
    match cut {
        Err(status) if matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled) => {}
        other => panic!("DeletePool past its deadline: {other:?}"),
    }
    expect_ok(
        suite.get_pool(&pool).await,
        "the pool survives a DeletePool cut short",
    );

    // Once the Host deletes, the cleanup ends; the restarted reconciler replaces the VM,
    // and a DeletePool given time cancels that one too.
    suite.sim_host(&host).faults().hold_deletes(false);
    suite.wait_hook_failed(&mut log, &booting).await;
    let replacement = suite.wait_in_flight(&mut log, &pool).await;
    expect_ok(suite.delete_pool(&pool, false).await, "DeletePool");
    suite.wait_hook_failed(&mut log, &replacement).await;
    suite.wait_pool_vms_gone(&pool).await;
    suite.finish().await;
}
