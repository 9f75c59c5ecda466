//! The embedded battery over gRPC against a simulated flintlock Host: a claim,
//! heartbeat and release round trip, and the other ways a VM leaves (expiry, a failed
//! hook, a forced pool delete), plus a restart on the same data dir. The full
//! conformance suite lives in /e2e; this checks the core end to end with fast timings.

use std::time::Duration;

use battery_embedded::local::insecure_host;
use battery_embedded::simhost::{SimulatedHost, SimulatedHostConfig};
use battery_embedded::{BatteryConfig, EmbeddedBattery};
use battery_proto::flintlock::types::{MicroVmSpec, NetworkInterface};
use battery_proto::poolmgr::v1alpha1::events_client::EventsClient;
use battery_proto::poolmgr::v1alpha1::host_admin_client::HostAdminClient;
use battery_proto::poolmgr::v1alpha1::lease_client::LeaseClient;
use battery_proto::poolmgr::v1alpha1::pool_admin_client::PoolAdminClient;
use battery_proto::poolmgr::v1alpha1::{
    AddHostRequest, ClaimVmRequest, CreatePoolRequest, DeletePoolRequest, Event, EventType,
    GetHostRequest, GetPoolRequest, HeartbeatRequest, HookFailurePolicy, ListLeasesRequest,
    PoolRef, PoolSpec, PoolStatus, ReleaseVmRequest, ReplenishmentStrategy,
    ReplenishmentStrategyType, SubscribeRequest,
};
use battery_telemetry::eventually;
use tempfile::TempDir;
use tokio::net::TcpListener;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

const DEADLINE: Duration = Duration::from_secs(20);
const NAMESPACE: &str = "team";

fn fast_config(data_dir: Option<std::path::PathBuf>) -> BatteryConfig {
    BatteryConfig {
        data_dir,
        sweep_interval: Duration::from_millis(100),
        warning_window: Duration::from_secs(2),
        reconcile_interval: Duration::from_millis(200),
        create_poll_interval: Duration::from_millis(20),
        create_timeout: Duration::from_secs(5),
        // Each readiness probe is cut at min(interval, 5 s), as in battery: leave room
        // for a process to start.
        guest_agent_interval: Duration::from_millis(200),
        guest_agent_timeout: Duration::from_secs(5),
        exec_timeout: Duration::from_secs(10),
        // Still polled as poolmgrd polls, only faster.
        event_poll_interval: Duration::from_millis(20),
        ..BatteryConfig::default()
    }
}

/// A simulated Host and an embedded battery with the Host registered.
struct Rig {
    _dir: TempDir,
    host: SimulatedHost,
    battery: EmbeddedBattery,
    channel: Channel,
}

impl Rig {
    async fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = SimulatedHost::start(SimulatedHostConfig {
            name: "host-0".into(),
            state_dir: dir.path().join("host-0"),
            ..SimulatedHostConfig::default()
        })
        .await
        .expect("simulated host");
        let battery = start_battery(fast_config(Some(dir.path().join("battery")))).await;
        let channel = connect(&battery).await;
        let added = HostAdminClient::new(channel.clone())
            .add_host(AddHostRequest {
                host: Some(insecure_host(host.name(), &host.address().to_string())),
                skip_validation: false,
            })
            .await
            .expect("AddHost")
            .into_inner();
        assert!(!added.cordoned);
        Self {
            _dir: dir,
            host,
            battery,
            channel,
        }
    }

    fn pools(&self) -> PoolAdminClient<Channel> {
        PoolAdminClient::new(self.channel.clone())
    }

    fn leases(&self) -> LeaseClient<Channel> {
        LeaseClient::new(self.channel.clone())
    }

    async fn create_pool(&self, spec: PoolSpec) {
        self.pools()
            .create_pool(CreatePoolRequest { spec: Some(spec) })
            .await
            .expect("CreatePool");
    }

    async fn status(&self, name: &str) -> PoolStatus {
        self.pools()
            .get_pool(GetPoolRequest {
                r#ref: Some(pool_ref(name)),
            })
            .await
            .expect("GetPool")
            .into_inner()
            .status
            .unwrap_or_default()
    }

    async fn wait_status(&self, name: &str, what: &str, ok: impl Fn(&PoolStatus) -> bool) {
        eventually(DEADLINE, what, || async {
            let status = self.status(name).await;
            ok(&status).then_some(())
        })
        .await;
    }

    /// Every event so far, from a fresh subscription's replay.
    async fn events(&self, pool: &str, until: impl Fn(&[Event]) -> bool) -> Vec<Event> {
        let mut stream = EventsClient::new(self.channel.clone())
            .subscribe(SubscribeRequest {
                pool: Some(pool_ref(pool)),
            })
            .await
            .expect("Subscribe")
            .into_inner();
        let mut events = Vec::new();
        tokio::time::timeout(DEADLINE, async {
            while !until(&events) {
                let event = stream.message().await.expect("stream").expect("event");
                events.push(event);
            }
        })
        .await
        .unwrap_or_else(|_| panic!("events never matched; got {events:?}"));
        events
    }

    async fn shutdown(self) {
        self.battery.shutdown().await;
        self.host.shutdown().await;
    }
}

