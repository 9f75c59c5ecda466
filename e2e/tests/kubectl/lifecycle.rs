//! A claim's life, through kubectl: bound at create, renewed through its `lease`
//! subresource, expired when left unrenewed, released when deleted, and holding up the
//! deletion of its Pool until it goes.
//!
//! Each test makes its own Pool of one MicroVM, so the lease timing is the test's: the
//! dev Pool's is battery's default, far too long to watch a lease run out.

use std::str::FromStr as _;
use std::time::Duration;

use battery_e2e::apiserver::{ApiServer, Kubectl, Route, Stream};
use battery_e2e::ts_nanos;
use serde_json::{Value, json};

use crate::{DEV_ACCOUNT, GROUP, GROUP_VERSION, assert_contains_all, table, text};

crate::on_both_routes!(
    create_prints_a_bound_claim_and_get_shows_its_lease,
    renewing_through_the_lease_subresource_moves_the_expiry,
    an_unrenewed_claim_expires_and_cannot_be_renewed,
    deleting_a_claim_releases_its_microvm,
    deleting_a_pool_waits_for_its_bound_claim,
    a_claim_ends_at_its_maximum_lifetime_and_get_shows_the_time_left,
);

/// kubectl wait's `--timeout` for every change a test waits for: far above what any
/// needs (an expiry is due within `expiryThreshold` plus battery's 2 s sweep).
const WAIT_TIMEOUT: &str = "--timeout=30s";
/// The claims' Holder, as Kubernetes names the dev ServiceAccount.
const HOLDER_IDENTITY: &str = "system:serviceaccount:default:dev";
const NANOS_PER_SECOND: i128 = 1_000_000_000;

/// A Pool's `spec.lease`, in whole seconds.
#[derive(Debug, Clone, Copy)]
struct LeaseTiming {
    heartbeat_interval: u64,
    expiry_threshold: u64,
}

/// A lease that outlives any test: claims stay Bound unless a test releases them.
const LONG_LEASE: LeaseTiming = LeaseTiming {
    heartbeat_interval: 10,
    expiry_threshold: 300,
};
/// Long enough for a renewal a second after the bind to find the lease alive.
const RENEWABLE_LEASE: LeaseTiming = LeaseTiming {
    heartbeat_interval: 1,
    expiry_threshold: 3,
};
/// Short, so a test can wait for it to run out.
const SHORT_LEASE: LeaseTiming = LeaseTiming {
    heartbeat_interval: 1,
    expiry_threshold: 2,
};

async fn create_prints_a_bound_claim_and_get_shows_its_lease(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let pool = TestPool::create(&kubectl, "binding", LONG_LEASE).await;
        let name = kubectl.unique("bound");
        let what = |step: &str| format!("kubectl {}: {step} {name}", kubectl.version());

        // From a file, as a user would write it.
        let manifest = server.scratch().join(format!("{name}.yaml"));
        std::fs::write(&manifest, yaml(&pool.claim_manifest(&name)))
            .unwrap_or_else(|e| panic!("write {}: {e}", manifest.display()));
        let manifest = manifest.to_str().expect("the scratch directory is UTF-8");
        let printed = kubectl.ok(&["create", "-f", manifest, "-o", "yaml"]).await;
        let claim: Value = serde_norway::from_str(&printed)
            .unwrap_or_else(|e| panic!("{}: not YAML ({e}):\n{printed}", what("create -o yaml")));
        let status = &claim["status"];
        assert_eq!(status["phase"], "Bound", "{}: {claim:#}", what("create"));
        let vm = text(&status["microVM"]["uid"]);
        let node = text(&status["host"]["nodeName"]);
        assert!(!vm.is_empty(), "{}: {claim:#}", what("create"));
        assert!(!node.is_empty(), "{}: {claim:#}", what("create"));
        assert_condition(&claim, "Bound", "True", "Bound");
        // battery's lease runs the Pool's expiryThreshold from the bind; boundTime is cut
        // to the second, so the gap is the threshold plus under a second.
        let lease_runs = instant(&status["leaseExpiresAt"]) - instant(&status["boundTime"]);
        let threshold = seconds(LONG_LEASE.expiry_threshold);
        assert!(
            (threshold..threshold + NANOS_PER_SECOND).contains(&lease_runs),
            "{}: the lease runs {lease_runs} ns from the bind, not the Pool's {threshold} ns: {claim:#}",
            what("create")
        );

        // The server's Table puts the lease in the default columns.
        let row = claim_row(&kubectl, &name).await;
        let cells: Vec<(&str, &str)> = row
            .iter()
            .map(|(column, cell)| (column.as_str(), cell.as_str()))
            .collect();
        let expires = text(&status["leaseExpiresAt"]);
        let expires_second = format!("{}Z", &expires[..19]);
        assert_eq!(
            cells[..5],
            [
                ("NAME", name.as_str()),
                ("POOL", pool.name.as_str()),
                ("PHASE", "Bound"),
                ("NODE", node),
                ("EXPIRES", expires_second.as_str()),
            ],
            "{}",
            what("get microvmclaims")
        );
        assert_eq!(cells[5], ("TTL", "<none>"), "{}", what("get microvmclaims"));
        assert_eq!(cells[6].0, "AGE", "{}", what("get microvmclaims"));

        kubectl.ok(&["delete", "mvc", &name]).await;
        pool.delete().await;
    }
}

