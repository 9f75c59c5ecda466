//! Provisioning one VM (§4.1, §4.2): reserve a host, CreateMicroVM, write the PROVISIONING
//! row; then, in the background, wait for CREATED, wait for the guest agent, run the
//! create commands and make it AVAILABLE, applying the hook-failure policy on any failure.

use std::sync::Arc;

use battery_proto::flintlock::types::micro_vm_status::MicroVmState;
use battery_proto::poolmgr::v1alpha1::{EventType, PoolSpec, VmPhase, VmRecord};
use tokio::time::Instant;

use super::engine::Engine;
use super::flintlock::{Flintlock, FlintlockError};
use super::lifecycle::{self, DELETE_TIMEOUT};
use super::model::{PoolKey, phase_of};
use super::store::{Placement, StoreError, Transition};
use super::time;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ProvisionError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("host {host}: {source}")]
    Flintlock {
        host: String,
        #[source]
        source: FlintlockError,
    },
}

/// Why a VM's bring-up failed: each is a hook failure (§4.1).
#[derive(Debug, thiserror::Error)]
enum BringUpError {
    #[error("flintlock reports the MicroVM FAILED")]
    Failed,
    #[error("not CREATED within {0:?}")]
    CreateTimeout(std::time::Duration),
    #[error(transparent)]
    Flintlock(#[from] FlintlockError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// How a bring-up ended without a failure.
enum BroughtUp {
    Available,
    /// The VM row went away or became DELETING (DeletePool): nothing more to do.
    Gone,
}

/// Provisions one VM of `spec`'s pool. Returns once its row is written (or the attempt
/// was skipped or failed); the rest of the bring-up continues in the background.
pub(crate) async fn provision(
    engine: &Arc<Engine>,
    spec: &Arc<PoolSpec>,
) -> Result<(), ProvisionError> {
    let key = PoolKey::of_spec(spec);
    let Some(placement) = engine
        .store
        .reserve_placement(&key, &spec.flintlock_hosts)?
    else {
        // No host registered, or all cordoned: skipped silently (§4.2).
        tracing::debug!(pool = %key, "no eligible host; provisioning skipped");
        return Ok(());
    };
    let uid = match create(engine, spec, &placement.host).await {
        Ok(uid) => uid,
        Err(source) => {
            release(engine, &placement);
            return Err(ProvisionError::Flintlock {
                host: placement.host,
                source,
            });
        }
    };
    let now = time::now();
    let vm = VmRecord {
        uid,
        pool_name: spec.name.clone(),
        flintlock_host: placement.host.clone(),
        phase: VmPhase::Provisioning as i32,
        lease_id: None,
        created_at: Some(now),
        updated_at: Some(now),
        pool_namespace: spec.namespace.clone(),
    };
    match engine.store.insert_provisioned_vm(placement.id, &vm) {
        Ok(true) => {}
        Ok(false) => {
            tracing::debug!(pool = %key, vm = %vm.uid, "pool deleted during provisioning; discarding the MicroVM");
            discard(engine, &vm).await;
            return Ok(());
        }
        Err(err) => {
            release(engine, &placement);
            discard(engine, &vm).await;
            return Err(err.into());
        }
    }
    tracing::info!(pool = %key, vm = %vm.uid, host = %vm.flintlock_host, "VM provisioned");
    engine.emit(&key, &vm.uid, EventType::VmProvisioned);
    engine.spawn(bring_up(Arc::clone(engine), Arc::clone(spec), vm));
    Ok(())
}

/// CreateMicroVM with the pool's template: `id = <pool>-<8 chars of a UUID>`,
/// `allow_guest_agent = true`, namespace defaulted to the pool's.
async fn create(engine: &Engine, spec: &PoolSpec, host: &str) -> Result<String, FlintlockError> {
    let client = engine.hosts.verified_client(host).await?;
    let mut template = spec.microvm_template.clone().unwrap_or_default();
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    template.id = format!("{}-{}", spec.name, &suffix[..8]);
    template.allow_guest_agent = true;
    if template.namespace.is_empty() {
        template.namespace.clone_from(&spec.namespace);
    }
    client.create(template, engine.config.create_timeout).await
}

fn release(engine: &Engine, placement: &Placement) {
    if let Err(err) = engine.store.release_placement(placement.id) {
        tracing::warn!(host = %placement.host, error = %err, "releasing a placement failed");
    }
}

/// Deletes a MicroVM that has no row to track it.
async fn discard(engine: &Engine, vm: &VmRecord) {
    let deleted = match engine.hosts.client(&vm.flintlock_host) {
        Ok(client) => client.delete(&vm.uid, DELETE_TIMEOUT).await,
        Err(err) => Err(err),
    };
    if let Err(err) = deleted {
        tracing::warn!(vm = %vm.uid, host = %vm.flintlock_host, error = %err, "deleting an untracked MicroVM failed");
    }
}

async fn bring_up(engine: Arc<Engine>, spec: Arc<PoolSpec>, vm: VmRecord) {
    let key = PoolKey::of_vm(&vm);
    match run_create_hooks(&engine, &spec, &vm).await {
        Ok(BroughtUp::Available) => {
            tracing::info!(pool = %key, vm = %vm.uid, "VM available");
            engine.emit(&key, &vm.uid, EventType::VmAvailable);
        }
        Ok(BroughtUp::Gone) => {
            tracing::debug!(pool = %key, vm = %vm.uid, "VM deleted during bring-up");
        }
        Err(err) => {
            tracing::warn!(pool = %key, vm = %vm.uid, error = %err, "create hook failed");
            lifecycle::hook_failed(&engine, &vm).await;
        }
    }
}

async fn run_create_hooks(
    engine: &Engine,
    spec: &PoolSpec,
    vm: &VmRecord,
) -> Result<BroughtUp, BringUpError> {
    let client = engine.hosts.client(&vm.flintlock_host)?;
    if !wait_created(engine, &client, vm).await? {
        return Ok(BroughtUp::Gone);
    }
    if !advance(engine, vm, VmPhase::CreateHookRunning)? {
        return Ok(BroughtUp::Gone);
    }
    let config = &engine.config;
    client
        .wait_ready(
            &vm.uid,
            config.guest_agent_interval,
            config.guest_agent_timeout,
        )
        .await?;
    for command in &spec.create_commands {
        client
            .run_hook(&vm.uid, command, config.exec_timeout)
            .await?;
    }
    if !advance(engine, vm, VmPhase::Available)? {
        return Ok(BroughtUp::Gone);
    }
    Ok(BroughtUp::Available)
}

/// Moves the VM on; false when it is gone or DELETING.
fn advance(engine: &Engine, vm: &VmRecord, to: VmPhase) -> Result<bool, StoreError> {
    Ok(matches!(
        engine.store.transition_vm(&vm.uid, to, false)?,
        Transition::Updated
    ))
}

/// Polls GetMicroVM every `create_poll_interval` until CREATED (true); FAILED or
/// `create_timeout` is a failure; false when the VM row went away meanwhile.
async fn wait_created(
    engine: &Engine,
    client: &Flintlock,
    vm: &VmRecord,
) -> Result<bool, BringUpError> {
    let config = &engine.config;
    let deadline = Instant::now() + config.create_timeout;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match client
            .get(&vm.uid, remaining.max(config.create_poll_interval))
            .await
        {
            Ok(microvm) => {
                let state = microvm
                    .status
                    .and_then(|status| MicroVmState::try_from(status.state).ok());
                match state {
                    Some(MicroVmState::Created) => return Ok(true),
                    Some(MicroVmState::Failed) => return Err(BringUpError::Failed),
                    _ => {}
                }
            }
            Err(err) => {
                let row = engine.store.get_vm(&vm.uid)?;
                if row.is_none_or(|row| phase_of(&row) == VmPhase::Deleting) {
                    return Ok(false);
                }
                tracing::debug!(vm = %vm.uid, error = %err, "GetMicroVM failed; polling on");
            }
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(BringUpError::CreateTimeout(config.create_timeout));
        }
        tokio::time::sleep(config.create_poll_interval.min(remaining)).await;
    }
}
