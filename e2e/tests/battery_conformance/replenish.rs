//! Replenishment (§4.2): the three strategies' target formulas, host choice (fewest of
//! the pool's VMs, list order on ties, cordoned skipped, one host for a whole pass),
//! passes that wait for their provisions, static-network pools.

use std::time::Duration;

use battery_e2e::api::EventType;
use battery_e2e::{
    Gate, HostRef, Options, PoolBuilder, Suite, consistently, expect_code, expect_ok,
};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_on_lease_grows_the_total_with_leases() {
    let suite = Suite::start().await;
    let spec = suite.pool("iol").size(2).immediate_on_lease();
    let pool = suite.create_ready_pool(spec.build()).await;
    // target = size - (available + claiming + provisioning): leased VMs are extra.
    let a = suite.claim_ok(&pool).await;
    suite.wait_counts(&pool, 2, 1).await;
    suite.claim_ok(&pool).await;
    suite.wait_counts(&pool, 2, 2).await;
    expect_ok(suite.release(&a.lease_id).await, "ReleaseVM");
    suite.hold_counts(&pool, 2, 1).await;
    assert_eq!(
        suite.pool_vms_on_hosts(&pool).await.len(),
        3,
        "2 warm + 1 leased"
    );
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_size_threshold_replenishes_only_below_min_size() {
    let suite = Suite::start().await;
    let spec = suite.pool("mst").size(3).min_size_threshold(2);
    let pool = suite.create_ready_pool(spec.build()).await;
    // 2 available is not below min_size 2: no top-up after a claim...
    let a = suite.claim_ok(&pool).await;
    suite.hold_counts(&pool, 2, 1).await;
    // ...nor after a delete.
    expect_ok(suite.release(&a.lease_id).await, "ReleaseVM");
    suite.hold_counts(&pool, 2, 0).await;
    // 1 available is below 2: top up by size - (available + leased) = 3 - 2 = 1.
    suite.claim_ok(&pool).await;
    suite.wait_counts(&pool, 2, 1).await;
    suite.hold_counts(&pool, 2, 1).await;
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_on_delete_tops_up_after_deletes_only() {
    let suite = Suite::start().await;
    let spec = suite.pool("rod").size(2).replace_on_delete();
    let pool = suite.create_ready_pool(spec.build()).await;
    // target = size - (available + claiming + leased + provisioning): a claim adds nothing.
    let a = suite.claim_ok(&pool).await;
    suite.hold_counts(&pool, 1, 1).await;
    expect_ok(suite.release(&a.lease_id).await, "ReleaseVM");
    suite.wait_counts(&pool, 2, 0).await;
    suite.hold_counts(&pool, 2, 0).await;
    suite.finish().await;
}

/// Grows `spec` to `size`, waits for it, and checks each Host's VM count.
async fn grow_to(suite: &Suite, spec: &PoolBuilder, size: i32, expect: &[(&HostRef, i32)]) {
    let pool = spec.pool_ref();
    suite.update_pool(spec.clone().size(size).build()).await;
    suite.wait_counts(&pool, size, 0).await;
    check_counts(suite, &format!("{} at size {size}", pool.name), expect).await;
}

async fn check_counts(suite: &Suite, when: &str, expect: &[(&HostRef, i32)]) {
    let mut got = Vec::new();
    for (host, _) in expect {
        got.push(suite.vm_count(&host.name).await);
    }
    let want: Vec<i32> = expect.iter().map(|(_, n)| *n).collect();
    assert_eq!(got, want, "VMs per host after {when}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_choice_prefers_fewest_of_the_pools_vms_and_skips_cordoned() {
    let suite = Suite::start().await;
    let h0 = suite.add_alias_host("h0", 0).await;
    let h1 = suite.add_alias_host("h1", 1).await;
    let p = suite.pool("p").size(1).hosts(&[&h0.name, &h1.name]);
    suite.create_ready_pool(p.clone().build()).await;
    check_counts(
        &suite,
        "p at size 1 (tie: first listed)",
        &[(&h0, 1), (&h1, 0)],
    )
    .await;
    grow_to(&suite, &p, 2, &[(&h0, 1), (&h1, 1)]).await;
    grow_to(&suite, &p, 3, &[(&h0, 2), (&h1, 1)]).await;

    expect_ok(suite.cordon(&h0.name, "conformance").await, "CordonHost");
    grow_to(&suite, &p, 4, &[(&h0, 2), (&h1, 2)]).await;
    grow_to(&suite, &p, 5, &[(&h0, 2), (&h1, 3)]).await; // the tie would pick h0

    // A pool whose only Host is cordoned provisions nothing...
    let r = suite.pool("r").hosts(&[&h0.name]);
    let r_ref = suite.create_pool(r.build()).await;
    suite.hold_counts(&r_ref, 0, 0).await;
    check_counts(&suite, "r on a cordoned host", &[(&h0, 2), (&h1, 3)]).await;
    // ...until it is uncordoned.
    expect_ok(suite.uncordon(&h0.name).await, "UncordonHost");
    suite.wait_counts(&r_ref, 1, 0).await;
    check_counts(&suite, "r after uncordon", &[(&h0, 3), (&h1, 3)]).await;

    // Counts are of this pool's VMs only: p has 2 on h0 and 3 on h1.
    grow_to(&suite, &p, 6, &[(&h0, 4), (&h1, 3)]).await;
    // A new pool ties at 0/0 and takes its first listed Host, whatever other pools hold.
    let q = suite.pool("q").hosts(&[&h0.name, &h1.name]);
    suite.create_ready_pool(q.build()).await;
    check_counts(&suite, "q listing h0 first", &[(&h0, 5), (&h1, 3)]).await;
    let q2 = suite.pool("q2").hosts(&[&h1.name, &h0.name]);
    suite.create_ready_pool(q2.build()).await;
    check_counts(&suite, "q2 listing h1 first", &[(&h0, 5), (&h1, 4)]).await;
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pass_places_all_its_vms_on_one_host() {
    let suite = Suite::start().await;
    let h0 = suite.add_alias_host("h0", 0).await;
    let h1 = suite.add_alias_host("h1", 1).await;
    let p = suite.pool("many").size(1).hosts(&[&h0.name, &h1.name]);
    suite.create_ready_pool(p.clone().build()).await;
    check_counts(&suite, "one VM (tie: first listed)", &[(&h0, 1), (&h1, 0)]).await;
    // One pass provisions the whole shortfall, and each of its picks counts the pool's
    // rows only, not the placements of the same pass: all go to the emptiest host.
    grow_to(&suite, &p, 9, &[(&h0, 1), (&h1, 8)]).await;
    grow_to(&suite, &p, 12, &[(&h0, 4), (&h1, 8)]).await;
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_waits_for_every_provision_it_started() {
    let options = Options::new().embedded_only("gates one VM's create hook on a local file");
    let Some(suite) = Suite::start_with(options).await else {
        return;
    };
    let gate = Gate::new();
    let spec = suite
        .pool("waits")
        .size(2)
        .immediate_on_lease()
        .create_commands(&[gate.first_waits_command()]);
    let pool = suite.create_pool(spec.build()).await;
    suite
        .wait_status(
            &pool,
            "one VM available, one held in its create hook",
            |s| s.available_count == 1 && s.provisioning_count == 1,
        )
        .await;
    let mut log = suite.subscribe(Some(&pool)).await;
    let held = suite.wait_in_flight(&mut log, &pool).await;
    // The claim nudges the reconciler and its ticks keep coming, but the pass that
    // provisioned both VMs has not returned: nothing is provisioned meanwhile.
    suite.claim_ok(&pool).await;
    let what = "no VM provisioned while the first pass waits on its held VM";
    consistently(suite.timing().settle(), what, async || {
        let s = suite.status(&pool).await;
        if (s.available_count, s.leased_count, s.provisioning_count) == (0, 1, 1) {
            Ok(())
        } else {
            Err(format!("{s:?}"))
        }
    })
    .await;
    gate.open();
    log.wait_vm(&held[0], EventType::VmAvailable).await;
    // The pass is over: the next tops the pool up.
    suite.wait_counts(&pool, 2, 1).await;
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_network_pool_waits_until_no_vm_row_is_left() {
    let options = Options::new()
        .embedded_only("injects host faults")
        .hosts(1)
        .sweep_interval(Duration::from_secs(3600));
    let Some(suite) = Suite::start_with(options).await else {
        return;
    };
    let host = suite.hosts()[0].name.clone();
    let spec = suite.pool("static").guest_mac("02:00:00:00:00:01");
    let pool = suite.create_ready_pool(spec.build()).await;
    let lease = suite.claim_ok(&pool).await;
    suite.sim_host(&host).faults().fail_deletes(true);
    expect_code(
        suite.release(&lease.lease_id).await,
        Code::Unavailable,
        "ReleaseVM while the host cannot delete",
    );
    // The VM's row is still there (DELETING): a static template provisions only into an
    // empty pool, although DELETING counts toward nothing.
    suite.hold_counts(&pool, 0, 0).await;
    suite.sim_host(&host).faults().fail_deletes(false);
    expect_ok(suite.release(&lease.lease_id).await, "ReleaseVM retried");
    suite.wait_counts(&pool, 1, 0).await;
    suite.finish().await;
}
