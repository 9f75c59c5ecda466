//! Looking at a Host directly through flintlock's API, the way poolmgrd itself talks to
//! it: whether a MicroVM exists, its spec and state, and running commands in it.
//! Works against simulated Hosts and real flintlockd alike (plaintext gRPC).

use battery_proto::flintlock::types::MicroVm;
use battery_proto::microvm::services::api::v1alpha1::micro_vm_client::MicroVmClient;
use battery_proto::microvm::services::api::v1alpha1::{GetMicroVmRequest, ListMicroVMsRequest};
use battery_proto::microvmexec::services::api::v1alpha1::micro_vm_exec_client::MicroVmExecClient;
use battery_proto::microvmexec::services::api::v1alpha1::{
    ExecCommandRequest, ExecStart, exec_command_request, exec_command_response,
};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

/// A lazily connected channel to a Host's flintlock gRPC address (`host:port`).
pub fn channel(address: &str) -> Channel {
    let uri = if address.contains("://") {
        address.to_owned()
    } else {
        format!("http://{address}")
    };
    Endpoint::from_shared(uri)
        .unwrap_or_else(|e| panic!("bad host address {address:?}: {e}"))
        .connect_lazy()
}

/// `GetMicroVM`; `Ok(None)` when the Host answers NOT_FOUND.
pub async fn get_vm(address: &str, uid: &str) -> Result<Option<MicroVm>, Status> {
    let mut client = MicroVmClient::new(channel(address));
    match client
        .get_micro_vm(GetMicroVmRequest {
            uid: uid.to_owned(),
        })
        .await
    {
        Ok(resp) => Ok(resp.into_inner().microvm),
        Err(status) if status.code() == Code::NotFound => Ok(None),
        Err(status) => Err(status),
    }
}

/// `ListMicroVMs` in one namespace.
pub async fn list_vms(address: &str, namespace: &str) -> Result<Vec<MicroVm>, Status> {
    let mut client = MicroVmClient::new(channel(address));
    let resp = client
        .list_micro_v_ms(ListMicroVMsRequest {
            namespace: namespace.to_owned(),
            name: None,
        })
        .await?;
    Ok(resp.into_inner().microvm)
}

/// What an exec'd command produced.
#[derive(Debug, Default, Clone)]
pub struct ExecOutput {
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub errors: Vec<String>,
}

/// Runs `command` through `sh -c` in the MicroVM, as battery runs its hooks.
pub async fn exec(address: &str, uid: &str, command: &str) -> Result<ExecOutput, Status> {
    let mut client = MicroVmExecClient::new(channel(address));
    let start = ExecCommandRequest {
        payload: Some(exec_command_request::Payload::Start(ExecStart {
            uid: uid.to_owned(),
            cmd: command.to_owned(),
            shell: true,
            ..ExecStart::default()
        })),
    };
    let mut stream = client
        .exec_command(futures::stream::iter([start]))
        .await?
        .into_inner();
    let mut out = ExecOutput::default();
    while let Some(msg) = stream.message().await? {
        match msg.payload {
            Some(exec_command_response::Payload::Stdout(b)) => {
                out.stdout.push_str(&String::from_utf8_lossy(&b));
            }
            Some(exec_command_response::Payload::Stderr(b)) => {
                out.stderr.push_str(&String::from_utf8_lossy(&b));
            }
            Some(exec_command_response::Payload::Error(e)) => out.errors.push(e),
            Some(exec_command_response::Payload::ExitCode(code)) => {
                out.exit_code = Some(code);
                break;
            }
            None => {}
        }
    }
    Ok(out)
}
