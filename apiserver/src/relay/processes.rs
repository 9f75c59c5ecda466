//! The agents' process tables (ADR 44), in our own types: start, list, attach, stop,
//! delete, and a claim's end. An attach is an exec stream ([`ExecSession`]) whose first
//! request names the process, so it is served as an exec session is.

use std::collections::HashMap;

use battery_api_machinery::status::ApiError;
use battery_proto::agent::v1alpha1::relay_client::RelayClient;
use battery_proto::agent::v1alpha1::{
    self as pb, AttachOpen, ExecRequest, ListProcessesRequest, ProcessRef, ProcessState,
    StartProcessRequest, StopProcessRequest, exec_request,
};
use battery_types::{HasResourceInfo, MicroVMProcess};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::client::{AgentRelay, MAX_MESSAGE_BYTES, OPEN_TIMEOUT, STDIN_BUFFER, unavailable};
use super::stream::{ClaimRef, ExecInputs, ExecOutputs, ExecSession, describe};

/// A process to start.
pub struct ProcessStart {
    pub namespace: String,
    pub name: String,
    pub claim: ClaimRef,
    pub microvm_uid: String,
    /// The object as created, kept by the agent and handed back as is.
    pub object: String,
    pub command: Vec<String>,
    pub env: HashMap<String, String>,
    pub working_dir: String,
    pub stdin: bool,
}

/// How far a process got, as its agent says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessRun {
    Running,
    Exited { code: i32, signal: Option<String> },
    Failed(String),
    Lost(String),
}

/// A process of an agent's table.
#[derive(Clone, Debug)]
pub struct AgentProcess {
    pub name: String,
    /// The object its start carried.
    pub object: String,
    pub claim_uid: String,
    pub run: ProcessRun,
    /// Seconds since the Unix epoch.
    pub start_time: i64,
    pub end_time: Option<i64>,
    /// When a delete asked for it (seconds since the Unix epoch); it goes once it ended.
    pub deletion_time: Option<i64>,
}

impl From<pb::Process> for AgentProcess {
    fn from(process: pb::Process) -> Self {
        let run = match process.state() {
            ProcessState::Running | ProcessState::Unspecified => ProcessRun::Running,
            ProcessState::Exited => ProcessRun::Exited {
                code: process.exit_code,
                signal: Some(process.signal.clone()).filter(|s| !s.is_empty()),
            },
            ProcessState::Failed => ProcessRun::Failed(process.message.clone()),
            ProcessState::Lost => ProcessRun::Lost(process.message.clone()),
        };
        Self {
            name: process.process.map(|p| p.name).unwrap_or_default(),
            object: process.object,
            claim_uid: process.claim.map(|c| c.uid).unwrap_or_default(),
            run,
            start_time: process.start_time,
            end_time: Some(process.end_time).filter(|t| *t != 0),
            deletion_time: Some(process.deletion_time).filter(|t| *t != 0),
        }
    }
}

