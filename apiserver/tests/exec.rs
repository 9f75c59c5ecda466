//! Issue 10: `microvmclaims/<name>/exec` end to end on a real socket: the embedded
//! battery's simulated Hosts (which run commands as flintlockd's exec API would), one
//! in-process `battery-agent` per Host over mTLS, and two clients: kube-rs's `ws` exec
//! and a hand-written `tokio-tungstenite` one speaking the channel protocol.

use battery_apiserver::testing as common;
#[path = "exec/harness.rs"]
mod harness;

use battery_apiserver::dev::pki::DEV_USER;
use battery_telemetry::free_loopback_address;
use common::{CLAIMS, POOLS, claim, get, pool};
use futures::{SinkExt, StreamExt};
use harness::{AgentProcess, DEADLINE, Exec, OTHER_USER, Raw, kube_exec};
use http::{Request as HttpRequest, StatusCode};
use kube::api::AttachParams;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn kube_rs_execs_print_and_report_exit_codes_and_get_upgrades_are_authorized_as_create() {
    let exec = Exec::start().await;
    exec.claim("c").await;
    let api = exec.claims(DEV_USER);

    let (printed, status) = kube_exec(&api, "c", &["echo", "hi"]).await;
    assert_eq!(printed, "hi\n");
    assert_eq!(status["status"], "Success", "{status}");

    let (_, status) = kube_exec(&api, "c", &["sh", "-c", "exit 3"]).await;
    assert_eq!(status["status"], "Failure", "{status}");
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(
        status["details"]["causes"],
        json!([{"reason": "ExitCode", "message": "3"}]),
        "{status}"
    );

    // kube-rs upgrades with a GET; RBAC was asked for `create` every time.
    let verbs = exec.authorizer.exec_verbs.lock().unwrap().clone();
    assert_eq!(verbs, ["create", "create"]);
}

#[tokio::test]
async fn a_hand_written_client_keeps_stdout_and_stderr_apart_and_ends_stdin_with_v5_close() {
    let exec = Exec::start().await;
    exec.claim("c").await;

    let output = exec
        .output(
            "command=sh&command=-c&command=echo%20out%3B%20echo%20err%20%3E%262&stdout=true&stderr=true",
            "v5.channel.k8s.io",
        )
        .await;
    assert_eq!(output.stdout, b"out\n");
    assert_eq!(output.stderr, b"err\n");
    assert_eq!(output.status, json!({"metadata": {}, "status": "Success"}));

    // A few MiB through stdin: the command sees end of file once v5 closes channel 0.
    let input: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let mut raw = exec
        .raw(
            DEV_USER,
            "c",
            "command=sha256sum&stdin=true&stdout=true&stderr=true",
            "v5.channel.k8s.io, v4.channel.k8s.io",
        )
        .await
        .unwrap();
    for chunk in input.chunks(64 * 1024) {
        raw.send(0, chunk).await;
    }
    raw.send(255, &[0]).await;
    let output = raw.read_all().await;
    let want = format!("{:x}  -\n", Sha256::digest(&input));
    assert_eq!(String::from_utf8_lossy(&output.stdout), want);
    assert_eq!(output.status["status"], "Success", "{}", output.status);

    // flintlock's env and working directory, beyond PodExecOptions: a later NAME= wins.
    let mut raw = exec
        .raw(
            DEV_USER,
            "c",
            "command=mkdir&command=-p&command=work&stdout=true",
            "v5.channel.k8s.io",
        )
        .await
        .unwrap();
    assert_eq!(raw.read_all().await.status["status"], "Success");
    let output = exec
        .output(
            "command=sh&command=-c&command=echo%20%24GREETING%3B%20basename%20%24PWD\
             &env=GREETING%3Dhi&env=GREETING%3Dhello%3Dthere&workingDir=%2Fwork&stdout=true",
            "v5.channel.k8s.io",
        )
        .await;
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "hello=there\nwork\n"
    );
    let Err((code, status)) = exec
        .raw(
            DEV_USER,
            "c",
            "command=true&stdout=true&env=%3Dx",
            "v5.channel.k8s.io",
        )
        .await
    else {
        panic!("an env without a NAME was accepted");
    };
    assert_eq!(code, 400, "{status}");
    assert!(
        status["message"].as_str().unwrap().contains("NAME=VALUE"),
        "{status}"
    );

    // v4 has no close; a command that does not read stdin needs none.
    let output = exec
        .output("&command=echo&command=v4&stdout=true", "v4.channel.k8s.io")
        .await;
    assert_eq!(output.stdout, b"v4\n");
    assert_eq!(output.status["status"], "Success", "{}", output.status);

    // v4.base64, for clients that send only text: stdin in, stdout and the Status out.
    let mut raw = exec
        .raw(
            DEV_USER,
            "c",
            "command=head&command=-c&command=3&stdin=true&stdout=true",
            "v4.base64.channel.k8s.io",
        )
        .await
        .unwrap();
    raw.ws
        .send(Message::Text("0aGkKdGhlcmUK".into()))
        .await
        .unwrap();
    let output = raw.read_all().await;
    assert_eq!(output.stdout, b"hi\n");
    assert_eq!(output.status["status"], "Success", "{}", output.status);
}