async fn start_battery(config: BatteryConfig) -> EmbeddedBattery {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    EmbeddedBattery::start(config, listener)
        .await
        .expect("battery start")
}

async fn connect(battery: &EmbeddedBattery) -> Channel {
    Channel::from_shared(format!("http://{}", battery.address()))
        .expect("uri")
        .connect()
        .await
        .expect("connect")
}

fn pool_ref(name: &str) -> PoolRef {
    PoolRef {
        name: name.into(),
        namespace: NAMESPACE.into(),
    }
}

fn pool_spec(name: &str, size: i32, strategy: ReplenishmentStrategyType) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        namespace: NAMESPACE.into(),
        microvm_template: Some(MicroVmSpec {
            vcpu: 1,
            memory_in_mb: 256,
            interfaces: vec![NetworkInterface {
                device_id: "eth0".into(),
                ..NetworkInterface::default()
            }],
            ..MicroVmSpec::default()
        }),
        size,
        flintlock_hosts: vec!["host-0".into()],
        replenishment_strategy: Some(ReplenishmentStrategy {
            r#type: strategy as i32,
            min_size: None,
        }),
        create_commands: vec!["echo created > created.txt".into()],
        pre_lease_commands: vec!["test -f created.txt".into()],
        hook_failure_policy: HookFailurePolicy::DeleteAndReplace as i32,
        heartbeat_interval: Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        }),
        heartbeat_expiry_threshold: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
    }
}

fn kinds_for(events: &[Event], vm: &str) -> Vec<EventType> {
    events
        .iter()
        .filter(|event| event.vm_uid == vm)
        .map(|event| event.r#type())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_heartbeat_release_round_trip() {
    let rig = Rig::start().await;

    let mut health = HealthClient::new(rig.channel.clone());
    let serving = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health")
        .into_inner();
    assert_eq!(serving.status(), ServingStatus::Serving);
    let listed = list_services(rig.channel.clone()).await;
    for service in [
        "poolmgr.v1alpha1.PoolAdmin",
        "poolmgr.v1alpha1.Lease",
        "poolmgr.v1alpha1.Events",
        "poolmgr.v1alpha1.HostAdmin",
        "grpc.health.v1.Health",
    ] {
        assert!(
            listed.iter().any(|s| s == service),
            "{service} in {listed:?}"
        );
    }
    assert!(
        !listed.iter().any(|s| s.starts_with("microvm")),
        "{listed:?}"
    );

    rig.create_pool(pool_spec(
        "web",
        1,
        ReplenishmentStrategyType::ReplaceOnDelete,
    ))
    .await;
    rig.wait_status("web", "one available VM", |s| s.available_count == 1)
        .await;

    let claim = ClaimVmRequest {
        pool: Some(pool_ref("web")),
        request_id: "req-1".into(),
    };
    let claimed = rig
        .leases()
        .claim_vm(claim.clone())
        .await
        .expect("ClaimVM")
        .into_inner();
    let host = claimed.host.clone().expect("host info");
    assert_eq!(host.name, "host-0");
    assert_eq!(host.address, rig.host.address().to_string());
    assert!(
        claimed.network_interfaces.contains_key("eth0"),
        "{claimed:?}"
    );
    assert!(rig.host.microvm_uids().contains(&claimed.vm_uid));
    let status = rig.status("web").await;
    assert_eq!((status.available_count, status.leased_count), (0, 1));

    // A retry with the same request_id replays the lease; another pool may not reuse it.
    let replayed = rig
        .leases()
        .claim_vm(claim)
        .await
        .expect("replay")
        .into_inner();
    assert_eq!(replayed.lease_id, claimed.lease_id);
    assert_eq!(replayed.vm_uid, claimed.vm_uid);
    rig.create_pool(pool_spec(
        "api",
        0,
        ReplenishmentStrategyType::ReplaceOnDelete,
    ))
    .await;
    let misuse = rig
        .leases()
        .claim_vm(ClaimVmRequest {
            pool: Some(pool_ref("api")),
            request_id: "req-1".into(),
        })
        .await
        .expect_err("request_id reused on another pool");
    assert_eq!(misuse.code(), Code::InvalidArgument);
    let empty = rig
        .leases()
        .claim_vm(ClaimVmRequest {
            pool: Some(pool_ref("api")),
            request_id: String::new(),
        })
        .await
        .expect_err("empty pool");
    assert_eq!(empty.code(), Code::ResourceExhausted);

    let leases = rig
        .leases()
        .list_leases(ListLeasesRequest {
            pool_ref: Some(pool_ref("web")),
        })
        .await
        .expect("ListLeases")
        .into_inner()
        .leases;
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].request_id, "req-1");
    let expires_before = leases[0].expires_at.expect("expires_at");

    let beat = rig
        .leases()
        .heartbeat(HeartbeatRequest {
            lease_id: claimed.lease_id.clone(),
        })
        .await
        .expect("Heartbeat")
        .into_inner();
    let expires_after = beat.expires_at.expect("expires_at");
    assert!(
        (expires_after.seconds, expires_after.nanos)
            > (expires_before.seconds, expires_before.nanos)
    );

    let host_status = HostAdminClient::new(rig.channel.clone())
        .get_host(GetHostRequest {
            name: "host-0".into(),
        })
        .await
        .expect("GetHost")
        .into_inner();
    assert_eq!(host_status.flintlock_version, "v0.15.2");
    assert!(host_status.vm_count >= 1);

    let release = ReleaseVmRequest {
        lease_id: claimed.lease_id.clone(),
    };
    rig.leases()
        .release_vm(release.clone())
        .await
        .expect("ReleaseVM");
    assert!(!rig.host.microvm_uids().contains(&claimed.vm_uid));
    let again = rig
        .leases()
        .release_vm(release)
        .await
        .expect_err("second release");
    assert_eq!(again.code(), Code::NotFound);
    let beat = rig
        .leases()
        .heartbeat(HeartbeatRequest {
            lease_id: claimed.lease_id.clone(),
        })
        .await
        .expect_err("heartbeat after release");
    assert_eq!(beat.code(), Code::NotFound);

    // REPLACE_ON_DELETE tops the pool up again.
    let events = rig
        .events("web", |events| {
            events
                .iter()
                .any(|e| e.r#type() == EventType::VmAvailable && e.vm_uid != claimed.vm_uid)
        })
        .await;
    assert_eq!(
        kinds_for(&events, &claimed.vm_uid),
        [
            EventType::VmProvisioned,
            EventType::VmAvailable,
            EventType::VmClaimed,
            EventType::VmDeletedOnRelease,
        ]
    );
    assert!(events.windows(2).all(|pair| pair[0].id < pair[1].id));
    assert!(
        events
            .iter()
            .all(|e| e.pool_name == "web" && e.payload_json.is_empty())
    );

    rig.shutdown().await;
}

