//! Create and pre-lease hooks run through the Host's exec API, and the hook-failure
//! policies (§3.1, §4.1): DELETE_AND_REPLACE deletes the VM directly, QUARANTINE keeps
//! it; both emit VM_HOOK_FAILED and no VM_DELETED_* event.

use battery_e2e::api::{EventType, HookFailurePolicy};
use battery_e2e::{Options, Suite, expect_code};
use tonic::Code;

use EventType::{VmAvailable, VmHookFailed, VmProvisioned};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_and_pre_lease_commands_run_in_the_vm() {
    let suite = Suite::start().await;
    let spec = suite
        .pool("hooks")
        .size(2)
        .create_commands(&["echo created > marks", "echo again >> marks"])
        .pre_lease_commands(&["echo claimed >> marks"]);
    let pool = suite.create_ready_pool(spec.build()).await;
    let mut log = suite.subscribe(Some(&pool)).await;
    let uids: Vec<String> = log.wait_vms(&pool, VmAvailable, 2).await;
    for uid in &uids {
        let out = suite.exec_in_vm(uid, "cat marks").await;
        assert_eq!(
            out.stdout, "created\nagain\n",
            "create commands ran in order in {uid}"
        );
    }
    let lease = suite.claim_ok(&pool).await;
    let claimed = suite.exec_in_vm(&lease.vm_uid, "cat marks").await;
    assert_eq!(
        claimed.stdout, "created\nagain\nclaimed\n",
        "the pre-lease command ran before ClaimVM returned"
    );
    let other = uids
        .iter()
        .find(|u| **u != lease.vm_uid)
        .expect("the other VM");
    let unclaimed = suite.exec_in_vm(other, "cat marks").await;
    assert_eq!(
        unclaimed.stdout, "created\nagain\n",
        "pre-lease commands run only on claim"
    );
    assert!(log.vms_with(&pool, VmHookFailed).is_empty());
    suite.finish().await;
}