async fn renewing_through_the_lease_subresource_moves_the_expiry(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let pool = TestPool::create(&kubectl, "renewing", RENEWABLE_LEASE).await;
        let name = kubectl.unique("renewed");
        let what = |step: &str| format!("kubectl {}: {step} {name}", kubectl.version());
        let bound = pool.claim(&name).await;
        let expires_before = instant(&bound["status"]["leaseExpiresAt"]);
        let column_before = expires_column(&kubectl, &name).await;

        // The one deliberate pause: battery sets the renewed expiry to the renewal plus
        // the threshold, so renewing over a second after the bind makes it strictly later
        // even at the one-second precision of the EXPIRES column.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let lease = kubectl
            .json(&[
                "patch",
                "microvmclaim",
                &name,
                "--subresource=lease",
                "--type=merge",
                "-p",
                "{}",
                "-o",
                "json",
            ])
            .await;
        let renewal = what("renew");
        assert_eq!(
            lease["apiVersion"], "coordination.k8s.io/v1",
            "{renewal}: {lease:#}"
        );
        assert_eq!(lease["kind"], "Lease", "{renewal}: {lease:#}");
        assert_eq!(
            lease["metadata"]["name"],
            name.as_str(),
            "{renewal}: {lease:#}"
        );
        assert_eq!(
            lease["spec"]["holderIdentity"], HOLDER_IDENTITY,
            "{renewal}: {lease:#}"
        );
        assert_eq!(
            lease["spec"]["leaseDurationSeconds"], RENEWABLE_LEASE.expiry_threshold,
            "{renewal}: {lease:#}"
        );
        let renewed_at = instant(&lease["spec"]["renewTime"]);

        // Reading the subresource shows that renewal.
        let read = kubectl
            .json(&["get", "mvc", &name, "--subresource=lease", "-o", "json"])
            .await;
        assert_eq!(
            read["kind"],
            "Lease",
            "{}: {read:#}",
            what("get --subresource=lease")
        );
        assert_eq!(
            read["spec"],
            lease["spec"],
            "{}",
            what("get --subresource=lease")
        );

        // And the claim: still Bound, renewed when the Lease says, expiring later.
        let claim = kubectl.json(&["get", "mvc", &name, "-o", "json"]).await;
        let status = &claim["status"];
        assert_eq!(status["phase"], "Bound", "{}: {claim:#}", what("get"));
        assert_eq!(
            instant(&status["renewTime"]),
            renewed_at,
            "{}: {claim:#}",
            what("get")
        );
        let expires_after = instant(&status["leaseExpiresAt"]);
        assert!(
            expires_after > expires_before,
            "{}: status.leaseExpiresAt did not move past {expires_before} ns: {claim:#}",
            what("renew")
        );
        let column_after = expires_column(&kubectl, &name).await;
        assert!(
            column_after > column_before,
            "{}: EXPIRES did not move past {column_before} ns, it is {column_after} ns",
            what("get microvmclaims after renewing")
        );

        kubectl.ok(&["delete", "mvc", &name]).await;
        pool.delete().await;
    }
}

