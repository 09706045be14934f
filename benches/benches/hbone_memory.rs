//! Memory held by idle HBONE tunnels: opens 10,000 tunnels (both ends in one process, 100
//! per connection as the client pools them by default), lets them sit idle, and reports the
//! growth of resident memory per tunnel. The baseline: the same measurement of idle loopback
//! TCP connection pairs (5,000 of them, to stay within open-file limits).
//!
//! Each side is measured in a fresh process of its own: the bench re-executes its own binary
//! with `HBONE_MEMORY_SIDE=tunnels:N` or `tcp:N`, the child prints its result on stdout, and
//! the parent prints both and their ratio. (Measured in one process, the side measured second
//! reuses the memory the first freed, and reads as almost free.) Resident memory is the
//! kernel's `VmRSS`, which it reports in KiB, so no page size is assumed. Under `--test` (and
//! `cargo test --benches`) both children run with 100 tunnels and 50 pairs, and no figure or
//! ratio is printed.
//!
//! `cargo bench -p meshkit-benches --bench hbone_memory`

use std::io::Read;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use meshkit_benches::{Mode, resident_bytes};
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
/// Sizes under `--test`: enough to run every step, not to measure.
const TEST_TUNNELS: usize = 100;
const TEST_TCP_PAIRS: usize = 50;
/// Selects the side a child process measures: `tunnels:N` or `tcp:N`.
const SIDE_ENV: &str = "HBONE_MEMORY_SIDE";
/// Bound on one side's setup in the child (opening or connecting everything).
const SIDE_BOUND: Duration = Duration::from_secs(120);
/// Bound on a child process, from spawn to exit.
const CHILD_BOUND: Duration = Duration::from_secs(180);
/// The line a child prints its result on.
const RESULT: &str = "hbone_memory_result";

fn rss_bytes() -> u64 {
    resident_bytes().expect("VmRSS in /proc/self/status (this bench needs Linux)")
}

/// Awaits `fut`, failing with `what` after [`SIDE_BOUND`].
async fn bounded<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(SIDE_BOUND, fut)
        .await
        .unwrap_or_else(|_| panic!("hbone_memory: {what} not done within {SIDE_BOUND:?}"))
}

