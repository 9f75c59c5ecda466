use std::sync::Mutex;

use futures::future::BoxFuture;
use serde_json::json;

use super::*;

fn claim(spec: serde_json::Value) -> MicroVMClaim {
    serde_json::from_value(json!({
        "apiVersion": battery_types::API_VERSION,
        "kind": "MicroVMClaim",
        "metadata": {"name": "build", "namespace": "ci", "uid": "u-1"},
        "spec": spec,
    }))
    .unwrap()
}

fn spec(env: serde_json::Value, files: serde_json::Value) -> serde_json::Value {
    json!({"poolRef": {"name": "p"}, "serviceAccountName": "ci", "env": env, "files": files})
}

fn values(pairs: &[(&str, &[u8])]) -> KeyValues {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.to_vec().into()))
        .collect()
}

fn exposed(env: &ClaimEnv) -> Vec<(String, String)> {
    env.iter()
        .map(|(k, v)| (k.clone(), v.expose_secret().to_owned()))
        .collect()
}

#[test]
fn references_are_each_object_once_and_files_only_when_asked() {
    let claim = claim(spec(
        json!([
            {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "a"}}},
            {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "b"}}},
            {"name": "C", "value": "c"},
            {"name": "D", "valueFrom": {"configMapKeyRef": {"name": "s", "key": "d"}}},
        ]),
        json!([{"path": "/f", "secretKeyRef": {"name": "t", "key": "k"}}]),
    ));
    assert_eq!(
        references(&claim.spec, true),
        [
            (SourceKind::Secret, "s".to_owned()),
            (SourceKind::ConfigMap, "s".to_owned()),
            (SourceKind::Secret, "t".to_owned()),
        ]
    );
    assert_eq!(references(&claim.spec, false).len(), 2);
}

#[test]
fn assembling_takes_literals_keys_and_optional_gaps() {
    let claim = claim(spec(
        json!([
            {"name": "GREETING", "value": "hello"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}},
            {"name": "MAYBE", "valueFrom": {"secretKeyRef": {"name": "s", "key": "nope", "optional": true}}},
            {"name": "GONE", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "x", "optional": true}}},
        ]),
        json!([
            {"path": "/etc/token", "secretKeyRef": {"name": "s", "key": "token"}},
            {"path": "/etc/mode", "configMapKeyRef": {"name": "c", "key": "mode"}},
            {"path": "/etc/bin", "mode": 0o755, "configMapKeyRef": {"name": "c", "key": "bin"}},
        ]),
    ));
    let fetched = Fetched::from([
        (
            (SourceKind::Secret, "s".to_owned()),
            Some(values(&[("token", b"t0k3n")])),
        ),
        ((SourceKind::ConfigMap, "absent".to_owned()), None),
        (
            (SourceKind::ConfigMap, "c".to_owned()),
            Some(values(&[("mode", b"fast"), ("bin", &[0xff, 0])])),
        ),
    ]);
    let resolved = assemble(&claim, &fetched, true).unwrap();
    assert_eq!(
        exposed(&resolved.env),
        [
            ("GREETING".to_owned(), "hello".to_owned()),
            ("TOKEN".to_owned(), "t0k3n".to_owned())
        ]
    );
    let files: Vec<(&str, i32, &[u8])> = resolved
        .files
        .iter()
        .map(|f| (f.path.as_str(), f.mode, f.content.expose_secret()))
        .collect();
    assert_eq!(
        files,
        [
            ("/etc/token", 0o600, b"t0k3n".as_slice()),
            ("/etc/mode", 0o644, b"fast".as_slice()),
            ("/etc/bin", 0o755, [0xff, 0].as_slice()),
        ]
    );
    // Without files (an exec's re-read), only the env.
    assert!(assemble(&claim, &fetched, false).unwrap().files.is_empty());
    // A secret never shows in a Debug print.
    assert!(!format!("{:?}", resolved.env).contains("t0k3n"));
}

