//! `e2e-cluster`: the control plane the e2e suites run, for a person: etcd, kube-apiserver
//! and kube-controller-manager on loopback (built by `e2e/go/build` on first use), with
//! battery-apiserver installed from `deploy/` as a cluster admin would, `serve` on the
//! embedded battery registered through its APIService, and an agent per simulated Host.
//! It prints the kubeconfigs to use and runs until Ctrl-C, then removes everything.

use battery_e2e::apiserver::ApiServer;
use battery_e2e::control_plane::Options;

#[tokio::main]
async fn main() {
    let server = ApiServer::aggregated_with_agents_and(Options {
        controllers: true,
        ..Options::default()
    })
    .await;
    let cluster = server.cluster().expect("a real control plane");
    println!(
        "e2e-cluster: kube-apiserver at {} with battery-apiserver behind the APIService \
         v1alpha1.battery.liquidmetal-x.dev (Available)",
        cluster.plane.url()
    );
    println!(
        "  cluster admin:                           export KUBECONFIG={}",
        cluster.plane.admin_kubeconfig().display()
    );
    println!(
        "  system:serviceaccount:default:dev (all): export KUBECONFIG={}",
        server.kubeconfig().display()
    );
    println!("  logs: {}", server.scratch().display());
    println!("next: kubectl get pools,microvmclaims,hosts -A   (Ctrl-C stops it all)");
    tokio::signal::ctrl_c().await.expect("wait for Ctrl-C");
}