fn id(s: &str) -> SpiffeId {
    s.parse().unwrap()
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// Resident memory grown by `n` idle loopback TCP connection pairs (both ends held, the
/// accepting end's task parked on a one-byte read), after one warm pair.
async fn idle_tcp_pairs(n: usize) -> u64 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accept = tokio::spawn(async move {
        let mut held = Vec::with_capacity(n + 1);
        for _ in 0..=n {
            let (mut s, _) = listener.accept().await.unwrap();
            held.push(tokio::spawn(async move {
                let mut b = [0u8; 1];
                let _ = s.read(&mut b).await;
            }));
        }
        held
    });
    // One pair first, as the tunnels side opens one tunnel first.
    let warm = bounded("the warm TCP pair", TcpStream::connect(addr))
        .await
        .unwrap();
    settle().await;
    let before = rss_bytes();
    let clients = bounded("connecting the TCP pairs", async {
        let mut clients = Vec::with_capacity(n);
        for _ in 0..n {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        clients
    })
    .await;
    let _server_side = bounded("accepting the TCP pairs", accept).await.unwrap();
    settle().await;
    let grown = rss_bytes().saturating_sub(before);
    drop((clients, warm));
    grown
}

/// Resident memory grown by `n` idle HBONE tunnels (both ends in this process), after one
/// warm tunnel, and the number of connections the client opened for them.
async fn idle_tunnels(n: usize) -> (u64, u64) {
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
    let warm = bounded("the warm tunnel", client.open(target.clone()))
        .await
        .unwrap();
    settle().await;
    let before = rss_bytes();
    let held = bounded("opening the tunnels", async {
        let mut held = Vec::with_capacity(n);
        for _ in 0..n {
            held.push(client.open(target.clone()).await.unwrap());
        }
        held
    })
    .await;
    settle().await;
    let grown = rss_bytes().saturating_sub(before);
    let connections = client.connections_opened();
    drop((held, warm));
    (grown, connections)
}

/// The child's part: measures the side `spec` (`tunnels:N` or `tcp:N`) and prints
/// `hbone_memory_result grown=BYTES connections=K` on stdout.
fn measure_side(spec: &str) {
    let (side, n) = spec
        .split_once(':')
        .unwrap_or_else(|| panic!("{SIDE_ENV}={spec}: expected tunnels:N or tcp:N"));
    let n: usize = n
        .parse()
        .unwrap_or_else(|_| panic!("{SIDE_ENV}={spec}: N is not a count"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (grown, connections) = match side {
        "tunnels" => rt.block_on(idle_tunnels(n)),
        "tcp" => (rt.block_on(idle_tcp_pairs(n)), n as u64),
        other => panic!("{SIDE_ENV}={spec}: unknown side {other}"),
    };
    println!("{RESULT} grown={grown} connections={connections}");
}

/// One side's result, read from a child process.
struct Side {
    grown: u64,
    connections: u64,
}

/// Runs this binary again with `HBONE_MEMORY_SIDE=side:n` and reads its result, failing if
/// the child does not exit within [`CHILD_BOUND`], fails, or prints no result.
fn run_side(side: &str, n: usize) -> Side {
    let exe = std::env::current_exe().expect("the path of this bench binary");
    let mut child = Command::new(exe)
        .env(SIDE_ENV, format!("{side}:{n}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting a child process for one side");
    let mut stdout = child.stdout.take().expect("piped stdout");
    // Read on a thread of its own so that the wait below stays bounded; the pipe closes when
    // the child exits (or is killed).
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        stdout.read_to_string(&mut out).map(|_| out)
    });
    let deadline = Instant::now() + CHILD_BOUND;
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for the child") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("hbone_memory: the {side} side did not exit within {CHILD_BOUND:?}; killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        status.success(),
        "hbone_memory: the {side} side failed ({status}); its stderr is above"
    );
    let out = reader
        .join()
        .expect("the stdout reader thread")
        .expect("reading the child's stdout");
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(RESULT))
        .unwrap_or_else(|| panic!("hbone_memory: the {side} side printed no result: {out:?}"));
    let field = |name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("hbone_memory: no {name} in {line:?}"))
    };
    Side {
        grown: field("grown"),
        connections: field("connections"),
    }
}

fn main() {
    if let Ok(spec) = std::env::var(SIDE_ENV) {
        measure_side(&spec);
        return;
    }
    let mode = Mode::from_args(std::env::args());
    let (n_tunnels, n_pairs) = match mode {
        // Nothing to list: this bench has no criterion benchmarks.
        Mode::List => return,
        Mode::Test => (TEST_TUNNELS, TEST_TCP_PAIRS),
        Mode::Measure | Mode::Profile => (TUNNELS, TCP_PAIRS),
    };
    let tunnels = run_side("tunnels", n_tunnels);
    let tcp = run_side("tcp", n_pairs);
    if mode == Mode::Test {
        println!(
            "hbone_memory: both sides ran in processes of their own ({n_tunnels} tunnels over \
             {} connections, {n_pairs} TCP pairs); not measured (Test mode), no ratio",
            tunnels.connections
        );
        return;
    }
    let per_tunnel = tunnels.grown as f64 / n_tunnels as f64;
    let per_tcp = tcp.grown as f64 / n_pairs as f64;
    println!(
        "idle HBONE tunnels: {n_tunnels} over {} connections (both ends), fresh process",
        tunnels.connections
    );
    println!(
        "  resident memory growth: {:.1} MiB, {:.1} KiB per tunnel",
        tunnels.grown as f64 / 1048576.0,
        per_tunnel / 1024.0
    );
    println!("idle TCP connection pairs (baseline): {n_pairs}, fresh process");
    println!(
        "  resident memory growth: {:.1} MiB, {:.1} KiB per pair",
        tcp.grown as f64 / 1048576.0,
        per_tcp / 1024.0
    );
    println!(
        "ratio (tunnel / TCP pair): {:.2}",
        per_tunnel / per_tcp.max(1.0)
    );
}
