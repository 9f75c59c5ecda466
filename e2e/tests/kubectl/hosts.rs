//! Hosts as battery sees them, through kubectl (issue 9): a Host another client of
//! battery registers shows in `kubectl get hosts` without a restart, and `kubectl delete
//! host` of a Host the dev Pool's empty selector places on is accepted at once, cordons
//! it, takes it out of the Pool's placement, and the Host goes once battery has no
//! MicroVM on it.
//!
//! Only on [`Route::Aggregated`], where the embedded battery runs in a process of its own
//! that the test can reach as another client.

use std::time::Duration;

use battery_e2e::apiserver::{ApiServer, Route};
use battery_e2e::{eventually, insecure_host};
use battery_proto::poolmgr::v1alpha1 as pb;
use pb::host_admin_client::HostAdminClient;
use pb::pool_admin_client::PoolAdminClient;

const WITHIN: Duration = Duration::from_secs(30);

type Channel = battery_e2e::BatteryChannel;

/// The Hosts battery places the dev Pool on.
async fn dev_pool_hosts(pools: &mut PoolAdminClient<Channel>) -> Result<Vec<String>, String> {
    let pool = pools
        .get_pool(pb::GetPoolRequest {
            r#ref: Some(pb::PoolRef {
                name: crate::DEV_POOL.to_owned(),
                namespace: "default".to_owned(),
            }),
        })
        .await
        .map_err(|e| e.to_string())?;
    Ok(pool.into_inner().spec.unwrap_or_default().flintlock_hosts)
}

#[tokio::test]
async fn a_host_registered_in_battery_shows_and_a_deleted_one_goes() {
    let server = ApiServer::start(Route::Aggregated).await;
    let battery = server.battery_access().expect("aggregated").channel();
    let mut hosts = HostAdminClient::new(battery.clone());
    let mut pools = PoolAdminClient::new(battery);
    for kubectl in server.kubectls() {
        let extra = kubectl.unique("extra");
        let names = async || {
            let list = kubectl.json(&["get", "hosts", "-o", "json"]).await;
            list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|h| h["metadata"]["name"].as_str().map(str::to_owned))
                .collect::<Vec<_>>()
        };
        // Registered without a dial: nothing serves there, so battery provisions nothing.
        hosts
            .add_host(pb::AddHostRequest {
                host: Some(insecure_host(&extra, "127.0.0.1:9")),
                skip_validation: true,
            })
            .await
            .unwrap();
        eventually(WITHIN, "the new Host in kubectl get hosts", async || {
            let seen = names().await;
            seen.contains(&extra)
                .then_some(())
                .ok_or(format!("hosts: {seen:?}"))
        })
        .await;
        // The dev Pool selects every Host, the new one too.
        eventually(WITHIN, "the dev Pool placed on the new Host", async || {
            let placed = dev_pool_hosts(&mut pools).await?;
            placed
                .contains(&extra)
                .then_some(())
                .ok_or(format!("placed on {placed:?}"))
        })
        .await;
        let deleted = kubectl
            .ok(&["delete", "host", &extra, "--wait=false"])
            .await;
        assert!(deleted.contains(&extra), "{deleted}");
        eventually(
            WITHIN,
            "the deleted Host out of the placement, then gone",
            async || {
                let placed = dev_pool_hosts(&mut pools).await?;
                let seen = names().await;
                (!placed.contains(&extra) && !seen.contains(&extra))
                    .then_some(())
                    .ok_or(format!("placed on {placed:?}, hosts {seen:?}"))
            },
        )
        .await;
        // The Pool stays on the Hosts that remain.
        let remaining = names().await;
        assert_eq!(
            dev_pool_hosts(&mut pools).await.unwrap(),
            remaining,
            "kubectl {}",
            kubectl.version()
        );
    }
}
