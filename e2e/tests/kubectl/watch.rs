//! `kubectl get -w`: a watch sees claims come and go.

use battery_e2e::apiserver::{ApiServer, Route, Stream};

use crate::create_claim;

crate::on_both_routes!(get_watch_sees_a_create_and_a_delete,);

async fn get_watch_sees_a_create_and_a_delete(route: Route) {
    let server = ApiServer::start(route).await;
    for kubectl in server.kubectls() {
        let name = kubectl.unique("watched");
        let mut watch = kubectl
            .cmd(&["get", "mvc", "-w", "--output-watch-events"])
            .spawn();
        // No need to wait for the watch to start: kubectl lists first and watches from
        // the list's resourceVersion, so the claim shows up as ADDED either way.
        create_claim(&kubectl, &name).await;
        let event = |kind: &'static str| {
            let name = name.clone();
            move |line: &str| line.split_whitespace().take(2).eq([kind, name.as_str()])
        };
        watch
            .line(Stream::Stdout, "ADDED for the claim", event("ADDED"))
            .await;
        // Now the watch is established and past the ADDED: the DELETED must reach it.
        kubectl.ok(&["delete", "mvc", &name]).await;
        watch
            .line(Stream::Stdout, "DELETED for the claim", event("DELETED"))
            .await;
    }
}
