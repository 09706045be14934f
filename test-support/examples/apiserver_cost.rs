//! What the API server fixture costs: start-up to ready, to CRDs established, and the memory
//! of both processes once ready, over a few starts. Needs `test-support/kube/build.sh` first.
//!
//! ```sh
//! cargo run --release -p meshkit-test-support --example apiserver_cost [STARTS]
//! ```

use std::time::{Duration, Instant};

use meshkit_test_support::apiserver::{ApiServer, Binaries};

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let starts: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(5);
    let binaries = Binaries::locate().unwrap_or_else(|why| panic!("{why}"));
    let (mut ready, mut whole, mut apiserver_mib, mut etcd_mib) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..starts {
        let started = Instant::now();
        let api = ApiServer::start(&binaries).await;
        whole.push(started.elapsed());
        ready.push(api.ready_after());
        let (apiserver, etcd) = api.pids();
        apiserver_mib.push(rss_mib(apiserver));
        etcd_mib.push(rss_mib(etcd));
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "{starts} starts: ready (etcd start to /readyz 200) median {:?}; with the CRDs \
         established median {:?}; resident memory once ready: kube-apiserver {:.0} MiB, etcd \
         {:.0} MiB (means)",
        median(ready),
        median(whole),
        mean(&apiserver_mib),
        mean(&etcd_mib)
    );
}
