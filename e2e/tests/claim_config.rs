//! Per-claim configuration end to end (issue 14): a claim's `env` and `files` from a
//! Secret and a ConfigMap, through a real kube-apiserver, as in a cluster (`serve`, the
//! embedded battery in its own process, one `battery-agent` per simulated Host): the
//! Secret and the ConfigMap are kube-apiserver's objects, and the SubjectAccessReviews
//! `serve` makes are RBAC's answers.
//!
//! The simulated Hosts run a session's commands as local processes rooted in the
//! MicroVM's directory, so the files are looked at relative to the working directory `/`
//! (which is where the write puts them, in a real guest too).

use std::collections::{BTreeMap, BTreeSet};

use battery_e2e::apiserver::{ApiServer, front};
use battery_e2e::kube_client;
use battery_types::{ClaimPhase, MicroVMClaim};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NAMESPACE: &str = "default";
const SECRET: &str = "ci-token";
const CONFIG_MAP: &str = "settings";
/// The ServiceAccount that may create and read claims, but not read Secrets.
const CREATOR: &str = "creator";

fn claim_json(name: &str, env: Value, files: Value) -> Value {
    json!({
        "apiVersion": battery_types::API_VERSION,
        "kind": "MicroVMClaim",
        "metadata": {"name": name},
        "spec": {"poolRef": {"name": "dev"}, "serviceAccountName": "dev", "env": env, "files": files},
    })
}

fn secret_env() -> Value {
    json!([{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "TOKEN"}}}])
}

/// The MicroVMs battery has leased, asked of battery itself.
async fn leased(server: &ApiServer) -> BTreeSet<String> {
    let leases = server.battery_leases().await;
    leases.into_iter().map(|lease| lease.vm_uid).collect()
}

/// Runs `command` in the claim as the kubectl user, in `/`, with the session's own
/// `env`; returns stdout and the Status.
async fn run(server: &ApiServer, claim: &str, command: &[&str], env: &[&str]) -> (String, Value) {
    server.exec_in_root(NAMESPACE, claim, command, env).await
}

