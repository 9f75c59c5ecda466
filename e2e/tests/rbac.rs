//! RBAC exactly as `deploy/` ships it, through a real kube-apiserver: the `battery-holder`
//! role alone is enough to claim, renew, exec and release; Kubernetes' `view` (which our
//! `battery-view` aggregates into) reads claims but neither renews, execs, opens a
//! terminal nor forwards a port; and exec needs the two verbs `docs/security.md` names,
//! `get` at kube-apiserver's front door and `create` at ours.

use battery_e2e::apiserver::{ApiServer, front};
use battery_e2e::channel_exec;
use battery_e2e::control_plane::Options;
use battery_e2e::https::Identity;
use battery_e2e::{dev_claim, kube_client};
use battery_types::{ClaimPhase, MicroVMClaim};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, AttachParams, DeleteParams, ObjectMeta, PostParams};
use tokio::io::AsyncReadExt as _;

const NAMESPACE: &str = "default";

/// `claims` of the kubectl user (allowed everything): for claims another account holds.
async fn admin_claims(server: &ApiServer) -> Api<MicroVMClaim> {
    Api::namespaced(kube_client(server.kubeconfig()).await, NAMESPACE)
}

/// The ServiceAccount `name` of [`NAMESPACE`] with a token, bound in [`NAMESPACE`] to the
/// shipped ClusterRole `role` as a namespace admin binds it; its claims API.
async fn account_bound_to(
    server: &ApiServer,
    name: &str,
    role: &str,
    allows: &[&str],
) -> Api<MicroVMClaim> {
    let cluster = server.cluster().expect("a real control plane");
    let kubeconfig = cluster
        .plane
        .service_account_kubeconfig(NAMESPACE, name)
        .await;
    let expected = front::battery_rule(&["microvmclaims"], allows);
    let subject = front::service_account(NAMESPACE, name);
    cluster.bind_in(NAMESPACE, role, subject, &expected).await;
    Api::namespaced(kube_client(&kubeconfig).await, NAMESPACE)
}

/// A WebSocket client of kube-apiserver with the token of the ServiceAccount `name` of
/// [`NAMESPACE`], for the claims' `exec` and `portforward`.
async fn channel_client_as(server: &ApiServer, name: &str) -> channel_exec::Client {
    let cluster = server.cluster().expect("a real control plane");
    let token = cluster.plane.service_account_token(NAMESPACE, name).await;
    channel_exec::Client {
        https: battery_e2e::https::Client::new(
            cluster.url(),
            &cluster.ca(),
            Identity::Token(token),
        ),
    }
}

/// Renews `claim` as the SDK does: a PUT of a Lease to its `lease` subresource.
async fn renew(claims: &Api<MicroVMClaim>, claim: &str) -> Result<Lease, kube::Error> {
    let body = Lease {
        metadata: ObjectMeta {
            name: Some(claim.to_owned()),
            ..Default::default()
        },
        spec: None,
    };
    let request = kube::core::Request::new(claims.resource_url())
        .replace_subresource(
            "lease",
            claim,
            &PostParams::default(),
            serde_json::to_vec(&body).expect("a Lease serializes"),
        )
        .expect("a request");
    claims.clone().into_client().request::<Lease>(request).await
}

/// Runs `echo hi` in `claim` with kube-rs as the user of `claims`; its stdout.
async fn echo(claims: &Api<MicroVMClaim>, claim: &str) -> Result<String, kube::Error> {
    let mut process = claims
        .exec(
            claim,
            ["echo", "hi"],
            &AttachParams::default().stderr(false),
        )
        .await?;
    let mut stdout = String::new();
    process
        .stdout()
        .expect("stdout is attached")
        .read_to_string(&mut stdout)
        .await
        .expect("read stdout");
    process.join().await.expect("the session ends");
    Ok(stdout)
}

#[track_caller]
fn assert_forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str) {
    match result {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{what}: {status:?}"),
        other => panic!("{what}: expected 403, got {other:?}"),
    }
}

#[tokio::test]
async fn the_holder_role_alone_claims_renews_execs_and_releases() {
    let server = ApiServer::aggregated_with_agents().await;
    let claims = account_bound_to(&server, "runner", "battery-holder", &["create"]).await;

    let created = claims
        .create(&PostParams::default(), &dev_claim("mine", "runner"))
        .await
        .expect("the holder role creates a claim");
    assert_eq!(
        created.status.and_then(|s| s.phase),
        Some(ClaimPhase::Bound)
    );
    claims.list(&Default::default()).await.expect("and lists");
    let renewed = renew(&claims, "mine").await.expect("renews its own claim");
    assert_eq!(
        renewed.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("system:serviceaccount:default:runner")
    );
    assert_eq!(
        echo(&claims, "mine").await.expect("execs in its own claim"),
        "hi\n"
    );

    // Another Holder's claim: RBAC lets the role through, the Holder rule refuses.
    admin_claims(&server)
        .await
        .create(&PostParams::default(), &dev_claim("theirs", "dev"))
        .await
        .expect("the kubectl user claims for itself");
    assert_forbidden(renew(&claims, "theirs").await, "renewing another's claim");

    claims
        .delete("mine", &DeleteParams::default())
        .await
        .expect("releases its claim");
    let leases = server.battery_leases().await;
    assert_eq!(
        leases.len(),
        1,
        "only the other claim's lease is left: {leases:?}"
    );
}

