//! The attack table: requests that must not get anything from battery-apiserver, sent
//! as a cluster carries them (through a real kube-apiserver, whose own authentication and
//! RBAC refuse some before they reach us) or straight to the server, bypassing the
//! aggregator as an attacker on the pod network could. Each row states what it proves and
//! which layer refuses it, must be refused with the right `Status`, and must change
//! nothing: no claim made, no MicroVM leased, no lease renewed.
//!
//! Then the rows that need time or state: a token whose ServiceAccount is deleted, the
//! watch limit, and a rotation of the front proxy's CA, which kube-apiserver takes from its
//! files and battery-apiserver from the ConfigMap kube-apiserver publishes, neither
//! restarted.

use std::time::Duration;

use battery_e2e::apiserver::front::{self, Cluster};
use battery_e2e::apiserver::{ApiServer, Route};
use battery_e2e::control_plane::install::{NAMESPACE, SERVICE};
use battery_e2e::eventually;
use battery_e2e::https::{Client, Identity};
use battery_e2e::pki::{Ca, Validity, write_client};
use http::StatusCode;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, Subject};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use serde_json::{Value, json};

/// The namespace of the claims and of the table's ServiceAccounts.
const DEFAULT: &str = "default";
const CLAIMS: &str = "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/microvmclaims";
const DEV_POOL: &str = "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/pools/dev";
/// The claim every row attacks; its Holder is the kubectl user, [`HOLDER`].
const HELD: &str = "held";
const HOLDER: &str = "system:serviceaccount:default:dev";
/// Watches battery-apiserver allows at once in this test.
const MAX_WATCHES: &str = "2";
/// How long battery-apiserver keeps a TokenReview answer (Go's default), and
/// kube-apiserver its own authentication of a token.
const TOKEN_CACHE: Duration = Duration::from_secs(10);
/// How long kube-apiserver may take to reload a file of its PKI: it watches them, and
/// reads them again every minute anyway.
const RELOAD_TIMEOUT: Duration = Duration::from_secs(90);
/// The ConfigMap of `kube-system` kube-apiserver publishes its CAs in.
const AUTHENTICATION: &str = "extension-apiserver-authentication";
const MERGE_PATCH: (&str, &str) = ("content-type", "application/merge-patch+json");

/// A client of kube-apiserver: a request as a cluster carries it to us.
fn through(server: &ApiServer, identity: Identity) -> Client {
    let cluster = server.cluster().expect("an aggregated server");
    Client::new(cluster.url(), &cluster.ca(), identity)
}

/// A client of battery-apiserver itself, on the pod network: it dials the address and
/// verifies the Service's name, which serve's certificate holds.
fn straight(server: &ApiServer, identity: Identity) -> Client {
    let cluster = server.cluster().expect("a real control plane");
    Client::new(server.backend(), &cluster.installation.serving_ca, identity)
        .with_server_name(&format!("{SERVICE}.{NAMESPACE}.svc"))
}

/// The kubectl user ([`HOLDER`], whom the harness lets do everything) through kube-apiserver.
fn kubectl_user(server: &ApiServer) -> Client {
    let cluster = server.cluster().expect("an aggregated server");
    through(server, cluster.kubectl_identity())
}

/// A group as an RBAC subject.
fn group(name: &str) -> Subject {
    Subject {
        kind: "Group".to_owned(),
        name: name.to_owned(),
        api_group: Some("rbac.authorization.k8s.io".to_owned()),
        ..Default::default()
    }
}