async fn an_unrenewed_claim_expires_and_cannot_be_renewed(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let pool = TestPool::create(&kubectl, "expiring", SHORT_LEASE).await;
        let name = kubectl.unique("expired");
        let what = |step: &str| format!("kubectl {}: {step} {name}", kubectl.version());
        let bound = pool.claim(&name).await;
        // The claim holds one of the Pool's MicroVMs until its lease runs out.
        pool.await_leased(1).await;

        await_jsonpath(&kubectl, &format!("mvc/{name}"), ".status.phase", "Expired").await;
        let claim = kubectl.json(&["get", "mvc", &name, "-o", "json"]).await;
        let expired = assert_condition(&claim, "Bound", "False", "LeaseExpired");
        // No earlier than the lease said: the transition time is cut to the second.
        let expires = instant(&bound["status"]["leaseExpiresAt"]);
        let transition = instant(&expired["lastTransitionTime"]);
        assert!(
            transition >= expires - expires % NANOS_PER_SECOND,
            "{}: expired before its lease ran out ({}): {claim:#}",
            what("expiry of"),
            text(&bound["status"]["leaseExpiresAt"])
        );
        assert_eq!(
            claim["status"]["microVM"],
            bound["status"]["microVM"],
            "{}: an Expired claim still names the MicroVM it had",
            what("expiry of")
        );

        // -v=6 logs each response's status line, so the code is checked too.
        let stderr = kubectl
            .fails(&[
                "patch",
                "microvmclaim",
                &name,
                "--subresource=lease",
                "--type=merge",
                "-p",
                "{}",
                "-v=6",
            ])
            .await;
        assert_contains_all(
            &stderr,
            &[
                "410 Gone",
                &format!(
                    "Error from server (Gone): the lease of microvmclaim default/{name} has expired"
                ),
            ],
            &what("renew the expired"),
        );

        // battery destroyed the MicroVM of the expired lease.
        pool.await_leased(0).await;
        kubectl.ok(&["delete", "mvc", &name]).await;
        pool.delete().await;
    }
}

/// Issue 42: `kubectl get` shows the time a claim has left under its limits (TTL), and a
/// claim past its maximum lifetime ends though its lease runs on, saying why in its
/// condition, its renewal's `410` and (where there is a cluster) an Event.
async fn a_claim_ends_at_its_maximum_lifetime_and_get_shows_the_time_left(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let pool = TestPool::create(&kubectl, "limited", LONG_LEASE).await;
        let name = kubectl.unique("short");
        let what = |step: &str| format!("kubectl {}: {step} {name}", kubectl.version());
        let mut manifest = pool.claim_manifest(&name);
        manifest["spec"]["maxLifetime"] = json!("10s");
        let created = kubectl
            .cmd(&["create", "-f", "-", "-o", "json"])
            .stdin(manifest.to_string())
            .json()
            .await;
        assert_eq!(
            created["status"]["maxLifetime"],
            "10s",
            "{}",
            what("create")
        );
        let row = claim_row(&kubectl, &name).await;
        let ttl = &row.iter().find(|(column, _)| column == "TTL").unwrap().1;
        assert!(
            ttl.ends_with('s')
                && ttl
                    .trim_end_matches('s')
                    .parse::<u32>()
                    .is_ok_and(|s| s <= 10),
            "{}: TTL is the time left, as an age: {row:?}",
            what("get")
        );

        await_jsonpath(&kubectl, &format!("mvc/{name}"), ".status.phase", "Expired").await;
        let claim = kubectl.json(&["get", "mvc", &name, "-o", "json"]).await;
        assert_condition(&claim, "Bound", "False", "MaxLifetimeReached");
        let row = claim_row(&kubectl, &name).await;
        assert!(
            row.contains(&("TTL".to_owned(), "<none>".to_owned())),
            "{row:?}"
        );
        let stderr = kubectl
            .fails(&[
                "patch",
                "microvmclaim",
                &name,
                "--subresource=lease",
                "--type=merge",
                "-p",
                "{}",
            ])
            .await;
        assert_contains_all(&stderr, &["(MaxLifetimeReached)"], &what("renew the ended"));
        if route == Route::Aggregated {
            let selector = format!("--field-selector=involvedObject.name={name}");
            let events = kubectl
                .json(&["get", "events", &selector, "-o", "json"])
                .await;
            let reasons: Vec<&Value> = events["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| &e["reason"])
                .collect();
            assert!(
                reasons.contains(&&json!("MaxLifetimeReached")),
                "{}: {events:#}",
                what("events of")
            );
        }
        // Its MicroVM went back to battery.
        pool.await_leased(0).await;
        kubectl.ok(&["delete", "mvc", &name]).await;
        pool.delete().await;
    }
}