#[tokio::test]
async fn bulk_output_on_both_streams_arrives_whole_in_order_and_in_bounded_frames() {
    let exec = Exec::start().await;
    exec.claim("c").await;

    // Several MiB each way, switching streams mid-way: output already in is sent in
    // frames joining many of the agent's messages, never across a change of stream.
    let output = exec
        .output(
            "command=sh&command=-c\
             &command=seq%201%20400000%3B%20seq%201%20300000%20%3E%262%3B%20seq%20400001%20700000\
             &stdout=true&stderr=true",
            "v5.channel.k8s.io",
        )
        .await;
    let seq = |from: u32, to: u32| -> Vec<u8> {
        (from..=to)
            .flat_map(|n| format!("{n}\n").into_bytes())
            .collect()
    };
    assert_eq!(output.status["status"], "Success", "{}", output.status);
    assert!(
        output.stdout == seq(1, 700_000),
        "stdout was not seq 1 700000"
    );
    assert!(
        output.stderr == seq(1, 300_000),
        "stderr was not seq 1 300000"
    );
    assert!(
        output.largest_frame <= 1024 * 1024,
        "a frame carried {} bytes",
        output.largest_frame
    );
}

#[tokio::test]
async fn refusals_are_statuses_before_the_upgrade() {
    let exec = Exec::start().await;
    let host = exec.claim("c").await;
    let refused = |status: StatusCode, reason: &str, got: Result<Raw, (StatusCode, Value)>| {
        let Err((code, body)) = got else {
            panic!("upgraded; wanted {status}");
        };
        assert_eq!(code, status, "{body}");
        assert_eq!(body["kind"], "Status", "{body}");
        assert_eq!(body["reason"], reason, "{body}");
        body
    };
    let v5 = "v5.channel.k8s.io";
    // A terminal is an SSH session, and this agent serves a certificate of its own
    // (no API server signed it an SSH certificate): refused, saying what is missing.
    let tty = refused(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        exec.raw(
            DEV_USER,
            "c",
            "command=sh&stdin=true&stdout=true&tty=true",
            v5,
        )
        .await,
    );
    assert!(
        tty["message"]
            .as_str()
            .unwrap()
            .contains("--agent-ssh-ca-key-file"),
        "{tty}"
    );
    refused(
        StatusCode::BAD_REQUEST,
        "BadRequest",
        exec.raw(DEV_USER, "c", "stdout=true", v5).await,
    );
    refused(
        StatusCode::NOT_FOUND,
        "NotFound",
        exec.raw(DEV_USER, "nope", "command=true&stdout=true", v5)
            .await,
    );
    let holder = refused(
        StatusCode::FORBIDDEN,
        "Forbidden",
        exec.raw(OTHER_USER, "c", "command=true&stdout=true", v5)
            .await,
    );
    assert!(
        holder["message"].as_str().unwrap().contains("Holder"),
        "{holder}"
    );
    refused(
        StatusCode::FORBIDDEN,
        "Forbidden",
        exec.raw("no-rbac", "c", "command=true&stdout=true", v5)
            .await,
    );

    // An agent with a valid certificate for the other Host's name, on this Host's
    // address: the API server does not finish the handshake, so no session reaches it.
    let other = exec
        .agents
        .iter()
        .find(|(n, ..)| *n != host)
        .unwrap()
        .0
        .clone();
    let rogue_address = free_loopback_address();
    let _rogue = AgentProcess::start(
        rogue_address,
        exec.h.battery().host(&host).unwrap().address(),
        &exec.agent_ca.serving(&other),
        &exec.client_ca,
    );
    exec.register(&host, rogue_address).await;
    let rogue = refused(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        exec.raw(DEV_USER, "c", "command=true&stdout=true", v5)
            .await,
    );
    assert!(
        rogue["message"].as_str().unwrap().contains(&host)
            && rogue["message"].as_str().unwrap().contains("certificate"),
        "{rogue}"
    );

    // Nothing listening: unreachable is a 503 too.
    exec.register(&host, free_loopback_address()).await;
    refused(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        exec.raw(DEV_USER, "c", "command=true&stdout=true", v5)
            .await,
    );
}

