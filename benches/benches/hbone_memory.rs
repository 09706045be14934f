//! Memory held by idle HBONE tunnels: opens 10,000 tunnels (both ends in this process, 100
//! per connection as the client pools them by default), lets them sit idle, and reports the
//! growth of resident memory per tunnel. A baseline in the same run: the same number of idle
//! loopback TCP connection pairs (5,000 of them, to stay within open-file limits).
//!
//! `cargo bench -p meshkit-benches --bench hbone_memory`

use std::net::SocketAddr;
use std::time::Duration;

use meshkit_hbone::{Client, ClientConfig, Decision, Server, ServerConfig, Target, decide_fn};
use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    Authorize, SingleIdentity, SpiffeId, SpiffeVerifier, TlsSettings, TrustDomain,
};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

const TUNNELS: usize = 10_000;
/// Idle TCP pairs of the baseline: two descriptors each, so half as many as tunnels to stay
/// under common open-file limits.
const TCP_PAIRS: usize = 5_000;

fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn id(s: &str) -> SpiffeId {
    s.parse().unwrap()
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(500)).await;
}

async fn idle_tcp_pairs(n: usize) -> usize {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accept = tokio::spawn(async move {
        let mut held = Vec::with_capacity(n);
        for _ in 0..n {
            let (mut s, _) = listener.accept().await.unwrap();
            held.push(tokio::spawn(async move {
                let mut b = [0u8; 1];
                let _ = s.read(&mut b).await;
            }));
        }
        held
    });
    settle().await;
    let before = rss_bytes();
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        clients.push(TcpStream::connect(addr).await.unwrap());
    }
    let _server_side = accept.await.unwrap();
    settle().await;
    let grown = rss_bytes().saturating_sub(before);
    drop(clients);
    grown
}

async fn idle_tunnels(n: usize) -> (usize, u64) {
    let ca = TestCa::new(TrustDomain::new("cluster.local").unwrap());
    let (client_id, server_id) = (
        id("spiffe://cluster.local/ns/bench/sa/client"),
        id("spiffe://cluster.local/ns/bench/sa/server"),
    );
    let tls = TlsSettings::default()
        .server_config(
            ca.issue(server_id.clone()),
            SpiffeVerifier::new(ca.bundle_set(), Authorize::AnyTrusted),
        )
        .unwrap();
    // Each accepted tunnel waits for EOF without reading into a buffer of its own.
    let service = decide_fn(|_req| async {
        Decision::accept(|tunnel| async move {
            let (mut recv, _send) = tunnel.into_split();
            while let Ok(Some(_)) = recv.chunk().await {}
        })
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let server = Server::new(ServerConfig::default(), SingleIdentity::new(tls), service);
    tokio::spawn(server.serve(listener));
    let client = Client::new(
        ClientConfig::default(),
        ca.issue(client_id.clone()),
        ca.bundle_set(),
    );
    let target = Target::new(addr, "127.0.0.1:9".parse().unwrap(), client_id, server_id);
    // One tunnel first so that TLS, h2 and tokio have their one-time allocations behind them.
    let warm = client.open(target.clone()).await.unwrap();
    settle().await;
    let before = rss_bytes();
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(client.open(target.clone()).await.unwrap());
    }
    settle().await;
    let grown = rss_bytes().saturating_sub(before);
    let connections = client.connections_opened();
    drop((held, warm));
    (grown, connections)
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        // `cargo test --benches` and `--list`: nothing to enumerate, nothing to check quickly.
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (tunnels, connections) = rt.block_on(idle_tunnels(TUNNELS));
    let tcp = rt.block_on(idle_tcp_pairs(TCP_PAIRS));
    let per_tunnel = tunnels as f64 / TUNNELS as f64;
    let per_tcp = tcp as f64 / TCP_PAIRS as f64;
    println!("idle HBONE tunnels: {TUNNELS} over {connections} connections (both ends)");
    println!(
        "  resident memory growth: {:.1} MiB, {:.1} KiB per tunnel",
        tunnels as f64 / 1048576.0,
        per_tunnel / 1024.0
    );
    println!("idle TCP connection pairs (baseline): {TCP_PAIRS}");
    println!(
        "  resident memory growth: {:.1} MiB, {:.1} KiB per pair",
        tcp as f64 / 1048576.0,
        per_tcp / 1024.0
    );
    println!(
        "ratio (tunnel / TCP pair): {:.2}",
        per_tunnel / per_tcp.max(1.0)
    );
}