/// A failing create command: each VM fails its hook and is replaced.
async fn failing_create_command(policy: HookFailurePolicy) {
    let suite = Suite::start().await;
    let name = format!(
        "bad-create-{}",
        policy.as_str_name().to_lowercase().replace('_', "-")
    );
    let spec = suite
        .pool(&name)
        .create_commands(&["exit 3"])
        .policy(policy);
    let pool = suite.create_pool(spec.build()).await;
    let mut log = suite.subscribe(Some(&pool)).await;
    let failed = log.wait_pool_n(&pool, VmHookFailed, 2).await;
    let first = &failed[0].vm_uid;
    assert_ne!(
        first, &failed[1].vm_uid,
        "a failed VM is replaced by a new one"
    );
    assert_eq!(
        log.types_of(first),
        vec![VmProvisioned, VmHookFailed],
        "a hook failure emits VM_HOOK_FAILED and no VM_DELETED_* event"
    );
    match policy {
        HookFailurePolicy::Quarantine => {
            let (_, vm) = suite.expect_vm(first).await;
            assert!(vm.spec.is_some(), "a quarantined VM is kept");
            suite
                .wait_status(&pool, "quarantined VMs counted", |s| {
                    s.quarantined_count >= 2 && s.available_count == 0
                })
                .await;
        }
        _ => {
            suite.wait_vm_gone(first).await;
            let status = suite.status(&pool).await;
            assert_eq!((status.available_count, status.quarantined_count), (0, 0));
        }
    }
    let claim = suite.claim(&pool, "").await;
    expect_code(
        claim,
        Code::ResourceExhausted,
        "ClaimVM with no VM past its create hook",
    );
    if policy == HookFailurePolicy::Quarantine {
        // Quarantined VMs stay until their pool is deleted.
        suite.delete_pool(&pool, false).await.expect("DeletePool");
        log.wait_vm(first, EventType::VmDeletedOnPoolDelete).await;
        suite.wait_vm_gone(first).await;
    }
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_create_command_deletes_and_replaces() {
    failing_create_command(HookFailurePolicy::DeleteAndReplace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_create_command_quarantines() {
    failing_create_command(HookFailurePolicy::Quarantine).await;
}

/// A failing pre-lease command: ClaimVM answers INTERNAL and the policy is applied.
async fn failing_pre_lease_command(policy: HookFailurePolicy) {
    let suite = Suite::start().await;
    let spec = suite
        .pool("bad-claim")
        .pre_lease_commands(&["exit 7"])
        .policy(policy);
    let pool = suite.create_ready_pool(spec.build()).await;
    let mut log = suite.subscribe(Some(&pool)).await;
    let uid = log.wait_nth_vm(&pool, VmAvailable, 1).await;

    let status = expect_code(suite.claim(&pool, "bad-1").await, Code::Internal, "ClaimVM");
    assert!(
        status.message().contains("pre-lease"),
        "INTERNAL names the pre-lease hook: {:?}",
        status.message()
    );
    log.wait_vm(&uid, VmHookFailed).await;
    assert!(
        suite.leases(Some(&pool)).await.is_empty(),
        "a failed claim leaves no lease"
    );
    // The failed VM is replaced either way.
    let replacement = log.wait_nth_vm(&pool, VmAvailable, 2).await;
    assert_ne!(replacement, uid);
    match policy {
        HookFailurePolicy::Quarantine => {
            suite
                .wait_status(&pool, "1 quarantined, 1 available", |s| {
                    s.quarantined_count == 1 && s.available_count == 1 && s.leased_count == 0
                })
                .await;
            suite.expect_vm(&uid).await;
        }
        _ => {
            suite.wait_counts(&pool, 1, 0).await;
            assert_eq!(suite.status(&pool).await.quarantined_count, 0);
            suite.wait_vm_gone(&uid).await;
        }
    }
    assert_eq!(
        log.types_of(&uid),
        vec![VmProvisioned, VmAvailable, VmHookFailed],
        "no VM_CLAIMED and no VM_DELETED_* for a VM that failed its pre-lease hook"
    );
    // The request_id is not taken by the failed claim.
    let retried = expect_code(
        suite.claim(&pool, "bad-1").await,
        Code::Internal,
        "ClaimVM again",
    );
    assert!(retried.message().contains("pre-lease"));
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_pre_lease_command_deletes_and_replaces() {
    failing_pre_lease_command(HookFailurePolicy::DeleteAndReplace).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_pre_lease_command_quarantines() {
    failing_pre_lease_command(HookFailurePolicy::Quarantine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_failure_is_a_hook_failure() {
    let options = Options::new().embedded_only("injects host faults").hosts(1);
    let Some(suite) = Suite::start_with(options).await else {
        return;
    };
    suite
        .sim_host(&suite.hosts()[0].name)
        .faults()
        .fail_boot(true);
    let spec = suite.pool("no-boot").quarantine();
    let pool = suite.create_pool(spec.build()).await;
    let mut log = suite.subscribe(Some(&pool)).await;
    let failed = log.wait_nth_vm(&pool, VmHookFailed, 1).await;
    assert_eq!(log.types_of(&failed), vec![VmProvisioned, VmHookFailed]);
    suite
        .wait_status(&pool, "the VM that never booted is quarantined", |s| {
            s.quarantined_count >= 1 && s.available_count == 0
        })
        .await;
    suite
        .sim_host(&suite.hosts()[0].name)
        .faults()
        .fail_boot(false);
    suite
        .wait_status(&pool, "a replacement boots", |s| s.available_count == 1)
        .await;
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_creates_are_retried() {
    let options = Options::new().embedded_only("injects host faults").hosts(1);
    let Some(suite) = Suite::start_with(options).await else {
        return;
    };
    suite
        .sim_host(&suite.hosts()[0].name)
        .faults()
        .fail_creates(true);
    let pool = suite.create_pool(suite.pool("retry").build()).await;
    let mut log = suite.subscribe(Some(&pool)).await;
    suite.hold_counts(&pool, 0, 0).await;
    let seen = log.observe(std::time::Duration::from_millis(100)).await;
    assert!(
        seen.is_empty(),
        "a refused CreateMicroVM writes no VM and no event: {seen:?}"
    );
    suite
        .sim_host(&suite.hosts()[0].name)
        .faults()
        .fail_creates(false);
    suite.wait_counts(&pool, 1, 0).await;
    suite.finish().await;
}