async fn list_services(channel: Channel) -> Vec<String> {
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection")
        .into_inner();
    let response = responses
        .message()
        .await
        .expect("reflection stream")
        .expect("a response");
    match response.message_response {
        Some(MessageResponse::ListServicesResponse(list)) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected reflection answer {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_expire_and_warn_first() {
    let rig = Rig::start().await;
    let mut spec = pool_spec("short", 1, ReplenishmentStrategyType::ImmediateOnLease);
    spec.heartbeat_expiry_threshold = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    rig.create_pool(spec).await;
    rig.wait_status("short", "one available VM", |s| s.available_count == 1)
        .await;
    let claimed = rig
        .leases()
        .claim_vm(ClaimVmRequest {
            pool: Some(pool_ref("short")),
            request_id: String::new(),
        })
        .await
        .expect("ClaimVM")
        .into_inner();
    let events = rig
        .events("short", |events| {
            kinds_for(events, &claimed.vm_uid).contains(&EventType::VmDeletedDueToExpiry)
        })
        .await;
    assert_eq!(
        kinds_for(&events, &claimed.vm_uid),
        [
            EventType::VmProvisioned,
            EventType::VmAvailable,
            EventType::VmClaimed,
            EventType::VmExpiringSoon,
            EventType::VmDeletedDueToExpiry,
        ]
    );
    let gone = rig
        .leases()
        .heartbeat(HeartbeatRequest {
            lease_id: claimed.lease_id,
        })
        .await
        .expect_err("expired");
    assert_eq!(gone.code(), Code::NotFound);
    rig.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_create_hooks_quarantine_and_forced_delete_drains() {
    let rig = Rig::start().await;
    let mut spec = pool_spec("broken", 1, ReplenishmentStrategyType::ReplaceOnDelete);
    spec.create_commands = vec!["exit 3".into()];
    spec.hook_failure_policy = HookFailurePolicy::Quarantine as i32;
    rig.create_pool(spec).await;
    // QUARANTINE pools replace quarantined VMs: more keep coming, all quarantined.
    rig.wait_status("broken", "two quarantined VMs", |s| {
        s.quarantined_count >= 2
    })
    .await;
    let events = rig
        .events("broken", |events| {
            events.iter().any(|e| e.r#type() == EventType::VmHookFailed)
        })
        .await;
    let failed = events
        .iter()
        .find(|e| e.r#type() == EventType::VmHookFailed)
        .map(|e| e.vm_uid.clone())
        .expect("a failed VM");
    assert_eq!(
        kinds_for(&events, &failed),
        [EventType::VmProvisioned, EventType::VmHookFailed]
    );

    rig.create_pool(pool_spec(
        "busy",
        1,
        ReplenishmentStrategyType::ReplaceOnDelete,
    ))
    .await;
    rig.wait_status("busy", "one available VM", |s| s.available_count == 1)
        .await;
    let claimed = rig
        .leases()
        .claim_vm(ClaimVmRequest {
            pool: Some(pool_ref("busy")),
            request_id: "busy-1".into(),
        })
        .await
        .expect("ClaimVM")
        .into_inner();
    let refused = rig
        .pools()
        .delete_pool(DeletePoolRequest {
            r#ref: Some(pool_ref("busy")),
            force: false,
        })
        .await
        .expect_err("leased VMs");
    assert_eq!(refused.code(), Code::FailedPrecondition);
    rig.pools()
        .delete_pool(DeletePoolRequest {
            r#ref: Some(pool_ref("busy")),
            force: true,
        })
        .await
        .expect("forced DeletePool");
    let missing = rig
        .pools()
        .get_pool(GetPoolRequest {
            r#ref: Some(pool_ref("busy")),
        })
        .await
        .expect_err("deleted");
    assert_eq!(missing.code(), Code::NotFound);
    let beat = rig
        .leases()
        .heartbeat(HeartbeatRequest {
            lease_id: claimed.lease_id,
        })
        .await
        .expect_err("lease ended with the pool");
    assert_eq!(beat.code(), Code::NotFound);
    let events = rig
        .events("busy", |events| {
            kinds_for(events, &claimed.vm_uid).contains(&EventType::VmDeletedOnPoolDelete)
        })
        .await;
    assert_eq!(
        kinds_for(&events, &claimed.vm_uid).last(),
        Some(&EventType::VmDeletedOnPoolDelete)
    );
    eventually(DEADLINE, "the MicroVM deleted on the host", || async {
        (!rig.host.microvm_uids().contains(&claimed.vm_uid)).then_some(())
    })
    .await;
    rig.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_pools_leases_and_events() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rig = Rig::start().await;
    let data_dir = dir.path().join("battery");
    // A second battery on its own data dir, sharing the rig's Host.
    let battery = start_battery(fast_config(Some(data_dir.clone()))).await;
    let channel = connect(&battery).await;
    HostAdminClient::new(channel.clone())
        .add_host(AddHostRequest {
            host: Some(insecure_host("host-0", &rig.host.address().to_string())),
            skip_validation: true,
        })
        .await
        .expect("AddHost");
    PoolAdminClient::new(channel.clone())
        .create_pool(CreatePoolRequest {
            spec: Some(pool_spec(
                "kept",
                1,
                ReplenishmentStrategyType::ReplaceOnDelete,
            )),
        })
        .await
        .expect("CreatePool");
    let available = |channel: Channel| async move {
        let pool = PoolAdminClient::new(channel)
            .get_pool(GetPoolRequest {
                r#ref: Some(pool_ref("kept")),
            })
            .await
            .ok()?
            .into_inner();
        (pool.status?.available_count == 1).then_some(())
    };
    eventually(DEADLINE, "one available VM", || available(channel.clone())).await;
    let claimed = LeaseClient::new(channel.clone())
        .claim_vm(ClaimVmRequest {
            pool: Some(pool_ref("kept")),
            request_id: "keep-1".into(),
        })
        .await
        .expect("ClaimVM")
        .into_inner();
    battery.shutdown().await;

    let battery = start_battery(fast_config(Some(data_dir))).await;
    let channel = connect(&battery).await;
    let beat = LeaseClient::new(channel.clone())
        .heartbeat(HeartbeatRequest {
            lease_id: claimed.lease_id.clone(),
        })
        .await;
    assert!(beat.is_ok(), "{beat:?}");
    let replayed = LeaseClient::new(channel.clone())
        .claim_vm(ClaimVmRequest {
            pool: Some(pool_ref("kept")),
            request_id: "keep-1".into(),
        })
        .await
        .expect("replay after restart")
        .into_inner();
    assert_eq!(replayed.lease_id, claimed.lease_id);
    let mut stream = EventsClient::new(channel.clone())
        .subscribe(SubscribeRequest { pool: None })
        .await
        .expect("Subscribe")
        .into_inner();
    let first = stream.message().await.expect("stream").expect("event");
    assert_eq!(first.id, 1);
    battery.shutdown().await;
    // The stream is cut at shutdown.
    let after = tokio::time::timeout(DEADLINE, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("stream ends");
    assert!(after.is_err() || after.is_ok_and(|end| end.is_none()));
    rig.shutdown().await;
}