async fn deleting_a_claim_releases_its_microvm(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let pool = TestPool::create(&kubectl, "releasing", LONG_LEASE).await;
        let name = kubectl.unique("released");
        let leased_before = pool.leased().await;
        pool.claim(&name).await;
        pool.await_leased(leased_before + 1).await;

        let output = kubectl.ok(&["delete", "microvmclaim", &name]).await;
        assert_deleted(&kubectl, &output, "microvmclaim", &name);
        assert_not_found(&kubectl, "microvmclaims", &name).await;
        pool.await_leased(leased_before).await;
        pool.delete().await;
    }
}

async fn deleting_a_pool_waits_for_its_bound_claim(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let pool = TestPool::create(&kubectl, "doomed", LONG_LEASE).await;
        let holder = kubectl.unique("holder");
        let late = kubectl.unique("late");
        let what = |step: &str| format!("kubectl {}: {step} {}", kubectl.version(), pool.name);
        pool.claim(&holder).await;
        pool.await_leased(1).await;

        // battery will not delete a Pool with a leased MicroVM: the delete is accepted
        // and left pending, so only --wait=false returns at once.
        let output = kubectl
            .ok(&["delete", "pool", &pool.name, "--wait=false"])
            .await;
        assert_deleted(&kubectl, &output, "pool", &pool.name);
        let pending = pool.get().await;
        assert!(
            pending["metadata"]["deletionTimestamp"].is_string(),
            "{}: {pending:#}",
            what("get the deleted pool")
        );
        let leased = pending["status"]["leased"].as_i64();
        assert_eq!(
            leased,
            Some(1),
            "{}: {pending:#}",
            what("get the deleted pool")
        );
        let blocked = assert_condition(&pending, "Ready", "False", "DeletionBlocked");
        // The message says what the deletion waits for: the one leased MicroVM.
        assert_contains_all(
            text(&blocked["message"]),
            &["waiting for 1 leased MicroVM"],
            &what("the Ready condition of"),
        );

        // A Pool on its way out takes no new claims, and the refusal leaves nothing.
        let stderr = kubectl
            .cmd(&["create", "-f", "-"])
            .stdin(pool.claim_manifest(&late).to_string())
            .fails()
            .await;
        assert_contains_all(
            &stderr,
            &[
                "Error from server (PoolDeleting)",
                &format!("pool default/{} is being deleted", pool.name),
            ],
            &what("claim on the deleted pool"),
        );
        assert_not_found(&kubectl, "microvmclaims", &late).await;

        // Still there: only releasing the claim lets it go.
        let still = pool.get().await;
        assert!(
            still["metadata"]["deletionTimestamp"].is_string(),
            "{}: {still:#}",
            what("get the deleted pool")
        );
        // -v=6 makes kubectl log its informer's progress: once its cache is populated it
        // watches from a known resourceVersion, so the deletion cannot slip past it.
        let mut wait = kubectl
            .cmd(&[
                "wait",
                "--for=delete",
                &format!("pool/{}", pool.name),
                WAIT_TIMEOUT,
                "-v=6",
            ])
            .spawn();
        wait.line(Stream::Stderr, "the informer's first sync", |line| {
            line.contains("Caches populated")
        })
        .await;
        kubectl.ok(&["delete", "mvc", &holder]).await;
        let output = wait.finish().await;
        assert!(output.success, "{output}");
        assert_eq!(
            output.stdout.trim_end(),
            format!("pool.{GROUP}/{} condition met", pool.name),
            "{output}"
        );
        assert_not_found(&kubectl, "pools", &pool.name).await;
    }
}

