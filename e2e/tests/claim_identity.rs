//! The claim's ServiceAccount inside its guest (issue 42 item 3; ADR 43), through a real
//! kube-apiserver, as in a cluster (`serve`, the embedded battery in its own process, one
//! `battery-agent` per simulated Host, kube-controller-manager publishing
//! `kube-root-ca.crt` and collecting garbage): the token is kube-apiserver's own
//! TokenRequest's, and TokenReview, also kube-apiserver's, says what it is worth.
//!
//! The simulated Hosts run a session's commands as local processes rooted in the
//! MicroVM's directory, so the files are read relative to the working directory `/`.

use std::collections::BTreeSet;
use std::time::Duration;

use battery_e2e::apiserver::{ApiServer, Route, front};
use battery_e2e::control_plane::Options;
use battery_e2e::{eventually, kube_client, kube_event};
use battery_types::{ClaimPhase, MicroVMClaim, Pool};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Service, ServiceAccount};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const NAMESPACE: &str = "default";
/// The claims' Holder, whose token the guest gets: the kubectl user of the harness, so it
/// may exec to read the files.
const WORKER: &str = "dev";
/// May create claims, but not request the worker's tokens.
const CREATOR: &str = "creator";
const AUDIENCE: &str = "battery-e2e.example.com";
/// Where the guest's files are, from the session's `/`.
const DIR: &str = "var/run/secrets/kubernetes.io/serviceaccount";
/// How old a token may get before `serve` replaces it, here: the API's shortest lifetime is
/// 10 minutes, 80% of which no test waits for.
const REFRESH_AFTER: &str = "3";
/// Generous, for a debug build on a loaded 2-core machine.
const DEADLINE: Duration = Duration::from_secs(90);
/// Where `serve` tells guests kube-apiserver is: here the `kubernetes` Service's
/// ClusterIP and port, what a Pod of this cluster is told (nothing routes to it here).
const GUEST_API_SERVER: &str = "10.0.0.1:443";

fn claim_json(name: &str, token: Option<Value>) -> Value {
    let mut claim = json!({
        "apiVersion": battery_types::API_VERSION,
        "kind": "MicroVMClaim",
        "metadata": {"name": name},
        "spec": {"poolRef": {"name": "dev"}, "serviceAccountName": WORKER},
    });
    if let Some(token) = token {
        claim["spec"]["serviceAccountToken"] = token;
    }
    claim
}

/// Runs `command` in the claim as the kubectl user, in `/`; returns stdout and the Status.
async fn run(server: &ApiServer, claim: &str, command: &[&str]) -> (String, Value) {
    server.exec_in_root(NAMESPACE, claim, command, &[]).await
}

/// The guest's file `name` in its ServiceAccount directory.
async fn guest_file(server: &ApiServer, claim: &str, name: &str) -> String {
    let (stdout, status) = run(server, claim, &["cat", &format!("{DIR}/{name}")]).await;
    assert_eq!(status["status"], "Success", "reading {name}: {status}");
    stdout
}

/// kube-apiserver's TokenReview of `token` for `audiences`.
async fn review(client: &kube::Client, token: &str, audiences: &[&str]) -> TokenReviewStatus {
    let reviews: Api<TokenReview> = Api::all(client.clone());
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_owned()),
            audiences: Some(audiences.iter().map(|a| (*a).to_owned()).collect()),
        },
        ..TokenReview::default()
    };
    reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

/// The MicroVMs battery has leased, asked of battery itself.
async fn leased(server: &ApiServer) -> BTreeSet<String> {
    let leases = server.battery_leases().await;
    leases.into_iter().map(|lease| lease.vm_uid).collect()
}

