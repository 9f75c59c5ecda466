//! The aggregator stand-in itself (`battery_e2e::stand_in`), against a tiny backend that
//! echoes what reached it: before the kubectl suite trusts it to stand for
//! kube-apiserver, these prove it forwards, authenticates, authorizes, answers the
//! reviews and serves the authentication ConfigMap the way kube-apiserver does.

mod support;

use std::time::Duration;

use battery_e2e::https::{Identity, Lines, STEP};
use battery_e2e::stand_in::pki::{self, Ca, Validity};
use battery_e2e::stand_in::write_client;
use http::StatusCode;
use http_body_util::BodyExt as _;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use support::{Setup, read};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const CLAIMS: &str = "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/microvmclaims";
const AUTH_CONFIG_MAP: &str =
    "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication";
const AUTH_CONFIG_MAPS: &str = "/api/v1/namespaces/kube-system/configmaps?fieldSelector=metadata.name%3Dextension-apiserver-authentication";

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|v| v.iter().map(|s| s.as_str().unwrap()).collect())
        .unwrap_or_default()
}

/// Adds a token user `alice` (uid, two groups, an extra) who may do anything to claims.
fn add_alice(policy: &mut Value) {
    policy["tokens"].as_array_mut().unwrap().push(json!({"token": "alice-token",
        "user": {"username": "alice", "uid": "alice-uid", "groups": ["devs", "ops"], "extra": {"scopes.example.com/team": ["a", "b"]}}}));
    policy["rules"].as_array_mut().unwrap().push(json!({"users": ["alice"], "verbs": ["*"],
        "apiGroups": ["battery.liquidmetal-x.dev"], "resources": ["microvmclaims", "microvmclaims/lease"]}));
}

