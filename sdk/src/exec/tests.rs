use futures::channel::mpsc as socket;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};

use super::*;

/// A WebSocket whose peer is the test: what the pump sends comes out of `sent`,
/// what the test pushes into `incoming` is what the pump receives.
struct FakeSocket {
    incoming: socket::UnboundedReceiver<Message>,
    sent: socket::UnboundedSender<Message>,
}

impl futures::Stream for FakeSocket {
    type Item = Result<Message, WsError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.incoming
            .poll_next_unpin(cx)
            .map(|message| message.map(Ok))
    }
}

impl futures::Sink<Message> for FakeSocket {
    type Error = WsError;

    fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        Poll::Ready(Ok(()))
    }

    fn start_send(self: Pin<&mut Self>, message: Message) -> Result<(), WsError> {
        self.sent
            .unbounded_send(message)
            .map_err(|_| WsError::ConnectionClosed)
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        Poll::Ready(Ok(()))
    }
}

fn binary(frame: &[u8]) -> Message {
    Message::Binary(frame.to_vec().into())
}

#[tokio::test]
async fn a_terminal_session_sends_its_size_first_then_each_resize() {
    let (to_pump, incoming) = socket::unbounded();
    let (sent, mut from_pump) = socket::unbounded();
    let (resizer, sizes) = Resizer::new(TerminalSize::new(80, 24));
    let (stdin, stdin_frames) = mpsc::channel(STDIN_FRAMES);
    let (mut stdout, stdout_pipe) = tokio::io::duplex(OUTPUT_BUFFER);
    let pump = Pump {
        ws: FakeSocket { incoming, sent },
        can_close: true,
        stdin: Some(stdin_frames),
        sizes: Some(sizes),
        stdout: Some(stdout_pipe),
        stderr: None,
    };
    // Typed before the session starts, yet sent after the size.
    stdin
        .send(StdinFrame::Data(b"ls\r".to_vec()))
        .await
        .unwrap();
    let session = tokio::spawn(pump.run());

    let mut size = vec![4];
    size.extend_from_slice(br#"{"Width":80,"Height":24}"#);
    assert_eq!(from_pump.next().await, Some(binary(&size)));
    assert_eq!(from_pump.next().await, Some(binary(b"\0ls\r")));
    resizer.resize(TerminalSize::new(132, 43)).unwrap();
    let mut resized = vec![4];
    resized.extend_from_slice(br#"{"Width":132,"Height":43}"#);
    assert_eq!(from_pump.next().await, Some(binary(&resized)));
    // Ctrl-C is a byte like any other: the guest's terminal makes it SIGINT.
    stdin.send(StdinFrame::Data(vec![3])).await.unwrap();
    assert_eq!(from_pump.next().await, Some(binary(&[0, 3])));

    to_pump.unbounded_send(binary(b"\x01$ ")).unwrap();
    to_pump
        .unbounded_send(binary(b"\x03{\"status\":\"Success\"}"))
        .unwrap();
    to_pump.unbounded_send(Message::Close(None)).unwrap();
    let status = session.await.unwrap().unwrap();
    assert_eq!(exit_code(status, "p").unwrap(), 0);
    let mut screen = Vec::new();
    stdout.read_to_end(&mut screen).await.unwrap();
    assert_eq!(screen, b"$ ");
    // The session is over: a resize now says so.
    let error = resizer.resize(TerminalSize::new(1, 1)).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::BrokenPipe);
}

/// The query of `command`'s request.
async fn query(command: Command) -> Vec<(String, String)> {
    form_urlencoded::parse(command.query(true).as_bytes())
        .into_owned()
        .filter(|(name, _)| name != "command")
        .collect()
}

#[tokio::test]
async fn a_terminal_asks_for_tty_and_no_stderr_as_kubectl_does() {
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    let client = Client::new(kube::Client::try_from(config).unwrap());
    let pair = |name: &str, value: &str| (name.to_owned(), value.to_owned());
    assert_eq!(
        query(client.command("c", ["sh"])).await,
        [
            pair("stdin", "true"),
            pair("stdout", "true"),
            pair("stderr", "true")
        ]
    );
    assert_eq!(
        query(client.command("c", ["sh"]).tty(TerminalSize::new(80, 24))).await,
        [
            pair("stdin", "true"),
            pair("stdout", "true"),
            pair("stderr", "false"),
            pair("tty", "true")
        ]
    );
}

fn failure(reason: &str, causes: Vec<StatusCause>) -> Status {
    Status {
        status: Some("Failure".to_owned()),
        code: Some(500),
        reason: Some(reason.to_owned()),
        details: Some(StatusDetails {
            causes: Some(causes),
            ..StatusDetails::default()
        }),
        ..Status::default()
    }
}

#[test]
fn the_exit_code_comes_from_the_status() {
    let success = Status {
        status: Some("Success".to_owned()),
        ..Status::default()
    };
    assert_eq!(exit_code(Some(success), "p").unwrap(), 0);
    let seven = failure(
        "NonZeroExitCode",
        vec![StatusCause {
            reason: Some("ExitCode".to_owned()),
            message: Some("7".to_owned()),
            field: None,
        }],
    );
    assert_eq!(exit_code(Some(seven), "p").unwrap(), 7);
    assert!(matches!(exit_code(None, "p"), Err(Error::ExecIncomplete)));
    assert!(matches!(
        exit_code(Some(failure("InternalError", vec![])), "p"),
        Err(Error::Api(_))
    ));
}
