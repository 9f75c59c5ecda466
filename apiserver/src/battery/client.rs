//! The gRPC client of battery. Only this module and its siblings under `battery/`
//! import `battery-proto`; the rest of the server sees our own types.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use battery_proto::poolmgr::v1alpha1 as pb;
use pb::events_client::EventsClient;
use pb::host_admin_client::HostAdminClient;
use pb::lease_client::LeaseClient;
use pb::pool_admin_client::PoolAdminClient;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use super::channel::{BatteryEndpoint, ChannelError, Credentials};
use super::convert;
use super::errors::{BatteryError, Rpc};
use crate::metrics::{BatteryOutcome, Metrics};
use battery_types::{HostSpec, HostStatus, NetworkInterfaceStatus, PoolSpec, PoolStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// Every unary call gets this long; ClaimVM, which runs the pool's pre-lease hooks, gets
/// [`CLAIM_TIMEOUT`]. Both stay well inside kube-apiserver's 60 s proxy limit.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// ClaimVM blocks while pre-lease hooks run (battery-api.md §4.3).
pub const CLAIM_TIMEOUT: Duration = Duration::from_secs(30);
/// DeletePool first cancels the Pool's MicroVMs still booting and waits for their
/// cleanup (up to 30 s, together), then deletes its MicroVMs (up to 30 s each, together);
/// cut short, poolmgrd starts the Pool's reconciler again
/// (`docs/reference/battery-behaviour.md` §7). So it gets both and a margin; its caller
/// runs it apart from any request (`resources::pools::deletion`).
pub const DELETE_POOL_TIMEOUT: Duration = Duration::from_secs(120);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// battery's lease id: a bearer secret for battery (anyone holding it may heartbeat or
/// release). It prints as `<redacted>` so it never reaches a log line or a response.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct LeaseId(String);

impl LeaseId {
    pub fn new(id: String) -> Self {
        Self(id)
    }

    /// The id itself, for the battery call that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A lease battery granted, in our types.
#[derive(Debug, Clone)]
pub struct Lease {
    pub id: LeaseId,
    pub vm_uid: String,
    /// battery's name of the Host the MicroVM runs on.
    pub host_name: String,
    pub network_interfaces: Vec<NetworkInterfaceStatus>,
    pub claimed_at: Option<Time>,
    pub expires_at: Option<MicroTime>,
}

impl Lease {
    /// Gives the lease the times battery gave it, from when it was asked for: battery
    /// claims at its `now` and expires the lease `threshold` later, so times read just
    /// before asking are early by at most a round trip, and the expiry shown is never
    /// later than battery's.
    pub fn asked_at(
        mut self,
        asked: Timestamp,
        threshold: Option<battery_types::Duration>,
    ) -> Self {
        self.claimed_at = Some(Time(asked));
        self.expires_at = threshold
            .and_then(|t| {
                asked
                    .checked_add(SignedDuration::from_nanos(t.as_nanos()))
                    .ok()
            })
            .map(MicroTime);
        self
    }
}

/// A lease as battery lists it.
#[derive(Debug, Clone)]
pub struct LeaseInfo {
    /// The lease id, a secret: for releasing a lease no claim holds.
    pub id: LeaseId,
    /// The request id it was claimed with: how a claim finds its lease.
    pub request_id: String,
    pub vm_uid: String,
}

/// A pool as battery holds it, in our types.
#[derive(Debug, Clone)]
pub struct BatteryPool {
    pub namespace: String,
    pub name: String,
    /// The spec battery holds; `placement` is ours, so it is always `None` here.
    pub spec: PoolSpec,
    /// The host names battery places the pool's MicroVMs on.
    pub hosts: Vec<String>,
    /// battery's counts, without conditions.
    pub counts: PoolStatus,
}

impl BatteryPool {
    fn from_pb(pool: pb::Pool) -> Self {
        let spec = pool.spec.unwrap_or_default();
        Self {
            namespace: spec.namespace.clone(),
            name: spec.name.clone(),
            hosts: spec.flintlock_hosts.clone(),
            counts: convert::pool_counts(pool.status.as_ref()),
            spec: convert::pool_spec_from_battery(&spec, None),
        }
    }
}

/// A host as battery holds it, in our types.
#[derive(Debug, Clone)]
pub struct BatteryHost {
    pub name: String,
    /// battery's view; `agentAddress` is ours, so it is always `None` here.
    pub spec: HostSpec,
    /// battery's view, without conditions.
    pub status: HostStatus,
}

impl BatteryHost {
    fn from_pb(status: pb::HostStatus) -> Option<Self> {
        let host = status.host.as_ref()?;
        Some(Self {
            name: host.name.clone(),
            spec: convert::host_spec_from_battery(host, None),
            status: convert::host_status_from_battery(&status),
        })
    }
}

/// battery's channel, every call carrying our credentials.
type Transport = InterceptedService<Channel, Credentials>;

/// A cheap-to-clone client of all of battery's services over one channel.
#[derive(Clone)]
pub struct BatteryClient {
    /// For the calls made without a generated client ([`Self::leased_request_ids`]).
    transport: Transport,
    pools: PoolAdminClient<Transport>,
    leases: LeaseClient<Transport>,
    events: EventsClient<Transport>,
    hosts: HostAdminClient<Transport>,
    health: tonic_health::pb::health_client::HealthClient<Transport>,
    /// Where each call's latency and outcome is recorded, once the server has a registry.
    metrics: Option<Arc<Metrics>>,
}

/// `ListLeasesResponse` read for its leases' `request_id` alone (`types.proto`:
/// `LeaseRecord.request_id = 8`); prost skips every other field.
#[derive(Clone, PartialEq, prost::Message)]
struct LeaseRequestIds {
    #[prost(message, repeated, tag = "1")]
    leases: Vec<LeaseRequestId>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct LeaseRequestId {
    #[prost(string, tag = "8")]
    request_id: String,
}

/// `ListLeases` of one pool, or of all pools.
fn list_leases_request(pool: Option<(&str, &str)>) -> pb::ListLeasesRequest {
    pb::ListLeasesRequest {
        pool_ref: pool.map(|(ns, name)| pool_ref(ns, name)),
    }
}

fn call<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(CALL_TIMEOUT);
    request
}

impl BatteryClient {
    /// A client of the battery at `address` (`http://host:port`) in plaintext, without
    /// credentials: the embedded battery on loopback (`dev`, tests). It connects on first
    /// use and reconnects after failures, so the server starts while battery is down.
    pub fn connect_lazy(address: &str) -> Result<Self, tonic::transport::Error> {
        let channel = Endpoint::from_shared(address.to_owned())?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .connect_lazy();
        Ok(Self::over(channel, Credentials::default()))
    }

    /// A client of the battery `endpoint` describes: its files read and checked, nothing
    /// dialled. The task returned, when there are files to follow, reloads them when they
    /// change (a rotation needs no restart); it runs until aborted.
    pub fn connect_secured(
        endpoint: &BatteryEndpoint,
    ) -> Result<(Self, Option<tokio::task::JoinHandle<()>>), ChannelError> {
        let (channel, credentials, follower) = endpoint.connect_lazy()?;
        Ok((Self::over(channel, credentials), follower))
    }

    fn over(channel: Channel, credentials: Credentials) -> Self {
        let transport = InterceptedService::new(channel, credentials);
        Self {
            pools: PoolAdminClient::new(transport.clone()),
            leases: LeaseClient::new(transport.clone()),
            events: EventsClient::new(transport.clone()),
            hosts: HostAdminClient::new(transport.clone()),
            health: tonic_health::pb::health_client::HealthClient::new(transport.clone()),
            transport,
            metrics: None,
        }
    }

    /// The same client, recording every call into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The one place a call's answer is read: battery's status becomes a
    /// [`BatteryError`], and the call's latency and outcome are recorded.
    async fn answer<T>(
        &self,
        rpc: Rpc,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, BatteryError> {
        let started = Instant::now();
        let answered = call
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| BatteryError::from_status(rpc, status));
        if let Some(metrics) = &self.metrics {
            let outcome = answered
                .as_ref()
                .map_or_else(BatteryError::outcome, |_| BatteryOutcome::Ok);
            metrics.record_battery_call(rpc.as_str(), outcome, started.elapsed());
        }
        answered
    }

    /// `Ok` when battery's health service says SERVING; otherwise why not, in words for
    /// `/readyz` (refused credentials said as such; no secret in them).
    pub async fn readiness(&self) -> Result<(), String> {
        let mut health = self.health.clone();
        let request = call(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        });
        match self.answer(Rpc::HealthCheck, health.check(request)).await {
            Ok(r)
                if r.status
                    == tonic_health::pb::health_check_response::ServingStatus::Serving as i32 =>
            {
                Ok(())
            }
            Ok(_) => Err("battery is not serving".to_owned()),
            Err(err) => Err(err.unready_reason()),
        }
    }

    pub async fn pool(&self, namespace: &str, name: &str) -> Result<BatteryPool, BatteryError> {
        let request = pb::GetPoolRequest {
            r#ref: Some(pool_ref(namespace, name)),
        };
        let pool = self
            .answer(Rpc::GetPool, self.pools.clone().get_pool(call(request)))
            .await?;
        Ok(BatteryPool::from_pb(pool))
    }

    /// Pools in `namespace`, or in all namespaces.
    pub async fn pools(&self, namespace: Option<&str>) -> Result<Vec<BatteryPool>, BatteryError> {
        let request = pb::ListPoolsRequest {
            namespace: namespace.map(str::to_owned),
        };
        let listed = self
            .answer(Rpc::ListPools, self.pools.clone().list_pools(call(request)))
            .await?;
        Ok(listed.pools.into_iter().map(BatteryPool::from_pb).collect())
    }

    /// Creates the pool `namespace/name` placed on `hosts`.
    pub async fn create_pool(
        &self,
        namespace: &str,
        name: &str,
        spec: &PoolSpec,
        hosts: Vec<String>,
    ) -> Result<BatteryPool, BatteryError> {
        let request = pb::CreatePoolRequest {
            spec: Some(convert::pool_spec_to_battery(namespace, name, spec, hosts)),
        };
        let pool = self
            .answer(
                Rpc::CreatePool,
                self.pools.clone().create_pool(call(request)),
            )
            .await?;
        Ok(BatteryPool::from_pb(pool))
    }

    /// Replaces the pool's spec (battery restarts its reconciler; it never scales down).
    pub async fn update_pool(
        &self,
        namespace: &str,
        name: &str,
        spec: &PoolSpec,
        hosts: Vec<String>,
    ) -> Result<BatteryPool, BatteryError> {
        let request = pb::UpdatePoolRequest {
            spec: Some(convert::pool_spec_to_battery(namespace, name, spec, hosts)),
        };
        let pool = self
            .answer(
                Rpc::UpdatePool,
                self.pools.clone().update_pool(call(request)),
            )
            .await?;
        Ok(BatteryPool::from_pb(pool))
    }

    /// Deletes the pool; battery refuses ([`super::Failure::PoolHasLeases`]) while a
    /// MicroVM of it is leased (we never force: that would end a Holder's lease under it).
    /// It may take up to [`DELETE_POOL_TIMEOUT`]: longer than a request may wait.
    pub async fn delete_pool(&self, namespace: &str, name: &str) -> Result<(), BatteryError> {
        let mut request = tonic::Request::new(pb::DeletePoolRequest {
            r#ref: Some(pool_ref(namespace, name)),
            force: false,
        });
        request.set_timeout(DELETE_POOL_TIMEOUT);
        self.answer(Rpc::DeletePool, self.pools.clone().delete_pool(request))
            .await?;
        Ok(())
    }

    /// Claims a MicroVM. `request_id` makes the call safe to repeat: battery answers a
    /// repeat with the same lease. ClaimVM's answer carries no times: the caller knows
    /// when it asked.
    pub async fn claim_vm(
        &self,
        namespace: &str,
        pool: &str,
        request_id: &str,
    ) -> Result<Lease, BatteryError> {
        let mut request = tonic::Request::new(pb::ClaimVmRequest {
            pool: Some(pool_ref(namespace, pool)),
            request_id: request_id.to_owned(),
        });
        request.set_timeout(CLAIM_TIMEOUT);
        let claimed = self
            .answer(Rpc::ClaimVm, self.leases.clone().claim_vm(request))
            .await?;
        let host = claimed.host.unwrap_or_default();
        Ok(Lease {
            id: LeaseId::new(claimed.lease_id),
            vm_uid: claimed.vm_uid,
            host_name: host.name,
            network_interfaces: convert::network_interfaces(&claimed.network_interfaces),
            claimed_at: None,
            expires_at: None,
        })
    }

    /// Renews a lease; answers the new expiry.
    pub async fn heartbeat(&self, lease: &LeaseId) -> Result<MicroTime, BatteryError> {
        let request = pb::HeartbeatRequest {
            lease_id: lease.expose().to_owned(),
        };
        let renewed = self
            .answer(Rpc::Heartbeat, self.leases.clone().heartbeat(call(request)))
            .await?;
        renewed
            .expires_at
            .as_ref()
            .and_then(convert::micro_time)
            .ok_or_else(|| {
                BatteryError::malformed(Rpc::Heartbeat, "an answer without a valid expires_at")
            })
    }

    pub async fn release_vm(&self, lease: &LeaseId) -> Result<(), BatteryError> {
        let request = pb::ReleaseVmRequest {
            lease_id: lease.expose().to_owned(),
        };
        self.answer(
            Rpc::ReleaseVm,
            self.leases.clone().release_vm(call(request)),
        )
        .await?;
        Ok(())
    }

    /// Every live lease, of all pools.
    pub async fn leases(&self) -> Result<Vec<LeaseInfo>, BatteryError> {
        let request = list_leases_request(None);
        let listed = self
            .answer(
                Rpc::ListLeases,
                self.leases.clone().list_leases(call(request)),
            )
            .await?;
        Ok(listed
            .leases
            .into_iter()
            .map(|l| LeaseInfo {
                id: LeaseId::new(l.lease_id),
                request_id: l.request_id,
                vm_uid: l.vm_uid,
            })
            .collect())
    }

    /// The request ids of the live leases of one pool, or of all pools: what a list
    /// needs to tell a Bound claim from an Expired one. `ListLeases` answers whole
    /// records; this reads only their `request_id`, skipping the other fields without
    /// allocating them, which at 10,000 leases is most of the call's cost on our side.
    pub async fn leased_request_ids(
        &self,
        pool: Option<(&str, &str)>,
    ) -> Result<HashSet<String>, BatteryError> {
        let request = list_leases_request(pool);
        let call = async {
            let mut grpc = tonic::client::Grpc::new(self.transport.clone());
            grpc.ready().await.map_err(|e| {
                tonic::Status::unavailable(format!("battery's channel is not ready: {e}"))
            })?;
            let codec =
                tonic_prost::ProstCodec::<pb::ListLeasesRequest, LeaseRequestIds>::default();
            let path = http::uri::PathAndQuery::from_static("/poolmgr.v1alpha1.Lease/ListLeases");
            grpc.unary(call(request), path, codec).await
        };
        let listed = self.answer(Rpc::ListLeases, call).await?;
        Ok(listed.leases.into_iter().map(|l| l.request_id).collect())
    }

    /// battery's event stream: its whole history, then live events.
    pub(super) async fn subscribe(&self) -> Result<tonic::Streaming<pb::Event>, BatteryError> {
        // No timeout: the stream lives as long as the server.
        let request = tonic::Request::new(pb::SubscribeRequest { pool: None });
        self.answer(Rpc::Subscribe, self.events.clone().subscribe(request))
            .await
    }

    /// Every host battery knows, in name order.
    pub async fn hosts(&self) -> Result<Vec<BatteryHost>, BatteryError> {
        let request = call(pb::ListHostsRequest {});
        let listed = self
            .answer(Rpc::ListHosts, self.hosts.clone().list_hosts(request))
            .await?;
        Ok(listed
            .hosts
            .into_iter()
            .filter_map(BatteryHost::from_pb)
            .collect())
    }

    pub async fn host(&self, name: &str) -> Result<BatteryHost, BatteryError> {
        let request = pb::GetHostRequest {
            name: name.to_owned(),
        };
        let status = self
            .answer(Rpc::GetHost, self.hosts.clone().get_host(call(request)))
            .await?;
        BatteryHost::from_pb(status)
            .ok_or_else(|| BatteryError::malformed(Rpc::GetHost, "an answer without a host"))
    }

    /// Registers a host; battery dials it and checks its flintlockd version first.
    pub async fn add_host(&self, name: &str, spec: &HostSpec) -> Result<BatteryHost, BatteryError> {
        let request = pb::AddHostRequest {
            host: Some(convert::host_to_battery(name, spec)),
            skip_validation: false,
        };
        self.answer(Rpc::AddHost, self.hosts.clone().add_host(call(request)))
            .await?;
        self.host(name).await
    }

    /// Replaces a host's address and TLS files.
    pub async fn update_host(&self, name: &str, spec: &HostSpec) -> Result<(), BatteryError> {
        let request = pb::UpdateHostRequest {
            host: Some(convert::host_to_battery(name, spec)),
            skip_validation: false,
        };
        self.answer(
            Rpc::UpdateHost,
            self.hosts.clone().update_host(call(request)),
        )
        .await?;
        Ok(())
    }

    pub async fn remove_host(&self, name: &str) -> Result<(), BatteryError> {
        let request = pb::RemoveHostRequest {
            name: name.to_owned(),
        };
        self.answer(
            Rpc::RemoveHost,
            self.hosts.clone().remove_host(call(request)),
        )
        .await?;
        Ok(())
    }

    pub async fn cordon_host(&self, name: &str, reason: &str) -> Result<(), BatteryError> {
        let request = pb::CordonHostRequest {
            name: name.to_owned(),
            reason: reason.to_owned(),
        };
        self.answer(
            Rpc::CordonHost,
            self.hosts.clone().cordon_host(call(request)),
        )
        .await?;
        Ok(())
    }

    pub async fn uncordon_host(&self, name: &str) -> Result<(), BatteryError> {
        let request = pb::UncordonHostRequest {
            name: name.to_owned(),
        };
        self.answer(
            Rpc::UncordonHost,
            self.hosts.clone().uncordon_host(call(request)),
        )
        .await?;
        Ok(())
    }
}

fn pool_ref(namespace: &str, name: &str) -> pb::PoolRef {
    pb::PoolRef {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_id_never_prints() {
        let id = LeaseId::new("5f0c-secret".into());
        assert_eq!(format!("{id}"), "<redacted>");
        assert_eq!(format!("{id:?}"), "<redacted>");
        assert_eq!(format!("{:?}", Some(&id)), "Some(<redacted>)");
        assert_eq!(id.expose(), "5f0c-secret");
    }

    #[test]
    fn request_ids_decode_from_whole_lease_records() {
        use prost::Message as _;
        let record = |n: u32| pb::LeaseRecord {
            lease_id: format!("secret-{n}"),
            vm_uid: format!("vm-{n}"),
            pool_name: "dev".into(),
            claimed_at: Some(prost_types::Timestamp::default()),
            last_heartbeat_at: None,
            expires_at: Some(prost_types::Timestamp::default()),
            pool_namespace: "default".into(),
            request_id: format!("microvmclaim/{n}"),
        };
        let answer = pb::ListLeasesResponse {
            leases: vec![record(1), record(2)],
        };
        let ids = LeaseRequestIds::decode(answer.encode_to_vec().as_slice()).unwrap();
        let ids: Vec<_> = ids.leases.into_iter().map(|l| l.request_id).collect();
        assert_eq!(ids, ["microvmclaim/1", "microvmclaim/2"]);
    }
}
