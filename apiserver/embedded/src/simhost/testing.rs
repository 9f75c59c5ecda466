//! For tests that drive a simulated Host as flintlock's clients do (feature `test-util`):
//! the agent's relay tests and the Host's own SSH tests need a booted MicroVM alike.

use std::time::Duration;

use battery_proto::flintlock::types::MicroVmSpec;
use battery_proto::flintlock::types::micro_vm_status::MicroVmState;
use battery_proto::microvm::services::api::v1alpha1::micro_vm_client::MicroVmClient;
use battery_proto::microvm::services::api::v1alpha1::{CreateMicroVmRequest, GetMicroVmRequest};
use battery_telemetry::eventually;
use tonic::transport::Channel;

use super::SimulatedHost;

/// How long a MicroVM may take to boot.
const BOOT_DEADLINE: Duration = Duration::from_secs(30);

/// A connection to `host`'s gRPC port.
pub async fn connect(host: &SimulatedHost) -> Channel {
    Channel::from_shared(format!("http://{}", host.address()))
        .expect("endpoint")
        .connect()
        .await
        .expect("connected to the host")
}

/// Creates the MicroVM `id` (namespace `ns`, one vCPU, 128 MiB, no interfaces) on `host`
/// and returns its uid once it is CREATED.
pub async fn create_microvm(host: &SimulatedHost, id: &str) -> String {
    let mut microvms = MicroVmClient::new(connect(host).await);
    let created = microvms
        .create_micro_vm(CreateMicroVmRequest {
            microvm: Some(MicroVmSpec {
                id: id.to_owned(),
                namespace: "ns".to_owned(),
                vcpu: 1,
                memory_in_mb: 128,
                ..MicroVmSpec::default()
            }),
            ..CreateMicroVmRequest::default()
        })
        .await
        .expect("created")
        .into_inner();
    let uid = created
        .microvm
        .and_then(|microvm| microvm.spec)
        .and_then(|spec| spec.uid)
        .expect("spec.uid set");
    eventually(
        BOOT_DEADLINE,
        &format!("microvm {uid} CREATED"),
        async || {
            let microvm = microvms
                .get_micro_vm(GetMicroVmRequest { uid: uid.clone() })
                .await
                .expect("got")
                .into_inner()
                .microvm
                .expect("microvm in the response");
            microvm.status.expect("status").state == MicroVmState::Created as i32
        },
    )
    .await;
    uid
}
