//! `/metrics` driven through the whole router, in-process: hostile paths add no series,
//! and the in-flight and open-watch gauges follow the requests.

use battery_apiserver::testing as common;

use std::sync::Arc;

use battery_apiserver::http::authz::AuthenticatedOnly;
use battery_apiserver::server::Settings;
use common::{Harness, POOLS, as_dev, get};
use http::StatusCode;
use tower::ServiceExt;

const GROUP_VERSION: &str = "/apis/battery.liquidmetal-x.dev/v1alpha1";

/// A server that refuses anonymous callers, as `serve` without a cluster does.
async fn refusing_anonymous() -> Harness {
    Harness::with_settings(Settings {
        authorizer: Some(Arc::new(AuthenticatedOnly)),
        ..common::settings()
    })
    .await
}

/// The exposition, scraped as the dev user.
async fn scrape(h: &Harness) -> String {
    let (status, headers, body) = h.send(get("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers[http::header::CONTENT_TYPE],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    String::from_utf8(body).unwrap()
}

/// The sample lines: everything but `# HELP`, `# TYPE`, `# UNIT` and `# EOF`.
fn series(text: &str) -> Vec<&str> {
    text.lines().filter(|l| !l.starts_with('#')).collect()
}

/// Three paths no table names, distinct for each `n`: an invented resource, an invented
/// group, and an invented non-resource path.
fn invented(n: usize) -> [String; 3] {
    [
        format!("{GROUP_VERSION}/namespaces/ns-{n}/invented-{n}/x%22{n}/sub-{n}"),
        format!("/apis/group-{n}.example.com/v{n}/things-{n}"),
        format!("/path-{n}/with%20space"),
    ]
}

async fn send_anonymous(h: &Harness, uri: &str) -> StatusCode {
    h.send_as_is(get(uri)).await.0
}

async fn send_as_dev(h: &Harness, uri: &str) -> StatusCode {
    h.send(get(uri)).await.0
}

#[tokio::test]
async fn issue_9_ten_thousand_invented_paths_add_no_series() {
    let h = refusing_anonymous().await;
    // The first few create each series these requests can reach: refused (403) and not
    // found (404), for each way a path can be invented.
    for n in 0..3 {
        for uri in invented(n) {
            assert_eq!(
                send_anonymous(&h, &uri).await,
                StatusCode::FORBIDDEN,
                "{uri}"
            );
            assert_eq!(send_as_dev(&h, &uri).await, StatusCode::NOT_FOUND, "{uri}");
        }
    }
    // The first scrape counts itself (a 200 on `/metrics`) from the second on.
    scrape(&h).await;
    let before = scrape(&h).await;
    let mut sent = 0;
    for n in 3.. {
        for uri in invented(n) {
            if sent % 2 == 0 {
                send_anonymous(&h, &uri).await;
            } else {
                send_as_dev(&h, &uri).await;
            }
            sent += 1;
        }
        if sent >= 10_000 {
            break;
        }
    }
    let after = scrape(&h).await;
    assert_eq!(
        series(&before).len(),
        series(&after).len(),
        "before:\n{before}\nafter:\n{after}"
    );
    assert!(
        after.contains(
            r#"battery_apiserver_requests_total{verb="get",resource="other",subresource="",code="403"}"#
        ),
        "{after}"
    );
    assert!(!after.contains("invented"), "{after}");
}

/// The value of the one sample named `name` (no labels).
fn gauge(text: &str, name: &str) -> i64 {
    let prefix = format!("{name} ");
    let line = series(text)
        .into_iter()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"));
    line[prefix.len()..].parse().unwrap()
}

#[tokio::test]
async fn the_gauges_count_requests_in_flight_and_watches_while_they_stream() {
    let h = Harness::start().await;
    let text = scrape(&h).await;
    assert_eq!(
        gauge(&text, "battery_apiserver_requests_in_flight"),
        1,
        "the scrape is in flight"
    );
    assert_eq!(gauge(&text, "battery_apiserver_watches_open"), 0);

    let watch = h
        .router()
        .oneshot(as_dev(get(&format!("{POOLS}?watch=true"))))
        .await
        .unwrap();
    assert_eq!(watch.status(), StatusCode::OK);
    let text = scrape(&h).await;
    assert_eq!(gauge(&text, "battery_apiserver_watches_open"), 1);
    assert_eq!(
        gauge(&text, "battery_apiserver_requests_in_flight"),
        1,
        "a streaming watch is no longer in flight"
    );
    drop(watch);
    assert_eq!(
        gauge(&scrape(&h).await, "battery_apiserver_watches_open"),
        0,
        "the watch's client went away"
    );
}

/// The series users alert on follow real work: a bind and its battery calls, the Pool's
/// MicroVMs by state, and battery's events applied.
#[tokio::test]
async fn binds_battery_calls_pools_and_events_are_recorded() {
    let h = Harness::start().await;
    h.create(POOLS, &common::pool("p", 2)).await;
    h.wait_available("p", 2).await;
    let (status, _, _) = h.claim("c", "p").await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, _) = h.claim("d", "nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The lease and battery's events reach the series a moment after the bind.
    let text = common::eventually(
        common::DEADLINE,
        "the lease and the events in the series",
        || async {
            let text = scrape(&h).await;
            let leased = series(&text).contains(
            &r#"battery_apiserver_pool_microvms{namespace="default",pool="p",state="leased"} 1"#,
        );
            let events = series(&text)
                .iter()
                .find_map(|l| l.strip_prefix("battery_apiserver_battery_events_total "))
                .and_then(|n| n.parse::<f64>().ok())
                .unwrap_or_default();
            if leased && events > 0.0 {
                Ok(text)
            } else {
                Err(format!("never recorded: {text}"))
            }
        },
    )
    .await;
    let has = |line: &str| series(&text).contains(&line);
    assert!(
        has(r#"battery_apiserver_bind_duration_seconds_count{outcome="bound"} 1"#),
        "{text}"
    );
    assert!(
        has(r#"battery_apiserver_bind_duration_seconds_count{outcome="refused"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"battery_apiserver_battery_call_duration_seconds_count{method="ClaimVM",outcome="ok"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"battery_apiserver_battery_call_duration_seconds_count{method="ClaimVM",outcome="not_found"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("battery_apiserver_battery_event_lag_seconds "),
        "{text}"
    );
}
