use super::*;

#[test]
fn options_are_read_as_kube_rs_sends_them() {
    let options =
        ExecOptions::parse("&stdout=true&stderr=true&command=sh&command=-c&command=exit%203")
            .unwrap();
    assert_eq!(options.command, ["sh", "-c", "exit 3"]);
    assert!(options.stdout && options.stderr && !options.stdin);
}

#[test]
fn a_terminal_carries_stderr_with_stdout() {
    let options =
        ExecOptions::parse("command=sh&stdin=true&stdout=true&stderr=true&tty=true").unwrap();
    assert!(options.tty && options.stdin && options.stdout && !options.stderr);
}

#[test]
fn refused_options_say_why() {
    let refused = |query: &str| ExecOptions::parse(query).unwrap_err();
    assert!(refused("stdout=true").message().contains("command"));
    assert!(
        refused("command=ls")
            .message()
            .contains("stdin, stdout, stderr")
    );
    assert!(
        refused("command=ls&stdout=1&container=c")
            .message()
            .contains("no containers")
    );
}

fn upgrade(protocols: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(
        header::SEC_WEBSOCKET_VERSION,
        HeaderValue::from_static("13"),
    );
    headers.insert(
        header::SEC_WEBSOCKET_KEY,
        HeaderValue::from_static("dGhlIHNhbXBsZSBub25jZQ=="),
    );
    headers.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_str(protocols).unwrap(),
    );
    headers
}

#[test]
fn the_handshake_picks_v5_over_v4_and_refuses_others() {
    let both = Handshake::of(
        &upgrade("v4.channel.k8s.io, v5.channel.k8s.io"),
        &Protocol::ALL,
    )
    .unwrap();
    assert_eq!(both.protocol, Protocol::V5);
    // RFC 6455's example key and answer.
    assert_eq!(both.accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    let v4 = Handshake::of(&upgrade("v4.channel.k8s.io"), &Protocol::ALL).unwrap();
    assert_eq!(v4.protocol, Protocol::V4);
    let base64 = Handshake::of(&upgrade("base64.channel.k8s.io"), &Protocol::ALL)
        .err()
        .unwrap();
    assert_eq!(base64.code(), StatusCode::BAD_REQUEST);
    let spdy = Handshake::of(&HeaderMap::new(), &Protocol::ALL)
        .err()
        .unwrap();
    assert!(spdy.message().contains("SPDY"), "{}", spdy.message());
}