#[tokio::test]
async fn an_agent_killed_mid_stream_fails_the_exec_and_its_successor_serves() {
    let mut exec = Exec::start().await;
    let host = exec.claim("c").await;
    let mut raw = exec
        .raw(
            DEV_USER,
            "c",
            "command=sh&command=-c&command=echo%20started%3B%20sleep%201000&stdout=true",
            "v5.channel.k8s.io",
        )
        .await
        .unwrap();
    // Wait for the command to run before killing its agent.
    let mut started = Vec::new();
    while !started.ends_with(b"started\n") {
        let Some(Ok(Message::Binary(data))) = raw.ws.next().await else {
            panic!("the session ended before the command printed");
        };
        started.extend_from_slice(&data[1..]);
    }
    let slot = exec.agents.iter_mut().find(|(n, ..)| *n == host).unwrap();
    slot.2.take().unwrap().kill();
    let output = raw.read_all().await;
    assert_eq!(output.status["status"], "Failure", "{}", output.status);
    assert!(
        output.status["message"]
            .as_str()
            .unwrap()
            .contains("did not finish"),
        "{}",
        output.status
    );

    let address = exec.agent_of(&host);
    let flintlock = exec.h.battery().host(&host).unwrap().address();
    let successor = AgentProcess::restart(
        address,
        flintlock,
        &exec.agent_ca.serving(&host),
        &exec.client_ca,
    )
    .await;
    exec.agents.iter_mut().find(|(n, ..)| *n == host).unwrap().2 = Some(successor);
    let api = exec.claims(DEV_USER);
    let (printed, status) =
        common::eventually(DEADLINE, "an exec through the successor agent", || async {
            match api
                .exec(
                    "c",
                    ["echo", "back"],
                    &AttachParams::default().stderr(false),
                )
                .await
            {
                Ok(mut attached) => {
                    let mut out = String::new();
                    let status = attached.take_status().unwrap();
                    attached
                        .stdout()
                        .unwrap()
                        .read_to_string(&mut out)
                        .await
                        .unwrap();
                    Ok((out, status.await))
                }
                Err(err) => Err(err.to_string()),
            }
        })
        .await;
    assert_eq!(printed, "back\n");
    let status = serde_json::to_value(status).unwrap();
    assert_eq!(status["status"], "Success", "{status}");
}