/// The table's RBAC, each role bound in `default` alone: the Holder's namespace mate and
/// the group `lease-editors` may renew any claim's lease as far as RBAC goes (only the
/// Holder rule stands between them and the lease); `deleted` reads claims; every
/// authenticated user lists them, which anonymous must not gain by being passed on by a
/// front proxy.
async fn grant_table(cluster: &Cluster) {
    let roles: Api<ClusterRole> = Api::all(cluster.plane.admin().await);
    let grants = [
        (
            "e2e:lease-editor",
            front::battery_rule(
                &["microvmclaims", "microvmclaims/lease"],
                &["get", "list", "create", "update", "patch"],
            ),
            vec![
                front::service_account(DEFAULT, "mate"),
                group("lease-editors"),
            ],
        ),
        (
            "e2e:claim-reader",
            front::battery_rule(&["microvmclaims"], &["get", "list"]),
            vec![front::service_account(DEFAULT, "deleted")],
        ),
        (
            "e2e:claim-lister",
            front::battery_rule(&["microvmclaims"], &["list"]),
            vec![group("system:authenticated")],
        ),
    ];
    for (name, rule, subjects) in grants {
        let role = ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            rules: Some(vec![rule.clone()]),
            ..Default::default()
        };
        roles
            .create(&PostParams::default(), &role)
            .await
            .unwrap_or_else(|e| panic!("create the ClusterRole {name}: {e}"));
        for subject in subjects {
            cluster.bind_in(DEFAULT, name, subject, &rule).await;
        }
    }
}

/// What an attack must not change.
#[derive(Debug, PartialEq)]
struct World {
    claims: Vec<String>,
    held_renewed: Value,
    leased: Value,
}