#[tokio::test]
async fn env_and_files_from_a_secret_reach_the_microvm_and_nowhere_else() {
    let server = ApiServer::aggregated_with_agents().await;
    let client = kube_client(server.kubeconfig()).await;
    let token = format!("tok-{}", uuid::Uuid::new_v4().simple());
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(SECRET.to_owned()),
            ..ObjectMeta::default()
        },
        string_data: Some(BTreeMap::from([("TOKEN".to_owned(), token.clone())])),
        ..Secret::default()
    };
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIG_MAP.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("mode".to_owned(), "fast".to_owned())])),
        ..ConfigMap::default()
    };
    config_maps
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap();

    let claims: Api<MicroVMClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let env = json!([
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "TOKEN"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": CONFIG_MAP, "key": "mode"}}},
        {"name": "GREETING", "value": "hello"},
    ]);
    let files = json!([
        {"path": "/etc/app/token", "mode": 0o640, "secretKeyRef": {"name": SECRET, "key": "TOKEN"}},
        {"path": "/etc/app/settings", "configMapKeyRef": {"name": CONFIG_MAP, "key": "mode"}},
    ]);
    let claim: MicroVMClaim = serde_json::from_value(claim_json("configured", env, files)).unwrap();
    let bound = claims.create(&PostParams::default(), &claim).await.unwrap();
    assert_eq!(
        bound.status.as_ref().and_then(|s| s.phase.clone()),
        Some(ClaimPhase::Bound)
    );

    // Every session gets the claim's env; its own env wins on a clash.
    let (stdout, status) = run(
        &server,
        "configured",
        &["sh", "-c", "echo $TOKEN $MODE $GREETING"],
        &[],
    )
    .await;
    assert_eq!(stdout, format!("{token} fast hello\n"), "{status}");
    let (stdout, _) = run(
        &server,
        "configured",
        &["sh", "-c", "echo $GREETING"],
        &["GREETING=bye"],
    )
    .await;
    assert_eq!(stdout, "bye\n");

    // The files were there when the create answered, with their modes.
    let (stdout, status) = run(
        &server,
        "configured",
        &[
            "sh",
            "-c",
            "stat -c '%a %n' etc/app/token etc/app/settings && cat etc/app/token",
        ],
        &[],
    )
    .await;
    assert_eq!(
        stdout,
        format!("640 etc/app/token\n644 etc/app/settings\n{token}"),
        "{status}"
    );

    // Both are fixed once bound.
    let patch = json!({"spec": {"env": [{"name": "TOKEN", "value": "mine"}]}});
    let Err(kube::Error::Api(immutable)) = claims
        .patch("configured", &PatchParams::default(), &Patch::Merge(&patch))
        .await
    else {
        panic!("a claim's env changed");
    };
    assert_eq!(immutable.code, 422, "{immutable:?}");
    assert!(
        immutable.message.contains("spec.env: Invalid value")
            && immutable.message.contains("field is immutable"),
        "{immutable:?}"
    );

    // Someone who may create claims but not get the Secret: 403 naming it, no lease.
    let before = leased(&server).await;
    let rules = vec![front::battery_rule(&["microvmclaims"], &["get", "create"])];
    let account = front::service_account(NAMESPACE, CREATOR);
    let cluster = server.cluster().expect("aggregated");
    cluster.grant("e2e:creator", rules, account).await;
    let user = battery_types::service_account_username(NAMESPACE, CREATOR);
    let creator = cluster.service_account_client(NAMESPACE, CREATOR);
    let collection = format!(
        "/apis/{}/namespaces/{NAMESPACE}/microvmclaims",
        battery_types::API_VERSION
    );
    let (code, body) = creator
        .call(
            "POST",
            &collection,
            &[],
            Some(claim_json("borrowed", secret_env(), json!([]))),
        )
        .await;
    assert_eq!(code, 403, "{body}");
    assert_eq!(
        body["message"],
        format!(
            "secrets \"{SECRET}\" is forbidden: User \"{user}\" cannot get resource \"secrets\" in API group \"\" in the namespace \"{NAMESPACE}\""
        ),
        "{body}"
    );
    assert_eq!(leased(&server).await, before);
    let (code, _) = creator.get(&format!("{collection}/borrowed")).await;
    assert_eq!(code, 404);

    // A key the Secret lacks: 422 naming it, no lease.
    let missing =
        json!([{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "NOPE"}}}]);
    let claim: MicroVMClaim =
        serde_json::from_value(claim_json("keyless", missing, json!([]))).unwrap();
    let Err(kube::Error::Api(refused)) = claims.create(&PostParams::default(), &claim).await else {
        panic!("a claim naming a missing key was bound");
    };
    assert_eq!(refused.code, 422, "{refused:?}");
    assert!(
        refused.message.contains(&format!(
            "spec.env[0].valueFrom.secretKeyRef.key: Invalid value: \"NOPE\": no such key in Secret {NAMESPACE}/{SECRET}"
        )),
        "{refused:?}"
    );
    assert_eq!(leased(&server).await, before);

    // A write that fails (its parent is a file the claim wrote first): an error naming
    // the path, the lease released, no claim.
    let clashing = json!([
        {"path": "/srv/a", "secretKeyRef": {"name": SECRET, "key": "TOKEN"}},
        {"path": "/srv/a/b", "secretKeyRef": {"name": SECRET, "key": "TOKEN"}},
    ]);
    let claim: MicroVMClaim =
        serde_json::from_value(claim_json("unwritable", json!([]), clashing)).unwrap();
    let Err(kube::Error::Api(failed)) = claims.create(&PostParams::default(), &claim).await else {
        panic!("a claim whose file cannot be written was bound");
    };
    assert_eq!(failed.code, 500, "{failed:?}");
    assert!(
        failed
            .message
            .contains("cannot write files /srv/a, /srv/a/b")
            && failed.message.contains("srv/a/b: Cannot open"),
        "{failed:?}"
    );
    assert_eq!(leased(&server).await, before);
    assert!(matches!(
        claims.get("unwritable").await,
        Err(kube::Error::Api(e)) if e.code == 404
    ));

    // The value is in no claim, no Event, no log.
    let kubectl = server.kubectls().next().expect("a kubectl");
    let yaml = kubectl
        .ok(&["get", "microvmclaims", "-o", "yaml", "-n", NAMESPACE])
        .await;
    assert!(yaml.contains("secretKeyRef"), "{yaml}");
    assert!(!yaml.contains(&token), "{yaml}");
    let events: Api<Event> = Api::all(client.clone());
    let events = serde_json::to_string(&events.list(&Default::default()).await.unwrap()).unwrap();
    assert!(!events.contains(&token), "{events}");
    let logs = server.logs();
    for log in logs {
        let text = String::from_utf8_lossy(&std::fs::read(&log).unwrap()).into_owned();
        assert!(!text.contains(&token), "{} holds the value", log.display());
    }
}

#[tokio::test]
async fn dev_has_literal_env_and_refuses_references() {
    let server = ApiServer::start(battery_e2e::apiserver::Route::Direct).await;
    let claims: Api<MicroVMClaim> =
        Api::namespaced(kube_client(server.kubeconfig()).await, NAMESPACE);
    let literal = json!([{"name": "GREETING", "value": "hello"}]);
    let claim: MicroVMClaim =
        serde_json::from_value(claim_json("literal", literal, json!([]))).unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    let (stdout, status) = run(&server, "literal", &["sh", "-c", "echo $GREETING"], &[]).await;
    assert_eq!(stdout, "hello\n", "{status}");

    let claim: MicroVMClaim =
        serde_json::from_value(claim_json("referring", secret_env(), json!([]))).unwrap();
    let Err(kube::Error::Api(refused)) = claims.create(&PostParams::default(), &claim).await else {
        panic!("dev bound a claim naming a Secret");
    };
    assert_eq!(refused.code, 400, "{refused:?}");
    assert!(refused.message.contains("no cluster"), "{refused:?}");

    // The published schema shows both fields.
    let kubectl = server.kubectls().next().expect("a kubectl");
    let output = kubectl.ok(&["explain", "microvmclaim.spec.files"]).await;
    for expected in [
        "path\t<string> -required-",
        "mode\t<integer>",
        "secretKeyRef\t<Object>",
    ] {
        assert!(output.contains(expected), "{expected:?} in {output}");
    }
    let output = kubectl
        .ok(&["explain", "microvmclaim.spec.env.valueFrom.secretKeyRef"])
        .await;
    for expected in ["key\t<string> -required-", "optional\t<boolean>"] {
        assert!(output.contains(expected), "{expected:?} in {output}");
    }
}