#[tokio::test]
async fn forwarding_says_who_the_user_is_and_strips_what_the_client_forged() {
    let s = Setup::start().await;
    let forged = [
        ("X-Remote-User", "system:admin"),
        ("X-Remote-Group", "system:masters"),
        ("X-Remote-Extra-Scopes", "all"),
        ("X-Remote-Uid", "0"),
    ];
    let (status, echo) = s
        .client(s.kubectl())
        .call("GET", &format!("{CLAIMS}?limit=5"), &forged, None)
        .await;
    assert_eq!(status, StatusCode::OK, "{echo}");
    let headers = &echo["headers"];
    assert_eq!(echo["path"], format!("{CLAIMS}?limit=5"));
    assert_eq!(strings(&headers["x-remote-user"]), [pki::KUBECTL_USER]);
    assert_eq!(
        strings(&headers["x-remote-group"]),
        [
            "system:serviceaccounts",
            "system:serviceaccounts:default",
            "system:authenticated"
        ],
        "one header line per group, system:authenticated added"
    );
    let credential =
        strings(&headers["x-remote-extra-authentication.kubernetes.io%2fcredential-id"]);
    assert!(
        credential.len() == 1 && credential[0].starts_with("X509SHA256="),
        "x509 users carry their credential id, the key escaped: {headers}"
    );
    assert!(
        headers.get("x-remote-uid").is_none(),
        "no forged uid: {headers}"
    );
    assert!(
        headers.get("x-remote-extra-scopes").is_none(),
        "no forged extra: {headers}"
    );

    // A token user: uid and extra get through; the token itself does not.
    s.edit_policy(add_alice);
    let (status, echo) = s
        .client(Identity::Token("alice-token".into()))
        .call(
            "POST",
            CLAIMS,
            &forged,
            Some(json!({"kind": "MicroVMClaim"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{echo}");
    let headers = &echo["headers"];
    assert_eq!(
        echo["body"],
        json!({"kind": "MicroVMClaim"}).to_string(),
        "the body is forwarded"
    );
    assert_eq!(strings(&headers["x-remote-user"]), ["alice"]);
    assert_eq!(strings(&headers["x-remote-uid"]), ["alice-uid"]);
    assert_eq!(
        strings(&headers["x-remote-group"]),
        ["devs", "ops", "system:authenticated"]
    );
    assert_eq!(
        strings(&headers["x-remote-extra-scopes.example.com%2fteam"]),
        ["a", "b"]
    );
    assert!(
        headers.get("authorization").is_none(),
        "the bearer token is not forwarded: {headers}"
    );

    // kubectl speaks HTTP/2; the forwarded request is the same.
    let response = s.client(s.kubectl()).open_h2("GET", CLAIMS).await;
    assert_eq!(response.status(), StatusCode::OK);
    let echo: Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(
        strings(&echo["headers"]["x-remote-user"]),
        [pki::KUBECTL_USER]
    );
}

#[tokio::test]
async fn credentials_that_do_not_verify_are_refused_with_401() {
    let s = Setup::start().await;
    let stranger_ca = Ca::new("someone else's CA").unwrap();
    let (cert, key) = write_client(
        &stranger_ca,
        s.stand_in.dir(),
        pki::KUBECTL_USER,
        &[],
        Validity::Current,
    );
    let client_ca = Ca::load(
        &s.stand_in.client_ca(),
        &s.stand_in.layout().client_ca().with_extension("key"),
    )
    .unwrap();
    let (expired, expired_key) = write_client(
        &client_ca,
        s.stand_in.dir(),
        pki::KUBECTL_USER,
        &[],
        Validity::Expired,
    );
    let before = s.backend.requests();
    for (what, identity) in [
        (
            "an unknown bearer token",
            Identity::Token("nobody's".into()),
        ),
        ("a certificate of another CA", Identity::Cert(cert, key)),
        (
            "an expired certificate",
            Identity::Cert(expired, expired_key),
        ),
    ] {
        let (status, body) = s.client(identity).get(CLAIMS).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {body}");
        assert_eq!(
            (body["kind"].as_str(), body["reason"].as_str()),
            (Some("Status"), Some("Unauthorized")),
            "{what}"
        );
    }
    assert_eq!(
        s.backend.requests(),
        before,
        "nothing unauthenticated reaches the backend"
    );

    // No credentials at all: anonymous, which the default policy lets do nothing.
    let (status, body) = s.client(Identity::Anonymous).get("/apis").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        body["message"],
        "forbidden: User \"system:anonymous\" cannot get path \"/apis\""
    );
}

#[tokio::test]
async fn denials_are_worded_as_kubernetes_words_them() {
    let s = Setup::start().await;
    let (cert, key) = s.stand_in.client_certificate("bob", &["viewers"]);
    let bob = s.client(Identity::Cert(cert, key));
    let before = s.backend.requests();
    for (method, path, message) in [
        (
            "GET",
            format!("{CLAIMS}/c"),
            "microvmclaims.battery.liquidmetal-x.dev \"c\" is forbidden: User \"bob\" cannot get resource \"microvmclaims\" in API group \"battery.liquidmetal-x.dev\" in the namespace \"default\"",
        ),
        (
            "GET",
            format!("{CLAIMS}?watch=true&fieldSelector=metadata.name%3Dc"),
            "microvmclaims.battery.liquidmetal-x.dev \"c\" is forbidden: User \"bob\" cannot watch resource \"microvmclaims\" in API group \"battery.liquidmetal-x.dev\" in the namespace \"default\"",
        ),
        (
            "POST",
            format!("{CLAIMS}/c/exec?command=true"),
            "microvmclaims.battery.liquidmetal-x.dev \"c\" is forbidden: User \"bob\" cannot create resource \"microvmclaims/exec\" in API group \"battery.liquidmetal-x.dev\" in the namespace \"default\"",
        ),
        (
            "DELETE",
            CLAIMS.to_owned(),
            "microvmclaims.battery.liquidmetal-x.dev is forbidden: User \"bob\" cannot deletecollection resource \"microvmclaims\" in API group \"battery.liquidmetal-x.dev\" in the namespace \"default\"",
        ),
        (
            "GET",
            "/api/v1/namespaces".to_owned(),
            "namespaces is forbidden: User \"bob\" cannot list resource \"namespaces\" in API group \"\" at the cluster scope",
        ),
        (
            "POST",
            "/stand-in/rotate-front-proxy".to_owned(),
            "forbidden: User \"bob\" cannot post path \"/stand-in/rotate-front-proxy\"",
        ),
    ] {
        let (status, body) = bob.call(method, &path, &[], None).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {body}");
        assert_eq!(body["reason"], "Forbidden");
        assert_eq!(body["message"], message, "{method} {path}");
    }
    assert_eq!(
        s.backend.requests(),
        before,
        "nothing refused reaches the backend"
    );

    // Discovery is every authenticated user's; system:masters may do everything.
    let (status, _) = bob.get("/apis/battery.liquidmetal-x.dev/v1alpha1").await;
    assert_eq!(status, StatusCode::OK);
    let (cert, key) = s.stand_in.client_certificate("root", &["system:masters"]);
    let (status, echo) = s
        .client(Identity::Cert(cert, key))
        .call("DELETE", CLAIMS, &[], None)
        .await;
    assert_eq!(status, StatusCode::OK, "{echo}");
    assert_eq!(
        strings(&echo["headers"]["x-remote-group"]),
        ["system:masters", "system:authenticated"]
    );
}

#[tokio::test]
async fn policy_edits_take_effect_at_once() {
    let s = Setup::start().await;
    let alice = s.client(Identity::Token("alice-token".into()));
    assert_eq!(
        alice.get(CLAIMS).await.0,
        StatusCode::UNAUTHORIZED,
        "no such token yet"
    );
    s.edit_policy(add_alice);
    assert_eq!(alice.get(CLAIMS).await.0, StatusCode::OK);
    assert_eq!(
        alice
            .get("/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/pools")
            .await
            .0,
        StatusCode::FORBIDDEN
    );
    // A deleted user is gone for the front side and for TokenReview alike.
    s.edit_policy(|policy| {
        policy["tokens"]
            .as_array_mut()
            .unwrap()
            .retain(|t| t["user"]["username"] != "alice")
    });
    assert_eq!(alice.get(CLAIMS).await.0, StatusCode::UNAUTHORIZED);
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "alice-token"}});
    let (status, answer) = s
        .client(s.apiserver())
        .call(
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            &[],
            Some(review),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(answer["status"]["authenticated"], false);
}

#[tokio::test]
async fn token_and_subject_access_reviews_answer_from_the_policy() {
    let s = Setup::start().await;
    s.edit_policy(add_alice);
    let apiserver = s.client(s.apiserver());
    let review = |token: &str| {
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": token, "audiences": ["https://kubernetes.default.svc"]}})
    };
    let (status, answer) = apiserver
        .call(
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            &[],
            Some(review("alice-token")),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    assert_eq!(answer["kind"], "TokenReview");
    assert_eq!(answer["status"]["authenticated"], true);
    assert_eq!(
        answer["status"]["user"],
        json!({"username": "alice", "uid": "alice-uid", "groups": ["devs", "ops"],
        "extra": {"scopes.example.com/team": ["a", "b"]}})
    );
    assert_eq!(
        answer["status"]["audiences"],
        json!(["https://kubernetes.default.svc"])
    );
    let (_, answer) = apiserver
        .call(
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            &[],
            Some(review("nope")),
        )
        .await;
    assert_eq!(answer["status"]["authenticated"], false);

    let sar = |user: &str, groups: &[&str], attributes: Value| {
        let mut spec = json!({"user": user, "groups": groups});
        let key = if attributes.get("path").is_some() {
            "nonResourceAttributes"
        } else {
            "resourceAttributes"
        };
        spec[key] = attributes;
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec})
    };
    let claim = |verb: &str, subresource: &str| {
        json!({"namespace": "default", "verb": verb, "group": "battery.liquidmetal-x.dev",
        "version": "v1alpha1", "resource": "microvmclaims", "subresource": subresource, "name": "c"})
    };
    for (what, review, allowed) in [
        (
            "alice may update a claim's lease",
            sar("alice", &["devs"], claim("update", "lease")),
            true,
        ),
        (
            "alice may not exec",
            sar("alice", &["devs"], claim("create", "exec")),
            false,
        ),
        (
            "bob may do nothing",
            sar("bob", &["system:authenticated"], claim("get", "")),
            false,
        ),
        (
            "the kubectl user may do everything",
            sar(pki::KUBECTL_USER, &[], claim("create", "exec")),
            true,
        ),
        (
            "system:masters may do everything",
            sar("root", &["system:masters"], claim("delete", "")),
            true,
        ),
        (
            "discovery is every authenticated user's",
            sar(
                "bob",
                &["system:authenticated"],
                json!({"path": "/apis/battery.liquidmetal-x.dev/v1alpha1", "verb": "get"}),
            ),
            true,
        ),
        (
            "metrics are not",
            sar(
                "bob",
                &["system:authenticated"],
                json!({"path": "/metrics", "verb": "get"}),
            ),
            false,
        ),
    ] {
        let (status, answer) = apiserver
            .call(
                "POST",
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                &[],
                Some(review),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{what}: {answer}");
        assert_eq!(answer["status"]["allowed"], allowed, "{what}: {answer}");
    }
    // Only who holds system:auth-delegator's permissions may ask.
    let alice = s.client(Identity::Token("alice-token".into()));
    let (status, _) = alice
        .call(
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            &[],
            Some(sar("alice", &[], claim("get", ""))),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn the_authentication_config_map_is_served_watched_and_rotated() {
    let s = Setup::start().await;
    let apiserver = s.client(s.apiserver());
    let (status, config_map) = apiserver.get(AUTH_CONFIG_MAP).await;
    assert_eq!(status, StatusCode::OK, "{config_map}");
    let data = &config_map["data"];
    assert_eq!(data["client-ca-file"], read(&s.stand_in.client_ca()));
    assert_eq!(
        data["requestheader-client-ca-file"],
        read(&s.stand_in.front_proxy_ca())
    );
    assert_eq!(
        data["requestheader-allowed-names"],
        "[\"front-proxy-client\"]"
    );
    assert_eq!(
        data["requestheader-username-headers"],
        "[\"X-Remote-User\"]"
    );
    assert_eq!(data["requestheader-group-headers"], "[\"X-Remote-Group\"]");
    assert_eq!(
        data["requestheader-extra-headers-prefix"],
        "[\"X-Remote-Extra-\"]"
    );
    assert_eq!(data["requestheader-uid-headers"], "[\"X-Remote-Uid\"]");

    // What kube::runtime::watcher does: list (with a limit), then watch from the list's version.
    let (status, list) = apiserver
        .get(&format!("{AUTH_CONFIG_MAPS}&limit=500"))
        .await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(list["kind"], "ConfigMapList");
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let version = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let watch = apiserver
        .open("GET", &format!("{AUTH_CONFIG_MAPS}&watch=true&resourceVersion={version}&allowWatchBookmarks=true&timeoutSeconds=60"), &[], None)
        .await;
    assert_eq!(watch.status(), StatusCode::OK);
    let mut events = Lines::new(watch);
    // The streaming-list form of the same.
    let initial = apiserver
        .open("GET", &format!("{AUTH_CONFIG_MAPS}&watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"), &[], None)
        .await;
    let mut initial = Lines::new(initial);
    assert_eq!(initial.next().await.unwrap()["type"], "ADDED");
    let bookmark = initial.next().await.unwrap();
    assert_eq!(bookmark["type"], "BOOKMARK");
    assert_eq!(
        bookmark["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );

    // Its namespace and name are all battery-apiserver's account may list and watch (it
    // may get any ConfigMap, for claims' env and files).
    let (status, _) = apiserver
        .get("/api/v1/namespaces/default/configmaps?watch=true")
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = apiserver
        .get("/api/v1/namespaces/kube-system/configmaps")
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    let old_ca = read(&s.stand_in.front_proxy_ca());
    let rotated = s.stand_in.rotate_front_proxy().await;
    let new_ca = read(&s.stand_in.front_proxy_ca());
    assert_ne!(old_ca, new_ca);
    assert_eq!(
        rotated["data"]["requestheader-client-ca-file"], new_ca,
        "the new CA only"
    );
    let modified = events.next().await.unwrap();
    assert_eq!(modified["type"], "MODIFIED");
    assert_eq!(
        modified["object"]["data"]["requestheader-client-ca-file"],
        new_ca
    );
    assert!(
        modified["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > version.parse::<u64>().unwrap()
    );
    // The backend checks against the CA file as it is now: only the new certificate passes.
    let (status, echo) = s.client(s.kubectl()).get(CLAIMS).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "forwarded with the new front-proxy certificate: {echo}"
    );
}

#[tokio::test]
async fn namespaces_and_events_are_served() {
    let s = Setup::start().await;
    s.edit_policy(|policy| {
        policy["namespaces"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "doomed", "phase": "Terminating"}))
    });
    let apiserver = s.client(s.apiserver());
    let (status, namespace) = apiserver.get("/api/v1/namespaces/default").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(namespace["status"]["phase"], "Active");
    let (_, namespace) = apiserver.get("/api/v1/namespaces/doomed").await;
    assert_eq!(namespace["status"]["phase"], "Terminating");
    let (status, missing) = apiserver.get("/api/v1/namespaces/ghost").await;
    assert_eq!(
        (status, missing["message"].as_str()),
        (
            StatusCode::NOT_FOUND,
            Some("namespaces \"ghost\" not found")
        )
    );
    let (_, list) = apiserver.get("/api/v1/namespaces").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 4);

    let event = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "p.1"}, "reason": "HookFailed", "type": "Warning",
        "involvedObject": {"kind": "Pool", "name": "p", "namespace": "default"}});
    let (status, created) = apiserver
        .call(
            "POST",
            "/api/v1/namespaces/default/events",
            &[],
            Some(event.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["metadata"]["namespace"], "default");
    let (status, _) = apiserver
        .call(
            "POST",
            "/api/v1/namespaces/default/events",
            &[],
            Some(event),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let kubectl = s.client(s.kubectl());
    let (_, events) = kubectl.get("/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Dp,involvedObject.kind%3DPool").await;
    assert_eq!(events["items"].as_array().unwrap().len(), 1, "{events}");
    let (_, events) = kubectl
        .get("/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Dq")
        .await;
    assert_eq!(events["items"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn secrets_and_config_maps_a_test_creates_are_served_to_the_apiserver() {
    let s = Setup::start().await;
    let kubectl = s.client(s.kubectl());
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token"},
        "data": {"a": "YQ=="}, "stringData": {"b": "bee", "a": "ay"}});
    let (status, created) = kubectl
        .call(
            "POST",
            "/api/v1/namespaces/default/secrets",
            &[],
            Some(secret.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    // As kube-apiserver keeps it: stringData merged into data (winning), typed Opaque.
    assert_eq!(
        created["data"],
        json!({"a": "YXk=", "b": "YmVl"}),
        "{created}"
    );
    assert_eq!(created["type"], "Opaque");
    assert!(created.get("stringData").is_none(), "{created}");
    let (status, _) = kubectl
        .call(
            "POST",
            "/api/v1/namespaces/default/secrets",
            &[],
            Some(secret),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
        "data": {"mode": "fast"}});
    let (status, _) = kubectl
        .call(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            &[],
            Some(config_map),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);

    // The apiserver's account reads them (its RBAC grants get) ...
    let apiserver = s.client(s.apiserver());
    let (status, read) = apiserver
        .get("/api/v1/namespaces/default/secrets/token")
        .await;
    assert_eq!(
        (status, &read["data"]["b"]),
        (StatusCode::OK, &json!("YmVl"))
    );
    let (status, read) = apiserver
        .get("/api/v1/namespaces/default/configmaps/settings")
        .await;
    assert_eq!(
        (status, &read["data"]["mode"]),
        (StatusCode::OK, &json!("fast"))
    );
    let (status, missing) = apiserver
        .get("/api/v1/namespaces/default/secrets/ghost")
        .await;
    assert_eq!(
        (status, missing["message"].as_str()),
        (StatusCode::NOT_FOUND, Some("secrets \"ghost\" not found"))
    );
    // ... but may not list them, nor create any.
    let (status, _) = apiserver.get("/api/v1/namespaces/default/secrets").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // The authentication ConfigMap is still there, beside the new one.
    let (_, list) = kubectl.get("/api/v1/configmaps").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 2, "{list}");
}

#[tokio::test]
async fn upgrades_are_spliced_refusals_forwarded_and_anything_else_is_503() {
    let s = Setup::start().await;
    let kubectl = s.client(s.kubectl());
    let upgrade = [("Connection", "Upgrade"), ("Upgrade", "echo")];
    let mut response = kubectl
        .open("GET", "/apis/test/v1/upgrade", &upgrade, None)
        .await;
    assert_eq!(response.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(
        response.headers()["x-seen-user"],
        pki::KUBECTL_USER,
        "the upgrade request carried the user"
    );
    let mut io = TokioIo::new(
        tokio::time::timeout(STEP, hyper::upgrade::on(&mut response))
            .await
            .unwrap()
            .unwrap(),
    );
    for message in [&b"hello"[..], b"and again"] {
        io.write_all(message).await.unwrap();
        let mut echoed = vec![0; message.len()];
        tokio::time::timeout(STEP, io.read_exact(&mut echoed))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(echoed, message);
    }

    let (status, body) = {
        let response = kubectl
            .open("GET", "/apis/test/v1/upgrade-refused", &upgrade, None)
            .await;
        (
            response.status(),
            response.into_body().collect().await.unwrap().to_bytes(),
        )
    };
    assert_eq!(
        (status, &body[..]),
        (StatusCode::FORBIDDEN, &b"not you"[..])
    );
    let (status, body) = kubectl
        .call("GET", "/apis/test/v1/upgrade-ignored", &upgrade, None)
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["message"], "invalid upgrade response: status code 200");
}

#[tokio::test]
async fn streamed_responses_are_not_buffered() {
    let s = Setup::start().await;
    for h2 in [false, true] {
        let kubectl = s.client(s.kubectl());
        let response = if h2 {
            kubectl.open_h2("GET", "/apis/test/v1/stream").await
        } else {
            kubectl.open("GET", "/apis/test/v1/stream", &[], None).await
        };
        let mut lines = Lines::new(response);
        // The second line does not exist until the first has arrived.
        assert_eq!(lines.next().await, Some(json!({"line": 1})), "h2: {h2}");
        s.backend.release_line();
        assert_eq!(lines.next().await, Some(json!({"line": 2})), "h2: {h2}");
        assert_eq!(lines.next().await, None);
    }
}

#[tokio::test]
async fn without_a_backend_forwarded_requests_get_503() {
    let dir = tempfile::tempdir().unwrap();
    let stand_in = battery_e2e::stand_in::StandIn::start(&dir.path().join("pki"), None).await;
    let (cert, key) = stand_in.layout().kubectl();
    let setup_less = battery_e2e::https::Client::new(
        stand_in.url(),
        &stand_in.serving_ca(),
        Identity::Cert(cert, key),
    );
    let (status, body) = setup_less.get(CLAIMS).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["kind"], "Status");
    // What it serves itself does not need a backend.
    let (status, _) = setup_less.get("/api/v1/namespaces/default").await;
    assert_eq!(status, StatusCode::OK);
    // A restarted stand-in reuses its certificates.
    let ca = read(&stand_in.serving_ca());
    drop(stand_in);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let again = battery_e2e::stand_in::StandIn::start(&dir.path().join("pki"), None).await;
    assert_eq!(read(&again.serving_ca()), ca);
}
