//! `pools/<name>/scale` driven in-process on the embedded battery: the Scale a read
//! projects, every write kind kubectl, HPA and KEDA send, and each refusal, with battery's
//! own GetPool checked after each write that changes the size.

use battery_apiserver::testing as common;

use battery_proto::poolmgr::v1alpha1 as pb;
use battery_types::POOL_UID_LABEL;
use common::{Harness, POOLS, pool};
use http::{Request, StatusCode, header};
use serde_json::{Value, json};

const MERGE: &str = "application/merge-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";

fn scale_path(name: &str) -> String {
    format!("{POOLS}/{name}/scale")
}

/// The size battery itself holds for `default/<name>`.
async fn battery_size(h: &Harness, name: &str) -> i32 {
    let mut pools = pb::pool_admin_client::PoolAdminClient::connect(format!(
        "http://{}",
        h.battery().address()
    ))
    .await
    .unwrap();
    pools
        .get_pool(pb::GetPoolRequest {
            r#ref: Some(pb::PoolRef {
                name: name.into(),
                namespace: "default".into(),
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .spec
        .unwrap()
        .size
}

/// A Pool `name` of `size`, with all its MicroVMs available.
async fn ready_pool(h: &Harness, name: &str, size: i32) -> Value {
    h.create(POOLS, &pool(name, size)).await;
    h.wait_available(name, i64::from(size)).await;
    h.get(&format!("{POOLS}/{name}")).await.1
}

async fn scale(h: &Harness, name: &str) -> Value {
    let (status, scale) = h.get(&scale_path(name)).await;
    assert_eq!(status, StatusCode::OK, "{scale}");
    scale
}

/// Checks the write answered 200 with a Scale of `replicas`, and that the Pool and
/// battery both say so.
async fn assert_scaled(h: &Harness, name: &str, answer: (StatusCode, Value), replicas: i32) {
    let (status, scale) = answer;
    assert_eq!(status, StatusCode::OK, "{scale}");
    assert_eq!(scale["kind"], "Scale", "{scale}");
    assert_eq!(scale["spec"]["replicas"], replicas, "{scale}");
    let (_, pool) = h.get(&format!("{POOLS}/{name}")).await;
    assert_eq!(pool["spec"]["size"], replicas, "{pool}");
    // The Scale answered is the Pool as written; battery's events for the new size may
    // have changed the Pool's status (and resourceVersion) since.
    let version = |object: &Value| -> u64 {
        object["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|rv| rv.parse().ok())
            .unwrap_or_else(|| panic!("a resourceVersion: {object}"))
    };
    assert!(version(&scale) <= version(&pool), "{scale}\n{pool}");
    assert_eq!(battery_size(h, name).await, replicas);
}

async fn send(
    h: &Harness,
    method: &str,
    uri: &str,
    content_type: &str,
    body: Value,
) -> (StatusCode, Value) {
    let (status, _, body) = h.call(method, uri, content_type, Some(body)).await;
    (status, body)
}

#[tokio::test]
async fn a_read_projects_the_pool() {
    let h = Harness::start().await;
    ready_pool(&h, "read", 2).await;
    // battery's late events may still change the Pool's status, and its resourceVersion:
    // compare a Scale read between two reads of one version of the Pool.
    let path = format!("{POOLS}/read");
    let mut stable = None;
    for _ in 0..50 {
        let (_, before) = h.get(&path).await;
        let read = scale(&h, "read").await;
        let (_, pool) = h.get(&path).await;
        if before["metadata"]["resourceVersion"] == pool["metadata"]["resourceVersion"] {
            stable = Some((pool, read));
            break;
        }
    }
    let (pool, read) = stable.expect("the Pool settled");
    let uid = pool["metadata"]["uid"].as_str().unwrap();
    assert_eq!(
        read,
        json!({
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                "name": "read",
                "namespace": "default",
                "uid": uid,
                "resourceVersion": pool["metadata"]["resourceVersion"],
                "creationTimestamp": pool["metadata"]["creationTimestamp"],
            },
            "spec": {"replicas": 2},
            "status": {"replicas": 2, "selector": format!("{POOL_UID_LABEL}={uid}")},
        })
    );

    // `kubectl get --subresource=scale` asks for a Table: kube-apiserver's columns.
    let (status, table) = h
        .json(
            Request::get(scale_path("read"))
                .header(
                    header::ACCEPT,
                    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
                )
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{table}");
    assert_eq!(table["kind"], "Table");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(columns, ["Name", "Desired", "Available"]);
    assert_eq!(table["rows"][0]["cells"], json!(["read", 2, 2]));

    // A leased MicroVM comes on top of size for ImmediateOnLease: replicas counts what
    // battery keeps at size, the replacement included.
    let (status, _, bound) = h.claim("c1", "read").await;
    assert_eq!(status, StatusCode::CREATED, "{bound}");
    h.eventually(&format!("{POOLS}/read"), |_, pool| {
        pool["status"]["leased"] == 1 && pool["status"]["available"] == 2
    })
    .await;
    assert_eq!(scale(&h, "read").await["status"]["replicas"], 2);

    let (status, missing) = h.get(&scale_path("nosuch")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{missing}");
    assert_eq!(
        missing["message"],
        "pools.battery.liquidmetal-x.dev \"nosuch\" not found"
    );
}

#[tokio::test]
async fn every_patch_kind_changes_the_pool_and_battery() {
    let h = Harness::start().await;
    let before = ready_pool(&h, "patched", 1).await;
    let path = scale_path("patched");

    // `kubectl scale` sends a merge patch.
    let answer = send(&h, "PATCH", &path, MERGE, json!({"spec": {"replicas": 3}})).await;
    assert_scaled(&h, "patched", answer, 3).await;
    let (_, after) = h.get(&format!("{POOLS}/patched")).await;
    assert_eq!(
        after["metadata"]["generation"],
        before["metadata"]["generation"].as_i64().unwrap() + 1,
        "a new size is a new spec"
    );
    // battery provisions to the new size, and status.replicas follows.
    h.wait_available("patched", 3).await;
    assert_eq!(scale(&h, "patched").await["status"]["replicas"], 3);

    // `kubectl patch --subresource=scale`'s default, and a JSON patch.
    let answer = send(
        &h,
        "PATCH",
        &path,
        STRATEGIC,
        json!({"spec": {"replicas": 2}}),
    )
    .await;
    assert_scaled(&h, "patched", answer, 2).await;
    let ops = json!([
        {"op": "test", "path": "/spec/replicas", "value": 2},
        {"op": "replace", "path": "/spec/replicas", "value": 4},
    ]);
    let answer = send(&h, "PATCH", &path, JSON_PATCH, ops).await;
    assert_scaled(&h, "patched", answer, 4).await;

    // dryRun answers the Scale it would write and changes nothing.
    let (status, dry) = send(
        &h,
        "PATCH",
        &format!("{path}?dryRun=All"),
        MERGE,
        json!({"spec": {"replicas": 9}}),
    )
    .await;
    assert_eq!(
        (status, &dry["spec"]["replicas"]),
        (StatusCode::OK, &json!(9))
    );
    assert_eq!(battery_size(&h, "patched").await, 4);
    assert_eq!(scale(&h, "patched").await["spec"]["replicas"], 4);

    // Server-side apply is not served here: 415 naming what is.
    let (status, refused) = send(
        &h,
        "PATCH",
        &format!("{path}?fieldManager=x"),
        "application/apply-patch+yaml",
        json!({"spec": {"replicas": 1}}),
    )
    .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .ends_with("application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_put_scales_with_resource_version_preconditions() {
    let h = Harness::start().await;
    ready_pool(&h, "put", 1).await;
    let path = scale_path("put");

    // HPA's write: the Scale it read, with a new spec.replicas. battery's late events
    // for the new Pool move its resourceVersion too, so a write that loses that race is
    // read and sent again, as HPA does on its next sync; each loss must be a real change.
    let mut attempts = 0;
    let (mut read, answer) = loop {
        let mut read = scale(&h, "put").await;
        read["spec"]["replicas"] = json!(2);
        let answer = send(&h, "PUT", &path, "application/json", read.clone()).await;
        if answer.0 != StatusCode::CONFLICT {
            break (read, answer);
        }
        let now = scale(&h, "put").await;
        assert_ne!(
            now["metadata"]["resourceVersion"], read["metadata"]["resourceVersion"],
            "a conflict on an unchanged Pool: {}",
            answer.1
        );
        attempts += 1;
        assert!(attempts < 20, "the Pool never settled: {}", answer.1);
    };
    assert_scaled(&h, "put", answer, 2).await;

    // The same body again is stale: 409, as for a Deployment, and nothing changes.
    read["spec"]["replicas"] = json!(5);
    let (status, conflict) = send(&h, "PUT", &path, "application/json", read.clone()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{conflict}");
    assert_eq!(
        conflict["message"],
        "Operation cannot be fulfilled on pools.battery.liquidmetal-x.dev \"put\": the object has been modified; please apply your changes to the latest version and try again"
    );
    assert_eq!(battery_size(&h, "put").await, 2);

    // Without a resourceVersion the write applies to whatever is current.
    read["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let answer = send(&h, "PUT", &path, "application/json", read.clone()).await;
    assert_scaled(&h, "put", answer, 5).await;

    // A body for another object, or of another kind, is refused.
    let mut other = read.clone();
    other["metadata"]["name"] = json!("other");
    let (status, refused) = send(&h, "PUT", &path, "application/json", other).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    let mut pool_kind = read.clone();
    pool_kind["kind"] = json!("Pool");
    let (status, refused) = send(&h, "PUT", &path, "application/json", pool_kind).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
}

#[tokio::test]
async fn refusals_name_the_field_and_change_nothing() {
    let h = Harness::start().await;
    ready_pool(&h, "refused", 1).await;
    let path = scale_path("refused");

    let (status, invalid) =
        send(&h, "PATCH", &path, MERGE, json!({"spec": {"replicas": -1}})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{invalid}");
    assert_eq!(
        invalid["message"],
        "Scale.autoscaling \"refused\" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0"
    );
    assert_eq!(
        invalid["details"],
        json!({"name": "refused", "group": "autoscaling", "kind": "Scale", "causes": [{
            "reason": "FieldValueInvalid",
            "message": "Invalid value: -1: must be greater than or equal to 0",
            "field": "spec.replicas",
        }]})
    );
    assert_eq!(battery_size(&h, "refused").await, 1);

    let (status, missing) = send(
        &h,
        "PATCH",
        &scale_path("nosuch"),
        MERGE,
        json!({"spec": {"replicas": 1}}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{missing}");

    let (status, _) = send(&h, "DELETE", &path, "application/json", json!({})).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn a_pool_being_deleted_is_not_scaled_back_up() {
    let h = Harness::start().await;
    ready_pool(&h, "draining", 1).await;
    let (status, _, bound) = h.claim("holding", "draining").await;
    assert_eq!(status, StatusCode::CREATED, "{bound}");
    // battery refuses to delete a Pool with a lease: it drains at size 0 until released.
    let (status, _) = h
        .json(
            Request::delete(format!("{POOLS}/draining"))
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(battery_size(&h, "draining").await, 0);

    let (status, refused) = send(
        &h,
        "PATCH",
        &scale_path("draining"),
        MERGE,
        json!({"spec": {"replicas": 3}}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(
        refused["message"],
        "Operation cannot be fulfilled on pools.battery.liquidmetal-x.dev \"draining\": the pool is being deleted"
    );
    assert_eq!(battery_size(&h, "draining").await, 0);
}
