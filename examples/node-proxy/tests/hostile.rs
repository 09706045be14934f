//! Hostile peers against the node proxy's inbound HBONE listener, on loopback, bounded in count
//! and time: rapid reset, CONTINUATION flood, oversized headers, slowloris before and after
//! TLS, window starvation, and a peer that never reads. Each attack runs against a node proxy
//! in this process, and each test asserts that the proxy stays up, that an honest tunnel
//! through it still works during and after the attack, and that the heap (counted exactly by
//! the allocator) grows by less than a stated bound. The tests run one at a time: the heap
//! counter is process-wide.
//!
//! Each test uses its own `127.79.N.11` as the workload address.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use meshkit_hbone::{Client, ClientConfig, H2Settings, ServerConfig, Target};
use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    Authorize, RotationConfig, SpiffeId, SpiffeVerifier, SvidCache, TlsSettings, TrustDomain,
};
use meshkit_mesh::{MeshConfig, Workload};
use meshkit_node_proxy::{NodeProxy, NodeProxyConfig};
use meshkit_test_support::{CountingAllocator, hostile};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

const MIB: isize = 1024 * 1024;
const ECHO_PORT: u16 = 8080;
/// An application port whose server writes without end: a peer that never reads it makes the
/// proxy hold whatever it may buffer.
const FIREHOSE_PORT: u16 = 8081;
/// The node proxy's timeouts in these tests, short so that slow peers are seen being cut.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);
const PREFACE_TIMEOUT: Duration = Duration::from_secs(1);
/// Bound on the waits here: generous, so that a loaded machine does not fail them.
const PATIENCE: Duration = Duration::from_secs(15);

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn ip(net: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 79, net, 11))
}

/// A node proxy serving one workload at `127.79.net.11` (an echo application and a firehose),
/// and what a client needs to reach it.
struct Node {
    hbone: SocketAddr,
    echo: SocketAddr,
    firehose: SocketAddr,
    workload: SpiffeId,
    ca: Arc<TestCa>,
    _proxy: NodeProxy,
    _mesh: watch::Sender<MeshConfig>,
}

impl Node {
    async fn start(net: u8) -> Self {
        let td = TrustDomain::new("cluster.local").unwrap();
        let ca = Arc::new(TestCa::new(td.clone()));
        let echo = SocketAddr::new(ip(net), ECHO_PORT);
        let firehose = SocketAddr::new(ip(net), FIREHOSE_PORT);
        tokio::spawn(echo_app(TcpListener::bind(echo).await.unwrap()));
        tokio::spawn(firehose_app(TcpListener::bind(firehose).await.unwrap()));
        let mesh = MeshConfig {
            policies: Vec::new(),
            rejected_policies: Vec::new(),
            workloads: vec![Workload {
                authorization_policies: Vec::new(),
                name: "app".into(),
                namespace: "shop".into(),
                service_account: "app".into(),
                ip: ip(net),
                node: "node".into(),
                ports: Some(vec![ECHO_PORT, FIREHOSE_PORT]),
            }],
            services: Vec::new(),
        };
        let (mesh_tx, mesh_rx) = watch::channel(mesh);
        let mut config = NodeProxyConfig::new("node", td.clone());
        config.server = ServerConfig::default()
            .with_handshake_timeout(HANDSHAKE_TIMEOUT)
            .with_preface_timeout(PREFACE_TIMEOUT)
            .with_first_stream_timeout(PREFACE_TIMEOUT)
            // Small enough that the oversized-header attack exceeds it on any default.
            .with_h2(H2Settings::default().with_max_header_list_size(64 * 1024));
        let certs = SvidCache::new(ca.clone(), RotationConfig::default());
        let proxy = NodeProxy::start(config, mesh_rx, certs, ca.bundle_set())
            .await
            .unwrap();
        Self {
            hbone: SocketAddr::new(ip(net), meshkit_hbone::HBONE_PORT),
            echo,
            firehose,
            workload: SpiffeId::from_istio(&td, "shop", "app").unwrap(),
            ca,
            _proxy: proxy,
            _mesh: mesh_tx,
        }
    }

    fn client_id(&self) -> SpiffeId {
        "spiffe://cluster.local/ns/shop/sa/client".parse().unwrap()
    }

