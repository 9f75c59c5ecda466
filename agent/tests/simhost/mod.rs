//! A simulated flintlock Host's MicroVM for the tests that relay into one.

use std::time::{Duration, Instant};

use battery_embedded::simhost::SimulatedHost;
use battery_proto::flintlock::types::MicroVmSpec;
use battery_proto::flintlock::types::micro_vm_status::MicroVmState;
use battery_proto::microvm::services::api::v1alpha1::micro_vm_client::MicroVmClient;
use battery_proto::microvm::services::api::v1alpha1::{CreateMicroVmRequest, GetMicroVmRequest};
use tonic::transport::Channel;

/// How long the MicroVM may take to boot.
const BOOT_DEADLINE: Duration = Duration::from_secs(30);

/// Creates a MicroVM on `host` and returns its uid once it is CREATED.
pub async fn create_microvm(host: &SimulatedHost) -> String {
    let channel = Channel::from_shared(format!("http://{}", host.address()))
        .expect("endpoint")
        .connect()
        .await
        .expect("connected to the host");
    let mut microvms = MicroVmClient::new(channel);
    let created = microvms
        .create_micro_vm(CreateMicroVmRequest {
            microvm: Some(MicroVmSpec {
                id: "vm".into(),
                namespace: "ns".into(),
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
        .expect("uid");
    let deadline = Instant::now() + BOOT_DEADLINE;
    loop {
        let microvm = microvms
            .get_micro_vm(GetMicroVmRequest { uid: uid.clone() })
            .await
            .expect("got")
            .into_inner()
            .microvm
            .expect("microvm");
        if microvm.status.expect("status").state == MicroVmState::Created as i32 {
            return uid;
        }
        assert!(
            Instant::now() < deadline,
            "the MicroVM is not CREATED in time"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
