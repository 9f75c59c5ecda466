//! The client of flintlockd's exec API (`microvmexec.services.api.v1alpha1.MicroVMExec`)
//! and SSH proxy (`MicroVMSSHProxy`, battery-api.md §2.3) on this Host: mTLS with the agent's client certificate, or plain
//! gRPC for a simulated Host.

use std::time::Duration;

use battery_proto::microvmexec::services::api::v1alpha1::micro_vm_exec_client::MicroVmExecClient;
use battery_proto::microvmexec::services::api::v1alpha1::{
    ExecCommandRequest, ExecCommandResponse,
};
use battery_proto::microvmsshproxy::services::api::v1alpha1::micro_vmssh_proxy_client::MicroVmsshProxyClient;
use battery_proto::microvmsshproxy::services::api::v1alpha1::{SshProxyRequest, SshProxyResponse};
use tokio_stream::Stream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Status, Streaming};

/// The largest gRPC message the agent decodes, from either side (flintlockd's and the
/// API server's): with the relay's bounded queues, what bounds a session's memory.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;
/// How long dialling flintlockd may take; it is on the same Host, so longer means down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Output flintlockd may send ahead of the agent reading it, per session: a bound on
/// what a slow API server makes the agent hold.
const STREAM_WINDOW_BYTES: u32 = 256 * 1024;

/// The largest HTTP/2 frame flintlockd may send: a message of output in one frame, not
/// HTTP/2's default 16 KiB pieces, each read and handled apart.
const MAX_FRAME_BYTES: u32 = 1024 * 1024;

/// How the agent authenticates flintlockd, and itself to it.
#[derive(Debug)]
pub enum FlintlockTls {
    /// Verify flintlockd's serving certificate against `ca`, present `identity`.
    Mutual { ca: Certificate, identity: Identity },
    /// Plain gRPC, for simulated Hosts.
    Insecure,
}

/// Where flintlockd is and how to talk to it; dialled only on first use.
#[derive(Debug)]
pub struct FlintlockConfig {
    endpoint: Endpoint,
    tls: FlintlockTls,
}

impl FlintlockConfig {
    /// `None` unless `address` is a bare host:port.
    pub fn new(address: &str, tls: FlintlockTls) -> Option<Self> {
        let (host, port) = address.rsplit_once(':')?;
        if host.is_empty() || address.contains('/') || port.parse::<u16>().is_err() {
            return None;
        }
        let scheme = match tls {
            FlintlockTls::Mutual { .. } => "https",
            FlintlockTls::Insecure => "http",
        };
        let endpoint = Endpoint::from_shared(format!("{scheme}://{address}")).ok()?;
        Some(Self { endpoint, tls })
    }

    /// The URI the agent dials.
    pub fn uri(&self) -> String {
        self.endpoint.uri().to_string()
    }
}

/// flintlockd's exec client; cheap to clone, one HTTP/2 connection under all sessions.
#[derive(Clone, Debug)]
pub struct Flintlock {
    client: MicroVmExecClient<Channel>,
    /// The same connection, for the readiness checks' calls on flintlockd's other services.
    channel: Channel,
}

impl Flintlock {
    /// Builds the client without dialling, so the agent starts while flintlockd is still
    /// coming up; fails only on TLS material rustls cannot use.
    pub fn new(config: FlintlockConfig) -> Result<Self, tonic::transport::Error> {
        let mut endpoint = config
            .endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .initial_stream_window_size(STREAM_WINDOW_BYTES)
            .max_frame_size(MAX_FRAME_BYTES);
        if let FlintlockTls::Mutual { ca, identity } = config.tls {
            endpoint = endpoint
                .tls_config(ClientTlsConfig::new().ca_certificate(ca).identity(identity))?;
        }
        let channel = endpoint.connect_lazy();
        let client =
            MicroVmExecClient::new(channel.clone()).max_decoding_message_size(MAX_MESSAGE_BYTES);
        Ok(Self { client, channel })
    }

    /// The connection to flintlockd, shared with the exec client.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Opens one `ExecCommand` stream; `requests` must start with `start`. Answers once
    /// flintlockd has accepted the start, so a bad uid fails here.
    pub async fn exec(
        &self,
        requests: impl Stream<Item = ExecCommandRequest> + Send + 'static,
    ) -> Result<Streaming<ExecCommandResponse>, Status> {
        let mut client = self.client.clone();
        Ok(client.exec_command(requests).await?.into_inner())
    }

    /// Opens one `SSHProxy` stream, a byte stream to the guest's sshd; `requests` must
    /// start with the MicroVM's uid.
    pub async fn ssh_proxy(
        &self,
        requests: impl Stream<Item = SshProxyRequest> + Send + 'static,
    ) -> Result<Streaming<SshProxyResponse>, Status> {
        let mut client = MicroVmsshProxyClient::new(self.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        Ok(client.ssh_proxy(requests).await?.into_inner())
    }
}