#[tokio::test]
async fn deleting_the_claim_ends_its_sessions_and_the_gauge_counts_them() {
    let exec = Exec::start().await;
    exec.claim("c").await;
    let mut raw = exec
        .raw(
            DEV_USER,
            "c",
            "command=sleep&command=1000&stdin=true&stdout=true",
            "v5.channel.k8s.io",
        )
        .await
        .unwrap();
    assert!(
        metrics(&exec)
            .await
            .contains("battery_apiserver_exec_sessions 1\n")
    );
    // stdin is still open: only the release can end this one.
    raw.send(0, b"ignored\n").await;
    let (status, body) = exec
        .h
        .json(
            HttpRequest::delete(format!("{CLAIMS}/c"))
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let output = raw.read_all().await;
    assert_eq!(output.status["status"], "Failure", "{}", output.status);
    assert!(
        output.status["message"]
            .as_str()
            .unwrap()
            .contains("released"),
        "{}",
        output.status
    );
    no_sessions_left(&exec).await;
}

#[tokio::test]
async fn many_sessions_run_at_once_and_closing_the_websocket_ends_the_command() {
    let exec = Exec::start().await;
    exec.claim("a").await;
    exec.claim("b").await;
    // Two long sessions held open while sixteen short ones run on both claims.
    let mut long = Vec::new();
    for claim in ["a", "b"] {
        let query = "command=sleep&command=1000&stdin=true&stdout=true";
        long.push(
            exec.raw(DEV_USER, claim, query, "v5.channel.k8s.io")
                .await
                .unwrap(),
        );
    }
    let short = (0..16).map(|i| {
        let exec = &exec;
        async move {
            let claim = if i % 2 == 0 { "a" } else { "b" };
            let query = format!("command=echo&command={i}&stdout=true");
            let mut raw = exec
                .raw(DEV_USER, claim, &query, "v5.channel.k8s.io")
                .await
                .unwrap();
            let output = raw.read_all().await;
            assert_eq!(output.stdout, format!("{i}\n").into_bytes());
            assert_eq!(output.status["status"], "Success", "{}", output.status);
        }
    });
    futures::future::join_all(short).await;
    assert!(
        metrics(&exec)
            .await
            .contains("battery_apiserver_exec_sessions 2\n")
    );

    // The client going away drops the relay stream, which ends `sleep` in the MicroVM.
    for mut raw in long {
        raw.ws.close(None).await.unwrap();
    }
    no_sessions_left(&exec).await;
}

#[tokio::test]
async fn the_session_cap_answers_429_and_no_relay_configuration_answers_503() {
    let exec = Exec::start_with(|s| s.max_exec_sessions = 1).await;
    exec.claim("c").await;
    let held = exec
        .raw(
            DEV_USER,
            "c",
            "command=sleep&command=1000&stdin=true&stdout=true",
            "v5.channel.k8s.io",
        )
        .await
        .unwrap();
    let Err((status, body)) = exec
        .raw(
            DEV_USER,
            "c",
            "command=true&stdout=true",
            "v5.channel.k8s.io",
        )
        .await
    else {
        panic!("a second session past the cap of one was upgraded");
    };
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["reason"], "TooManyRequests", "{body}");
    drop(held);

    let unconfigured = Exec::start_with(|s| s.agent_relay = None).await;
    unconfigured.claim("c").await;
    let Err((status, body)) = unconfigured
        .raw(
            DEV_USER,
            "c",
            "command=true&stdout=true",
            "v5.channel.k8s.io",
        )
        .await
    else {
        panic!("upgraded without a relay configuration");
    };
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.starts_with("exec is not configured"), "{body}");
    assert!(message.contains("--agent-ca-file"), "{body}");
}