async fn world(admin: &Client) -> World {
    let (status, list) = admin.get(CLAIMS).await;
    assert_eq!(status, StatusCode::OK, "list claims: {list}");
    let mut claims: Vec<String> = list["items"]
        .as_array()
        .expect("a list has items")
        .iter()
        .map(|c| {
            c["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    claims.sort();
    let (_, held) = admin.get(&format!("{CLAIMS}/{HELD}")).await;
    let (_, pool) = admin.get(DEV_POOL).await;
    World {
        claims,
        held_renewed: held["status"]["renewTime"].clone(),
        leased: pool["status"]["leased"].clone(),
    }
}

fn claim(name: &str) -> Value {
    json!({
        "apiVersion": "battery.liquidmetal-x.dev/v1alpha1",
        "kind": "MicroVMClaim",
        "metadata": {"name": name},
        "spec": {"poolRef": {"name": "dev"}, "serviceAccountName": "dev"},
    })
}

/// One row: what it proves, who sends it where, and the refusal it must get.
struct Row {
    proves: String,
    client: Client,
    method: &'static str,
    path: String,
    headers: Vec<(&'static str, &'static str)>,
    body: Option<Value>,
    code: StatusCode,
    reason: &'static str,
    /// What the Status message must say, to show the refusal's cause.
    says: String,
}

/// `X-Remote-*` headers claiming the cluster's most powerful identity.
const FORGED: [(&str, &str); 3] = [
    ("X-Remote-User", "system:admin"),
    ("X-Remote-Group", "system:masters"),
    ("X-Remote-Extra-Scopes", "all"),
];

#[tokio::test]
async fn every_attack_is_refused_with_a_status_and_changes_nothing() {
    let server = ApiServer::aggregated_with(&["--max-watches", MAX_WATCHES]).await;
    let cluster = server.cluster().expect("a real control plane");
    grant_table(cluster).await;
    let plane = &cluster.plane;
    let nobody = plane.service_account_token(DEFAULT, "nobody").await;
    let mate = plane.service_account_token(DEFAULT, "mate").await;
    let (cert, key, _) = server.client_certificate("alice", &["lease-editors"]);
    let alice = Identity::Cert(cert, key);
    let admin = kubectl_user(&server);

    let (status, held) = admin.call("POST", CLAIMS, &[], Some(claim(HELD))).await;
    assert_eq!(status, StatusCode::CREATED, "the Holder's claim: {held}");
    let before = world(&admin).await;

    let (ca, ca_key) = plane.pki().front_proxy_ca();
    let front_proxy_ca = Ca::load(&ca, &ca_key).expect("the cluster's front-proxy CA");
    let (front_cert, front_key) = plane.pki().front_proxy_client();
    let vouched = Identity::Cert(front_cert, front_key);
    let stranger_ca = Ca::new("someone-else").expect("a CA");
    let lease = format!("{CLAIMS}/{HELD}/lease");
    let create = |proves: &str,
                  client,
                  headers: &[(&'static str, &'static str)],
                  code,
                  reason,
                  says: &str| Row {
        proves: proves.to_owned(),
        client,
        method: "POST",
        path: CLAIMS.to_owned(),
        headers: headers.to_vec(),
        body: Some(claim("stolen")),
        code,
        reason,
        says: says.to_owned(),
    };
    let renew = |proves: &str, client, user: &str, headers: &[(&'static str, &'static str)]| Row {
        proves: proves.to_owned(),
        client,
        method: "PATCH",
        path: lease.clone(),
        headers: [&[MERGE_PATCH], headers].concat(),
        body: Some(json!({})),
        code: StatusCode::FORBIDDEN,
        reason: "Forbidden",
        says: format!(
            r#"User "{user}" cannot renew the lease of this claim: only its Holder {HOLDER} may"#
        ),
    };
    let mut rows = vec![
        create(
            "identity headers without a client certificate are ignored: the caller is anonymous, and battery-apiserver refuses anonymous",
            straight(&server, Identity::Anonymous),
            &FORGED,
            StatusCode::FORBIDDEN,
            "Forbidden",
            r#"User "system:anonymous""#,
        ),
        create(
            "identity headers sent to kube-apiserver are ignored there too: the caller stays anonymous, refused by kube-apiserver's RBAC before it reaches us",
            through(&server, Identity::Anonymous),
            &FORGED,
            StatusCode::FORBIDDEN,
            "Forbidden",
            r#"User "system:anonymous""#,
        ),
        create(
            "anonymous is refused by kube-apiserver's RBAC",
            through(&server, Identity::Anonymous),
            &[],
            StatusCode::FORBIDDEN,
            "Forbidden",
            r#"User "system:anonymous""#,
        ),
        create(
            "anonymous is refused by battery-apiserver itself",
            straight(&server, Identity::Anonymous),
            &[],
            StatusCode::FORBIDDEN,
            "Forbidden",
            r#"User "system:anonymous""#,
        ),
        create(
            "a ServiceAccount without RBAC is refused by kube-apiserver's RBAC",
            through(&server, Identity::Token(nobody)),
            &[],
            StatusCode::FORBIDDEN,
            "Forbidden",
            r#"User "system:serviceaccount:default:nobody""#,
        ),
        create(
            "battery-apiserver authorizes again: a user without RBAC, vouched for by kube-apiserver's own front-proxy certificate, is refused by battery-apiserver",
            straight(&server, vouched.clone()),
            &[
                ("X-Remote-User", "system:serviceaccount:default:nobody"),
                ("X-Remote-Group", "system:authenticated"),
            ],
            StatusCode::FORBIDDEN,
            "Forbidden",
            r#"User "system:serviceaccount:default:nobody""#,
        ),
        Row {
            proves: "anonymous forwarded by the real front proxy does not become system:authenticated, so gets nothing granted to it: battery-apiserver refuses it".to_owned(),
            client: straight(&server, vouched.clone()),
            method: "GET",
            path: CLAIMS.to_owned(),
            headers: vec![
                ("X-Remote-User", "system:anonymous"),
                ("X-Remote-Group", "system:unauthenticated"),
            ],
            body: None,
            code: StatusCode::FORBIDDEN,
            reason: "Forbidden",
            says: r#"User "system:anonymous" cannot list"#.to_owned(),
        },
        renew(
            "the Holder's namespace mate, whom RBAC lets write microvmclaims/lease (at kube-apiserver and in our SubjectAccessReview), is refused by battery-apiserver's Holder rule",
            through(&server, Identity::Token(mate)),
            "system:serviceaccount:default:mate",
            &[],
        ),
        renew(
            "a non-Holder (a client certificate of the cluster CA, in a group RBAC lets write microvmclaims/lease) is refused by battery-apiserver's Holder rule",
            through(&server, alice.clone()),
            "alice",
            &[],
        ),
        renew(
            "identity headers a user sends to kube-apiserver never reach us: its aggregator replaces them, so alice naming the Holder is still alice to battery-apiserver's Holder rule",
            through(&server, alice),
            "alice",
            &[("X-Remote-User", HOLDER), ("X-Remote-Group", "system:masters")],
        ),
        Row {
            proves: "a body over the limit is refused by battery-apiserver, through kube-apiserver, even for a user who may create".to_owned(),
            client: kubectl_user(&server),
            method: "POST",
            path: CLAIMS.to_owned(),
            headers: Vec::new(),
            body: Some(json!({"metadata": {"name": "big"}, "padding": "x".repeat(4 << 20)})),
            code: StatusCode::PAYLOAD_TOO_LARGE,
            reason: "RequestEntityTooLarge",
            // Our wording: kube-apiserver passes the body on.
            says: "the request body is larger than".to_owned(),
        },
    ];
    // Certificates that must not vouch for the forged headers, nor fall back to anonymous,
    // at either server.
    let refused_certificates = [
        (
            "a certificate of a CA nobody trusts cannot vouch for headers",
            &stranger_ca,
            "front-proxy-client",
            Validity::Current,
        ),
        (
            "a certificate of the front-proxy CA whose CN is not an allowed name cannot vouch for headers",
            &front_proxy_ca,
            "intruder",
            Validity::Current,
        ),
        (
            "an expired front-proxy certificate cannot vouch for headers",
            &front_proxy_ca,
            "front-proxy-client",
            Validity::Expired,
        ),
    ];
    for (what, ca, cn, validity) in refused_certificates {
        let (cert, key) = write_client(ca, server.scratch(), cn, &[], validity);
        let identity = Identity::Cert(cert, key);
        for (client, who) in [
            (through(&server, identity.clone()), "kube-apiserver"),
            (straight(&server, identity), "battery-apiserver"),
        ] {
            rows.push(create(
                &format!("{what}: refused by {who}"),
                client,
                &FORGED,
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                "Unauthorized",
            ));
        }
    }
    for row in rows {
        let (code, status) = row
            .client
            .call(row.method, &row.path, &row.headers, row.body)
            .await;
        assert_eq!(code, row.code, "{}: {status}", row.proves);
        assert_eq!(status["kind"], "Status", "{}: {status}", row.proves);
        assert_eq!(status["reason"], row.reason, "{}: {status}", row.proves);
        assert_eq!(
            status["code"],
            row.code.as_u16(),
            "{}: {status}",
            row.proves
        );
        assert!(
            status["message"]
                .as_str()
                .is_some_and(|m| m.contains(&row.says)),
            "{}: the message should say {:?}: {status}",
            row.proves,
            row.says
        );
        assert_eq!(
            world(&admin).await,
            before,
            "{}: something changed",
            row.proves
        );
        eprintln!("refused as it must be: {}", row.proves);
    }

    deleted_service_account_token(&server, &admin, &before).await;
    too_many_watches(&admin, &before).await;

    // The controls. A user the front proxy names, in no group, lists claims: battery-apiserver
    // adds system:authenticated, so anonymous was refused for being anonymous.
    let (code, list) = straight(&server, vouched)
        .call(
            "GET",
            CLAIMS,
            &[("X-Remote-User", "system:serviceaccount:default:nobody")],
            None,
        )
        .await;
    assert_eq!(
        code,
        StatusCode::OK,
        "an authenticated user may list: {list}"
    );
    // The Holder itself renews through the same path, so the refusals above were the
    // Holder rule's and the limits', not a broken route.
    let (code, renewed) = admin
        .call("PATCH", &lease, &[MERGE_PATCH], Some(json!({})))
        .await;
    assert_eq!(code, StatusCode::OK, "the Holder renews: {renewed}");
    assert_ne!(
        world(&admin).await.held_renewed,
        before.held_renewed,
        "the Holder's renewal shows on the claim"
    );
}

/// A ServiceAccount's token works until the account is deleted; then it is a 401 both
/// through kube-apiserver and straight to battery-apiserver, once their caches (10 s
/// each: kube-apiserver's of its authentication, ours of the TokenReview we ask it) have
/// let go of the old answer.
async fn deleted_service_account_token(server: &ApiServer, admin: &Client, before: &World) {
    let plane = &server.cluster().expect("a real control plane").plane;
    let token = plane.service_account_token(DEFAULT, "deleted").await;
    let routes = [
        (
            "through kube-apiserver",
            through(server, Identity::Token(token.clone())),
        ),
        ("straight", straight(server, Identity::Token(token))),
    ];
    for (route, client) in &routes {
        let (code, list) = client.get(CLAIMS).await;
        assert_eq!(
            code,
            StatusCode::OK,
            "{route}: the token works while its account exists: {list}"
        );
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(plane.admin().await, DEFAULT);
    accounts
        .delete("deleted", &DeleteParams::default())
        .await
        .expect("delete the ServiceAccount");
    for (route, client) in &routes {
        let what = format!("{route}: the deleted account's token to be refused");
        let refused = eventually(TOKEN_CACHE * 3, &what, async || {
            let (code, status) = client.get(CLAIMS).await;
            if code == StatusCode::UNAUTHORIZED {
                Ok(status)
            } else {
                Err(format!("{code}: {status}"))
            }
        })
        .await;
        assert_eq!(refused["reason"], "Unauthorized", "{route}: {refused}");
    }
    assert_eq!(
        &world(admin).await,
        before,
        "the deleted token changed something"
    );
}

/// Watches past `--max-watches` are refused with 429 and a Retry-After; the open ones go
/// on, and closing one makes room again.
async fn too_many_watches(admin: &Client, before: &World) {
    let watch = format!("{CLAIMS}?watch=true");
    let limit: usize = MAX_WATCHES.parse().expect("a number");
    let mut open = Vec::new();
    for _ in 0..limit {
        let response = admin.open("GET", &watch, &[], None).await;
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "a watch within the limit"
        );
        open.push(response);
    }
    let refused = admin.open("GET", &watch, &[], None).await;
    assert_eq!(
        refused.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "one watch too many"
    );
    let retry_after = refused
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    assert!(
        retry_after.is_some_and(|s| s > 0),
        "a Retry-After in seconds"
    );
    let body = http_body_util::BodyExt::collect(refused.into_body())
        .await
        .expect("the refusal's body")
        .to_bytes();
    let status: Value = serde_json::from_slice(&body).expect("a Status");
    assert_eq!(status["reason"], "TooManyRequests", "{status}");
    assert_eq!(
        status["details"]["retryAfterSeconds"].as_u64(),
        retry_after,
        "{status}"
    );
    drop(open.pop());
    let _reopened = eventually(
        Duration::from_secs(10),
        "a closed watch to make room",
        async || {
            let response = admin.open("GET", &watch, &[], None).await;
            match response.status() {
                StatusCode::OK => Ok(response),
                code => Err(code.to_string()),
            }
        },
    )
    .await;
    assert_eq!(&world(admin).await, before, "the watches changed something");
}

/// The certificates in a PEM bundle, in a set's order.
fn certificates(pem: &str) -> Vec<Vec<u8>> {
    let mut ders: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|der| der.expect("a PEM certificate").to_vec())
        .collect();
    ders.sort();
    ders
}

/// Waits until kube-apiserver's ConfigMap names exactly the front-proxy CAs `pems`.
async fn published(config_maps: &Api<ConfigMap>, pems: &[&str]) {
    let expected = certificates(&pems.join("\n"));
    eventually(
        RELOAD_TIMEOUT,
        "the ConfigMap to name the front-proxy CAs",
        async || {
            let config_map = config_maps
                .get(AUTHENTICATION)
                .await
                .map_err(|e| e.to_string())?;
            let bundle = config_map
                .data
                .and_then(|mut data| data.remove("requestheader-client-ca-file"))
                .unwrap_or_default();
            if certificates(&bundle) == expected {
                Ok(())
            } else {
                Err(bundle)
            }
        },
    )
    .await;
}

/// An operator rotates the front proxy's CA in the steps that let no request fail
/// (`ClusterPki::rotate_front_proxy`): kube-apiserver reloads its files and publishes the
/// CAs in the ConfigMap, and battery-apiserver, watching it, trusts the new certificate
/// before kube-apiserver presents it, and refuses the old one once the old CA is gone,
/// neither restarted. Requests through kube-apiserver work at every step.
#[tokio::test]
async fn a_rotated_front_proxy_ca_takes_effect_without_a_restart() {
    let server = ApiServer::start(Route::Aggregated).await;
    let plane = &server.cluster().expect("a real control plane").plane;
    let pki = plane.pki();
    let admin = kubectl_user(&server);
    let works = async |step: &str| {
        let (code, list) = admin.get(CLAIMS).await;
        assert_eq!(
            code,
            StatusCode::OK,
            "through kube-apiserver {step}: {list}"
        );
    };
    works("before the rotation").await;

    // Keep the old certificate: the rotation replaces its files.
    let (cert, key) = pki.front_proxy_client();
    let old = (
        server.scratch().join("old-front-proxy-client.crt"),
        server.scratch().join("old-front-proxy-client.key"),
    );
    std::fs::copy(cert, &old.0).expect("copy the old certificate");
    std::fs::copy(key, &old.1).expect("copy the old key");
    let as_holder = [("X-Remote-User", HOLDER)];
    let old_to_serve = straight(&server, Identity::Cert(old.0.clone(), old.1.clone()));
    let old_to_cluster = through(&server, Identity::Cert(old.0, old.1));
    let answer = async |client: &Client, expected: StatusCode| match client
        .call("GET", CLAIMS, &as_holder, None)
        .await
    {
        (code, _) if code == expected => Ok(()),
        (code, status) => Err(format!("{code}: {status}")),
    };
    answer(&old_to_serve, StatusCode::OK)
        .await
        .expect("the old certificate works before the rotation");

    let config_maps: Api<ConfigMap> = Api::namespaced(plane.admin().await, "kube-system");
    let old_ca = std::fs::read_to_string(pki.front_proxy_ca().0).expect("the old CA");
    let rotation = pki.rotate_front_proxy().expect("a new front-proxy CA");
    published(&config_maps, &[&old_ca, rotation.ca_pem()]).await;
    let (cert, key) = rotation.next_client();
    let new_to_serve = straight(&server, Identity::Cert(cert, key));
    eventually(
        RELOAD_TIMEOUT,
        "battery-apiserver to trust the new CA beside the old",
        async || answer(&new_to_serve, StatusCode::OK).await,
    )
    .await;
    works("while both CAs are trusted").await;

    rotation
        .switch_client()
        .expect("give kube-apiserver the new certificate");
    works("after the switch").await;

    // Nothing shows when kube-apiserver took the new certificate, but its CA file, written
    // after it and watched the same way, shows when reloaded: kube-apiserver itself
    // refuses the old certificate.
    rotation.drop_old_ca().expect("drop the old CA");
    eventually(
        RELOAD_TIMEOUT,
        "kube-apiserver to refuse the old certificate",
        async || answer(&old_to_cluster, StatusCode::UNAUTHORIZED).await,
    )
    .await;
    // kube-apiserver only adds to the ConfigMap, so battery-apiserver, as every aggregated
    // server, still trusts the old CA: the operator deletes the ConfigMap, and
    // kube-apiserver writes it again with what it trusts now.
    answer(&old_to_serve, StatusCode::OK)
        .await
        .expect("battery-apiserver trusts the old CA while the ConfigMap names it");
    config_maps
        .delete(AUTHENTICATION, &DeleteParams::default())
        .await
        .expect("delete the ConfigMap");
    published(&config_maps, &[rotation.ca_pem()]).await;
    eventually(
        RELOAD_TIMEOUT,
        "battery-apiserver to refuse the old certificate",
        async || answer(&old_to_serve, StatusCode::UNAUTHORIZED).await,
    )
    .await;
    works("after the old CA is gone").await;
}
