//! Provisioning one VM (§4.1, §4.2), as poolmgrd's Provision does it: reserve a host,
//! CreateMicroVM, write the PROVISIONING row, wait for CREATED and for the guest agent,
//! run the create commands and make the VM AVAILABLE. It returns only once the VM is
//! AVAILABLE or its failure has been handled. Every failure after the row, the
//! reconciler being stopped included, applies the hook-failure policy of the spec the
//! reconciler holds.

use std::sync::Arc;

use battery_proto::flintlock::types::micro_vm_status::MicroVmState;
use battery_proto::poolmgr::v1alpha1::{EventType, PoolSpec, VmPhase, VmRecord};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::engine::Engine;
use super::flintlock::{Flintlock, FlintlockError};
use super::lifecycle::{self, DELETE_TIMEOUT};
use super::model::PoolKey;
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
    /// The reconciler was stopped before the VM had a row: no row, no event.
    #[error("the pool's reconciler was stopped")]
    Cancelled,
    /// The VM failed after its row was written, and the hook-failure policy was applied.
    #[error("VM {vm}: {source}")]
    BringUp {
        vm: String,
        #[source]
        source: BringUpError,
    },
}

/// Why a VM's bring-up failed: each is a hook failure (§4.1).
#[derive(Debug, thiserror::Error)]
pub(crate) enum BringUpError {
    #[error("flintlock reports the MicroVM FAILED")]
    Failed,
    #[error("not CREATED within {0:?}")]
    CreateTimeout(std::time::Duration),
    #[error("its row is gone or DELETING, so it cannot become {0:?}")]
    NotAdvanced(VmPhase),
    #[error("the pool's reconciler was stopped")]
    Cancelled,
    #[error(transparent)]
    Flintlock(#[from] FlintlockError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Provisions one VM of `spec`'s pool, unless `stop` cuts it short.
pub(crate) async fn provision(
    engine: &Arc<Engine>,
    spec: &Arc<PoolSpec>,
    stop: &CancellationToken,
) -> Result<(), ProvisionError> {
    if stop.is_cancelled() {
        return Err(ProvisionError::Cancelled);
    }
    let key = PoolKey::of_spec(spec);
    let Some(placement) = engine
        .store
        .reserve_placement(&key, &spec.flintlock_hosts)?
    else {
        // No host registered, or all cordoned: skipped silently (§4.2).
        tracing::debug!(pool = %key, "no eligible host; provisioning skipped");
        return Ok(());
    };
    let mut creating = Box::pin(create(
        Arc::clone(engine),
        Arc::clone(spec),
        placement.host.clone(),
    ));
    let created = tokio::select! {
        created = &mut creating => created,
        () = stop.cancelled() => {
            release(engine, &placement);
            // poolmgrd abandons the call, and a flintlock that creates the MicroVM all
            // the same leaves it untracked; the answer is awaited in the background here
            // and what it made is deleted.
            let background = Arc::clone(engine);
            let host = placement.host;
            engine.spawn(async move {
                if let Ok(uid) = creating.await {
                    discard(&background, &host, &uid).await;
                }
            });
            return Err(ProvisionError::Cancelled);
        }
    };
    let uid = match created {
        Ok(uid) => uid,
        Err(source) => {
            release(engine, &placement);
            return Err(ProvisionError::Flintlock {
                host: placement.host,
                source,
            });
        }
    };
    if stop.is_cancelled() {
        // poolmgrd's row write fails on the cancelled context; the MicroVM is deleted.
        release(engine, &placement);
        discard(engine, &placement.host, &uid).await;
        return Err(ProvisionError::Cancelled);
    }
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
            discard(engine, &vm.flintlock_host, &vm.uid).await;
            return Ok(());
        }
        Err(err) => {
            release(engine, &placement);
            discard(engine, &vm.flintlock_host, &vm.uid).await;
            return Err(err.into());
        }
    }
    tracing::info!(pool = %key, vm = %vm.uid, host = %vm.flintlock_host, "VM provisioned");
    engine.emit(&key, &vm.uid, EventType::VmProvisioned);
    let brought_up = tokio::select! {
        biased;
        () = stop.cancelled() => Err(BringUpError::Cancelled),
        brought_up = bring_up(engine, spec, &vm) => brought_up,
    };
    match brought_up {
        Ok(()) => {
            tracing::info!(pool = %key, vm = %vm.uid, "VM available");
            engine.emit(&key, &vm.uid, EventType::VmAvailable);
            Ok(())
        }
        Err(source) => {
            tracing::warn!(pool = %key, vm = %vm.uid, error = %source, "create hook failed");
            lifecycle::hook_failed(engine, spec, &vm).await;
            Err(ProvisionError::BringUp { vm: vm.uid, source })
        }
    }
}

/// CreateMicroVM with the pool's template: `id = <pool>-<8 chars of a UUID>`,
/// `allow_guest_agent = true`, namespace defaulted to the pool's. Owns its arguments so
/// an abandoned call can finish in the background.
async fn create(
    engine: Arc<Engine>,
    spec: Arc<PoolSpec>,
    host: String,
) -> Result<String, FlintlockError> {
    let client = engine.hosts.verified_client(&host).await?;
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
async fn discard(engine: &Engine, host: &str, uid: &str) {
    let deleted = match engine.hosts.client(host) {
        Ok(client) => client.delete(uid, DELETE_TIMEOUT).await,
        Err(err) => Err(err),
    };
    if let Err(err) = deleted {
        tracing::warn!(vm = uid, host, error = %err, "deleting an untracked MicroVM failed");
    }
}

/// From the written row to AVAILABLE.
async fn bring_up(engine: &Engine, spec: &PoolSpec, vm: &VmRecord) -> Result<(), BringUpError> {
    let client = engine.hosts.client(&vm.flintlock_host)?;
    wait_created(engine, &client, &vm.uid).await?;
    advance(engine, vm, VmPhase::CreateHookRunning)?;
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
    advance(engine, vm, VmPhase::Available)
}

/// Moves the VM on; a row gone or DELETING is a failure, as poolmgrd's refused write.
fn advance(engine: &Engine, vm: &VmRecord, to: VmPhase) -> Result<(), BringUpError> {
    match engine.store.transition_vm(&vm.uid, to, false)? {
        Transition::Updated => Ok(()),
        Transition::Deleting | Transition::Missing => Err(BringUpError::NotAdvanced(to)),
    }
}

/// Polls GetMicroVM at once and then every `create_poll_interval` until CREATED; FAILED,
/// a failed GetMicroVM, or `create_timeout` passing is a failure.
async fn wait_created(engine: &Engine, client: &Flintlock, uid: &str) -> Result<(), BringUpError> {
    let config = &engine.config;
    let polling = async {
        let mut ticker = tokio::time::interval(config.create_poll_interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let microvm = client.get(uid, config.create_timeout).await?;
            let state = microvm
                .status
                .and_then(|status| MicroVmState::try_from(status.state).ok());
            match state {
                Some(MicroVmState::Created) => return Ok(()),
                Some(MicroVmState::Failed) => return Err(BringUpError::Failed),
                _ => {}
            }
        }
    };
    tokio::time::timeout(config.create_timeout, polling)
        .await
        .map_err(|_| BringUpError::CreateTimeout(config.create_timeout))?
}