#[tokio::test]
async fn the_guests_token_is_the_holders_is_replaced_and_is_refused_once_the_claim_ends() {
    let server = ApiServer::aggregated_with_agents_and(Options {
        controllers: true,
        serve_env: &[
            (
                "BATTERY_APISERVER_TOKEN_REFRESH_AFTER_SECONDS",
                REFRESH_AFTER,
            ),
            ("BATTERY_APISERVER_GUEST_API_SERVER", GUEST_API_SERVER),
        ],
        ..Options::default()
    })
    .await;
    let client = kube_client(server.kubeconfig()).await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NAMESPACE);
    for name in [WORKER, CREATOR] {
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..ServiceAccount::default()
        };
        match accounts.create(&PostParams::default(), &account).await {
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            created => {
                created.unwrap();
            }
        }
    }
    // The Pool gives every claim's guest a token for the audience.
    let pools: Api<Pool> = Api::namespaced(client.clone(), NAMESPACE);
    let patch =
        json!({"spec": {"serviceAccountToken": {"audience": AUDIENCE, "expirationSeconds": 600}}});
    pools
        .patch("dev", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let ca = eventually(DEADLINE, "kube-root-ca.crt to be published", async || {
        let config_map = config_maps
            .get_opt("kube-root-ca.crt")
            .await
            .map_err(|e| e.to_string())?;
        config_map
            .and_then(|c| c.data?.remove("ca.crt"))
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;

    // Someone who may create claims but not request the worker's tokens: 403 naming the
    // ServiceAccount, nothing leased.
    let before = leased(&server).await;
    let rules = vec![front::battery_rule(&["microvmclaims"], &["get", "create"])];
    let cluster = server.cluster().expect("aggregated");
    cluster
        .grant(
            "e2e:creator",
            rules,
            front::service_account(NAMESPACE, CREATOR),
        )
        .await;
    let user = battery_types::service_account_username(NAMESPACE, CREATOR);
    let creator = cluster.service_account_client(NAMESPACE, CREATOR);
    let collection = format!(
        "/apis/{}/namespaces/{NAMESPACE}/microvmclaims",
        battery_types::API_VERSION
    );
    let (code, body) = creator
        .call("POST", &collection, &[], Some(claim_json("borrowed", None)))
        .await;
    assert_eq!(code, 403, "{body}");
    assert_eq!(
        body["message"],
        format!(
            "serviceaccounts \"{WORKER}\" is forbidden: User \"{user}\" cannot create resource \
             \"serviceaccounts/token\" in API group \"\" in the namespace \"{NAMESPACE}\""
        ),
        "{body}"
    );
    assert_eq!(leased(&server).await, before);

    // The cluster admin may: the guest has what a Pod of the worker has.
    let claims: Api<MicroVMClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let claim: MicroVMClaim = serde_json::from_value(claim_json("agent", None)).unwrap();
    let bound = claims.create(&PostParams::default(), &claim).await.unwrap();
    assert_eq!(
        bound.status.as_ref().and_then(|s| s.phase.clone()),
        Some(ClaimPhase::Bound)
    );
    assert_eq!(guest_file(&server, "agent", "namespace").await, NAMESPACE);
    assert_eq!(guest_file(&server, "agent", "ca.crt").await, ca);
    let first = guest_file(&server, "agent", "token").await;
    let reviewed = review(&client, &first, &[AUDIENCE]).await;
    assert_eq!(reviewed.authenticated, Some(true), "{reviewed:?}");
    let reviewed_user = reviewed.user.clone().unwrap_or_default();
    assert_eq!(
        reviewed_user.username.as_deref(),
        Some(battery_types::service_account_username(NAMESPACE, WORKER).as_str())
    );
    assert_eq!(reviewed.audiences, Some(vec![AUDIENCE.to_owned()]));
    // For its audience only: kube-apiserver's own refuses it.
    let elsewhere = review(&client, &first, &[]).await;
    assert_ne!(elsewhere.authenticated, Some(true), "{elsewhere:?}");
    // Its sessions are told where kube-apiserver is, as a Pod is: here what a Pod of
    // this cluster is told, the `kubernetes` Service.
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    let kubernetes = services.get("kubernetes").await.unwrap().spec.unwrap();
    let port = kubernetes.ports.unwrap_or_default()[0].port;
    assert_eq!(
        format!("{}:{port}", kubernetes.cluster_ip.unwrap_or_default()),
        GUEST_API_SERVER
    );
    let told = [
        "printenv",
        "KUBERNETES_SERVICE_HOST",
        "KUBERNETES_SERVICE_PORT",
    ];
    let (stdout, status) = run(&server, "agent", &told).await;
    assert_eq!(status["status"], "Success", "{status}");
    assert_eq!(stdout, "10.0.0.1\n443\n");

    // A claim left to expire (never renewed) ends the same way as one deleted.
    let claim: MicroVMClaim = serde_json::from_value(claim_json("lapsed", None)).unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    let lapsed = guest_file(&server, "lapsed", "token").await;
    let reviewed = review(&client, &lapsed, &[AUDIENCE]).await;
    assert_eq!(reviewed.authenticated, Some(true), "{reviewed:?}");

    // Replaced before it expires, by a token that authenticates too.
    let second = eventually(DEADLINE, "the token to be replaced", async || {
        let token = guest_file(&server, "agent", "token").await;
        if token == first || token.is_empty() {
            return Err("still the first".to_owned());
        }
        Ok(token)
    })
    .await;
    let reviewed = review(&client, &second, &[AUDIENCE]).await;
    assert_eq!(reviewed.authenticated, Some(true), "{reviewed:?}");

    // Deleted: its binding Secret goes first, and with it the tokens.
    claims
        .delete("agent", &DeleteParams::default())
        .await
        .unwrap();
    eventually(DEADLINE, "the tokens to be refused", async || {
        for token in [&first, &second] {
            let reviewed = review(&client, token, &[AUDIENCE]).await;
            if reviewed.authenticated == Some(true) {
                return Err(format!("still authenticates: {:?}", reviewed.user));
            }
        }
        Ok(())
    })
    .await;
    eventually(DEADLINE, "the unrenewed claim to expire", async || {
        let claim = claims.get("lapsed").await.map_err(|e| e.to_string())?;
        match claim.status.and_then(|s| s.phase) {
            Some(ClaimPhase::Expired) => Ok(()),
            phase => Err(format!("{phase:?}")),
        }
    })
    .await;
    eventually(
        DEADLINE,
        "the expired claim's token to be refused",
        async || {
            let reviewed = review(&client, &lapsed, &[AUDIENCE]).await;
            if reviewed.authenticated == Some(true) {
                return Err(format!("still authenticates: {:?}", reviewed.user));
            }
            Ok(())
        },
    )
    .await;

    // A token that cannot be replaced (its ServiceAccount is gone) is told on the claim,
    // with what to do, once the tries have failed a few times in a row.
    let claim: MicroVMClaim = serde_json::from_value(claim_json("orphan", None)).unwrap();
    let orphan = claims.create(&PostParams::default(), &claim).await.unwrap();
    let orphaned = guest_file(&server, "orphan", "token").await;
    accounts
        .delete(WORKER, &DeleteParams::default())
        .await
        .unwrap();
    let uid = orphan.metadata.uid.as_deref();
    let failing = kube_event(&client, NAMESPACE, uid, "TokenRotationFailing", DEADLINE).await;
    assert_eq!(failing.type_.as_deref(), Some("Warning"));
    let message = failing.message.unwrap_or_default();
    assert!(
        message.contains(&format!("requesting a token of ServiceAccount {WORKER}"))
            && message.contains(&format!(
                "kubectl get serviceaccount {WORKER} -n {NAMESPACE}"
            ))
            && message.contains("the token in the MicroVM expires at"),
        "{message}"
    );

    // Nothing of any token in a claim, an Event or a log.
    let kubectl = server.kubectls().next().expect("a kubectl");
    let yaml = kubectl
        .ok(&["get", "microvmclaims,pools", "-o", "yaml", "-n", NAMESPACE])
        .await;
    assert!(yaml.contains(AUDIENCE), "{yaml}");
    let events: Api<Event> = Api::all(client.clone());
    let events = serde_json::to_string(&events.list(&Default::default()).await.unwrap()).unwrap();
    let logs = server.logs();
    for token in [&first, &second, &lapsed, &orphaned] {
        assert!(!yaml.contains(token.as_str()), "{yaml}");
        assert!(!events.contains(token.as_str()), "{events}");
        for log in &logs {
            let text = String::from_utf8_lossy(&std::fs::read(log).unwrap()).into_owned();
            assert!(
                !text.contains(token.as_str()),
                "{} holds a token",
                log.display()
            );
        }
    }
}

#[tokio::test]
async fn dev_refuses_a_token_saying_it_has_no_cluster() {
    let server = ApiServer::start(Route::Direct).await;
    let client = kube_client(server.kubeconfig()).await;
    let claims: Api<MicroVMClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let claim: MicroVMClaim =
        serde_json::from_value(claim_json("identified", Some(json!({})))).unwrap();
    let Err(kube::Error::Api(refused)) = claims.create(&PostParams::default(), &claim).await else {
        panic!("dev bound a claim asking for a ServiceAccount token");
    };
    assert_eq!(refused.code, 422, "{refused:?}");
    assert!(
        refused
            .message
            .contains("spec.serviceAccountToken: Forbidden: this API server has no cluster"),
        "{refused:?}"
    );
    let pools: Api<Pool> = Api::namespaced(client, NAMESPACE);
    let patch = json!({"spec": {"serviceAccountToken": {"audience": AUDIENCE}}});
    let Err(kube::Error::Api(refused)) = pools
        .patch("dev", &PatchParams::default(), &Patch::Merge(&patch))
        .await
    else {
        panic!("dev took a Pool asking for ServiceAccount tokens");
    };
    assert_eq!(refused.code, 422, "{refused:?}");
    assert!(
        refused
            .message
            .contains("no cluster to request ServiceAccount tokens"),
        "{refused:?}"
    );
}
