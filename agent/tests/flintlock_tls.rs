//! The agent's side towards flintlockd over mTLS: it verifies flintlockd's serving
//! certificate against `--flintlock-ca-file` and presents `--flintlock-cert-file`. The
//! simulated Hosts serve no TLS, so a stand-in `MicroVMExec` here does, and requires a
//! client certificate, so an exec that completes proves both directions.

use std::time::Duration;

use battery_agent::Cli;
use battery_agent::testing::Ca;
use battery_proto::Bytes;
use battery_proto::agent::v1alpha1::relay_client::RelayClient;
use battery_proto::agent::v1alpha1::{
    ExecOpen, ExecRequest, exec_request, exec_response, exit_status,
};
use battery_proto::microvmexec::services::api::v1alpha1::exec_command_response::Payload;
use battery_proto::microvmexec::services::api::v1alpha1::micro_vm_exec_server::{
    MicroVmExec, MicroVmExecServer,
};
use battery_proto::microvmexec::services::api::v1alpha1::{
    ExecCommandRequest, ExecCommandResponse,
};
use clap::Parser as _;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

const DEADLINE: Duration = Duration::from_secs(30);

/// Answers every exec with one stdout chunk and exit code 0.
struct StandIn;

#[tonic::async_trait]
impl MicroVmExec for StandIn {
    type ExecCommandStream =
        tokio_stream::Iter<std::vec::IntoIter<Result<ExecCommandResponse, Status>>>;

    async fn exec_command(
        &self,
        _request: Request<Streaming<ExecCommandRequest>>,
    ) -> Result<Response<Self::ExecCommandStream>, Status> {
        let reply = |payload| {
            Ok(ExecCommandResponse {
                payload: Some(payload),
            })
        };
        Ok(Response::new(tokio_stream::iter(vec![
            reply(Payload::Stdout(Bytes::from_static(b"over mTLS"))),
            reply(Payload::ExitCode(0)),
        ])))
    }
}

#[tokio::test]
async fn the_agent_reaches_flintlockd_over_mutual_tls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |name: &str, pem: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).expect("write PEM");
        path.display().to_string()
    };
    // flintlockd's side: its serving CA and the CA of its clients.
    let flintlock_ca = Ca::new("flintlockd serving CA");
    let flintlock_clients = Ca::new("flintlockd client CA");
    let serving = flintlock_ca.loopback_server();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let flintlockd = listener.local_addr().expect("address");
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(serving.cert, serving.key))
        .client_ca_root(Certificate::from_pem(&flintlock_clients.pem));
    tokio::spawn(
        Server::builder()
            .tls_config(tls)
            .expect("stand-in TLS")
            .add_service(MicroVmExecServer::new(StandIn))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );

    // The agent, with a client certificate for flintlockd and its own relay PKI.
    let relay_ca = Ca::new("relay CA");
    let agent_serving = relay_ca.loopback_server();
    let agent_client = flintlock_clients.client("battery-agent");
    let cli = Cli::try_parse_from([
        "battery-agent".to_owned(),
        "--tls-cert-file".to_owned(),
        write("agent.crt", &agent_serving.cert),
        "--tls-private-key-file".to_owned(),
        write("agent.key", &agent_serving.key),
        "--client-ca-file".to_owned(),
        write("relay-ca.crt", &relay_ca.pem),
        // By name, as the serving certificate names localhost.
        "--flintlock-address".to_owned(),
        format!("localhost:{}", flintlockd.port()),
        "--flintlock-ca-file".to_owned(),
        write("flintlock-ca.crt", &flintlock_ca.pem),
        "--flintlock-cert-file".to_owned(),
        write("flintlock-client.crt", &agent_client.cert),
        "--flintlock-key-file".to_owned(),
        write("flintlock-client.key", &agent_client.key),
    ])
    .expect("flags parse");
    let agent = battery_agent::build(cli.into_config().expect("valid")).expect("builds");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(agent.serve(listener, std::future::pending()));

    let client = relay_ca.client("battery-apiserver");
    let channel = Channel::from_shared(format!("https://{address}"))
        .expect("endpoint")
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&relay_ca.pem))
                .identity(Identity::from_pem(client.cert, client.key))
                .domain_name("localhost"),
        )
        .expect("client TLS")
        .connect()
        .await
        .expect("connected");
    let open = ExecRequest {
        payload: Some(exec_request::Payload::Open(ExecOpen {
            microvm_uid: "u".into(),
            command: vec!["true".into()],
            stdout: true,
            ..ExecOpen::default()
        })),
    };
    let mut responses = RelayClient::new(channel)
        .exec(tokio_stream::iter([open]))
        .await
        .expect("opened over mTLS to flintlockd")
        .into_inner();
    let mut payloads = Vec::new();
    while let Some(response) = tokio::time::timeout(DEADLINE, responses.message())
        .await
        .expect("in time")
        .expect("healthy")
    {
        payloads.push(response.payload.expect("payload"));
    }
    assert_eq!(
        payloads,
        [
            exec_response::Payload::Stdout(Bytes::from_static(b"over mTLS")),
            exec_response::Payload::Exit(battery_proto::agent::v1alpha1::ExitStatus {
                outcome: Some(exit_status::Outcome::Code(0)),
            }),
        ]
    );
}
