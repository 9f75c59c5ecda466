use std::sync::Mutex;

use k8s_openapi::api::core::v1::{ResourceQuotaSpec, ResourceQuotaStatus, ScopeSelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::battery::LeaseId;

fn quota(name: &str, hard: &[(&str, &str)]) -> ResourceQuota {
    ResourceQuota {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some("team".to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(
                hard.iter()
                    .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                    .collect(),
            ),
            ..ResourceQuotaSpec::default()
        }),
        status: None,
    }
}

fn totals(count: i64, vcpus: i64, memory_bytes: i64) -> Totals {
    Totals {
        count,
        vcpus,
        memory_bytes,
    }
}

const VM: Usage = Usage {
    vcpus: 2,
    memory_bytes: 1 << 30,
};

#[test]
fn a_count_over_its_limit_is_refused_in_the_quota_plugins_words() {
    let limits = Limits::of(&quota("claims", &[(COUNT, "10"), ("pods", "3")])).unwrap();
    assert!(limits.admit(&totals(9, 0, 0), &totals(1, 2, 0)).is_ok());
    assert_eq!(
        limits
            .admit(&totals(10, 0, 0), &totals(1, 2, 0))
            .unwrap_err(),
        "exceeded quota: claims, requested: count/microvmclaims.battery.liquidmetal-x.dev=1, \
         used: count/microvmclaims.battery.liquidmetal-x.dev=10, \
         limited: count/microvmclaims.battery.liquidmetal-x.dev=10"
    );
}

#[test]
fn only_the_limits_exceeded_are_named_sorted_with_memory_in_binary_units() {
    let limits = Limits::of(&quota(
        "compute",
        &[(MEMORY, "3Gi"), (VCPUS, "6"), (COUNT, "100")],
    ))
    .unwrap();
    let used = totals(3, 6, 3 << 30);
    assert_eq!(
        limits.admit(&used, &Totals::one(VM)).unwrap_err(),
        "exceeded quota: compute, requested: battery.liquidmetal-x.dev/memory=1Gi,\
         battery.liquidmetal-x.dev/vcpus=2, used: battery.liquidmetal-x.dev/memory=3Gi,\
         battery.liquidmetal-x.dev/vcpus=6, limited: battery.liquidmetal-x.dev/memory=3Gi,\
         battery.liquidmetal-x.dev/vcpus=6"
    );
    // Exactly at the limit is within it.
    assert!(
        limits
            .admit(&totals(3, 4, 2 << 30), &Totals::one(VM))
            .is_ok()
    );
    // A fractional limit compares exactly: 1.5 vCPUs hold one vCPU, not two.
    let half = Limits::of(&quota("half", &[(VCPUS, "1500m")])).unwrap();
    assert!(half.admit(&totals(0, 1, 0), &totals(1, 0, 0)).is_ok());
    assert!(half.admit(&totals(0, 1, 0), &totals(1, 1, 0)).is_err());
}

#[test]
fn quotas_naming_none_of_our_resources_or_scoped_do_not_apply() {
    assert!(Limits::of(&quota("pods", &[("pods", "3"), ("requests.cpu", "2")])).is_none());
    let mut scoped = quota("scoped", &[(COUNT, "1")]);
    scoped.spec.as_mut().unwrap().scopes = Some(vec!["BestEffort".to_owned()]);
    assert!(Limits::of(&scoped).is_none());
    let mut selected = quota("selected", &[(COUNT, "1")]);
    selected.spec.as_mut().unwrap().scope_selector = Some(ScopeSelector::default());
    assert!(Limits::of(&selected).is_none());
}

