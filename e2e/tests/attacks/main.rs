//! The attack table: requests that must not get anything from battery-apiserver, sent
//! as a cluster would carry them (through the aggregator stand-in) or straight to the
//! server, bypassing the aggregator as an attacker on the pod network could. Each row
//! states what it proves, must be refused with the right `Status`, and must change
//! nothing: no claim made, no MicroVM leased, no lease renewed.
//!
//! Then the rows that need time or state: a token whose ServiceAccount is deleted, the
//! watch limit, and a rotation of the front proxy's CA, which battery-apiserver must
//! take from the watched ConfigMap without a restart.
//!
//! These alone still run behind the aggregator stand-in, not a real kube-apiserver
//! (ADR 30): the rows sent "as a cluster would carry them" are judged by the stand-in's
//! policy file, and the rotation goes through its endpoint. On the real control plane the
//! aggregator refuses some of them before they reach us, so each row must be judged again
//! for what it then proves; that move is open work.

use std::time::Duration;

use battery_e2e::apiserver::ApiServer;
use battery_e2e::eventually;
use battery_e2e::https::{Client, Identity};
use battery_e2e::stand_in::pki::{Ca, Validity};
use battery_e2e::stand_in::{StandIn, write_client};
use http::StatusCode;
use serde_json::{Value, json};

const CLAIMS: &str = "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/microvmclaims";
const DEV_POOL: &str = "/apis/battery.liquidmetal-x.dev/v1alpha1/namespaces/default/pools/dev";
/// The claim every row attacks; its Holder is the kubectl user, `default:dev`.
const HELD: &str = "held";
/// Watches battery-apiserver allows at once in this test.
const MAX_WATCHES: &str = "2";
/// battery-apiserver keeps a TokenReview answer this long (Go's default).
const TOKEN_CACHE: Duration = Duration::from_secs(10);
const MERGE_PATCH: (&str, &str) = ("content-type", "application/merge-patch+json");

/// Users the policy adds for the table, each with a bearer token of the same name.
fn attack_policy(policy: &mut Value) {
    let sa = |name: &str| {
        json!({
            "username": format!("system:serviceaccount:default:{name}"),
            "groups": ["system:serviceaccounts", "system:serviceaccounts:default"],
        })
    };
    let tokens = policy["tokens"]
        .as_array_mut()
        .expect("the policy has tokens");
    tokens.extend([
        json!({"token": "nobody", "user": sa("nobody")}),
        json!({"token": "mate", "user": sa("mate")}),
        json!({"token": "alice", "user": {"username": "alice", "groups": ["lease-editors"]}}),
        json!({"token": "deleted", "user": sa("deleted")}),
    ]);
    let rules = policy["rules"]
        .as_array_mut()
        .expect("the policy has rules");
    rules.extend([
        // The Holder's namespace mate and alice may renew any claim's lease as far as
        // RBAC goes: only the Holder rule stands between them and the lease.
        json!({
            "users": ["system:serviceaccount:default:mate"],
            "groups": ["lease-editors"],
            "verbs": ["get", "list", "create", "update", "patch"],
            "apiGroups": ["battery.liquidmetal-x.dev"],
            "resources": ["microvmclaims", "microvmclaims/lease"],
            "namespaces": ["default"],
        }),
        json!({
            "users": ["system:serviceaccount:default:deleted"],
            "verbs": ["get", "list"],
            "apiGroups": ["battery.liquidmetal-x.dev"],
            "resources": ["microvmclaims"],
            "namespaces": ["default"],
        }),
        json!({
            "groups": ["system:authenticated"],
            "verbs": ["get"],
            "nonResourceURLs": ["/apis", "/apis/*"],
        }),
        // What anonymous must not gain by being passed on by a front proxy.
        json!({
            "groups": ["system:authenticated"],
            "verbs": ["list"],
            "apiGroups": ["battery.liquidmetal-x.dev"],
            "resources": ["microvmclaims"],
            "namespaces": ["default"],
        }),
    ]);
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
    proves: &'static str,
    client: Client,
    method: &'static str,
    path: String,
    headers: Vec<(&'static str, &'static str)>,
    body: Option<Value>,
    code: StatusCode,
    reason: &'static str,
    /// What the Status message must say, to show the refusal's cause.
    says: &'static str,
}

/// `X-Remote-*` headers claiming the cluster's most powerful identity.
const FORGED: [(&str, &str); 3] = [
    ("X-Remote-User", "system:admin"),
    ("X-Remote-Group", "system:masters"),
    ("X-Remote-Extra-Scopes", "all"),
];

/// A client certificate of `ca`, in `dir`.
fn cert(ca: &Ca, stand_in: &StandIn, cn: &str, validity: Validity) -> Identity {
    let (cert, key) = write_client(ca, stand_in.dir(), cn, &[], validity);
    Identity::Cert(cert, key)
}

