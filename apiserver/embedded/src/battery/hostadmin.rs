//! `poolmgr.v1alpha1.HostAdmin` (§3.3, §4.8): hosts live in the store and are managed at
//! runtime; each has a flintlock connection.

use std::sync::Arc;

use battery_proto::poolmgr::v1alpha1::host_admin_server::HostAdmin;
use battery_proto::poolmgr::v1alpha1::{
    AddHostRequest, CordonHostRequest, GetHostRequest, Host, HostStatus, ListHostsRequest,
    ListHostsResponse, RemoveHostRequest, UncordonHostRequest, UpdateHostRequest,
};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::connections::dial;
use super::engine::Engine;
use super::errors::internal;
use super::flintlock::{self, Flintlock};
use super::store::HostRemoval;
use super::time;

pub(crate) struct HostAdminService {
    engine: Arc<Engine>,
}

impl HostAdminService {
    pub(crate) fn new(engine: Arc<Engine>) -> Self {
        Self { engine }
    }

    fn status(&self, host: Host, vm_count: i32) -> HostStatus {
        let flintlock_version = self.engine.hosts.version(&host.name);
        HostStatus {
            host: Some(host),
            vm_count,
            flintlock_version,
        }
    }

    fn cordon(&self, name: &str, reason: Option<&str>) -> Result<Response<Host>, Status> {
        require_name(name)?;
        match self
            .engine
            .store
            .set_cordon(name, reason)
            .map_err(internal)?
        {
            Some(host) => {
                tracing::info!(
                    host = name,
                    cordoned = reason.is_some(),
                    "host cordon changed"
                );
                Ok(Response::new(host))
            }
            // battery answers FAILED_PRECONDITION here, not NOT_FOUND.
            None => Err(Status::failed_precondition(format!(
                "host {name:?} is not registered"
            ))),
        }
    }
}

fn require_name(name: &str) -> Result<(), Status> {
    if name.is_empty() {
        Err(Status::invalid_argument("name is required"))
    } else {
        Ok(())
    }
}

fn require_host_name(host: &Host) -> Result<(), Status> {
    if host.name.is_empty() {
        Err(Status::invalid_argument("host.name is required"))
    } else {
        Ok(())
    }
}

/// AddHost/UpdateHost's spec rules (§3.3). A host with `tls` unset fails: it is neither
/// insecure nor carries a ca_file.
pub(crate) fn validate_host(host: &Host) -> Result<(), Status> {
    let invalid = |msg: &str| Err(Status::invalid_argument(msg));
    require_host_name(host)?;
    if host.address.is_empty() {
        return invalid("host.address is required");
    }
    let Some(tls) = &host.tls else {
        return invalid("host.tls is required: set insecure, or ca_file");
    };
    let has_files =
        !tls.ca_file.is_empty() || !tls.cert_file.is_empty() || !tls.key_file.is_empty();
    if tls.insecure && has_files {
        return invalid("host.tls.insecure cannot be combined with ca_file, cert_file or key_file");
    }
    if !tls.insecure && tls.ca_file.is_empty() {
        return invalid("host.tls.ca_file is required unless host.tls.insecure");
    }
    if tls.cert_file.is_empty() != tls.key_file.is_empty() {
        return invalid("host.tls.cert_file and host.tls.key_file must be set together");
    }
    Ok(())
}

/// Dials the host (reading its TLS files) and, unless skipped, checks that ServerInfo
/// reports flintlock >= v0.15.2. Returns the channel and the version seen.
async fn connect(host: &Host, skip_validation: bool) -> Result<(Channel, Option<String>), Status> {
    let channel = dial(&host.address, host.tls.as_ref())
        .map_err(|err| Status::failed_precondition(format!("host {}: {err}", host.name)))?;
    if skip_validation {
        return Ok((channel, None));
    }
    let check = async {
        let version = Flintlock::new(channel.clone()).server_info().await?;
        flintlock::check_version(&version)?;
        Ok::<_, flintlock::FlintlockError>(version)
    };
    let version = check.await.map_err(|err| {
        Status::failed_precondition(format!("host {} failed validation: {err}", host.name))
    })?;
    Ok((channel, Some(version)))
}

#[tonic::async_trait]
impl HostAdmin for HostAdminService {
    async fn cordon_host(
        &self,
        request: Request<CordonHostRequest>,
    ) -> Result<Response<Host>, Status> {
        let request = request.into_inner();
        self.cordon(&request.name, Some(&request.reason))
    }

    async fn uncordon_host(
        &self,
        request: Request<UncordonHostRequest>,
    ) -> Result<Response<Host>, Status> {
        self.cordon(&request.into_inner().name, None)
    }

    async fn list_hosts(
        &self,
        _request: Request<ListHostsRequest>,
    ) -> Result<Response<ListHostsResponse>, Status> {
        let hosts = self
            .engine
            .store
            .list_hosts_with_counts()
            .map_err(internal)?
            .into_iter()
            .map(|(host, vm_count)| self.status(host, vm_count))
            .collect();
        Ok(Response::new(ListHostsResponse { hosts }))
    }