#[tokio::test]
async fn view_reads_claims_but_cannot_renew_or_exec() {
    // The ClusterRole aggregation controller puts `battery-view` into `view`.
    let server = ApiServer::aggregated_with_agents_and(Options {
        controllers: true,
        ..Options::default()
    })
    .await;
    // Even as the claim's Holder, `view` gives neither `lease` nor `exec`.
    admin_claims(&server)
        .await
        .create(&PostParams::default(), &dev_claim("watched", "viewer"))
        .await
        .expect("a claim held by the viewer");
    let claims = account_bound_to(&server, "viewer", "view", &["get"]).await;

    claims.get("watched").await.expect("view reads a claim");
    assert_eq!(
        claims
            .list(&Default::default())
            .await
            .expect("and lists")
            .items
            .len(),
        1
    );
    assert_forbidden(renew(&claims, "watched").await, "renewing with view");
    assert!(echo(&claims, "watched").await.is_err(), "view may not exec");
    // Nor open a terminal or forward a port: kube-apiserver refuses both upgrades itself.
    let client = channel_client_as(&server, "viewer").await;
    for (subresource, query, protocol) in [
        (
            "exec",
            "command=sh&stdin=true&stdout=true&tty=true",
            "v5.channel.k8s.io",
        ),
        ("portforward", "ports=80", "v4.channel.k8s.io"),
    ] {
        let refused = client
            .open(
                &format!(
                    "{}?{query}",
                    channel_exec::connect_path(NAMESPACE, "watched", subresource)
                ),
                protocol,
            )
            .await
            .err()
            .unwrap_or_else(|| panic!("view may not open {subresource}"));
        assert_eq!(refused.0, 403, "{subresource}: {}", refused.1);
        let message = refused.1["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!(
                "cannot get resource \"microvmclaims/{subresource}\""
            )),
            "{subresource}: {}",
            refused.1
        );
    }
    assert_forbidden(
        claims
            .create(&PostParams::default(), &dev_claim("mine", "viewer"))
            .await,
        "creating with view",
    );
    assert_forbidden(
        claims.delete("watched", &DeleteParams::default()).await,
        "deleting with view",
    );
}

/// Exec's two verbs: with `get` alone on `microvmclaims/exec` kube-apiserver proxies the
/// upgrade and we refuse it for want of `create`; with `create` alone kube-apiserver
/// refuses it itself; with both (as `battery-holder` has) the Holder runs the command.
#[tokio::test]
async fn exec_needs_get_at_kube_apiserver_and_create_at_ours() {
    let server = ApiServer::aggregated_with_agents().await;
    let cluster = server.cluster().expect("a real control plane");
    let admin = admin_claims(&server).await;
    for (holder, verbs, refusal) in [
        (
            "getter",
            &["get"][..],
            Some("cannot create resource \"microvmclaims/exec\""),
        ),
        (
            "creator",
            &["create"][..],
            Some("cannot get resource \"microvmclaims/exec\""),
        ),
        ("both", &["get", "create"][..], None),
    ] {
        admin
            .create(&PostParams::default(), &dev_claim(holder, holder))
            .await
            .expect("a claim for the holder");
        let rules = vec![front::battery_rule(&["microvmclaims/exec"], verbs)];
        let subject = front::service_account(NAMESPACE, holder);
        cluster
            .grant(&format!("e2e:exec-{holder}"), rules, subject)
            .await;
        let client = channel_client_as(&server, holder).await;
        let path = format!(
            "{}?{}",
            channel_exec::exec_path(NAMESPACE, holder),
            channel_exec::query(&["echo", "hi"], false)
        );
        let opened = client.open(&path, "v5.channel.k8s.io").await;
        match (refusal, opened) {
            (Some(refusal), Err((code, status))) => {
                assert_eq!(code, 403, "{holder}: {status}");
                let message = status["message"].as_str().unwrap_or_default();
                assert!(message.contains(refusal), "{holder}: {status}");
            }
            (None, Ok(session)) => {
                let outcome = session.finish().await;
                assert_eq!(outcome.stdout, b"hi\n", "{holder}: {outcome:?}");
            }
            (refusal, opened) => panic!(
                "{holder} with {verbs:?}: expected {refusal:?}, got {:?}",
                opened.map(|s| s.protocol)
            ),
        }
    }
}
