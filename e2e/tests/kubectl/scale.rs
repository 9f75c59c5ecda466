//! `pools/<name>/scale`, the `autoscaling/v1` Scale subresource, as a Deployment's: `kubectl
//! scale` (which finds the Scale kind through discovery), `kubectl get --raw` and `get
//! --subresource=scale`, `kubectl patch --subresource=scale` with its default strategic
//! merge patch, an HPA's read and write through client-go's shape (kube-rs' scale calls),
//! the errors, RBAC on `pools/scale`, and discovery and OpenAPI listing it. Every write is
//! checked on the Pool's `spec.size`, and on battery's own GetPool where battery runs as
//! a process of its own (the aggregated route).

use std::time::Duration;

use battery_api_machinery::selectors::LabelSelector;
use battery_e2e::apiserver::{ApiServer, Kubectl, Route, front};
use battery_e2e::eventually;
use battery_e2e::https::{Client, Identity};
use battery_types::{POOL_UID_LABEL, Pool};
use k8s_openapi::api::autoscaling::v1::Scale;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::{DEV_POOL, GROUP, GROUP_VERSION, assert_contains_all, table, text};

crate::on_both_routes!(
    kubectl_scale_sets_the_pool_size_and_battery_follows,
    patch_and_get_the_scale_subresource,
    an_hpa_reads_the_selector_and_writes_with_preconditions,
    refusals_are_kubernetes_errors,
    discovery_and_openapi_list_the_scale,
);

/// `kubectl get --raw` path of the dev Pool's Scale.
const SCALE_PATH: &str =
    "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/pools/dev/scale";
/// How long battery may take to provision up to a new size.
const PROVISION_TIMEOUT: Duration = Duration::from_secs(30);

async fn raw_scale(kubectl: &Kubectl) -> Value {
    kubectl.json(&["get", "--raw", SCALE_PATH]).await
}

async fn pool_size(kubectl: &Kubectl) -> Value {
    kubectl
        .json(&["get", "bpool", DEV_POOL, "-o", "json"])
        .await["spec"]["size"]
        .clone()
}

/// The size battery holds for the dev Pool, asked of battery itself; `None` where battery
/// runs inside `battery-apiserver dev` and has no address of its own.
async fn battery_size(server: &ApiServer) -> Option<i32> {
    let access = server.battery_access()?;
    let mut pools = battery_e2e::api::pool_admin_client::PoolAdminClient::new(access.channel());
    let pool = pools
        .get_pool(battery_e2e::api::GetPoolRequest {
            r#ref: Some(battery_e2e::api::PoolRef {
                name: DEV_POOL.into(),
                namespace: "default".into(),
            }),
        })
        .await
        .expect("GetPool")
        .into_inner();
    Some(pool.spec.expect("a pool has a spec").size)
}

/// The Pool's `spec.size` and battery's size are both `size`.
async fn assert_size(server: &ApiServer, kubectl: &Kubectl, size: i64, what: &str) {
    assert_eq!(
        pool_size(kubectl).await,
        size,
        "kubectl {}: {what}: spec.size",
        kubectl.version()
    );
    if let Some(battery) = battery_size(server).await {
        assert_eq!(i64::from(battery), size, "{what}: battery's GetPool");
    }
}

/// Waits until battery has provisioned the dev Pool to `replicas`, as the Scale shows it.
async fn await_replicas(kubectl: &Kubectl, replicas: i64) {
    eventually(
        PROVISION_TIMEOUT,
        "the Scale's status.replicas",
        async || match raw_scale(kubectl).await["status"]["replicas"].as_i64() {
            Some(now) if now == replicas => Ok(()),
            now => Err(format!("{now:?}, expecting {replicas}")),
        },
    )
    .await;
}