#[tokio::test]
async fn an_expiring_claim_ends_its_sessions() {
    let exec = Exec::start().await;
    let mut body = pool("short", 1);
    body["spec"]["lease"] = json!({"heartbeatInterval": "100ms", "expiryThreshold": "1s"});
    exec.h.create(POOLS, &body).await;
    exec.h.wait_available("short", 1).await;
    exec.h.create(CLAIMS, &claim("expiring", "short")).await;
    let mut raw = exec
        .raw(
            DEV_USER,
            "expiring",
            "command=sleep&command=1000&stdin=true&stdout=true",
            "v5.channel.k8s.io",
        )
        .await
        .unwrap();
    // Never renewed: battery expires the lease, and with it the session.
    let output = raw.read_all().await;
    assert_eq!(output.status["status"], "Failure", "{}", output.status);
    exec.h
        .eventually(&format!("{CLAIMS}/expiring"), |_, claim| {
            claim["status"]["phase"] == "Expired"
        })
        .await;
    let (status, body) = exec
        .raw(
            DEV_USER,
            "expiring",
            "command=true&stdout=true",
            "v5.channel.k8s.io",
        )
        .await
        .err()
        .expect("an exec into an Expired claim was upgraded");
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
}

#[tokio::test]
async fn a_claim_whose_lease_battery_let_go_unseen_is_refused_as_expired() {
    let exec = Exec::start().await;
    exec.claim("c").await;
    let v5 = "v5.channel.k8s.io";
    // Served from the record once the follower keeps up with battery's events.
    let mut raw = exec
        .raw(DEV_USER, "c", "command=true&stdout=true", v5)
        .await
        .unwrap();
    assert_eq!(raw.read_all().await.status["status"], "Success");
    // Another client of battery releases the lease: battery deletes the MicroVM, and the
    // release's event is not one the follower applies (our own releases record first).
    let (_, bound) = exec.h.get(&format!("{CLAIMS}/c")).await;
    let uid = bound["metadata"]["uid"].as_str().unwrap();
    exec.h.release_behind_our_back(uid).await;
    // The record still says Bound; the agent finds no MicroVM, and battery, asked then,
    // no lease: the answer is the claim's, as for an Expired one.
    let (status, body) = exec
        .raw(DEV_USER, "c", "command=true&stdout=true", v5)
        .await
        .err()
        .expect("an exec into a released MicroVM was upgraded");
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("has expired"),
        "{body}"
    );
    let (_, claim) = exec.h.get(&format!("{CLAIMS}/c")).await;
    assert_eq!(claim["status"]["phase"], "Expired", "{claim}");
}

/// What `/metrics` shows.
#[tokio::test]
async fn a_full_agent_is_answered_429_as_our_own_cap_is() {
    let exec = Exec::start().await;
    let host = exec.claim("c").await;
    // A second agent for the Host, relaying one session at most.
    let listen = free_loopback_address();
    let flintlock = exec.h.battery().host(&host).unwrap().address();
    let _capped = AgentProcess::start_capped(
        listen,
        flintlock,
        &exec.agent_ca.serving(&host),
        &exec.client_ca,
        1,
    );
    exec.register(&host, listen).await;
    let v5 = "v5.channel.k8s.io";
    let _held = exec
        .raw(DEV_USER, "c", "command=sleep&command=1000&stdout=true", v5)
        .await
        .unwrap();
    let Err((status, body)) = exec
        .raw(DEV_USER, "c", "command=true&stdout=true", v5)
        .await
    else {
        panic!("a session past the agent's cap was upgraded");
    };
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["reason"], "TooManyRequests", "{body}");
    assert!(body["message"].as_str().unwrap().contains("busy"), "{body}");
}

async fn metrics(exec: &Exec) -> String {
    let (_, _, body) = exec.h.send(get("/metrics")).await;
    String::from_utf8(body).unwrap()
}

/// Waits until the exec sessions gauge is back at 0.
async fn no_sessions_left(exec: &Exec) {
    common::eventually(DEADLINE, "no exec sessions left", || async {
        let text = metrics(exec).await;
        if text.contains("battery_apiserver_exec_sessions 0\n") {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;
}
