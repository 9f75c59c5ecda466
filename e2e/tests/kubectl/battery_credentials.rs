//! Issue 39: `serve` reaches battery as a production poolmgrd is secured (TLS, a client
//! certificate and a basic-auth token: the aggregated route's embedded battery requires
//! all three), binds through the real kube-apiserver that way, and when battery refuses
//! its token says so on `/readyz` and in the 503 a create gets, leaks no lease, and
//! picks up a mended token file without a restart.

use std::time::Duration;

use battery_e2e::apiserver::{ApiServer, Route};
use battery_e2e::https::{Client, Identity};
use http_body_util::BodyExt as _;

use super::{CLAIMS_PATH, claim_manifest};

/// How long `serve` may take to read a changed token file (it looks every 2 s).
const RELOAD: Duration = Duration::from_secs(30);
const REFUSED: &str = "battery refused the API server's credentials";

/// `serve`'s own `/readyz`, as a kubelet probe reads it: status and text.
async fn serve_readyz(server: &ApiServer) -> (http::StatusCode, String) {
    let cluster = server.cluster().expect("aggregated");
    let probe = Client::new(
        server.backend(),
        &cluster.installation.serving_ca,
        Identity::Anonymous,
    )
    .with_server_name("battery-apiserver.battery-system.svc");
    let response = probe.open("GET", "/readyz", &[], None).await;
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Replaces the token file at once, as a Secret volume swaps its files.
fn write_token(server: &ApiServer, token: &str) {
    let file = server.battery_token_file().expect("aggregated");
    let staged = file.with_extension("staged");
    std::fs::write(&staged, format!("{token}\n")).unwrap();
    std::fs::rename(&staged, &file).unwrap();
}

#[tokio::test]
async fn binds_over_a_secured_channel_and_a_refused_token_is_said_and_leaks_nothing() {
    let server = ApiServer::start(Route::Aggregated).await;
    let kubectl = server.kubectls().next().expect("a kubectl");
    let right_token = std::fs::read_to_string(server.battery_token_file().unwrap()).unwrap();

    // Bound through kube-apiserver, serve and battery over TLS with both credentials.
    let bound = kubectl.unique("bound");
    let claim = kubectl
        .cmd(&["create", "-o", "json", "-f", "-"])
        .stdin(claim_manifest(&bound).to_string())
        .json()
        .await;
    assert_eq!(claim["status"]["phase"], "Bound", "{claim}");
    let leases_before = server.battery_leases().await.len();

    write_token(&server, "not-the-token");
    let readyz = battery_e2e::eventually(RELOAD, "serve to report the refused token", async || {
        let (status, body) = serve_readyz(&server).await;
        if status != http::StatusCode::OK && body.contains(REFUSED) {
            Ok(body)
        } else {
            Err(format!("{status}: {body}"))
        }
    })
    .await;
    assert!(
        !readyz.contains("not-the-token") && !readyz.contains(right_token.trim()),
        "{readyz}"
    );

    // A create answers 503 with the same reason, and battery holds no lease for it.
    let refused = kubectl.unique("refused");
    let status = kubectl
        .cmd(&["create", "--raw", CLAIMS_PATH, "-f", "-"])
        .stdin(claim_manifest(&refused).to_string())
        .fails()
        .await;
    assert!(status.contains(REFUSED), "{status}");
    assert!(!status.contains("not-the-token"), "{status}");
    assert_eq!(server.battery_leases().await.len(), leases_before);
    let listed = kubectl.fails(&["get", "microvmclaim", &refused]).await;
    assert!(
        listed.contains("NotFound") || listed.contains("not found"),
        "{listed}"
    );

    // The mended file is read again: ready, and binding, with no restart.
    write_token(&server, right_token.trim());
    battery_e2e::eventually(
        RELOAD,
        "serve to be ready again",
        async || match serve_readyz(&server).await {
            (http::StatusCode::OK, _) => Ok(()),
            (status, body) => Err(format!("{status}: {body}")),
        },
    )
    .await;
    let again = kubectl.unique("again");
    let claim = kubectl
        .cmd(&["create", "-o", "json", "-f", "-"])
        .stdin(claim_manifest(&again).to_string())
        .json()
        .await;
    assert_eq!(claim["status"]["phase"], "Bound", "{claim}");
    kubectl
        .ok(&["delete", "microvmclaim", &bound, &again])
        .await;
}