    /// An honest tunnel to the echo application with a fresh client (its own connection).
    async fn honest_echo(&self) {
        let client = Client::new(
            ClientConfig::default(),
            self.ca.issue(self.client_id()),
            self.ca.bundle_set(),
        );
        let target = Target::new(
            self.hbone,
            self.echo,
            self.client_id(),
            self.workload.clone(),
        );
        let echoed = tokio::time::timeout(PATIENCE, async {
            let mut tunnel = client.open(target).await.expect("an honest tunnel opens");
            tunnel.write_all(b"honest traffic").await.unwrap();
            tunnel.shutdown().await.unwrap();
            let mut back = Vec::new();
            tunnel.read_to_end(&mut back).await.unwrap();
            back
        })
        .await
        .expect("honest traffic still flows");
        assert_eq!(echoed, b"honest traffic");
    }

    /// Mutual TLS with the node proxy as the client identity, and nothing above it.
    async fn tls(&self) -> tokio_rustls::client::TlsStream<TcpStream> {
        let config = TlsSettings::default()
            .client_config(
                self.ca.issue(self.client_id()),
                SpiffeVerifier::new(
                    self.ca.bundle_set(),
                    Authorize::Exact(self.workload.clone()),
                ),
            )
            .unwrap();
        let sock = TcpStream::connect(self.hbone).await.unwrap();
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(
                rustls::pki_types::ServerName::IpAddress(self.hbone.ip().into()),
                sock,
            )
            .await
            .unwrap()
    }
}

async fn echo_app(listener: TcpListener) {
    while let Ok((mut sock, _)) = listener.accept().await {
        tokio::spawn(async move {
            let (mut r, mut w) = sock.split();
            let _ = tokio::io::copy(&mut r, &mut w).await;
            let _ = w.shutdown().await;
        });
    }
}

async fn firehose_app(listener: TcpListener) {
    while let Ok((mut sock, _)) = listener.accept().await {
        tokio::spawn(async move {
            let chunk = vec![0x5a; 64 * 1024];
            while sock.write_all(&chunk).await.is_ok() {}
        });
    }
}

