//! Concurrency (§3.1, §4.3, §4.7): racing claims for the same VMs, for the same
//! request_id, and against DeletePool with and without force.

use std::collections::BTreeSet;

use battery_e2e::api::{ClaimVmResponse, PoolRef};
use battery_e2e::{Suite, expect_code, expect_ok};
use futures::future::join_all;
use tonic::{Code, Status};

type Claim = Result<ClaimVmResponse, Status>;

/// `n` ClaimVM calls in flight at once (one HTTP/2 connection, handled concurrently).
async fn claims(suite: &Suite, pool: &PoolRef, n: usize, request_id: &str) -> Vec<Claim> {
    join_all((0..n).map(|_| suite.claim(pool, request_id))).await
}

fn winners(results: &[Claim]) -> Vec<&ClaimVmResponse> {
    results.iter().filter_map(|r| r.as_ref().ok()).collect()
}

fn codes(results: &[Claim]) -> Vec<Code> {
    results
        .iter()
        .map(|r| r.as_ref().err().map_or(Code::Ok, Status::code))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_never_share_a_vm() {
    let suite = Suite::start().await;
    let pool = suite.create_ready_pool(suite.pool("last").build()).await;
    let mut handed_out = BTreeSet::new();
    for round in 0..8 {
        let results = claims(&suite, &pool, 2, "").await;
        let won = winners(&results);
        assert_eq!(
            won.len(),
            1,
            "round {round}: exactly one claim wins: {:?}",
            codes(&results)
        );
        assert!(
            codes(&results).contains(&Code::ResourceExhausted),
            "round {round}: the loser gets RESOURCE_EXHAUSTED: {:?}",
            codes(&results)
        );
        assert!(
            handed_out.insert(won[0].vm_uid.clone()),
            "VM {} leased twice",
            won[0].vm_uid
        );
        expect_ok(suite.release(&won[0].lease_id).await, "ReleaseVM");
        suite.wait_counts(&pool, 1, 0).await;
    }

    let many = suite
        .create_ready_pool(suite.pool("many").size(3).build())
        .await;
    let results = claims(&suite, &many, 8, "").await;
    let won = winners(&results);
    let vms: BTreeSet<&str> = won.iter().map(|c| c.vm_uid.as_str()).collect();
    assert_eq!(
        (won.len(), vms.len()),
        (3, 3),
        "3 VMs, 3 distinct winners: {:?}",
        codes(&results)
    );
    let lost = codes(&results)
        .into_iter()
        .filter(|c| *c == Code::ResourceExhausted)
        .count();
    assert_eq!(lost, 5, "the other 5 get RESOURCE_EXHAUSTED");
    let leased: BTreeSet<String> = suite
        .leases(Some(&many))
        .await
        .into_iter()
        .map(|l| l.vm_uid)
        .collect();
    assert_eq!(leased, vms.iter().map(|s| s.to_string()).collect());
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_with_one_request_id_share_one_lease() {
    let suite = Suite::start().await;
    // As many VMs as claims, so every racer finds either the lease or a VM to try.
    let n = 6;
    let pool = suite
        .create_ready_pool(suite.pool("same").size(n).build())
        .await;
    let results = claims(&suite, &pool, n as usize, "same-request").await;
    let won = winners(&results);
    assert_eq!(
        won.len(),
        n as usize,
        "every racer succeeds: {:?}",
        codes(&results)
    );
    for claim in &won {
        assert_eq!(*claim, won[0], "all racers get the same lease");
    }
    let leases = suite.leases(Some(&pool)).await;
    assert_eq!(leases.len(), 1, "one lease: {leases:?}");
    // The losers' VMs went back to AVAILABLE: none lost, none extra.
    suite.wait_counts(&pool, n - 1, 1).await;
    suite.hold_counts(&pool, n - 1, 1).await;
    suite.finish().await;
}

/// Claims racing a DeletePool: the codes each side may see, and no lease left behind.
async fn claims_race_delete(force: bool) {
    let suite = Suite::start().await;
    for round in 0..6 {
        let name = format!("race-{round}");
        // Every other round the pre-lease hook widens the window.
        let hooks: &[&str] = if round % 2 == 0 { &[] } else { &["sleep 0.05"] };
        let spec = suite.pool(&name).size(3).pre_lease_commands(hooks);
        let pool = suite.create_ready_pool(spec.build()).await;
        let racing = join_all((0..4).map(|i| staggered(i, suite.claim(&pool, ""))));
        let (results, deleted) = tokio::join!(racing, suite.delete_pool(&pool, force));
        for code in codes(&results) {
            let allowed = [
                Code::Ok,
                Code::NotFound,
                Code::ResourceExhausted,
                Code::Aborted,
            ];
            // A forced delete's drain may remove a MicroVM under a running pre-lease hook,
            // which poolmgrd fails as a hook failure.
            let interrupted = force && code == Code::Internal;
            assert!(
                allowed.contains(&code) || interrupted,
                "round {round}: ClaimVM answered {code:?}"
            );
        }
        let won = winners(&results);
        match deleted {
            Ok(()) => {
                if !force {
                    assert!(
                        won.is_empty(),
                        "round {round}: an unforced delete succeeded past a lease"
                    );
                }
                expect_code(suite.get_pool(&pool).await, Code::NotFound, "GetPool");
                assert!(
                    suite.leases(Some(&pool)).await.is_empty(),
                    "round {round}: leases left"
                );
                for claim in &won {
                    let hb = suite.heartbeat(&claim.lease_id).await;
                    expect_code(hb, Code::NotFound, "Heartbeat of a lease on a deleted pool");
                    assert!(suite.lease(&claim.lease_id).await.is_none());
                }
                suite.wait_pool_vms_gone(&pool).await;
            }
            Err(status) => {
                assert!(!force, "round {round}: forced DeletePool failed: {status}");
                assert_eq!(
                    status.code(),
                    Code::FailedPrecondition,
                    "round {round}: {status}"
                );
                assert!(
                    !won.is_empty(),
                    "round {round}: refused although nothing was leased"
                );
                expect_ok(suite.get_pool(&pool).await, "the pool survives");
                for claim in &won {
                    expect_ok(suite.heartbeat(&claim.lease_id).await, "its leases survive");
                }
                expect_ok(suite.delete_pool(&pool, true).await, "forced DeletePool");
                assert!(suite.leases(Some(&pool)).await.is_empty());
            }
        }
    }
    suite.finish().await;
}

/// Runs `f` after `yields` scheduler yields, to stagger racers a little.
async fn staggered<F: std::future::Future>(yields: usize, f: F) -> F::Output {
    for _ in 0..yields {
        tokio::task::yield_now().await;
    }
    f.await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_racing_an_unforced_delete_pool() {
    claims_race_delete(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_racing_a_forced_delete_pool() {
    claims_race_delete(true).await;
}