#[test]
fn the_status_patch_touches_only_our_entries_and_only_when_they_differ() {
    let mut q = quota("claims", &[(COUNT, "10"), ("pods", "3")]);
    q.status = Some(ResourceQuotaStatus {
        hard: Some(BTreeMap::from([
            ("pods".to_owned(), Quantity("3".to_owned())),
            (VCPUS.to_owned(), Quantity("8".to_owned())),
        ])),
        used: Some(BTreeMap::from([(
            "pods".to_owned(),
            Quantity("1".to_owned()),
        )])),
    });
    let limits = Limits::of(&q).unwrap();
    let patch = limits.status_patch(&q, &totals(4, 8, 0)).unwrap();
    // The controller's `pods` untouched; the vCPU limit no longer in `spec.hard` removed.
    assert_eq!(
        patch,
        json!({"status": {"hard": {COUNT: "10", VCPUS: null}, "used": {COUNT: "4"}}})
    );
    q.status = Some(ResourceQuotaStatus {
        hard: Some(BTreeMap::from([(
            COUNT.to_owned(),
            Quantity("10".to_owned()),
        )])),
        used: Some(BTreeMap::from([(
            COUNT.to_owned(),
            Quantity("4".to_owned()),
        )])),
    });
    assert_eq!(limits.status_patch(&q, &totals(4, 8, 0)), None);
}

/// Quotas held in memory; status patches recorded.
#[derive(Default)]
struct Quotas {
    quotas: Mutex<Vec<ResourceQuota>>,
    patches: Mutex<Vec<(String, Value)>>,
}

impl QuotaSource for Quotas {
    fn quotas<'a>(
        &'a self,
        _namespace: &'a str,
    ) -> BoxFuture<'a, Result<Arc<Vec<ResourceQuota>>, ApiError>> {
        let quotas = self.quotas.lock().unwrap().clone();
        Box::pin(async move { Ok(Arc::new(quotas)) })
    }

    fn patch_quota_status<'a>(
        &'a self,
        _namespace: &'a str,
        name: &'a str,
        patch: Value,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        self.patches.lock().unwrap().push((name.to_owned(), patch));
        Box::pin(async { Ok(()) })
    }
}

fn quotas_with(hard: &[(&str, &str)]) -> (Arc<ClaimQuotas>, Arc<Quotas>, Arc<MetaStore>) {
    let source = Arc::new(Quotas::default());
    source.quotas.lock().unwrap().push(quota("claims", hard));
    let store = Arc::new(MetaStore::in_memory().unwrap());
    let quotas = Arc::new(ClaimQuotas::new(store.clone(), Some(source.clone())));
    (quotas, source, store)
}

/// Records a claim as the store holds a Bound one (with a lease) or an Expired one.
async fn record(store: &Arc<MetaStore>, uid: &str, bound: bool) {
    let record = ClaimRecord {
        metadata: ObjectMeta {
            name: Some(uid.to_owned()),
            namespace: Some("team".to_owned()),
            uid: Some(uid.to_owned()),
            ..ObjectMeta::default()
        },
        lease: bound.then(|| LeaseId::new(format!("lease-{uid}"))),
        usage: Some(VM),
        ..ClaimRecord::default()
    };
    store
        .transact(|tx| tx.put(&super::super::key("team", uid), &record))
        .await
        .unwrap();
}