async fn kubectl_scale_sets_the_pool_size_and_battery_follows(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let original = raw_scale(&kubectl).await["spec"]["replicas"]
            .as_i64()
            .expect("the Scale has spec.replicas");
        let output = kubectl
            .ok(&["scale", "bpool", DEV_POOL, "--replicas=5"])
            .await;
        assert_eq!(output.trim_end(), format!("pool.{GROUP}/{DEV_POOL} scaled"));
        assert_size(&server, &kubectl, 5, "kubectl scale --replicas=5").await;
        await_replicas(&kubectl, 5).await;

        // With a precondition kubectl reads the Scale, checks it and writes it back (PUT).
        let stderr = kubectl
            .fails(&[
                "scale",
                "bpool",
                DEV_POOL,
                "--current-replicas=2",
                "--replicas=4",
            ])
            .await;
        assert_contains_all(
            &stderr,
            &["Expected replicas to be 2, was 5"],
            "kubectl scale --current-replicas with the wrong count",
        );
        assert_size(&server, &kubectl, 5, "a refused precondition").await;
        let output = kubectl
            .ok(&[
                "scale",
                "bpool",
                DEV_POOL,
                "--current-replicas=5",
                "--replicas=4",
            ])
            .await;
        assert_eq!(output.trim_end(), format!("pool.{GROUP}/{DEV_POOL} scaled"));
        assert_size(&server, &kubectl, 4, "kubectl scale --current-replicas=5").await;

        // A size reduction only stops provisioning: battery keeps the surplus.
        let size = original.to_string();
        kubectl
            .ok(&["scale", "bpool", DEV_POOL, &format!("--replicas={size}")])
            .await;
        assert_size(&server, &kubectl, original, "scaled back").await;
    }
}

async fn patch_and_get_the_scale_subresource(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let original = raw_scale(&kubectl).await["spec"]["replicas"].clone();
        // kubectl patch's default type is a strategic merge patch, which a Scale takes.
        let output = kubectl
            .ok(&[
                "patch",
                "bpool",
                DEV_POOL,
                "--subresource=scale",
                "-p",
                r#"{"spec":{"replicas":4}}"#,
            ])
            .await;
        // kubectl names what the server answered, as for `deployments/scale`.
        assert_eq!(
            output.trim_end(),
            format!("scale.autoscaling/{DEV_POOL} patched")
        );
        assert_size(&server, &kubectl, 4, "patch --subresource=scale").await;
        await_replicas(&kubectl, 4).await;

        // `get --subresource=scale` prints kube-apiserver's Scale columns.
        let output = kubectl
            .ok(&["get", "bpool", DEV_POOL, "--subresource=scale"])
            .await;
        assert_eq!(
            table(&output),
            [
                vec!["NAME", "DESIRED", "AVAILABLE"],
                vec![DEV_POOL, "4", "4"]
            ],
            "kubectl {}: get --subresource=scale:\n{output}",
            kubectl.version()
        );
        let scale = kubectl
            .json(&[
                "get",
                "bpool",
                DEV_POOL,
                "--subresource=scale",
                "-o",
                "json",
            ])
            .await;
        assert_eq!(scale["apiVersion"], "autoscaling/v1", "{scale:#}");
        assert_eq!(scale["kind"], "Scale", "{scale:#}");

        let json_patch =
            format!(r#"[{{"op":"replace","path":"/spec/replicas","value":{original}}}]"#);
        kubectl
            .ok(&[
                "patch",
                "bpool",
                DEV_POOL,
                "--subresource=scale",
                "--type=json",
                "-p",
                &json_patch,
            ])
            .await;
        assert_size(
            &server,
            &kubectl,
            original.as_i64().unwrap(),
            "a JSON patch",
        )
        .await;
    }
}