    async fn add_host(&self, request: Request<AddHostRequest>) -> Result<Response<Host>, Status> {
        let request = request.into_inner();
        let spec = request.host.unwrap_or_default();
        // poolmgrd's order: the name, then whether it is taken, then the rest of the spec.
        require_host_name(&spec)?;
        let exists = || Status::already_exists(format!("host {:?} already exists", spec.name));
        if self
            .engine
            .store
            .get_host(&spec.name)
            .map_err(internal)?
            .is_some()
        {
            return Err(exists());
        }
        validate_host(&spec)?;
        let (channel, version) = connect(&spec, request.skip_validation).await?;
        // Only name, address and tls are taken; a new host is uncordoned.
        let host = Host {
            name: spec.name.clone(),
            address: spec.address.clone(),
            cordoned: false,
            cordoned_reason: String::new(),
            cordoned_at: None,
            updated_at: Some(time::now()),
            tls: spec.tls.clone(),
        };
        if !self.engine.store.insert_host(&host).map_err(internal)? {
            return Err(exists());
        }
        self.engine
            .hosts
            .install(&host.name, &host.address, Some(channel), version);
        tracing::info!(host = %host.name, address = %host.address, "host added");
        Ok(Response::new(host))
    }

    async fn update_host(
        &self,
        request: Request<UpdateHostRequest>,
    ) -> Result<Response<Host>, Status> {
        let request = request.into_inner();
        let spec = request.host.unwrap_or_default();
        // poolmgrd's order: the name, then whether it is known, then the rest of the spec.
        require_host_name(&spec)?;
        let not_found = || Status::not_found(format!("host {:?} not found", spec.name));
        if self
            .engine
            .store
            .get_host(&spec.name)
            .map_err(internal)?
            .is_none()
        {
            return Err(not_found());
        }
        validate_host(&spec)?;
        let (channel, version) = connect(&spec, request.skip_validation).await?;
        // Address and TLS are replaced; the name and cordon state never change.
        let Some(host) = self
            .engine
            .store
            .update_host(&spec.name, &spec.address, spec.tls.clone())
            .map_err(internal)?
        else {
            return Err(not_found());
        };
        // The connection is swapped and the version cache reset (§4.8).
        self.engine
            .hosts
            .install(&host.name, &host.address, Some(channel), version);
        tracing::info!(host = %host.name, address = %host.address, "host updated");
        Ok(Response::new(host))
    }

    async fn remove_host(
        &self,
        request: Request<RemoveHostRequest>,
    ) -> Result<Response<()>, Status> {
        let name = request.into_inner().name;
        require_name(&name)?;
        let _host_refs = self.engine.host_refs.write().await;
        match self.engine.store.remove_host(&name).map_err(internal)? {
            HostRemoval::Removed => {
                self.engine.hosts.remove(&name);
                tracing::info!(host = %name, "host removed");
                Ok(Response::new(()))
            }
            HostRemoval::NotFound => Err(Status::not_found(format!("host {name:?} not found"))),
            HostRemoval::InUse { pools, vm_count } => {
                let named = if pools.is_empty() {
                    String::new()
                } else {
                    format!("named in flintlock_hosts by pools {}; ", pools.join(", "))
                };
                Err(Status::failed_precondition(format!(
                    "host {name:?} is still in use ({named}vm_count is {vm_count}): cordon it, drop it from each pool spec, and wait for vm_count to reach 0"
                )))
            }
        }
    }

    async fn get_host(
        &self,
        request: Request<GetHostRequest>,
    ) -> Result<Response<HostStatus>, Status> {
        let name = request.into_inner().name;
        require_name(&name)?;
        match self
            .engine
            .store
            .get_host_with_count(&name)
            .map_err(internal)?
        {
            Some((host, vm_count)) => Ok(Response::new(self.status(host, vm_count))),
            None => Err(Status::not_found(format!("host {name:?} not found"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use battery_proto::poolmgr::v1alpha1::HostTls;
    use tonic::Code;

    use super::*;

    fn host(tls: Option<HostTls>) -> Host {
        Host {
            name: "h".into(),
            address: "127.0.0.1:9090".into(),
            tls,
            ..Host::default()
        }
    }

    fn tls(insecure: bool, ca: &str, cert: &str, key: &str) -> Option<HostTls> {
        Some(HostTls {
            insecure,
            ca_file: ca.into(),
            cert_file: cert.into(),
            key_file: key.into(),
        })
    }

    fn invalid(host: &Host) -> bool {
        validate_host(host).is_err_and(|status| status.code() == Code::InvalidArgument)
    }

    #[test]
    fn host_spec_rules() {
        assert!(validate_host(&host(tls(true, "", "", ""))).is_ok());
        assert!(validate_host(&host(tls(false, "/ca", "", ""))).is_ok());
        assert!(validate_host(&host(tls(false, "/ca", "/c", "/k"))).is_ok());

        assert!(invalid(&host(None)));
        assert!(invalid(&host(tls(false, "", "", ""))));
        assert!(invalid(&host(tls(true, "/ca", "", ""))));
        assert!(invalid(&host(tls(true, "", "/c", "/k"))));
        assert!(invalid(&host(tls(false, "/ca", "/c", ""))));
        assert!(invalid(&host(tls(false, "/ca", "", "/k"))));
        let mut nameless = host(tls(true, "", "", ""));
        nameless.name.clear();
        assert!(invalid(&nameless));
        let mut addressless = host(tls(true, "", "", ""));
        addressless.address.clear();
        assert!(invalid(&addressless));
    }
}
