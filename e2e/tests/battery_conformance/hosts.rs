//! HostAdmin (§3.3, §4.8), gRPC health and the port's token: codes incl. the quirks, cordon state,
//! the flintlock version check, RemoveHost's guards.

use battery_e2e::api::pool_admin_client::PoolAdminClient;
use battery_e2e::api::{Host, HostTls, ListPoolsRequest};
use battery_e2e::{
    BatteryAccess, Credential, Options, Suite, eventually, expect_code, expect_ok, insecure_host,
    skip,
};
use battery_embedded::simhost::{SimulatedHost, SimulatedHostConfig};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// A port nothing listens on.
const UNREACHABLE: &str = "127.0.0.1:1";

fn with_tls(name: &str, address: &str, tls: Option<HostTls>) -> Host {
    Host {
        name: name.to_owned(),
        address: address.to_owned(),
        tls,
        ..Host::default()
    }
}

fn tls(insecure: bool, ca: &str, cert: &str, key: &str) -> Option<HostTls> {
    Some(HostTls {
        insecure,
        ca_file: ca.to_owned(),
        cert_file: cert.to_owned(),
        key_file: key.to_owned(),
    })
}

/// Host specs AddHost and UpdateHost refuse with INVALID_ARGUMENT even with
/// skip_validation (the file paths do not exist: spec rules come before reading them).
fn malformed(name: &str) -> Vec<(&'static str, Host)> {
    let (ca, cert, key) = (
        "/nonexistent/ca.pem",
        "/nonexistent/c.pem",
        "/nonexistent/k.pem",
    );
    vec![
        ("no address", with_tls(name, "", tls(true, "", "", ""))),
        ("tls unset", with_tls(name, UNREACHABLE, None)),
        (
            "not insecure and no ca_file",
            with_tls(name, UNREACHABLE, tls(false, "", cert, key)),
        ),
        (
            "insecure with a ca_file",
            with_tls(name, UNREACHABLE, tls(true, ca, "", "")),
        ),
        (
            "insecure with a client cert",
            with_tls(name, UNREACHABLE, tls(true, "", cert, key)),
        ),
        (
            "cert_file without key_file",
            with_tls(name, UNREACHABLE, tls(false, ca, cert, "")),
        ),
        (
            "key_file without cert_file",
            with_tls(name, UNREACHABLE, tls(false, ca, "", key)),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_serving() {
    let suite = Suite::start().await;
    let req = HealthCheckRequest {
        service: String::new(),
    };
    let resp = expect_ok(suite.health().check(req).await, "Health.Check").into_inner();
    assert_eq!(resp.status, ServingStatus::Serving as i32);
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_token_every_call_is_refused() {
    let suite = Suite::start().await;
    let Some(token) = suite.access().token.clone() else {
        skip("the battery is reached without a token");
        suite.finish().await;
        return;
    };
    let wrong = BatteryAccess {
        token: Some(format!("{token}-not")),
        ..suite.access().clone()
    };
    let refusals = [
        (
            suite.access().without(Credential::Token),
            "missing or malformed authorization header",
        ),
        (wrong, "invalid auth token"),
    ];
    // Checked before any handler, health included.
    for (access, message) in refusals {
        let channel = access.channel();
        let health = HealthClient::new(channel.clone())
            .check(HealthCheckRequest::default())
            .await;
        let pools = PoolAdminClient::new(channel)
            .list_pools(ListPoolsRequest::default())
            .await;
        for status in [health.map(drop), pools.map(drop)] {
            let status = status.expect_err("a call without the right token");
            assert_eq!(
                (status.code(), status.message()),
                (Code::Unauthenticated, message)
            );
        }
    }
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_admin_error_codes() {
    let suite = Suite::start().await;
    let unknown = format!("{}-unknown", suite.namespace());
    let fake = format!("{}-fake", suite.namespace());
    expect_code(
        suite.cordon("", "r").await,
        Code::InvalidArgument,
        "CordonHost \"\"",
    );
    expect_code(
        suite.uncordon("").await,
        Code::InvalidArgument,
        "UncordonHost \"\"",
    );
    let quirk = "Cordon/Uncordon of an unregistered host is FAILED_PRECONDITION, not NOT_FOUND";
    expect_code(
        suite.cordon(&unknown, "r").await,
        Code::FailedPrecondition,
        quirk,
    );
    expect_code(
        suite.uncordon(&unknown).await,
        Code::FailedPrecondition,
        quirk,
    );
    expect_code(
        suite.get_host("").await,
        Code::InvalidArgument,
        "GetHost \"\"",
    );
    expect_code(
        suite.get_host(&unknown).await,
        Code::NotFound,
        "GetHost unknown",
    );
    expect_code(
        suite.remove_host("").await,
        Code::InvalidArgument,
        "RemoveHost \"\"",
    );
    expect_code(
        suite.remove_host(&unknown).await,
        Code::NotFound,
        "RemoveHost unknown",
    );
    let spec = insecure_host(&unknown, UNREACHABLE);
    expect_code(
        suite.update_host(spec, true).await,
        Code::NotFound,
        "UpdateHost unknown",
    );

    expect_code(
        suite.add_host(insecure_host("", UNREACHABLE), true).await,
        Code::InvalidArgument,
        "AddHost without a name",
    );
    let existing = &suite.hosts()[0];
    expect_code(
        suite
            .add_host(insecure_host(&existing.name, &existing.address), true)
            .await,
        Code::AlreadyExists,
        "AddHost of a registered name",
    );
    // The name is looked up before the rest of the spec is checked.
    expect_code(
        suite
            .add_host(insecure_host(&existing.name, ""), true)
            .await,
        Code::AlreadyExists,
        "AddHost of a registered name with no address",
    );
    expect_code(
        suite.update_host(insecure_host(&unknown, ""), true).await,
        Code::NotFound,
        "UpdateHost of an unknown name with no address",
    );
    for (what, host) in malformed(&fake) {
        expect_code(
            suite.add_host(host, true).await,
            Code::InvalidArgument,
            what,
        );
    }
    let unreadable = with_tls(
        &fake,
        UNREACHABLE,
        tls(false, "/nonexistent/ca.pem", "", ""),
    );
    expect_code(
        suite.add_host(unreadable.clone(), true).await,
        Code::FailedPrecondition,
        "AddHost with an unreadable ca_file",
    );
    expect_code(
        suite
            .add_host(insecure_host(&fake, UNREACHABLE), false)
            .await,
        Code::FailedPrecondition,
        "AddHost of an unreachable host without skip_validation",
    );
    expect_code(
        suite.get_host(&fake).await,
        Code::NotFound,
        "refused hosts are not stored",
    );

    expect_ok(
        suite
            .add_host(insecure_host(&fake, UNREACHABLE), true)
            .await,
        "AddHost (skip)",
    );
    for (what, host) in malformed(&fake) {
        let what = format!("UpdateHost: {what}");
        expect_code(
            suite.update_host(host, true).await,
            Code::InvalidArgument,
            &what,
        );
    }
    expect_code(
        suite.update_host(unreadable, true).await,
        Code::FailedPrecondition,
        "UpdateHost with an unreadable ca_file",
    );
    expect_code(
        suite
            .update_host(insecure_host(&fake, "127.0.0.1:2"), false)
            .await,
        Code::FailedPrecondition,
        "UpdateHost to an unreachable address without skip_validation",
    );
    let kept = expect_ok(suite.get_host(&fake).await, "GetHost")
        .host
        .expect("host");
    assert_eq!(kept.address, UNREACHABLE, "refused updates change nothing");
    expect_ok(suite.remove_host(&fake).await, "RemoveHost");
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cordon_state_round_trip() {
    let suite = Suite::start().await;
    let name = format!("{}-cordon", suite.namespace());
    let mut spec = insecure_host(&name, UNREACHABLE);
    spec.cordoned = true;
    spec.cordoned_reason = "ignored".into();
    spec.cordoned_at = Some(prost_types::Timestamp {
        seconds: 1,
        nanos: 0,
    });
    let added = expect_ok(suite.add_host(spec, true).await, "AddHost");
    assert!(
        !added.cordoned && added.cordoned_reason.is_empty() && added.cordoned_at.is_none(),
        "AddHost ignores cordon fields: {added:?}"
    );
    assert!(added.updated_at.is_some());
    assert_eq!(
        (
            added.address.as_str(),
            added.tls.as_ref().map(|t| t.insecure)
        ),
        (UNREACHABLE, Some(true))
    );
    let status = expect_ok(suite.get_host(&name).await, "GetHost");
    assert_eq!(status.host.as_ref(), Some(&added));
    assert_eq!(status.vm_count, 0);
    assert_eq!(
        status.flintlock_version, "",
        "never checked with skip_validation"
    );

    let cordoned = expect_ok(suite.cordon(&name, "maintenance").await, "CordonHost");
    assert!(cordoned.cordoned && cordoned.cordoned_at.is_some());
    assert_eq!(cordoned.cordoned_reason, "maintenance");
    let again = expect_ok(suite.cordon(&name, "still").await, "CordonHost again");
    assert!(again.cordoned);
    assert_eq!(
        again.cordoned_reason, "still",
        "cordoning again updates the reason"
    );
    let got = expect_ok(suite.get_host(&name).await, "GetHost")
        .host
        .expect("host");
    assert_eq!(got, again);

    let updated = expect_ok(
        suite
            .update_host(insecure_host(&name, "127.0.0.1:2"), true)
            .await,
        "UpdateHost",
    );
    assert_eq!(
        updated.address, "127.0.0.1:2",
        "UpdateHost replaces the address"
    );
    assert!(
        updated.cordoned && updated.cordoned_reason == "still",
        "...and keeps the cordon"
    );

    for _ in 0..2 {
        let open = expect_ok(suite.uncordon(&name).await, "UncordonHost");
        assert!(
            !open.cordoned && open.cordoned_reason.is_empty() && open.cordoned_at.is_none(),
            "uncordon clears reason and cordoned_at: {open:?}"
        );
    }
    expect_ok(suite.remove_host(&name).await, "RemoveHost");
    expect_code(
        suite.get_host(&name).await,
        Code::NotFound,
        "GetHost after RemoveHost",
    );
    expect_code(
        suite.remove_host(&name).await,
        Code::NotFound,
        "RemoveHost twice",
    );
    suite.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_hosts_reports_registered_hosts_in_name_order() {
    let suite = Suite::start().await;
    suite.add_alias_host("listed", 0).await;
    let listed = suite.list_hosts().await;
    let names: Vec<String> = listed
        .iter()
        .filter_map(|h| h.host.as_ref())
        .map(|h| h.name.clone())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "ListHosts is ordered by name");
    for host in suite.hosts() {
        let entry = listed
            .iter()
            .find(|h| h.host.as_ref().is_some_and(|x| x.name == host.name))
            .unwrap_or_else(|| panic!("{} is listed", host.name));
        assert_eq!(entry.host.as_ref().expect("host").address, host.address);
        let got = expect_ok(suite.get_host(&host.name).await, "GetHost");
        assert_eq!(got.host, entry.host);
    }
    let alias = format!("{}-listed", suite.namespace());
    let entry = expect_ok(suite.get_host(&alias).await, "GetHost alias");
    assert!(
        !entry.flintlock_version.is_empty(),
        "a validated AddHost records the version"
    );
    suite.finish().await;
}

async fn sim_host(dir: &std::path::Path, name: &str, version: &str) -> SimulatedHost {
    let state_dir = dir.join(name);
    std::fs::create_dir_all(&state_dir).expect("state dir");
    SimulatedHost::start(SimulatedHostConfig {
        name: name.to_owned(),
        state_dir,
        version: version.to_owned(),
        ..SimulatedHostConfig::default()
    })
    .await
    .unwrap_or_else(|e| panic!("start simulated host {name}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_host_checks_the_flintlock_version() {
    let options =
        Options::new().embedded_only("starts simulated hosts of other flintlock versions");
    let Some(suite) = Suite::start_with(options).await else {
        return;
    };
    let configured = expect_ok(suite.get_host(&suite.hosts()[0].name).await, "GetHost");
    assert_eq!(
        configured.flintlock_version, "v0.15.2",
        "the version ServerInfo reported"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let old = sim_host(dir.path(), "old", "v0.15.1").await;
    let newer = sim_host(dir.path(), "newer", "v0.15.10").await;
    let built = sim_host(dir.path(), "built", "v0.15.2-3-gabc1234").await;
    let old_name = format!("{}-old", suite.namespace());
    let old_spec = insecure_host(&old_name, &old.address().to_string());
    expect_code(
        suite.add_host(old_spec.clone(), false).await,
        Code::FailedPrecondition,
        "AddHost of flintlock v0.15.1 (< v0.15.2)",
    );
    expect_code(
        suite.get_host(&old_name).await,
        Code::NotFound,
        "the refused host",
    );
    let newer_name = format!("{}-newer", suite.namespace());
    let newer_spec = insecure_host(&newer_name, &newer.address().to_string());
    expect_ok(
        suite.add_host(newer_spec, false).await,
        "AddHost of v0.15.10 (versions compare numerically)",
    );
    let got = expect_ok(suite.get_host(&newer_name).await, "GetHost");
    assert_eq!(got.flintlock_version, "v0.15.10");
    // Only the version's core is compared: a build past the v0.15.2 tag is v0.15.2.
    let built_name = format!("{}-built", suite.namespace());
    let built_spec = insecure_host(&built_name, &built.address().to_string());
    expect_ok(
        suite.add_host(built_spec, false).await,
        "AddHost of v0.15.2-3-gabc1234 (git describe of a build past v0.15.2)",
    );

    expect_ok(
        suite.add_host(old_spec.clone(), true).await,
        "AddHost v0.15.1 with skip_validation",
    );
    expect_code(
        suite.update_host(old_spec.clone(), false).await,
        Code::FailedPrecondition,
        "UpdateHost to v0.15.1 without skip_validation",
    );
    expect_ok(
        suite.update_host(old_spec, true).await,
        "UpdateHost with skip_validation",
    );
    // The reconciler checks the version before placing VMs on a Host.
    let pool = suite
        .create_pool(suite.pool("old").hosts(&[&old_name]).build())
        .await;
    suite.hold_counts(&pool, 0, 0).await;
    assert!(
        old.microvm_uids().is_empty(),
        "no MicroVM created on a too-old flintlock"
    );
    let refused = expect_ok(suite.get_host(&old_name).await, "GetHost");
    assert_eq!(
        refused.flintlock_version, "v0.15.1",
        "the version a refused check saw is shown"
    );
    suite.finish().await;
    for host in [old, newer, built] {
        host.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remove_host_refused_while_named_by_a_pool_or_holding_vms() {
    let suite = Suite::start().await;
    let alias = suite.add_alias_host("rm", 0).await;
    let spec = suite.pool("p").hosts(&[&alias.name]);
    let pool = suite.create_ready_pool(spec.clone().build()).await;
    let refused = "RemoveHost of a host with VMs and named by a pool";
    expect_code(
        suite.remove_host(&alias.name).await,
        Code::FailedPrecondition,
        refused,
    );

    // The operator's path: cordon, drop it from every pool spec, wait for vm_count 0.
    expect_ok(suite.cordon(&alias.name, "retiring").await, "CordonHost");
    suite
        .update_pool(spec.hosts(&suite.host_names()).build())
        .await;
    assert_eq!(
        suite.vm_count(&alias.name).await,
        1,
        "UpdatePool does not move VMs"
    );
    let refused = "RemoveHost of a host that still has a VM";
    expect_code(
        suite.remove_host(&alias.name).await,
        Code::FailedPrecondition,
        refused,
    );
    expect_ok(suite.delete_pool(&pool, false).await, "DeletePool");
    eventually(
        suite.timing().timeout,
        "vm_count to reach 0",
        async || match suite.vm_count(&alias.name).await {
            0 => Ok(()),
            n => Err(format!("vm_count {n}")),
        },
    )
    .await;
    expect_ok(suite.remove_host(&alias.name).await, "RemoveHost");
    expect_code(
        suite.get_host(&alias.name).await,
        Code::NotFound,
        "GetHost after RemoveHost",
    );
    let orphan = suite.pool("orphan").hosts(&[&alias.name]).build();
    expect_code(
        suite.try_create_pool(orphan).await,
        Code::InvalidArgument,
        "a removed host",
    );

    // Named by a pool alone is enough to refuse.
    let named = suite.add_alias_host("named", 0).await;
    let empty = suite
        .create_pool(suite.pool("empty").size(0).hosts(&[&named.name]).build())
        .await;
    let refused = "RemoveHost of a host named by a pool";
    expect_code(
        suite.remove_host(&named.name).await,
        Code::FailedPrecondition,
        refused,
    );
    expect_ok(suite.delete_pool(&empty, false).await, "DeletePool");
    expect_ok(
        suite.remove_host(&named.name).await,
        "RemoveHost once no pool names it",
    );
    suite.finish().await;
}