#[tokio::test]
async fn concurrent_binds_reserve_exactly_the_quota() {
    let (quotas, _, _) = quotas_with(&[(COUNT, "10")]);
    let attempts = (0..1000).map(|i| {
        let quotas = quotas.clone();
        tokio::spawn(async move {
            quotas
                .reserve("team", &format!("c{i}"), &format!("uid-{i}"), VM)
                .await
        })
    });
    let mut held = Vec::new();
    let mut refused = 0;
    for attempt in futures::future::join_all(attempts).await {
        match attempt.unwrap() {
            Ok(Some(reservation)) => held.push(reservation),
            Ok(None) => panic!("a quota applies"),
            Err(err) => {
                assert_eq!(err.code(), http::StatusCode::FORBIDDEN);
                assert!(
                    err.message()
                        .contains("used: count/microvmclaims.battery.liquidmetal-x.dev=10,"),
                    "{}",
                    err.message()
                );
                refused += 1;
            }
        }
    }
    assert_eq!((held.len(), refused), (10, 990));
    // A bind that ends gives its share back.
    held.pop();
    let again = quotas
        .reserve("team", "again", "uid-again", VM)
        .await
        .unwrap();
    assert!(again.is_some());
    assert!(
        quotas
            .reserve("team", "over", "uid-over", VM)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn used_is_claims_and_reservations_each_counted_once() {
    let (quotas, _, store) = quotas_with(&[(COUNT, "4"), (VCPUS, "100")]);
    record(&store, "bound", true).await;
    // Counted as the quota controller counts the object, without its MicroVM.
    record(&store, "expired", false).await;
    let binding = quotas
        .reserve("team", "binding", "binding", VM)
        .await
        .unwrap();
    assert_eq!(quotas.used("team").unwrap(), totals(3, 4, 2 << 30));
    // Recorded Bound while its reservation is still held: one claim, not two.
    record(&store, "binding", true).await;
    assert_eq!(quotas.used("team").unwrap(), totals(3, 4, 2 << 30));
    drop(binding);
    assert_eq!(quotas.used("team").unwrap(), totals(3, 4, 2 << 30));
    assert!(
        quotas
            .reserve("team", "fourth", "fourth", VM)
            .await
            .unwrap()
            .is_some()
    );
    // Other namespaces' claims are not counted.
    assert_eq!(quotas.used("other").unwrap(), Totals::default());
}

#[tokio::test]
async fn an_expired_claim_holds_its_count_until_deleted_and_frees_its_vm_at_once() {
    let (quotas, _, store) = quotas_with(&[(COUNT, "2"), (VCPUS, "2")]);
    record(&store, "a", true).await;
    // A second MicroVM of 2 vCPUs is over the vCPU limit while the first is Bound...
    let Err(refused) = quotas.reserve("team", "b", "b", VM).await else {
        panic!("a second MicroVM of 2 vCPUs reserved against a limit of 2");
    };
    assert!(
        refused.message().contains("exceeded quota: claims")
            && refused
                .message()
                .contains("battery.liquidmetal-x.dev/vcpus=2,"),
        "{}",
        refused.message()
    );
    // ...and within it once that one Expired, which still counts as one claim.
    record(&store, "a", false).await;
    let b = quotas.reserve("team", "b", "b", VM).await.unwrap();
    record(&store, "b", true).await;
    drop(b);
    assert_eq!(quotas.used("team").unwrap(), totals(2, 2, 1 << 30));
    let Err(refused) = quotas.reserve("team", "c", "c", Usage::default()).await else {
        panic!("a third claim reserved against a count of 2");
    };
    assert_eq!(
        refused.message(),
        "microvmclaims.battery.liquidmetal-x.dev \"c\" is forbidden: exceeded quota: claims, \
         requested: count/microvmclaims.battery.liquidmetal-x.dev=1, \
         used: count/microvmclaims.battery.liquidmetal-x.dev=2, \
         limited: count/microvmclaims.battery.liquidmetal-x.dev=2"
    );
    // Deleting the Expired claim frees its count.
    store
        .transact(|tx| tx.delete(&super::super::key("team", "a")))
        .await
        .unwrap();
    assert_eq!(quotas.used("team").unwrap(), totals(1, 2, 1 << 30));
}

#[tokio::test]
async fn without_a_cluster_nothing_is_reserved_or_written() {
    let store = Arc::new(MetaStore::in_memory().unwrap());
    let quotas = Arc::new(ClaimQuotas::new(store, None));
    assert!(!quotas.enabled());
    assert!(
        quotas
            .reserve("team", "c", "uid", VM)
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn the_status_is_written_after_binds_with_what_claims_use() {
    let (quotas, source, store) = quotas_with(&[(COUNT, "10"), (MEMORY, "8Gi")]);
    tokio::spawn(quotas.clone().write_status());
    for uid in ["a", "b"] {
        let reservation = quotas.reserve("team", uid, uid, VM).await.unwrap();
        record(&store, uid, true).await;
        drop(reservation);
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let patches = source.patches.lock().unwrap().clone();
        if let Some((name, patch)) = patches.last() {
            assert_eq!(name, "claims");
            assert_eq!(
                patch,
                &json!({"status": {"hard": {COUNT: "10", MEMORY: "8Gi"}, "used": {COUNT: "2", MEMORY: "2Gi"}}})
            );
            // Debounced: the two binds close together are one write.
            assert_eq!(patches.len(), 1, "{patches:?}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no status written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