/// The heap's growth since `before`, once the proxy had `settle` to finish what the attack
/// started.
async fn heap_growth(before: isize, settle: Duration) -> isize {
    tokio::time::sleep(settle).await;
    CountingAllocator::live() - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_leaves_the_node_proxy_serving() {
    let _serial = SERIAL.lock().await;
    let node = Node::start(1).await;
    node.honest_echo().await;
    let before = CountingAllocator::live();
    // Four connections, each opening and resetting 5,000 streams as fast as it can write.
    let attacks = (0..4).map(|_| async {
        let mut tls = node.tls().await;
        let _ = hostile::rapid_reset(&mut tls, &node.echo.to_string(), 5_000).await;
        hostile::closed_within(&mut tls, Duration::from_millis(500)).await;
    });
    futures::future::join_all(attacks).await;
    node.honest_echo().await;
    let growth = heap_growth(before, Duration::from_millis(500)).await;
    eprintln!("rapid reset: heap grew by {} KiB", growth / 1024);
    assert!(growth < 32 * MIB, "rapid reset left {growth} bytes held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_flood_is_cut_off() {
    let _serial = SERIAL.lock().await;
    let node = Node::start(2).await;
    let before = CountingAllocator::live();
    let mut tls = node.tls().await;
    // Up to 80 MiB of header block that never ends: the proxy must close long before.
    let authority = node.echo.to_string();
    let flood = hostile::continuation_flood(&mut tls, &authority, 5_000, 16 * 1024);
    let _ = tokio::time::timeout(PATIENCE, flood).await;
    assert!(
        hostile::closed_within(&mut tls, PATIENCE).await,
        "the flooding connection was not closed"
    );
    node.honest_echo().await;
    let growth = heap_growth(before, Duration::from_millis(200)).await;
    assert!(growth < 16 * MIB, "the flood left {growth} bytes held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_headers_are_refused_without_harm() {
    let _serial = SERIAL.lock().await;
    let node = Node::start(3).await;
    let before = CountingAllocator::live();
    for _ in 0..10 {
        let mut tls = node.tls().await;
        let authority = node.echo.to_string();
        let sent = hostile::oversized_headers(&mut tls, &authority, 1024 * 1024);
        let _ = tokio::time::timeout(PATIENCE, sent).await;
        // Refused: the stream gets 431 or a reset, or the connection goes; either way no
        // tunnel is opened (the echo application would answer on it).
        let mut buf = vec![0u8; 64 * 1024];
        let _ = tokio::time::timeout(Duration::from_millis(300), tls.read(&mut buf)).await;
    }
    node.honest_echo().await;
    let growth = heap_growth(before, Duration::from_millis(200)).await;
    assert!(
        growth < 16 * MIB,
        "oversized headers left {growth} bytes held"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_before_tls_is_cut_by_the_handshake_timeout() {
    let _serial = SERIAL.lock().await;
    let node = Node::start(4).await;
    let before = CountingAllocator::live();
    // 100 sockets that start a TLS record and never finish it (fewer than the per-source
    // handshake limit, so the timeout is what must close them).
    let mut slow = Vec::new();
    for _ in 0..100 {
        let mut sock = TcpStream::connect(node.hbone).await.unwrap();
        sock.write_all(&[0x16, 0x03, 0x01, 0x02]).await.unwrap();
        slow.push(sock);
    }
    node.honest_echo().await;
    let held = CountingAllocator::live() - before;
    eprintln!("100 sockets before TLS: heap grew by {} KiB", held / 1024);
    assert!(held < 8 * MIB, "100 sockets before TLS hold {held} bytes");
    for sock in &mut slow {
        assert!(
            hostile::closed_within(sock, HANDSHAKE_TIMEOUT + PATIENCE).await,
            "a socket silent in the handshake was not closed"
        );
    }
    node.honest_echo().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_after_tls_is_cut_by_the_preface_timeout() {
    let _serial = SERIAL.lock().await;
    let node = Node::start(5).await;
    let before = CountingAllocator::live();
    // 20 peers with valid certificates that finish TLS and send half a preface.
    let mut slow = Vec::new();
    for _ in 0..20 {
        let mut tls = node.tls().await;
        tls.write_all(&meshkit_test_support::h2_frame::PREFACE[..10])
            .await
            .unwrap();
        tls.flush().await.unwrap();
        slow.push(tls);
    }
    node.honest_echo().await;
    for tls in &mut slow {
        assert!(
            hostile::closed_within(tls, PREFACE_TIMEOUT + PATIENCE).await,
            "a peer silent after TLS was not closed"
        );
    }
    drop(slow);
    node.honest_echo().await;
    let growth = heap_growth(before, Duration::from_millis(200)).await;
    assert!(growth < 8 * MIB, "slow peers left {growth} bytes held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_starvation_and_a_peer_that_never_reads_hold_bounded_memory() {
    let _serial = SERIAL.lock().await;
    let node = Node::start(6).await;
    let before = CountingAllocator::live();
    // One peer grants no window at all; the other takes every byte the proxy will send on
    // 200 firehose tunnels and then never reads its socket again.
    let mut starved = node.tls().await;
    hostile::zero_window(&mut starved, &node.firehose.to_string(), 200)
        .await
        .unwrap();
    let mut never_reads = node.tls().await;
    hostile::start(&mut never_reads).await.unwrap();
    let big_window = meshkit_test_support::h2_frame::settings(&[(0x4, 0x7fff_ffff)]);
    never_reads.write_all(&big_window).await.unwrap();
    let block = meshkit_test_support::h2_frame::connect_block(&node.firehose.to_string());
    let mut opens = Vec::new();
    for i in 0..200u32 {
        let stream = 1 + 2 * i;
        opens.extend(meshkit_test_support::h2_frame::frame(
            meshkit_test_support::h2_frame::HEADERS,
            meshkit_test_support::h2_frame::END_HEADERS,
            stream,
            &block,
        ));
    }
    // The connection window too: as large as HTTP/2 allows.
    opens.extend(meshkit_test_support::h2_frame::frame(
        meshkit_test_support::h2_frame::WINDOW_UPDATE,
        0,
        0,
        &0x7fff_0000u32.to_be_bytes(),
    ));
    never_reads.write_all(&opens).await.unwrap();
    // Both peers keep their connections open and read nothing while the firehoses push.
    tokio::time::sleep(Duration::from_secs(2)).await;
    node.honest_echo().await;
    let held = CountingAllocator::live() - before;
    eprintln!(
        "starved and never-reading peers: heap grew by {} KiB",
        held / 1024
    );
    assert!(
        held < 96 * MIB,
        "a starved and a never-reading peer make the proxy hold {held} bytes"
    );
    drop((starved, never_reads));
    node.honest_echo().await;
}
