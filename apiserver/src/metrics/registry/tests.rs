use std::time::{Duration, SystemTime};

use battery_api_machinery::request_info::RequestInfo;
use http::Method;

use super::*;

const GROUP_VERSION: &str = "/apis/battery.liquidmetal-x.dev/v1alpha1";

fn route(method: Method, path: &str) -> RouteLabels {
    RouteLabels::of(&RequestInfo::parse(&method, path, None).unwrap())
}

/// The rendered lines that start with `prefix`.
fn lines(metrics: &Metrics, prefix: &str) -> Vec<String> {
    metrics
        .render()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

#[test]
fn labels_name_only_the_resource_table_and_the_verb_set() {
    let ns = format!("{GROUP_VERSION}/namespaces/default");
    let cases = [
        (Method::GET, format!("{ns}/pools"), ("list", "pools", "")),
        (
            Method::PATCH,
            format!("{ns}/microvmclaims/c/lease"),
            ("patch", "microvmclaims", "lease"),
        ),
        (
            Method::GET,
            format!("{ns}/microvmclaims/c/bogus"),
            ("get", "microvmclaims", OTHER),
        ),
        (
            Method::GET,
            format!("{ns}/invented-\"x\"/y/z"),
            ("get", OTHER, ""),
        ),
        (
            Method::GET,
            "/apis/other.example.com/v1/pools".to_owned(),
            ("list", OTHER, ""),
        ),
        (Method::POST, "/metrics".to_owned(), (OTHER, OTHER, "")),
        (Method::GET, "/healthz".to_owned(), ("get", OTHER, "")),
        (Method::OPTIONS, format!("{ns}/pools"), (OTHER, "pools", "")),
    ];
    for (method, path, (verb, resource, subresource)) in cases {
        assert_eq!(
            route(method, &path),
            RouteLabels {
                verb,
                resource,
                subresource
            },
            "{path}"
        );
    }
}

#[test]
fn requests_are_counted_by_code_and_timed_by_route() {
    let metrics = Metrics::default();
    let hosts = route(Method::GET, &format!("{GROUP_VERSION}/hosts"));
    metrics.record_request(hosts, 200, Duration::from_millis(3));
    metrics.record_request(hosts, 200, Duration::from_millis(300));
    metrics.record_request(hosts, 503, Duration::from_millis(1));
    let mut counted = lines(&metrics, "battery_apiserver_requests_total{");
    counted.sort();
    assert_eq!(
        counted,
        [
            r#"battery_apiserver_requests_total{verb="list",resource="hosts",subresource="",code="200"} 2"#,
            r#"battery_apiserver_requests_total{verb="list",resource="hosts",subresource="",code="503"} 1"#,
        ]
    );
    let labels = r#"verb="list",resource="hosts",subresource="""#;
    assert_eq!(
        lines(
            &metrics,
            &format!("battery_apiserver_request_duration_seconds_bucket{{le=\"0.005\",{labels}}}")
        ),
        [format!(
            "battery_apiserver_request_duration_seconds_bucket{{le=\"0.005\",{labels}}} 2"
        )]
    );
    assert_eq!(
        lines(
            &metrics,
            &format!("battery_apiserver_request_duration_seconds_count{{{labels}}}")
        ),
        [format!(
            "battery_apiserver_request_duration_seconds_count{{{labels}}} 3"
        )]
    );
}

#[test]
fn binds_and_battery_calls_are_timed_by_outcome() {
    let metrics = Metrics::default();
    metrics.record_bind(BindOutcome::Bound, Duration::from_millis(8));
    metrics.record_bind(BindOutcome::Exhausted, Duration::from_secs(5));
    metrics.record_battery_call("ClaimVM", BatteryOutcome::Ambiguous, Duration::from_secs(2));
    let mut binds = lines(&metrics, "battery_apiserver_bind_duration_seconds_count");
    binds.sort();
    assert_eq!(
        binds,
        [
            r#"battery_apiserver_bind_duration_seconds_count{outcome="bound"} 1"#,
            r#"battery_apiserver_bind_duration_seconds_count{outcome="exhausted"} 1"#,
        ]
    );
    assert_eq!(
        lines(
            &metrics,
            r#"battery_apiserver_bind_duration_seconds_bucket{le="2.5",outcome="exhausted"}"#
        ),
        [r#"battery_apiserver_bind_duration_seconds_bucket{le="2.5",outcome="exhausted"} 0"#]
    );
    assert_eq!(
        lines(
            &metrics,
            "battery_apiserver_battery_call_duration_seconds_sum"
        ),
        [
            r#"battery_apiserver_battery_call_duration_seconds_sum{method="ClaimVM",outcome="ambiguous"} 2.0"#
        ]
    );
}

#[test]
fn a_pools_counts_are_one_series_per_state_until_it_is_forgotten() {
    let metrics = Metrics::default();
    let counts = PoolCounts {
        available: 3,
        leased: 2,
        provisioning: 1,
        quarantined: 0,
    };
    metrics.set_pool_counts("ci", "warm", counts);
    metrics.set_pool_counts(
        "ci",
        "warm",
        PoolCounts {
            leased: 4,
            ..counts
        },
    );
    metrics.set_pool_counts("ci", "odd\"name\n", PoolCounts::default());
    let pool = |state: &str, n: i64| {
        format!(
            r#"battery_apiserver_pool_microvms{{namespace="ci",pool="warm",state="{state}"}} {n}"#
        )
    };
    let mut warm = lines(
        &metrics,
        r#"battery_apiserver_pool_microvms{namespace="ci",pool="warm""#,
    );
    warm.sort();
    assert_eq!(
        warm,
        [
            pool("available", 3),
            pool("leased", 4),
            pool("provisioning", 1),
            pool("quarantined", 0)
        ]
    );
    assert_eq!(
        lines(
            &metrics,
            r#"battery_apiserver_pool_microvms{namespace="ci",pool="odd\"name\n",state="leased"}"#
        )
        .len(),
        1,
        "quotes and line feeds are escaped:\n{}",
        metrics.render()
    );
    metrics.forget_pool("ci", "warm");
    assert!(
        lines(
            &metrics,
            r#"battery_apiserver_pool_microvms{namespace="ci",pool="warm""#
        )
        .is_empty()
    );
    assert_eq!(lines(&metrics, "battery_apiserver_pool_microvms{").len(), 4);
}

#[test]
fn each_applied_event_is_counted_and_sets_the_lag() {
    let metrics = Metrics::default();
    metrics.record_event(Some(SystemTime::now() - Duration::from_secs(90)));
    metrics.record_event(Some(SystemTime::now() + Duration::from_secs(5)));
    assert_eq!(
        lines(&metrics, "battery_apiserver_battery_events_total"),
        ["battery_apiserver_battery_events_total 2"]
    );
    assert_eq!(
        lines(&metrics, "battery_apiserver_battery_event_lag_seconds "),
        ["battery_apiserver_battery_event_lag_seconds 0.0"],
        "a clock ahead of ours is no lag"
    );
    metrics.record_event(Some(SystemTime::now() - Duration::from_secs(90)));
    let lag: f64 = lines(&metrics, "battery_apiserver_battery_event_lag_seconds ")[0]
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((90.0..91.0).contains(&lag), "{lag}");
}

#[tokio::test]
async fn the_stores_durable_writes_are_served_and_refused_ones_are_not() {
    use crate::meta_store::{Key, MetaStore, StoreError};
    let store = std::sync::Arc::new(MetaStore::in_memory().unwrap());
    let metrics = Metrics::default().with_store_writes(store.write_duration());
    let key = Key::new("pools", Some("default"), "p");
    store
        .transact(|tx| -> Result<(), StoreError> { tx.put(&key, &1) })
        .await
        .unwrap();
    let refused: Result<(), StoreError> = store
        .transact(|_| Err(StoreError::Sync(redb::Error::DatabaseAlreadyOpen)))
        .await;
    assert!(refused.is_err());
    assert_eq!(
        lines(
            &metrics,
            "battery_apiserver_store_write_duration_seconds_count"
        ),
        ["battery_apiserver_store_write_duration_seconds_count 1"]
    );
}
