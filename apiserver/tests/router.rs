//! The server's router driven in-process (no socket), on the embedded battery: what
//! kubectl cannot show directly — watch resourceVersion semantics, bookmarks, streaming
//! lists, metadata-only watches, pagination, discovery caching and content negotiation.

use battery_apiserver::testing as common;

use std::time::Duration;

use axum::body::Body;
use battery_apiserver::dev::pki::DEV_USER;
use battery_apiserver::meta_store::MetaStore;
use battery_apiserver::server::Settings;
use common::{CLAIMS, Harness, POOLS, as_dev, as_user, claim, get, pool, post};
use futures::StreamExt;
use http::{Request, StatusCode, header};
use serde_json::{Value, json};
use tower::ServiceExt;

async fn next_event(stream: &mut (impl futures::Stream<Item = Value> + Unpin)) -> Value {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("a watch event within 10s")
        .expect("the watch is still open")
}

#[tokio::test]
async fn a_watch_from_a_version_sees_only_later_changes_and_an_old_one_is_expired() {
    let h = Harness::start().await;
    let first = h.create_pool("a", 0).await;
    let rv = first["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut events = Box::pin(
        h.watch(
            &format!("{POOLS}?watch=true&resourceVersion={rv}"),
            "application/json",
        )
        .await,
    );
    h.create_pool("b", 0).await;
    let event = next_event(&mut events).await;
    assert_eq!(event["type"], "ADDED");
    assert_eq!(
        event["object"]["metadata"]["name"], "b",
        "a was before the version asked for"
    );

    // "0" means from any version: the current objects first, as ADDED.
    let mut from_any = Box::pin(
        h.watch(
            &format!("{POOLS}?watch=true&resourceVersion=0"),
            "application/json",
        )
        .await,
    );
    for name in ["a", "b"] {
        let event = next_event(&mut from_any).await;
        assert_eq!(
            (
                event["type"].as_str(),
                event["object"]["metadata"]["name"].as_str()
            ),
            (Some("ADDED"), Some(name))
        );
    }
}

#[tokio::test]
async fn a_version_older_than_the_watch_history_is_expired() {
    // A store that has handed out versions 1-5 before this server started.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.redb");
    std::sync::Arc::new(MetaStore::open(&path).unwrap())
        .transact(
            |tx| -> Result<(), battery_apiserver::meta_store::StoreError> {
                for _ in 0..5 {
                    tx.next_resource_version();
                }
                Ok(())
            },
        )
        .await
        .unwrap();
    let h = Harness::with_store(MetaStore::open(&path).unwrap()).await;
    let (status, body) = h
        .json(get(&format!("{POOLS}?watch=true&resourceVersion=1")))
        .await;
    assert_eq!(status, StatusCode::GONE, "{body}");
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "Expired");
}