async fn an_hpa_reads_the_selector_and_writes_with_preconditions(route: Route) {
    let server = ApiServer::start(route).await;
    let pools: Api<Pool> = Api::namespaced(
        battery_e2e::kube_client(server.kubeconfig()).await,
        "default",
    );
    let pool = pools.get(DEV_POOL).await.expect("the dev Pool");
    let uid = pool.metadata.uid.clone().expect("a uid");

    // HPA parses status.selector as a label selector; it names this Pool and no other.
    // Read once battery has started the Pool's MicroVMs, when it counts them all.
    let read: Scale = eventually(PROVISION_TIMEOUT, "a settled Scale", async || {
        let scale = pools.get_scale(DEV_POOL).await.map_err(|e| e.to_string())?;
        let desired = scale.spec.as_ref().and_then(|s| s.replicas);
        match scale.status.as_ref().map(|s| s.replicas) {
            Some(observed) if Some(observed) == desired => Ok(scale),
            observed => Err(format!(
                "status.replicas {observed:?}, spec.replicas {desired:?}"
            )),
        }
    })
    .await;
    let status = read.status.clone().expect("a Scale has a status");
    let selector = LabelSelector::parse(status.selector.as_deref().unwrap_or_default())
        .expect("status.selector parses as a label selector");
    let labels = |uid: &str| [(POOL_UID_LABEL.to_owned(), uid.to_owned())].into();
    assert!(selector.matches(&labels(&uid)), "{status:?}");
    assert!(!selector.matches(&labels("another-pool")), "{status:?}");
    assert!(!selector.matches(&Default::default()), "{status:?}");
    let replicas = read
        .spec
        .as_ref()
        .and_then(|s| s.replicas)
        .unwrap_or_default();
    assert_eq!(status.replicas, replicas, "a settled Pool is at size");

    // HPA writes back the Scale it read, with its resourceVersion; battery's events move
    // the Pool's resourceVersion too, so a write that loses the race is read and sent
    // again, as HPA does on its next sync.
    let (wanted, written) = eventually(PROVISION_TIMEOUT, "a PUT of a fresh Scale", async || {
        let mut wanted = pools.get_scale(DEV_POOL).await.map_err(|e| e.to_string())?;
        wanted.spec.as_mut().unwrap().replicas = Some(replicas + 1);
        match pools
            .replace_scale(DEV_POOL, &PostParams::default(), &wanted)
            .await
        {
            Ok(written) => Ok((wanted, written)),
            Err(kube::Error::Api(status)) if status.code == 409 => Err(status.message),
            Err(e) => panic!("PUT scale: {e}"),
        }
    })
    .await;
    assert_eq!(written.spec.unwrap().replicas, Some(replicas + 1));
    assert_ne!(
        written.metadata.resource_version, wanted.metadata.resource_version,
        "a write is a new resourceVersion"
    );
    // The Scale written from is stale now: 409, as for a Deployment.
    match pools
        .replace_scale(DEV_POOL, &PostParams::default(), &wanted)
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 409, "{status:?}"),
        other => panic!("a stale Scale was written: {other:?}"),
    }
    let pool = pools.get(DEV_POOL).await.unwrap();
    assert_eq!(pool.spec.size, Some(replicas + 1));
    if let Some(size) = battery_size(&server).await {
        assert_eq!(size, replicas + 1);
    }
}

