//! PoolAdmin: what CreatePool provisions, validation codes (§3.2), ListPools,
//! UpdatePool without scale-down, PoolStatus counts (§1.1).

use battery_e2e::api::{
    EventType, PoolRef, PoolSpec, ReplenishmentStrategy, ReplenishmentStrategyType,
};
use battery_e2e::fl::micro_vm_status::MicroVmState;
use battery_e2e::{Gate, Options, Suite, expect_code, expect_ok};
use tonic::Code;

const MAC: &str = "02:00:00:00:00:01";

/// A spec as battery stores and echoes it: poolmgrd's validator turns
/// `allow_guest_agent` on in the template.
fn as_stored(spec: &PoolSpec) -> PoolSpec {
    let mut spec = spec.clone();
    if let Some(t) = spec.microvm_template.as_mut() {
        t.allow_guest_agent = true;
    }
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_pool_provisions_the_template_on_hosts() {
    let suite = Suite::start().await;
    let ns = suite.namespace().to_owned();
    let spec = suite.pool("web").size(2).build();
    let created = expect_ok(suite.try_create_pool(spec.clone()).await, "CreatePool");
    assert_eq!(created.spec.expect("spec"), as_stored(&spec));
    let pool = PoolRef {
        name: "web".into(),
        namespace: ns.clone(),
    };
    suite.wait_counts(&pool, 2, 0).await;
    let got = expect_ok(suite.get_pool(&pool).await, "GetPool");
    assert_eq!(
        got.spec.expect("spec"),
        as_stored(&spec),
        "GetPool returns the spec"
    );

    let mut log = suite.subscribe(Some(&pool)).await;
    let uids: Vec<String> = log.wait_vms(&pool, EventType::VmAvailable, 2).await;
    let template = spec.microvm_template.expect("template");
    for uid in &uids {
        let (_, vm) = suite.expect_vm(uid).await;
        let vm_spec = vm.spec.expect("MicroVM spec");
        let suffix = vm_spec.id.strip_prefix("web-").unwrap_or_else(|| {
            panic!(
                "flintlock id {:?} is <pool name>-<8 chars> (§4.2)",
                vm_spec.id
            )
        });
        assert_eq!(suffix.len(), 8, "flintlock id {:?}", vm_spec.id);
        assert_eq!(
            vm_spec.namespace, ns,
            "an empty template namespace becomes the pool's"
        );
        assert!(vm_spec.allow_guest_agent, "allow_guest_agent is forced on");
        assert_eq!(
            (vm_spec.vcpu, vm_spec.memory_in_mb),
            (template.vcpu, template.memory_in_mb)
        );
        assert_eq!(vm_spec.interfaces.len(), template.interfaces.len());
        let state = vm.status.expect("MicroVM status").state;
        assert_eq!(
            state,
            MicroVmState::Created as i32,
            "available VMs are CREATED"
        );
    }
    let ids: Vec<String> = suite
        .pool_vms_on_hosts(&pool)
        .await
        .into_iter()
        .filter_map(|vm| vm.spec.and_then(|s| s.uid))
        .collect();
    assert_eq!(ids.len(), 2, "exactly size MicroVMs exist: {ids:?}");

    // A template namespace of its own is kept.
    let mut template_ns = suite.pool("tmpl").build();
    let own_ns = format!("{ns}-own");
    template_ns
        .microvm_template
        .as_mut()
        .expect("template")
        .namespace = own_ns.clone();
    let tmpl = suite.create_ready_pool(template_ns).await;
    let mut log = suite.subscribe(Some(&tmpl)).await;
    let uid = log.wait_nth_vm(&tmpl, EventType::VmAvailable, 1).await;
    let (_, vm) = suite.expect_vm(&uid).await;
    assert_eq!(
        vm.spec.expect("spec").namespace,
        own_ns,
        "a template namespace is kept"
    );
    suite.finish().await;
}

/// Specs CreatePool and UpdatePool must refuse with INVALID_ARGUMENT (§3.2).
fn invalid_specs(suite: &Suite, name: &str) -> Vec<(&'static str, PoolSpec)> {
    let base = || suite.pool(name);
    let strategy = |kind: i32, min_size: Option<i32>| {
        Some(ReplenishmentStrategy {
            r#type: kind,
            min_size,
        })
    };
    let unknown_host = format!("{}-no-such-host", suite.namespace());
    let mut hosts_with_unknown = suite.host_names();
    hosts_with_unknown.push(unknown_host.clone());
    let mst = ReplenishmentStrategyType::MinSizeThreshold as i32;
    vec![
        ("empty name", base().name("").build()),
        ("empty namespace", base().namespace("").build()),
        ("no replenishment strategy", base().strategy(None).build()),
        (
            "UNSPECIFIED strategy",
            base().strategy(strategy(0, None)).build(),
        ),
        (
            "unknown strategy",
            base().strategy(strategy(42, None)).build(),
        ),
        (
            "MIN_SIZE_THRESHOLD without min_size",
            base().strategy(strategy(mst, None)).build(),
        ),
        (
            "MIN_SIZE_THRESHOLD with min_size 0",
            base().min_size_threshold(0).build(),
        ),
        (
            "MIN_SIZE_THRESHOLD with min_size -1",
            base().min_size_threshold(-1).build(),
        ),
        (
            "UNSPECIFIED hook failure policy",
            base().raw_policy(0).build(),
        ),
        ("unknown hook failure policy", base().raw_policy(9).build()),
        ("no template", base().template(None).build()),
        (
            "guest_mac with size 2",
            base().size(2).guest_mac(MAC).build(),
        ),
        (
            "static address with IMMEDIATE_ON_LEASE",
            base()
                .immediate_on_lease()
                .static_address("10.0.0.5/24")
                .build(),
        ),
        (
            "guest_mac with QUARANTINE",
            base().quarantine().guest_mac(MAC).build(),
        ),
        ("unknown host", base().hosts(&[unknown_host]).build()),
        (
            "an unknown host among known ones",
            base().hosts(&hosts_with_unknown).build(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_admin_validation_codes() {
    let suite = Suite::start().await;
    let existing_spec = suite.pool("existing").size(0).build();
    let existing = suite.create_pool(existing_spec.clone()).await;
    let fresh = suite.pool_ref("fresh");
    let missing = suite.pool_ref("missing");

    for (what, spec) in invalid_specs(&suite, "fresh") {
        expect_code(
            suite.try_create_pool(spec).await,
            Code::InvalidArgument,
            what,
        );
        expect_code(suite.get_pool(&fresh).await, Code::NotFound, what);
    }
    for (what, spec) in invalid_specs(&suite, "existing") {
        let what = format!("UpdatePool: {what}");
        expect_code(
            suite.try_update_pool(spec).await,
            Code::InvalidArgument,
            &what,
        );
    }
    let got = expect_ok(suite.get_pool(&existing).await, "GetPool");
    assert_eq!(got.spec.expect("spec"), as_stored(&existing_spec));
    // Validation and the host check come before the existence check.
    for (what, spec) in invalid_specs(&suite, "missing") {
        let what = format!("UpdatePool of a missing pool: {what}");
        expect_code(
            suite.try_update_pool(spec).await,
            Code::InvalidArgument,
            &what,
        );
    }
    let dup_bad_host = suite
        .pool("existing")
        .hosts(&["no-such-host-anywhere"])
        .build();
    expect_code(
        suite.try_create_pool(dup_bad_host).await,
        Code::InvalidArgument,
        "CreatePool of an existing name with an unknown host",
    );

    expect_code(
        suite.try_create_pool(existing_spec.clone()).await,
        Code::AlreadyExists,
        "CreatePool twice",
    );
    expect_code(
        suite.try_update_pool(suite.pool("missing").build()).await,
        Code::NotFound,
        "UpdatePool of a missing pool",
    );
    expect_code(suite.get_pool(&missing).await, Code::NotFound, "GetPool");
    for force in [false, true] {
        let what = format!("DeletePool of a missing pool (force={force})");
        expect_code(
            suite.delete_pool(&missing, force).await,
            Code::NotFound,
            &what,
        );
    }
    // UpdatePool is safe to repeat.
    for _ in 0..2 {
        suite.update_pool(existing_spec.clone()).await;
    }

    // Accepted edge cases: size 0, and static networking in a pool of at most one VM.
    let static_mac = suite.pool("static-mac").guest_mac(MAC).build();
    expect_ok(
        suite.try_create_pool(static_mac).await,
        "guest_mac, size 1, REPLACE_ON_DELETE",
    );
    let static_ip = suite
        .pool("static-ip")
        .min_size_threshold(1)
        .static_address("10.0.0.5/24");
    expect_ok(
        suite.try_create_pool(static_ip.build()).await,
        "static address, size 1, MIN_SIZE_THRESHOLD",
    );
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pools_filters_by_namespace_presence() {
    let suite = Suite::start().await;
    let ns = suite.namespace().to_owned();
    let other_ns = format!("{ns}-other");
    for spec in [
        suite.pool("a").size(0).build(),
        suite.pool("b").size(0).build(),
        suite.pool("c").size(0).namespace(&other_ns).build(),
    ] {
        suite.create_pool(spec).await;
    }
    let names = |pools: Vec<battery_e2e::api::Pool>, ns_prefix: &str| -> Vec<(String, String)> {
        let mut names: Vec<(String, String)> = pools
            .into_iter()
            .map(|p| p.spec.expect("spec"))
            .filter(|s| s.namespace.starts_with(ns_prefix))
            .map(|s| (s.namespace, s.name))
            .collect();
        names.sort();
        names
    };
    let pair = |n: &str, name: &str| (n.to_owned(), name.to_owned());
    assert_eq!(
        names(suite.list_pools(Some(&ns)).await, ""),
        vec![pair(&ns, "a"), pair(&ns, "b")],
        "namespace set: exactly that namespace's pools"
    );
    assert_eq!(
        names(suite.list_pools(Some(&other_ns)).await, ""),
        vec![pair(&other_ns, "c")]
    );
    assert_eq!(
        names(suite.list_pools(None).await, &ns),
        vec![pair(&ns, "a"), pair(&ns, "b"), pair(&other_ns, "c")],
        "namespace unset: all namespaces"
    );
    assert!(
        suite.list_pools(Some("")).await.is_empty(),
        "namespace set to \"\" filters to namespace \"\" (no pool can live there)"
    );
    for pool in suite.list_pools(Some(&ns)).await {
        assert!(pool.status.is_some(), "listed pools carry a status");
    }
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_pool_grows_without_rollout_or_scale_down() {
    let suite = Suite::start().await;
    let v1 = suite.pool("grow").create_commands(&["echo v1 > version"]);
    let pool = suite.create_ready_pool(v1.clone().build()).await;
    let mut log = suite.subscribe(Some(&pool)).await;
    let first = log.wait_nth_vm(&pool, EventType::VmAvailable, 1).await;

    let v2 = v1.size(3).create_commands(&["echo v2 > version"]);
    let updated = suite.update_pool(v2.clone().build()).await;
    assert_eq!(
        updated.spec.expect("spec").size,
        3,
        "UpdatePool returns the new spec"
    );
    suite.wait_counts(&pool, 3, 0).await;
    let uids: Vec<String> = log.wait_vms(&pool, EventType::VmAvailable, 3).await;
    for uid in &uids {
        let expected = if *uid == first { "v1" } else { "v2" };
        let out = suite.exec_in_vm(uid, "cat version").await;
        assert_eq!(
            out.stdout.trim(),
            expected,
            "VM {uid}: new VMs use the new spec, existing ones are untouched (no rollout)"
        );
    }

    let shrunk = suite.update_pool(v2.size(1).build()).await;
    assert_eq!(shrunk.spec.expect("spec").size, 1);
    suite.hold_counts(&pool, 3, 0).await;
    assert_eq!(
        suite.pool_vms_on_hosts(&pool).await.len(),
        3,
        "no scale-down"
    );
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_status_counts_each_phase() {
    let Some(suite) =
        Suite::start_with(Options::new().embedded_only("gates hooks on a local file")).await
    else {
        return;
    };
    let create_gate = Gate::new();
    let claim_gate = Gate::new();
    let spec = suite
        .pool("counts")
        .size(2)
        .create_commands(&[create_gate.wait_command()])
        .pre_lease_commands(&[claim_gate.wait_command()])
        .build();
    let pool = suite.create_pool(spec).await;
    suite
        .wait_status(
            &pool,
            "both VMs running create hooks count as provisioning",
            |s| s.provisioning_count == 2 && s.available_count == 0 && s.leased_count == 0,
        )
        .await;
    create_gate.open();
    suite.wait_counts(&pool, 2, 0).await;

    let claiming = {
        let pool = pool.clone();
        let mut client = suite.lease_client();
        tokio::spawn(async move {
            let req = battery_e2e::api::ClaimVmRequest {
                pool: Some(pool),
                request_id: String::new(),
            };
            client.claim_vm(req).await
        })
    };
    suite
        .wait_status(
            &pool,
            "a claim in its pre-lease hook counts as leased",
            |s| s.leased_count == 1 && s.available_count == 1 && s.provisioning_count == 0,
        )
        .await;
    assert!(
        suite.leases(Some(&pool)).await.is_empty(),
        "no lease before the hook finished"
    );
    claim_gate.open();
    let claimed = expect_ok(claiming.await.expect("claim task"), "ClaimVM").into_inner();
    suite.wait_counts(&pool, 1, 1).await;
    assert_eq!(suite.leases(Some(&pool)).await.len(), 1);
    assert!(!claimed.lease_id.is_empty());
    assert_eq!(suite.status(&pool).await.quarantined_count, 0);
    suite.finish().await;
}
