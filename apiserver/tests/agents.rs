//! Exec agents and their Hosts: an agent may write only its own Host; its readiness
//! report reaches the claims on that Host and battery's placement.

mod common;
mod dev_process;

use axum::body::Body;
use battery_apiserver::api::UserInfo;
use battery_types::Host;
use battery_types::agent_identity::{AGENT_GROUP, agent_username};
use battery_types::conditions::{self, HostReadyReason};
use common::{DEADLINE, HOSTS, Harness, eventually};
use dev_process::DevProcess;
use http::{Request, StatusCode, header};
use serde_json::{Value, json};

const MERGE: &str = "application/merge-patch+json";

/// `method` on `uri` as the exec agent of Host `host`, past authentication.
async fn as_agent(
    h: &Harness,
    host: &str,
    method: &str,
    uri: &str,
    content_type: &str,
    body: Value,
) -> (StatusCode, Value) {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body.to_string()))
        .unwrap();
    request.extensions_mut().insert(UserInfo {
        name: agent_username(host),
        groups: vec![AGENT_GROUP.to_owned(), "system:authenticated".to_owned()],
        ..UserInfo::default()
    });
    let (status, _, body) = h.send_as_is(request).await;
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn ready_report(status: &str, reason: &str, message: &str) -> Value {
    json!({"status": {"conditions": [{
        "type": "Ready", "status": status, "reason": reason, "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z"
    }]}})
}

#[tokio::test]
async fn an_agent_writes_its_own_host_and_is_refused_every_other() {
    let h = Harness::start().await;
    h.eventually(HOSTS, |_, list| {
        list["items"].as_array().is_some_and(|i| i.len() == 2)
    })
    .await;

    // Its own Host: the registration patch and the status report.
    let (status, host) = as_agent(
        &h,
        "host-0",
        "PATCH",
        &format!("{HOSTS}/host-0"),
        MERGE,
        json!({"spec": {"agentAddress": "127.0.0.1:10270"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{host}");
    assert_eq!(host["spec"]["agentAddress"], "127.0.0.1:10270");
    let (status, host) = as_agent(
        &h,
        "host-0",
        "PATCH",
        &format!("{HOSTS}/host-0/status"),
        MERGE,
        ready_report("True", "Ready", "usable"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{host}");

    // Another Host, its spec, its status, its creation and its deletion: 403, naming
    // both Hosts.
    let other = [
        (
            "PATCH",
            format!("{HOSTS}/host-1"),
            MERGE,
            json!({"spec": {"agentAddress": "127.0.0.1:1"}}),
        ),
        (
            "PATCH",
            format!("{HOSTS}/host-1/status"),
            MERGE,
            ready_report("False", "KVMUnavailable", "forged"),
        ),
        (
            "POST",
            HOSTS.to_owned(),
            "application/json",
            json!({"apiVersion": "battery.liquidmetal-x.dev/v1alpha1", "kind": "Host",
                "metadata": {"name": "host-9"},
                "spec": {"address": "127.0.0.1:9", "tls": {"insecure": true}}}),
        ),
        (
            "DELETE",
            format!("{HOSTS}/host-1"),
            "application/json",
            json!({}),
        ),
    ];
    for (method, uri, content_type, body) in other {
        let (status, refusal) = as_agent(&h, "host-0", method, &uri, content_type, body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {uri}: {refusal}");
        assert_eq!(refusal["reason"], "Forbidden");
        let message = refusal["message"].as_str().unwrap();
        assert!(
            message.contains("\"host-0\"") && message.contains("system:battery-agent:host-0"),
            "{message}"
        );
    }
    let (_, host1) = h.get(&format!("{HOSTS}/host-1")).await;
    assert!(host1["spec"].get("agentAddress").is_none(), "{host1}");
    assert!(common::condition(&host1, "Ready").is_none(), "{host1}");
}

#[tokio::test]
async fn in_dev_each_agent_registers_its_host_and_reports_it_ready() {
    let dir = tempfile::tempdir().unwrap();
    let dev = DevProcess::start(
        &dir.path().join("dev"),
        &["--pool-size", "0"],
        &[],
        std::process::Stdio::null(),
    );
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(dev.dir.join("kubeconfig")).unwrap(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let hosts: kube::Api<Host> = kube::Api::all(kube::Client::try_from(config).unwrap());
    let listed = eventually(DEADLINE, || async {
        let list = hosts
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?;
        let ready = list.items.iter().all(|host| {
            host.spec.agent_address.is_some()
                && host.status.as_ref().is_some_and(|s| {
                    conditions::is_status_condition_true(&s.conditions, conditions::READY)
                })
        });
        if list.items.len() == 2 && ready {
            Ok(list.items)
        } else {
            Err(format!("{:?}", list.items))
        }
    })
    .await;
    for host in listed {
        let status = host.status.unwrap();
        let ready =
            conditions::find_status_condition(&status.conditions, conditions::READY).unwrap();
        assert_eq!(ready.reason, HostReadyReason::Ready.as_str());
        // The simulated Hosts have neither; the report must not claim them.
        assert!(
            ready
                .message
                .contains("not checked (turned off): KVM, the thin pool"),
            "{}",
            ready.message
        );
        let agent = host.spec.agent_address.unwrap();
        assert!(agent.starts_with("127.0.0.1:"), "{agent}");
    }
    assert!(dev.stop().success());
}