async fn refusals_are_kubernetes_errors(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let size = pool_size(&kubectl).await;
        let stderr = kubectl
            .fails(&[
                "patch",
                "bpool",
                DEV_POOL,
                "--subresource=scale",
                "--type=merge",
                "-p",
                r#"{"spec":{"replicas":-1}}"#,
            ])
            .await;
        assert_contains_all(
            &stderr,
            &[
                r#"The Scale "dev" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0"#,
            ],
            "a negative count",
        );

        let stderr = kubectl
            .fails(&["scale", "bpool", "nosuch", "--replicas=1"])
            .await;
        assert_contains_all(
            &stderr,
            &[&format!(r#"pools.{GROUP} "nosuch" not found"#)],
            "kubectl scale of a missing Pool",
        );
        let stderr = kubectl
            .fails(&[
                "get",
                "--raw",
                "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/pools/nosuch/scale",
            ])
            .await;
        assert_contains_all(&stderr, &["NotFound"], "the Scale of a missing Pool");

        // A PUT of a Scale read before another write: 409 Conflict.
        let stale = raw_scale(&kubectl).await;
        kubectl
            .ok(&[
                "scale",
                "bpool",
                DEV_POOL,
                &format!("--replicas={}", size.as_i64().unwrap() + 1),
            ])
            .await;
        let mut body = stale.clone();
        body["spec"]["replicas"] = json!(7);
        let stderr = kubectl
            .cmd(&["replace", "--raw", SCALE_PATH, "-f", "-"])
            .stdin(body.to_string())
            .fails()
            .await;
        assert_contains_all(
            &stderr,
            &[
                "Conflict",
                &format!(
                    r#"Operation cannot be fulfilled on pools.{GROUP} "dev": the object has been modified"#
                ),
            ],
            "a stale PUT",
        );
        assert_eq!(pool_size(&kubectl).await, size.as_i64().unwrap() + 1);
        kubectl
            .ok(&["scale", "bpool", DEV_POOL, &format!("--replicas={size}")])
            .await;
        assert_size(&server, &kubectl, size.as_i64().unwrap(), "restored").await;
    }
}

async fn discovery_and_openapi_list_the_scale(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let list = kubectl
            .json(&["get", "--raw", &format!("/apis/{GROUP_VERSION}")])
            .await;
        let scale = list["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .find(|r| r["name"] == "pools/scale")
            .unwrap_or_else(|| panic!("no pools/scale in discovery: {list:#}"));
        assert_eq!(
            (&scale["group"], &scale["version"], &scale["kind"]),
            (&json!("autoscaling"), &json!("v1"), &json!("Scale")),
            "{scale:#}"
        );
        assert_eq!(
            scale["verbs"],
            json!(["get", "patch", "update"]),
            "{scale:#}"
        );

        let path =
            "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/{namespace}/pools/{name}/scale";
        let gvk = json!({"group": "autoscaling", "version": "v1", "kind": "Scale"});
        let v2 = kubectl.json(&["get", "--raw", "/openapi/v2"]).await;
        for method in ["get", "put", "patch"] {
            assert_eq!(
                v2["paths"][path][method]["x-kubernetes-group-version-kind"], gvk,
                "/openapi/v2 {method} {path}"
            );
        }
        assert_eq!(
            v2["paths"][path]["get"]["responses"]["200"]["schema"]["$ref"],
            "#/definitions/io.k8s.api.autoscaling.v1.Scale"
        );
        assert_eq!(
            v2["definitions"]["io.k8s.api.autoscaling.v1.Scale"]["x-kubernetes-group-version-kind"],
            json!([gvk])
        );
        let v3 = kubectl
            .json(&["get", "--raw", &format!("/openapi/v3/apis/{GROUP_VERSION}")])
            .await;
        let patch = &v3["paths"][path]["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"], gvk);
        assert!(
            patch["requestBody"]["content"]
                .get("application/strategic-merge-patch+json")
                .is_some(),
            "{patch:#}"
        );
        assert_eq!(
            text(
                &v3["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
                    ["$ref"]
            ),
            "#/components/schemas/io.k8s.api.autoscaling.v1.Scale"
        );
    }
}

/// RBAC on `pools/scale` as a real cluster's RBAC sees it: reading the Pool is not
/// scaling it, and `update`/`patch` on `pools/scale` are what let one scale. The writes
/// without them never reach us: kube-apiserver refuses them itself, in its own words.
#[tokio::test]
async fn rbac_names_pools_scale() {
    const SCALER: &str = "scaler";
    let server = ApiServer::start(Route::Aggregated).await;
    let cluster = server
        .cluster()
        .expect("the aggregated route has a control plane");
    let grant = async |role: &str, resources: &[&str], verbs: &[&str]| {
        let rules = vec![front::battery_rule(resources, verbs)];
        cluster.grant(role, rules, front::user(SCALER)).await;
    };
    grant("e2e:scaler-read", &["pools", "pools/scale"], &["get"]).await;
    let (cert, key, _) = server.client_certificate(SCALER, &[]);
    let scaler = Client::new(cluster.url(), &cluster.ca(), Identity::Cert(cert, key));
    let (code, read) = scaler.get(SCALE_PATH).await;
    assert_eq!(code, 200, "{read}");
    let size = read["spec"]["replicas"].as_i64().unwrap();

    let merge = [("content-type", "application/merge-patch+json")];
    let patch = json!({"spec": {"replicas": size + 1}});
    let (code, refused) = scaler
        .call("PATCH", SCALE_PATH, &merge, Some(patch.clone()))
        .await;
    assert_eq!(code, 403, "{refused}");
    assert!(
        text(&refused["message"]).starts_with(&format!(
            r#"pools.{GROUP} "dev" is forbidden: User "{SCALER}" cannot patch resource "pools/scale" in API group "{GROUP}" in the namespace "default""#
        )),
        "{refused}"
    );
    let (code, refused) = scaler
        .call("PUT", SCALE_PATH, &[], Some(read.clone()))
        .await;
    assert_eq!(code, 403, "{refused}");
    assert_eq!(
        battery_size(&server).await,
        Some(i32::try_from(size).unwrap())
    );

    grant("e2e:scaler-scale", &["pools/scale"], &["update", "patch"]).await;
    let (code, scaled) = scaler.call("PATCH", SCALE_PATH, &merge, Some(patch)).await;
    assert_eq!(code, 200, "{scaled}");
    assert_eq!(
        battery_size(&server).await,
        Some(i32::try_from(size + 1).unwrap())
    );
}