#[test]
fn a_missing_key_or_object_is_422_naming_it_and_binary_env_is_refused() {
    let claim = claim(spec(
        json!([
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "TOKEN"}}},
            {"name": "RAW", "valueFrom": {"secretKeyRef": {"name": "s", "key": "raw"}}},
        ]),
        json!([{"path": "/etc/x", "configMapKeyRef": {"name": "absent", "key": "x"}}]),
    ));
    let fetched = Fetched::from([
        (
            (SourceKind::Secret, "s".to_owned()),
            Some(values(&[("raw", &[0xc3, 0x28])])),
        ),
        ((SourceKind::ConfigMap, "absent".to_owned()), None),
    ]);
    let Err(error) = assemble(&claim, &fetched, true) else {
        panic!("missing keys resolve");
    };
    assert_eq!(error.code(), http::StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        error.message(),
        "MicroVMClaim.battery.liquidmetal-x.dev \"build\" is invalid: [\
         spec.env[0].valueFrom.secretKeyRef.key: Invalid value: \"TOKEN\": no such key in Secret ci/s, \
         spec.env[1].valueFrom.secretKeyRef.key: Invalid value: \"raw\": the value is not UTF-8 text, so it cannot be an environment variable, \
         spec.files[0].configMapKeyRef.name: Invalid value: \"absent\": ConfigMap ci/absent not found]"
    );
}

#[test]
fn a_sessions_own_env_wins_over_the_claims() {
    let claim_env: ClaimEnv = [("A", "claim"), ("B", "claim")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.into()))
        .collect();
    let own = HashMap::from([("B".to_owned(), "session".to_owned())]);
    let env = session_env(&claim_env, own);
    assert_eq!(env["A"], "claim");
    assert_eq!(env["B"], "session");
}

/// Denies `get` on the Secret `denied`, records every decision asked.
#[derive(Default)]
struct Policy {
    asked: Mutex<Vec<String>>,
}

impl Authorizer for Policy {
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        request: &'a RequestInfo,
    ) -> BoxFuture<'a, Result<Decision, ApiError>> {
        self.asked.lock().unwrap().push(format!(
            "{} {} {} {}/{}",
            user.name, request.verb, request.resource, request.namespace, request.name
        ));
        let decision = if request.name == "denied" {
            Decision::Deny(String::new())
        } else {
            Decision::Allow
        };
        Box::pin(async move { Ok(decision) })
    }
}

/// A cluster serving the Secret `ci/token` (`TOKEN`), and counting its reads.
fn cluster(reads: Arc<Mutex<Vec<String>>>) -> Arc<Cluster> {
    let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
        let reads = reads.clone();
        async move {
            let path = request.uri().path().to_owned();
            reads.lock().unwrap().push(path.clone());
            let (code, body) = if path == "/api/v1/namespaces/ci/secrets/token" {
                (
                    200,
                    json!({"apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": "token", "namespace": "ci"},
                        "data": {"TOKEN": "czNjcjN0"}}),
                )
            } else {
                (
                    404,
                    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
                        "reason": "NotFound", "code": 404, "message": "not found"}),
                )
            };
            let response = http::Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(body.to_string())
                .unwrap();
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    Arc::new(Cluster::new(kube::Client::new(service, "default")))
}

fn alice() -> UserInfo {
    UserInfo {
        name: "alice".to_owned(),
        ..UserInfo::default()
    }
}

