//! `scripts/backup` of a running `serve` on the embedded battery restores into a new
//! server that shows the same Pools and Bound claims, with battery's leases matching.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use battery_e2e::apiserver::ApiServer;
use battery_e2e::kube_client;
use battery_types::{ClaimPhase, MicroVMClaim, MicroVMClaimSpec, Pool, PoolRef};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

/// What a backup must keep: each claim's name, phase and MicroVM.
type Claims = BTreeSet<(String, Option<String>, Option<String>)>;

async fn claims(server: &ApiServer) -> Claims {
    let api: Api<MicroVMClaim> = Api::default_namespaced(kube_client(server.kubeconfig()).await);
    api.list(&Default::default())
        .await
        .unwrap()
        .into_iter()
        .map(|claim| {
            let status = claim.status.unwrap_or_default();
            (
                claim.metadata.name.unwrap_or_default(),
                status.phase.map(|p| p.as_str().to_owned()),
                status.micro_vm.map(|vm| vm.uid),
            )
        })
        .collect()
}

async fn pools(server: &ApiServer) -> BTreeSet<String> {
    let api: Api<Pool> = Api::default_namespaced(kube_client(server.kubeconfig()).await);
    api.list(&Default::default())
        .await
        .unwrap()
        .into_iter()
        .filter_map(|pool| pool.metadata.name)
        .collect()
}

/// The MicroVMs battery has leased, asked of battery itself.
async fn leased(server: &ApiServer) -> BTreeSet<String> {
    let leases = server.battery_leases().await;
    leases.into_iter().map(|lease| lease.vm_uid).collect()
}

fn claim(name: &str) -> MicroVMClaim {
    MicroVMClaim {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: MicroVMClaimSpec {
            pool_ref: PoolRef {
                name: "dev".to_owned(),
            },
            service_account_name: "dev".to_owned(),
            ..MicroVMClaimSpec::default()
        },
        status: None,
    }
}

fn backup(out: &Path, server: &ApiServer, data: &Path) {
    let (battery, serve) = server.battery_and_serve_pids();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/backup");
    let output = Command::new(script)
        .arg(out)
        .arg(battery.to_string())
        .arg(data.join("battery"))
        .arg(serve.to_string())
        .arg(data.join("apiserver"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "scripts/backup: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The claims Bound with a MicroVM.
fn bound(claims: &Claims) -> BTreeSet<String> {
    claims
        .iter()
        .filter(|(_, phase, _)| phase.as_deref() == Some(ClaimPhase::Bound.as_str()))
        .filter_map(|(_, _, vm)| vm.clone())
        .collect()
}

#[tokio::test]
async fn a_backup_of_a_running_server_restores_its_pools_claims_and_leases() {
    let scratch = tempfile::tempdir().unwrap();
    let data = scratch.path().join("data");
    let server = ApiServer::aggregated_on(&data).await;
    let api: Api<MicroVMClaim> = Api::default_namespaced(kube_client(server.kubeconfig()).await);
    for name in ["kept-a", "kept-b", "released"] {
        api.create(&PostParams::default(), &claim(name))
            .await
            .unwrap();
    }
    api.delete("released", &DeleteParams::default())
        .await
        .unwrap();
    let before = claims(&server).await;
    let bound = bound(&before);
    assert_eq!(bound.len(), 2, "{before:?}");
    assert_eq!(leased(&server).await, bound);
    let pools_before = pools(&server).await;

    let out = scratch.path().join("backup");
    backup(&out, &server, &data);
    // Both went on serving.
    assert_eq!(claims(&server).await, before);
    drop(server);

    let restored = ApiServer::aggregated_on(&out).await;
    assert_eq!(pools(&restored).await, pools_before);
    assert_eq!(claims(&restored).await, before);
    assert_eq!(leased(&restored).await, bound);
}

#[tokio::test]
async fn a_backup_taken_while_claims_bind_restores_leases_and_claims_that_agree() {
    let scratch = tempfile::tempdir().unwrap();
    let data = scratch.path().join("data");
    let server = ApiServer::aggregated_on(&data).await;
    let api: Api<MicroVMClaim> = Api::default_namespaced(kube_client(server.kubeconfig()).await);
    // Binds and releases going on while the backup stops both processes.
    let churn = tokio::spawn(async move {
        for n in 0.. {
            let name = format!("churn-{n}");
            if api
                .create(&PostParams::default(), &claim(&name))
                .await
                .is_ok()
                && n % 2 == 0
            {
                let _ = api.delete(&name, &DeleteParams::default()).await;
            }
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let out = scratch.path().join("backup");
    backup(&out, &server, &data);
    churn.abort();
    drop(server);

    // Whatever instant it caught, the restored server settles to agreement: every Bound
    // claim's MicroVM leased, and no lease without its Bound claim.
    let restored = ApiServer::aggregated_on(&out).await;
    battery_e2e::eventually(
        std::time::Duration::from_secs(30),
        "battery's leases to be the Bound claims' MicroVMs",
        async || {
            let (claims, leased) = (claims(&restored).await, leased(&restored).await);
            if bound(&claims) == leased {
                Ok(())
            } else {
                Err(format!("claims {claims:?}, leased {leased:?}"))
            }
        },
    )
    .await;
}