#[tokio::test]
async fn a_streaming_list_ends_its_initial_events_with_the_annotated_bookmark() {
    let h = Harness::start().await;
    h.create_pool("a", 0).await;
    h.create_pool("b", 0).await;
    let mut events = Box::pin(
        h.watch(
            &format!("{POOLS}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"),
            "application/json",
        )
        .await,
    );
    let names: Vec<Value> = vec![next_event(&mut events).await, next_event(&mut events).await]
        .into_iter()
        .map(|e| {
            assert_eq!(e["type"], "ADDED");
            e["object"]["metadata"]["name"].clone()
        })
        .collect();
    assert_eq!(names, [json!("a"), json!("b")]);
    let bookmark = next_event(&mut events).await;
    assert_eq!(bookmark["type"], "BOOKMARK");
    assert_eq!(bookmark["object"]["kind"], "Pool");
    assert_eq!(
        bookmark["object"]["apiVersion"],
        "battery.liquidmetal-x.dev/v1alpha1"
    );
    assert_eq!(
        bookmark["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );

    // Without bookmarks a streaming list cannot end its initial events: refused.
    let (status, body) = h
        .json(get(&format!(
            "{POOLS}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
        )))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

#[tokio::test]
async fn a_metadata_only_watch_sends_partial_object_metadata() {
    let h = Harness::start().await;
    let accept = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
    let mut events = Box::pin(h.watch(&format!("{POOLS}?watch=true"), accept).await);
    h.create_pool("m", 0).await;
    let event = next_event(&mut events).await;
    assert_eq!(event["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(event["object"]["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(event["object"]["metadata"]["name"], "m");
    assert!(event["object"].get("spec").is_none());
}

#[tokio::test]
async fn table_watch_sends_columns_once() {
    let h = Harness::start().await;
    let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
    let mut events = Box::pin(h.watch(&format!("{POOLS}?watch=true"), accept).await);
    h.create_pool("t1", 0).await;
    h.create_pool("t2", 0).await;
    let first = next_event(&mut events).await;
    let second = next_event(&mut events).await;
    assert_eq!(first["object"]["kind"], "Table");
    let columns: Vec<&str> = first["object"]["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        ["Name", "Size", "Available", "Leased", "Ready", "Age"]
    );
    assert_eq!(second["object"]["columnDefinitions"], json!([]));
    assert_eq!(second["object"]["rows"][0]["cells"][0], "t2");
}

#[tokio::test]
async fn lists_page_with_limit_and_continue() {
    let h = Harness::start().await;
    for name in ["p1", "p2", "p3"] {
        h.create_pool(name, 0).await;
    }
    let (_, page1) = h.json(get(&format!("{POOLS}?limit=2"))).await;
    let names = |list: &Value| -> Vec<String> {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(&page1), ["p1", "p2"]);
    assert_eq!(page1["metadata"]["remainingItemCount"], 1);
    let token = page1["metadata"]["continue"].as_str().unwrap();
    let (_, page2) = h
        .json(get(&format!("{POOLS}?limit=2&continue={token}")))
        .await;
    assert_eq!(names(&page2), ["p3"]);
    assert!(page2["metadata"].get("continue").is_none());
    let (status, bad) = h.json(get(&format!("{POOLS}?continue=garbage"))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    // With a selector what follows is not counted (it would be before filtering), as
    // kube-apiserver leaves it out; the token still resumes.
    let (_, selected) = h
        .json(get(&format!("{POOLS}?limit=2&labelSelector=team%3Dci")))
        .await;
    assert_eq!(names(&selected), ["p1", "p2"]);
    assert!(
        selected["metadata"].get("remainingItemCount").is_none(),
        "{selected}"
    );
    let token = selected["metadata"]["continue"].as_str().unwrap();
    let (_, rest) = h
        .json(get(&format!(
            "{POOLS}?limit=2&labelSelector=team%3Dci&continue={token}"
        )))
        .await;
    assert_eq!(names(&rest), ["p3"]);
}

#[tokio::test]
async fn label_and_field_selectors_filter_and_unknown_fields_are_refused() {
    let h = Harness::start().await;
    h.create_pool("sel", 0).await;
    let (_, hit) = h
        .json(get(&format!("{POOLS}?labelSelector=team%3Dci")))
        .await;
    assert_eq!(hit["items"].as_array().unwrap().len(), 1);
    let (_, miss) = h
        .json(get(&format!("{POOLS}?labelSelector=team%3Dother")))
        .await;
    assert_eq!(miss["items"].as_array().unwrap().len(), 0);
    let (_, by_name) = h
        .json(get(&format!("{POOLS}?fieldSelector=metadata.name%3Dsel")))
        .await;
    assert_eq!(by_name["items"].as_array().unwrap().len(), 1);
    let (status, body) = h
        .json(get(&format!("{POOLS}?fieldSelector=spec.size%3D1")))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["message"], "field label not supported: spec.size");
}

#[tokio::test]
async fn aggregated_discovery_is_cached_by_etag_and_other_representations_are_406() {
    let h = Harness::start().await;
    let accept =
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
    let (status, headers, _) = h
        .send(
            Request::get("/apis")
                .header(header::ACCEPT, accept)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers[header::CONTENT_TYPE],
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    );
    let etag = headers[header::ETAG].clone();
    let (status, _, body) = h
        .send(
            Request::get("/apis")
                .header(header::ACCEPT, accept)
                .header(header::IF_NONE_MATCH, etag)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_MODIFIED);
    assert!(body.is_empty());
    let (status, _, _) = h
        .send(
            Request::get("/apis")
                .header(header::ACCEPT, "application/vnd.kubernetes.protobuf")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_ACCEPTABLE);
}

#[tokio::test]
async fn unsupported_patches_and_unknown_paths_answer_status() {
    let h = Harness::start().await;
    h.create_pool("x", 0).await;
    let (status, body) = h
        .json(
            Request::patch(format!("{POOLS}/x"))
                .header(
                    header::CONTENT_TYPE,
                    "application/strategic-merge-patch+json",
                )
                .body(Body::from("{}"))
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(body["kind"], "Status");
    let (status, body) = h
        .json(get(
            "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/nosuch",
        ))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["kind"], "Status");
    let (status, body) = h.json(get("/no/such/path")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["reason"], "NotFound");
    // The deprecated `/watch/` prefix serves GET only, as Go's routes do.
    for method in ["POST", "DELETE", "PATCH", "OPTIONS"] {
        let request = Request::builder()
            .method(method)
            .uri("/apis/battery.liquidmetal-x.dev/v1alpha1/watch/namespaces/default/pools")
            .body(Body::empty())
            .unwrap();
        let (status, body) = h.json(request).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method}: {body}");
        assert_eq!(body["reason"], "MethodNotAllowed", "{method}");
    }
}

#[tokio::test]
async fn dry_run_create_of_a_claim_binds_nothing() {
    let h = Harness::start().await;
    h.create_pool("dry", 1).await;
    let (status, body) = h
        .json(post(&format!("{CLAIMS}?dryRun=All"), &claim("c", "dry")))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(body["status"].is_null(), "a dry run binds nothing: {body}");
    let (status, _) = h.json(get(&format!("{CLAIMS}/c"))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_finalizer_holds_a_deletion_until_it_is_removed() {
    let h = Harness::start().await;
    let mut held = pool("held", 0);
    held["metadata"]["finalizers"] = json!(["example.com/hold"]);
    h.create(POOLS, &held).await;
    let delete = Request::delete(format!("{POOLS}/held"))
        .body(Body::empty())
        .unwrap();
    let (status, marked) = h.json(delete).await;
    assert_eq!(status, StatusCode::OK, "{marked}");
    assert!(
        marked["metadata"]["deletionTimestamp"].is_string(),
        "{marked}"
    );
    let (status, _) = h.json(get(&format!("{POOLS}/held"))).await;
    assert_eq!(status, StatusCode::OK, "still there while the finalizer is");

    // A new finalizer cannot join an object being deleted.
    let add = Request::patch(format!("{POOLS}/held"))
        .header(header::CONTENT_TYPE, "application/merge-patch+json")
        .body(Body::from(
            json!({"metadata": {"finalizers": ["example.com/hold", "late"]}}).to_string(),
        ))
        .unwrap();
    let (status, body) = h.json(add).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    let release = Request::patch(format!("{POOLS}/held"))
        .header(header::CONTENT_TYPE, "application/merge-patch+json")
        .body(Body::from(
            json!({"metadata": {"finalizers": null}}).to_string(),
        ))
        .unwrap();
    let (status, body) = h.json(release).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = h.json(get(&format!("{POOLS}/held"))).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "the last finalizer's removal completed the deletion"
    );
}

#[tokio::test]
async fn a_watch_ends_after_its_timeout() {
    let h = Harness::start().await;
    let request = get(&format!(
        "{POOLS}?watch=true&timeoutSeconds=1&resourceVersion=0"
    ));
    let response =
        tokio::time::timeout(Duration::from_secs(10), h.router().oneshot(as_dev(request)))
            .await
            .unwrap()
            .unwrap();
    // The whole body arrives: the stream ended by itself.
    let body = tokio::time::timeout(
        Duration::from_secs(10),
        axum::body::to_bytes(response.into_body(), usize::MAX),
    )
    .await
    .expect("the watch closed after timeoutSeconds");
    assert!(body.unwrap().is_empty(), "no pools, no events");
}

#[tokio::test]
async fn a_stale_resource_version_conflicts_and_an_update_without_one_is_invalid() {
    let h = Harness::start().await;
    let created = h.create_pool("v", 0).await;
    let mut stale = created.clone();
    stale["spec"]["size"] = json!(1);
    let put = |body: &Value| {
        Request::put(format!("{POOLS}/v"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let (status, updated) = h.json(put(&stale)).await;
    assert_eq!(status, StatusCode::OK, "{updated}");
    assert_eq!(
        updated["metadata"]["generation"], 2,
        "a spec change moves generation"
    );
    let (status, conflict) = h.json(put(&stale)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{conflict}");
    assert_eq!(conflict["reason"], "Conflict");
    let mut unversioned = updated.clone();
    unversioned["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let (status, invalid) = h.json(put(&unversioned)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{invalid}");
    // The spec and its generation are as the one accepted update left them; the
    // resourceVersion may move meanwhile, as battery's status of the Pool is followed.
    let (_, now) = h.json(get(&format!("{POOLS}/v"))).await;
    assert_eq!(
        (&now["metadata"]["generation"], &now["spec"]),
        (&updated["metadata"]["generation"], &updated["spec"]),
        "refusals changed nothing"
    );
}

#[tokio::test]
async fn watches_beyond_the_cap_and_creates_beyond_the_rate_are_429s() {
    use battery_apiserver::api::{CreateRate, Limits};
    let h = Harness::with_settings(Settings {
        limits: Limits {
            max_watches: 1,
            creates: Some(CreateRate {
                per_second: 0.1,
                burst: 2,
            }),
            ..Limits::default()
        },
        ..common::settings()
    })
    .await;
    let _open = h
        .watch(&format!("{POOLS}?watch=true"), "application/json")
        .await;
    let (status, headers, body) = h.send(get(&format!("{POOLS}?watch=true"))).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert!(headers.contains_key(header::RETRY_AFTER));

    h.create_pool("r1", 0).await;
    h.create_pool("r2", 0).await;
    let (status, headers, body) = h.send(post(POOLS, &pool("r3", 0))).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        String::from_utf8_lossy(&body)
    );
    assert!(headers.contains_key(header::RETRY_AFTER));
    let (status, _) = h.json(get(&format!("{POOLS}/r3"))).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "the refused create made nothing"
    );
}

#[tokio::test]
async fn a_request_past_its_deadline_is_a_504_status() {
    use battery_apiserver::api::Limits;
    let h = Harness::with_settings(Settings {
        limits: Limits {
            request_timeout: Duration::from_nanos(1),
            ..Limits::default()
        },
        ..common::settings()
    })
    .await;
    let (status, body) = h.json(get(POOLS)).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{body}");
    assert_eq!(body["reason"], "Timeout");
}

#[tokio::test]
async fn dev_policy_allows_its_user_and_refuses_everyone_else() {
    use battery_apiserver::http::authz::LocalPolicy;
    let h = Harness::with_settings(Settings {
        authorizer: Some(std::sync::Arc::new(LocalPolicy {
            user: DEV_USER.into(),
        })),
        ..common::settings()
    })
    .await;
    h.create_pool("mine", 0).await;
    let (status, _) = h.json_as_is(as_user("someone", get(POOLS))).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}