#[tokio::test]
async fn resolving_asks_for_the_requesting_user_before_reading_anything() {
    let reads = Arc::new(Mutex::new(Vec::new()));
    let policy = Arc::new(Policy::default());
    let config = ClaimConfig::new(
        Some(cluster(reads.clone())),
        Some(policy.clone()),
        Arc::new(AgentRelay::new(None)),
    );
    let allowed = claim(spec(
        json!([{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "token", "key": "TOKEN"}}}]),
        json!([]),
    ));
    let resolved = config.resolve(&alice(), &allowed).await.unwrap();
    assert_eq!(
        exposed(&resolved.env),
        [("TOKEN".to_owned(), "s3cr3t".to_owned())]
    );
    assert_eq!(
        *policy.asked.lock().unwrap(),
        ["alice get secrets ci/token"]
    );
    assert_eq!(
        *reads.lock().unwrap(),
        ["/api/v1/namespaces/ci/secrets/token"]
    );

    // One reference refused: 403 naming it, and nothing at all read.
    reads.lock().unwrap().clear();
    let denied = claim(spec(
        json!([{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "token", "key": "TOKEN"}}}]),
        json!([{"path": "/etc/x", "secretKeyRef": {"name": "denied", "key": "k"}}]),
    ));
    let Err(error) = config.resolve(&alice(), &denied).await else {
        panic!("a Secret alice may not get was read");
    };
    assert_eq!(error.code(), http::StatusCode::FORBIDDEN);
    assert_eq!(
        error.message(),
        "secrets \"denied\" is forbidden: User \"alice\" cannot get resource \"secrets\" in API group \"\" in the namespace \"ci\""
    );
    assert!(reads.lock().unwrap().is_empty());

    // At an exec after a restart: read again with the server's client, no review.
    policy.asked.lock().unwrap().clear();
    let env = config.env(&allowed, false).await.unwrap();
    assert_eq!(exposed(&env), [("TOKEN".to_owned(), "s3cr3t".to_owned())]);
    assert!(policy.asked.lock().unwrap().is_empty());
    // Kept since: no second read.
    config.env(&allowed, false).await.unwrap();
    assert_eq!(reads.lock().unwrap().len(), 1);
    // Forgotten on release: read again.
    config.forget("u-1");
    config.env(&allowed, false).await.unwrap();
    assert_eq!(reads.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn without_a_cluster_references_are_refused_and_literals_work() {
    let config = ClaimConfig::new(None, None, Arc::new(AgentRelay::new(None)));
    let literal = claim(spec(json!([{"name": "A", "value": "1"}]), json!([])));
    let resolved = config.resolve(&alice(), &literal).await.unwrap();
    assert_eq!(exposed(&resolved.env), [("A".to_owned(), "1".to_owned())]);
    let referring = claim(spec(
        json!([]),
        json!([{"path": "/etc/x", "secretKeyRef": {"name": "s", "key": "k"}}]),
    ));
    let Err(error) = config.resolve(&alice(), &referring).await else {
        panic!("dev read a Secret");
    };
    assert_eq!(error.code(), http::StatusCode::BAD_REQUEST);
    assert!(
        error.message().contains("no cluster"),
        "{}",
        error.message()
    );
}

#[tokio::test]
async fn a_guest_with_a_token_is_told_where_the_api_server_is_under_its_own_env() {
    let api = "api.example.com:6443".parse().unwrap();
    let config = ClaimConfig::new(None, None, Arc::new(AgentRelay::new(None)))
        .with_guest_api_server(Some(api));
    let own = |pairs: &[(&str, &str)]| -> ClaimEnv {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).into()))
            .collect()
    };
    let literal = claim(spec(json!([]), json!([])));
    config.remember("u-1", own(&[("KUBERNETES_SERVICE_PORT", "443")]), true);
    assert_eq!(
        exposed(&config.env(&literal, true).await.unwrap()),
        [
            (
                "KUBERNETES_SERVICE_HOST".to_owned(),
                "api.example.com".to_owned()
            ),
            ("KUBERNETES_SERVICE_PORT".to_owned(), "443".to_owned()),
        ],
        "the claim's own value wins"
    );
    // Read again after a restart: the same.
    config.forget("u-1");
    let env = config.env(&literal, true).await.unwrap();
    assert_eq!(env.len(), 2);
    // Without a token, nothing: the guest has nothing to authenticate with.
    config.forget("u-1");
    config.remember("u-1", own(&[("A", "1")]), false);
    assert_eq!(
        exposed(&config.env(&literal, false).await.unwrap()),
        [("A".to_owned(), "1".to_owned())]
    );
    // Without the flag, nothing either.
    let untold = ClaimConfig::new(None, None, Arc::new(AgentRelay::new(None)));
    assert!(untold.env(&literal, true).await.unwrap().is_empty());
}