/// A Pool of one MicroVM made for one test, named per kubectl release.
struct TestPool<'k> {
    kubectl: &'k Kubectl,
    name: String,
}

impl<'k> TestPool<'k> {
    /// Creates the Pool `base` (made unique to the release) from YAML on stdin, and
    /// waits until its MicroVM is available: a claim binds only to an available one.
    async fn create(kubectl: &'k Kubectl, base: &str, lease: LeaseTiming) -> Self {
        let name = kubectl.unique(base);
        let manifest = json!({
            "apiVersion": GROUP_VERSION,
            "kind": "Pool",
            "metadata": {"name": name},
            "spec": {
                "size": 1,
                "lease": {
                    "heartbeatInterval": format!("{}s", lease.heartbeat_interval),
                    "expiryThreshold": format!("{}s", lease.expiry_threshold),
                },
                "template": {
                    "vcpu": 1,
                    "memoryInMb": 1024,
                    "kernel": {"image": "k"},
                    "rootVolume": {"id": "root", "containerSource": "r"},
                    "interfaces": [{"deviceId": "eth1"}],
                },
            },
        });
        kubectl
            .cmd(&["create", "-f", "-"])
            .stdin(yaml(&manifest))
            .ok()
            .await;
        let pool = Self { kubectl, name };
        await_jsonpath(kubectl, &pool.resource(), ".status.available", "1").await;
        pool
    }

    /// `pool/<name>`, for `kubectl wait`.
    fn resource(&self) -> String {
        format!("pool/{}", self.name)
    }

    /// The Pool as `kubectl get -o json` prints it (its status live from battery).
    async fn get(&self) -> Value {
        self.kubectl
            .json(&["get", "pool", &self.name, "-o", "json"])
            .await
    }

    /// How many of the Pool's MicroVMs are leased now.
    async fn leased(&self) -> i64 {
        let pool = self.get().await;
        pool["status"]["leased"]
            .as_i64()
            .unwrap_or_else(|| panic!("the Pool {} has no status.leased: {pool:#}", self.name))
    }

    /// Waits until `count` of the Pool's MicroVMs are leased: battery's count may trail
    /// a bind, a release or an expiry.
    async fn await_leased(&self, count: i64) {
        await_jsonpath(
            self.kubectl,
            &self.resource(),
            ".status.leased",
            &count.to_string(),
        )
        .await;
    }

    /// A MicroVMClaim `name` on this Pool, held by the dev ServiceAccount.
    fn claim_manifest(&self, name: &str) -> Value {
        json!({
            "apiVersion": GROUP_VERSION,
            "kind": "MicroVMClaim",
            "metadata": {"name": name},
            "spec": {"poolRef": {"name": self.name}, "serviceAccountName": DEV_ACCOUNT},
        })
    }

    /// Creates the claim `name` on this Pool and returns what the server answered, which
    /// binds synchronously: it must already be Bound.
    async fn claim(&self, name: &str) -> Value {
        let created = self
            .kubectl
            .cmd(&["create", "-f", "-", "-o", "json"])
            .stdin(self.claim_manifest(name).to_string())
            .json()
            .await;
        assert_eq!(
            created["status"]["phase"],
            "Bound",
            "kubectl {}: the create response of {name} is not Bound: {created:#}",
            self.kubectl.version()
        );
        created
    }

    /// Deletes the Pool, which must hold no lease by now, and waits until it is gone, so
    /// the next release starts from the same state.
    async fn delete(self) {
        let output = self.kubectl.ok(&["delete", "pool", &self.name]).await;
        assert_deleted(self.kubectl, &output, "pool", &self.name);
        assert_not_found(self.kubectl, "pools", &self.name).await;
    }
}

