//! Starts the tests' Kubernetes API server (etcd and kube-apiserver, with the Gateway API and
//! Istio CRDs) and keeps it running until Ctrl-C, printing its kubeconfig: for running
//! `mesh-demo --kubeconfig` or `control-plane --kubeconfig` against a real API server without
//! a cluster. Needs `test-support/kube/build.sh` first.
//!
//! ```sh
//! cargo run -p meshkit-test-support --example apiserver
//! ```

use meshkit_test_support::apiserver::{ApiServer, Binaries};

#[tokio::main]
async fn main() {
    let binaries = Binaries::locate().unwrap_or_else(|why| panic!("{why}"));
    let api = ApiServer::start(&binaries).await;
    println!(
        "kube-apiserver {} ready in {:?}",
        api.url(),
        api.ready_after()
    );
    println!("kubeconfig: {}", api.kubeconfig().display());
    println!("Ctrl-C stops it and removes its folder");
    tokio::signal::ctrl_c().await.expect("waiting for Ctrl-C");
}