/// The answer of `call` to the agent of `host` at `address`, about the process `name`
/// ("" for none): an error saying `late` if it did not answer within [`OPEN_TIMEOUT`], or
/// the refusal's as [`refused`] reads it.
async fn answered<T>(
    (host, address): (&str, &str),
    name: &str,
    late: &str,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, ApiError> {
    tokio::time::timeout(OPEN_TIMEOUT, call)
        .await
        .map_err(|_| unavailable(host, address, late))?
        .map(tonic::Response::into_inner)
        .map_err(|status| refused(host, address, name, &status))
}

/// An agent's refusal, as the API answers it.
fn refused(host: &str, address: &str, name: &str, status: &tonic::Status) -> ApiError {
    let info = &MicroVMProcess::INFO;
    match status.code() {
        tonic::Code::NotFound => ApiError::not_found(info, name),
        tonic::Code::AlreadyExists => ApiError::already_exists(info, name),
        tonic::Code::ResourceExhausted => ApiError::too_many_requests(
            format!("the exec agent of Host {host}: {}", status.message()),
            10,
        ),
        tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => {
            ApiError::bad_request(status.message().to_owned())
        }
        _ => unavailable(
            host,
            address,
            format_args!("it refused: {}", describe(status)),
        ),
    }
}

fn process_ref(namespace: &str, name: &str) -> Option<ProcessRef> {
    Some(ProcessRef {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    })
}

impl AgentRelay {
    fn client(&self, host: &str, address: &str) -> Result<RelayClient<Channel>, ApiError> {
        let channel = self.channel(host, address)?;
        Ok(RelayClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// Starts a process; answers once the agent has it running.
    pub async fn start_process(
        &self,
        host: &str,
        address: &str,
        start: ProcessStart,
    ) -> Result<AgentProcess, ApiError> {
        let name = start.name.clone();
        let request = StartProcessRequest {
            process: process_ref(&start.namespace, &start.name),
            claim: Some(start.claim.into()),
            microvm_uid: start.microvm_uid,
            object: start.object,
            command: start.command,
            env: start.env,
            working_dir: start.working_dir,
            stdin: start.stdin,
        };
        let started = answered(
            (host, address),
            &name,
            "it did not start the process in time",
            self.client(host, address)?.start_process(request),
        )
        .await?;
        Ok(started.into())
    }

    /// The processes of `namespace` in the table of `host`'s agent.
    pub async fn list_processes(
        &self,
        host: &str,
        address: &str,
        namespace: &str,
    ) -> Result<Vec<AgentProcess>, ApiError> {
        let request = ListProcessesRequest {
            namespace: namespace.to_owned(),
        };
        let list = answered(
            (host, address),
            "",
            "it did not list its processes in time",
            self.client(host, address)?.list_processes(request),
        )
        .await?;
        Ok(list.items.into_iter().map(Into::into).collect())
    }

    /// Stops a process (SIGTERM, SIGKILL after `grace_seconds`); with `delete`, the agent
    /// forgets it once it ended.
    pub async fn stop_process(
        &self,
        host: &str,
        address: &str,
        (namespace, name): (&str, &str),
        grace_seconds: u32,
        delete: bool,
    ) -> Result<AgentProcess, ApiError> {
        let request = StopProcessRequest {
            process: process_ref(namespace, name),
            grace_period_seconds: grace_seconds,
        };
        let mut client = self.client(host, address)?;
        let stopping = async {
            if delete {
                client.delete_process(request).await
            } else {
                client.stop_process(request).await
            }
        };
        let stopped = answered(
            (host, address),
            name,
            "it did not answer the stop in time",
            stopping,
        )
        .await?;
        Ok(stopped.into())
    }

    /// Replaces the object the process carries: its metadata changed.
    pub async fn replace_process_object(
        &self,
        host: &str,
        address: &str,
        (namespace, name): (&str, &str),
        object: String,
    ) -> Result<AgentProcess, ApiError> {
        let request = pb::ReplaceProcessObjectRequest {
            process: process_ref(namespace, name),
            object,
        };
        let mut client = self.client(host, address)?;
        let replaced = answered(
            (host, address),
            name,
            "it did not answer in time",
            client.replace_process_object(request),
        )
        .await?;
        Ok(replaced.into())
    }

    /// Ends and forgets the processes of the claim `claim`, which ended.
    pub async fn forget_claim_processes(
        &self,
        host: &str,
        address: &str,
        claim: ClaimRef,
    ) -> Result<(), ApiError> {
        answered(
            (host, address),
            "",
            "it did not answer in time",
            self.client(host, address)?
                .forget_claim_processes(pb::ClaimRef::from(claim)),
        )
        .await?;
        Ok(())
    }

    /// Attaches to a process: its retained output of the `streams` asked for (stdin,
    /// stdout, stderr), then live, and its end; stdin to write to it.
    pub async fn attach_process(
        &self,
        host: &str,
        address: &str,
        (namespace, name): (&str, &str),
        [stdin, stdout, stderr]: [bool; 3],
    ) -> Result<ExecSession, ApiError> {
        let mut client = self.client(host, address)?;
        let (requests, queue) = mpsc::channel(STDIN_BUFFER);
        // The queue is new, so there is room for the first message.
        requests
            .try_send(ExecRequest {
                payload: Some(exec_request::Payload::Attach(AttachOpen {
                    process: process_ref(namespace, name),
                    stdin,
                    stdout,
                    stderr,
                })),
            })
            .map_err(|_| ApiError::internal(std::io::Error::other("queueing the attach")))?;
        let opened = answered(
            (host, address),
            name,
            "it did not accept the attach in time",
            client.attach_process(ReceiverStream::new(queue)),
        )
        .await?;
        Ok(ExecSession {
            input: ExecInputs(requests),
            output: ExecOutputs(opened),
        })
    }
}