#[tokio::test]
async fn every_attack_is_refused_with_a_status_and_changes_nothing() {
    let server = ApiServer::behind_stand_in(&["--max-watches", MAX_WATCHES]).await;
    let stand_in = server.stand_in().expect("an aggregated server");
    stand_in.edit_policy(attack_policy);
    let layout = stand_in.layout();
    let ca = stand_in.serving_ca();
    let through = |identity: Identity| Client::new(stand_in.url(), &ca, identity);
    let straight = |identity: Identity| Client::new(server.backend(), &ca, identity);
    let admin = kubectl_user(stand_in);

    let (status, held) = admin.call("POST", CLAIMS, &[], Some(claim(HELD))).await;
    assert_eq!(status, StatusCode::CREATED, "the Holder's claim: {held}");
    let before = world(&admin).await;

    let front_proxy_ca = Ca::load(&layout.front_proxy_ca(), &layout.front_proxy_ca_key())
        .expect("the stand-in's front-proxy CA");
    let (front_cert, front_key) = stand_in.front_proxy_client();
    let stranger_ca = Ca::new("someone-else").expect("a CA");
    let lease = format!("{CLAIMS}/{HELD}/lease");
    let create =
        |proves, client, headers: &[(&'static str, &'static str)], code, reason, says| Row {
            proves,
            client,
            method: "POST",
            path: CLAIMS.to_owned(),
            headers: headers.to_vec(),
            body: Some(claim("stolen")),
            code,
            reason,
            says,
        };
    let renew = |proves, client| Row {
        proves,
        client,
        method: "PATCH",
        path: lease.clone(),
        headers: vec![MERGE_PATCH],
        body: Some(json!({})),
        code: StatusCode::FORBIDDEN,
        reason: "Forbidden",
        says: "only its Holder system:serviceaccount:default:dev may",
    };
    let mut rows = vec![
        create(
            "identity headers without a client certificate are ignored: the caller is anonymous, and anonymous may not create",
            straight(Identity::Anonymous),
            &FORGED,
            StatusCode::FORBIDDEN,
            "Forbidden",
            r#"User "system:anonymous""#,
        ),
        create(
            "anonymous is refused by the cluster",
            through(Identity::Anonymous),
            &[],
            StatusCode::FORBIDDEN,
            "Forbidden",
            r#"User "system:anonymous""#,
        ),
        create(
            "anonymous is refused by battery-apiserver itself",
            straight(Identity::Anonymous),
            &[],
            StatusCode::FORBIDDEN,
            "Forbidden",
            r#"User "system:anonymous""#,
        ),
        create(
            "a user without RBAC is refused by the cluster",
            through(Identity::Token("nobody".to_owned())),
            &[],
            StatusCode::FORBIDDEN,
            "Forbidden",
            r#"User "system:serviceaccount:default:nobody""#,
        ),
        create(
            "battery-apiserver authorizes again: a user without RBAC, vouched for by the real front proxy, is refused",
            straight(Identity::Cert(front_cert.clone(), front_key.clone())),
            &[
                ("X-Remote-User", "system:serviceaccount:default:nobody"),
                ("X-Remote-Group", "system:authenticated"),
            ],
            StatusCode::FORBIDDEN,
            "Forbidden",
            r#"User "system:serviceaccount:default:nobody""#,
        ),
        Row {
            proves: "anonymous forwarded by the real front proxy does not become system:authenticated, so gets nothing granted to it",
            client: straight(Identity::Cert(front_cert.clone(), front_key.clone())),
            method: "GET",
            path: CLAIMS.to_owned(),
            headers: vec![
                ("X-Remote-User", "system:anonymous"),
                ("X-Remote-Group", "system:unauthenticated"),
            ],
            body: None,
            code: StatusCode::FORBIDDEN,
            reason: "Forbidden",
            says: r#"User "system:anonymous" cannot list"#,
        },
        renew(
            "the Holder's namespace mate, with RBAC on microvmclaims/lease, may not renew",
            through(Identity::Token("mate".to_owned())),
        ),
        renew(
            "a non-Holder with RBAC on microvmclaims/lease may not renew",
            through(Identity::Token("alice".to_owned())),
        ),
        Row {
            proves: "a body over the limit is refused, through the aggregator, even for a user who may create",
            client: kubectl_user(stand_in),
            method: "POST",
            path: CLAIMS.to_owned(),
            headers: Vec::new(),
            body: Some(json!({"metadata": {"name": "big"}, "padding": "x".repeat(4 << 20)})),
            code: StatusCode::PAYLOAD_TOO_LARGE,
            reason: "RequestEntityTooLarge",
            says: "too large",
        },
    ];
    // Certificates that must not vouch for the forged headers, nor fall back to anonymous.
    let refused_certificates = [
        (
            "a certificate of a CA the server does not trust cannot vouch for headers",
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
    rows.extend(
        refused_certificates
            .into_iter()
            .map(|(proves, ca, cn, validity)| {
                create(
                    proves,
                    straight(cert(ca, stand_in, cn, validity)),
                    &FORGED,
                    StatusCode::UNAUTHORIZED,
                    "Unauthorized",
                    "Unauthorized",
                )
            }),
    );
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
                .is_some_and(|m| m.contains(row.says)),
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
    let vouched = straight(Identity::Cert(front_cert, front_key));
    let (code, list) = vouched
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

/// The kubectl user (`default:dev`, who may do everything) through the stand-in.
fn kubectl_user(stand_in: &StandIn) -> Client {
    let (cert, key) = stand_in.layout().kubectl();
    Client::new(
        stand_in.url(),
        &stand_in.serving_ca(),
        Identity::Cert(cert, key),
    )
}

/// A ServiceAccount's token works until the account is deleted; then it is a 401 both
/// through the cluster and straight to battery-apiserver, once its TokenReview cache
/// (10 s, as Go's) has let go of the old answer.
async fn deleted_service_account_token(server: &ApiServer, admin: &Client, before: &World) {
    let stand_in = server.stand_in().expect("an aggregated server");
    let ca = stand_in.serving_ca();
    let token = || Identity::Token("deleted".to_owned());
    let straight = Client::new(server.backend(), &ca, token());
    let through = Client::new(stand_in.url(), &ca, token());
    for (route, client) in [
        ("straight", &straight),
        ("through the aggregator", &through),
    ] {
        let (code, list) = client.get(CLAIMS).await;
        assert_eq!(
            code,
            StatusCode::OK,
            "{route}: the token works while its account exists: {list}"
        );
    }
    stand_in.edit_policy(|policy| {
        policy["tokens"]
            .as_array_mut()
            .expect("the policy has tokens")
            .retain(|t| t["token"] != "deleted");
    });
    let (code, status) = through.get(CLAIMS).await;
    assert_eq!(
        code,
        StatusCode::UNAUTHORIZED,
        "through the aggregator: {status}"
    );
    let refused = eventually(
        TOKEN_CACHE * 3,
        "battery-apiserver to refuse the deleted account's token",
        async || {
            let (code, status) = straight.get(CLAIMS).await;
            if code == StatusCode::UNAUTHORIZED {
                Ok(status)
            } else {
                Err(format!("{code}: {status}"))
            }
        },
    )
    .await;
    assert_eq!(refused["reason"], "Unauthorized", "{refused}");
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

/// kube-apiserver rotates the front proxy's CA and publishes it in the ConfigMap:
/// battery-apiserver, watching it, trusts the new certificate and refuses the old one,
/// without a restart.
#[tokio::test]
async fn a_rotated_front_proxy_ca_takes_effect_without_a_restart() {
    let server = ApiServer::behind_stand_in(&[]).await;
    let stand_in = server.stand_in().expect("an aggregated server");
    let admin = kubectl_user(stand_in);
    let (status, list) = admin.get(CLAIMS).await;
    assert_eq!(status, StatusCode::OK, "before the rotation: {list}");

    // Keep the old front-proxy certificate: the rotation overwrites the files.
    let old = tempfile::tempdir().expect("a temporary directory");
    let (cert, key) = stand_in.front_proxy_client();
    let old_cert = old.path().join("front-proxy-client.crt");
    let old_key = old.path().join("front-proxy-client.key");
    std::fs::copy(cert, &old_cert).expect("copy the old certificate");
    std::fs::copy(key, &old_key).expect("copy the old key");
    let as_aggregator = [("X-Remote-User", "system:serviceaccount:default:dev")];
    let straight_with_old = Client::new(
        server.backend(),
        &stand_in.serving_ca(),
        Identity::Cert(old_cert, old_key),
    );
    let (status, _) = straight_with_old
        .call("GET", CLAIMS, &as_aggregator, None)
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the old certificate works before the rotation"
    );

    let config_map = stand_in.rotate_front_proxy().await;
    assert!(
        config_map["data"]["requestheader-client-ca-file"]
            .as_str()
            .is_some_and(|pem| pem.contains("BEGIN CERTIFICATE")),
        "{config_map:#}"
    );
    eventually(
        Duration::from_secs(30),
        "battery-apiserver to trust the new front-proxy certificate",
        async || match admin.get(CLAIMS).await {
            (StatusCode::OK, _) => Ok(()),
            (code, status) => Err(format!("{code}: {status}")),
        },
    )
    .await;
    let (status, refused) = straight_with_old
        .call("GET", CLAIMS, &as_aggregator, None)
        .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "the old certificate after the rotation: {refused}"
    );
}