/// Waits with `kubectl wait` until `jsonpath` of `object` reads `value`.
async fn await_jsonpath(kubectl: &Kubectl, object: &str, jsonpath: &str, value: &str) {
    let condition = format!("--for=jsonpath={{{jsonpath}}}={value}");
    let output = kubectl
        .ok(&["wait", object, &condition, WAIT_TIMEOUT])
        .await;
    assert!(
        output.trim_end().ends_with("condition met"),
        "kubectl {} wait {object} {condition}: {output}",
        kubectl.version()
    );
}

/// The claim `name`'s row of `kubectl get microvmclaims`, each cell paired with its
/// column's header.
async fn claim_row(kubectl: &Kubectl, name: &str) -> Vec<(String, String)> {
    let printed = kubectl.ok(&["get", "microvmclaims"]).await;
    let rows = table(&printed);
    let (header, rows) = rows
        .split_first()
        .unwrap_or_else(|| panic!("kubectl {}: no table:\n{printed}", kubectl.version()));
    let row = rows
        .iter()
        .find(|row| row.first() == Some(&name))
        .unwrap_or_else(|| {
            panic!(
                "kubectl {}: no row for {name}:\n{printed}",
                kubectl.version()
            )
        });
    assert_eq!(header.len(), row.len(), "a ragged table:\n{printed}");
    header
        .iter()
        .zip(row)
        .map(|(column, cell)| ((*column).to_owned(), (*cell).to_owned()))
        .collect()
}

/// The claim `name`'s EXPIRES column in `kubectl get microvmclaims`, parsed.
async fn expires_column(kubectl: &Kubectl, name: &str) -> i128 {
    let row = claim_row(kubectl, name).await;
    let (_, expires) = row
        .iter()
        .find(|(column, _)| column == "EXPIRES")
        .unwrap_or_else(|| panic!("kubectl {}: no EXPIRES column: {row:?}", kubectl.version()));
    instant(&Value::from(expires.as_str()))
}

/// The condition `type_` of `object`, asserted to have `status` and `reason`.
#[track_caller]
fn assert_condition<'v>(object: &'v Value, type_: &str, status: &str, reason: &str) -> &'v Value {
    let condition = object["status"]["conditions"]
        .as_array()
        .and_then(|conditions| conditions.iter().find(|c| c["type"] == type_))
        .unwrap_or_else(|| panic!("no {type_} condition: {object:#}"));
    assert_eq!(
        (&condition["status"], &condition["reason"]),
        (&json!(status), &json!(reason)),
        "the {type_} condition: {object:#}"
    );
    condition
}

/// Asserts that `output` is kubectl's report of deleting `kind` `name`.
#[track_caller]
fn assert_deleted(kubectl: &Kubectl, output: &str, kind: &str, name: &str) {
    let deleted = format!("{kind}.{GROUP} \"{name}\" deleted");
    // Newer releases also say where from.
    let accepted = [deleted.clone(), format!("{deleted} from default namespace")];
    let line = output.trim_end();
    assert!(
        accepted.iter().any(|report| report == line),
        "kubectl {}: expected one of {accepted:?}, got {line:?}",
        kubectl.version()
    );
}

/// Asserts that `kubectl get <plural> <name>` finds nothing.
async fn assert_not_found(kubectl: &Kubectl, plural: &str, name: &str) {
    let stderr = kubectl.fails(&["get", plural, name]).await;
    assert_contains_all(
        &stderr,
        &[&format!(
            "Error from server (NotFound): {plural}.{GROUP} \"{name}\" not found"
        )],
        &format!("kubectl {}: get {plural} {name}", kubectl.version()),
    );
}

/// An RFC 3339 time, as nanoseconds since the epoch.
#[track_caller]
fn instant(value: &Value) -> i128 {
    let time = text(value);
    let parsed = prost_types::Timestamp::from_str(time)
        .unwrap_or_else(|e| panic!("{time:?} is not an RFC 3339 time: {e}"));
    ts_nanos(&Some(parsed))
}

fn seconds(count: u64) -> i128 {
    i128::from(count) * NANOS_PER_SECOND
}

/// `manifest` as YAML, as a user would write it.
fn yaml(manifest: &Value) -> String {
    serde_norway::to_string(manifest).expect("a JSON value is YAML")
}
