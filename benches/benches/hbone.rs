//! meshkit-hbone on loopback, each beside its baseline in the same run: bulk throughput
//! (raw TCP, plain rustls TLS 1.3, HBONE), 1 KiB round trips (TLS, HBONE), tunnel opening on a
//! warm pooled connection (one at a time, and 100 at once, beside a 1-byte round trip on that
//! connection) and on a cold one (beside TCP + TLS), and 64 MiB from server to client through
//! a tunnel whose connection carries ten stalled tunnels (readers that never read) beside the
//! same on a connection of its own. Each end runs on a thread of its own (see `Ends`), except
//! in the `round_trip_1kib_1thread` and `tunnel_open_1thread` groups, which put both on one
//! thread to compare CPU per round trip and per open.
//!
//! `cargo bench -p meshkit-benches --bench hbone`; `HBONE_PROFILE_RTT=hbone:N` (or `tls:N`)
//! runs N round trips without criterion, for `valgrind --tool=callgrind` (`open:N`: N warm
//! tunnel opens; `cold:N`: N cold tunnels; `handshake:N`: N TCP + TLS handshakes, each
//! confirmed by a 1-byte round trip).
//! `HBONE_BENCH_PROVIDER=aws-lc-rs` runs every transport with aws-lc-rs instead of ring.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group};
use meshkit_benches::{Ratio, Run};
use meshkit_hbone::{Client, ClientConfig, Decision, Server, ServerConfig, Target, decide_fn};
// HBONE's buffers under rustls, which "TLS, buffered" gets too.
use meshkit_hbone::{TLS_READ_BUFFER as READ_BUFFER, TLS_WRITE_BUFFER as WRITE_BUFFER};
use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    Authorize, SingleIdentity, SpiffeId, SpiffeVerifier, TlsSettings, TrustBundleSet, TrustDomain,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::{Handle, Runtime};

/// The allocator of the project's proxy binaries, so that both transports are measured as they
/// run there (glibc's allocator returns HTTP/2's 1 MiB frame buffers to the kernel and
/// page-faults them back in on every frame).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BULK: usize = 64 * 1024 * 1024;
const CHUNK: usize = 1024 * 1024;
const CLIENT: &str = "spiffe://cluster.local/ns/bench/sa/client";
const SERVER: &str = "spiffe://cluster.local/ns/bench/sa/server";

fn id(s: &str) -> SpiffeId {
    s.parse().unwrap()
}

/// The HTTP/2 settings under test: the defaults, unless `HBONE_BENCH_FRAME` (bytes) asks for
/// another maximum frame size, for tuning experiments.
fn h2_settings() -> meshkit_hbone::H2Settings {
    let settings = meshkit_hbone::H2Settings::default();
    match std::env::var("HBONE_BENCH_FRAME")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(frame) => settings.with_max_frame_size(frame),
        None => settings,
    }
}

/// The two ends of every exchange, each on a thread of its own, as the proxies run (one
/// thread per process): the client end on the bench thread, the server end on its own
/// thread. One end per thread keeps the scheduler out of the comparison: with a shared
/// work-stealing runtime the tasks of both ends migrate between workers and the bulk ratio
/// moved by 20% from run to run.
struct Ends {
    client: Runtime,
    server: Handle,
    /// Dropping it stops the server thread's runtime.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Ends {
    fn new() -> Self {
        let server = current_thread();
        let handle = server.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            server.block_on(async {
                let _ = stopped.await;
            })
        });
        Self {
            client: current_thread(),
            server: handle,
            _stop: stop,
        }
    }
}

/// A current-thread runtime with I/O and timers, as each end of every exchange runs on.
fn current_thread() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Bound on each benchmark's setup (connects, handshakes, tunnel opens, a first transfer): a
/// setup that stalls fails naming itself instead of hanging.
const SETUP_BOUND: Duration = Duration::from_secs(60);

/// Runs the setup step `what` on `rt`, failing if it takes longer than [`SETUP_BOUND`].
fn setup<F: std::future::Future>(rt: &Runtime, what: &str, fut: F) -> F::Output {
    rt.block_on(async {
        tokio::time::timeout(SETUP_BOUND, fut)
            .await
            .unwrap_or_else(|_| panic!("bench setup `{what}` not done within {SETUP_BOUND:?}"))
    })
}

/// A loopback listener for a server end; made blocking-free so either runtime can adopt it.
fn listener() -> (std::net::TcpListener, SocketAddr) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    (l, addr)
}

/// TLS settings for every transport: ring (meshkit's default provider), or aws-lc-rs when
/// `HBONE_BENCH_PROVIDER=aws-lc-rs`.
fn tls_settings() -> TlsSettings {
    match std::env::var("HBONE_BENCH_PROVIDER").as_deref() {
        Ok("aws-lc-rs") => TlsSettings::default().with_provider(Arc::new(
            meshkit_identity::prefer_aes_128_gcm(rustls::crypto::aws_lc_rs::default_provider()),
        )),
        Ok("ring") | Err(_) => TlsSettings::default(),
        Ok(other) => panic!("HBONE_BENCH_PROVIDER={other}: expected ring or aws-lc-rs"),
    }
}

struct Pki {
    ca: TestCa,
}

impl Pki {
    fn new() -> Self {
        Self {
            ca: TestCa::new(TrustDomain::new("cluster.local").unwrap()),
        }
    }

    fn server_tls(&self) -> rustls::ServerConfig {
        tls_settings()
            .server_config(
                self.ca.issue(id(SERVER)),
                SpiffeVerifier::new(self.ca.bundle_set(), Authorize::AnyTrusted),
            )
            .unwrap()
    }

    fn client_tls(&self) -> rustls::ClientConfig {
        tls_settings()
            .client_config(
                self.ca.issue(id(CLIENT)),
                SpiffeVerifier::new(self.ca.bundle_set(), Authorize::Exact(id(SERVER))),
            )
            .unwrap()
    }

    fn client(&self) -> Client {
        Client::new(
            ClientConfig::default()
                .with_h2(h2_settings())
                .with_tls(tls_settings()),
            self.ca.issue(id(CLIENT)),
            self.ca.bundle_set(),
        )
    }
}

/// What the far end of every transport does: `Sink` acknowledges each `BULK` bytes with one
/// byte; `Echo` sends back what it reads.
#[derive(Clone, Copy)]
enum Peer {
    Sink,
    Echo,
}

async fn serve_peer<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, peer: Peer) {
    let mut buf = vec![0u8; CHUNK];
    let mut seen = 0usize;
    loop {
        let n = match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        match peer {
            Peer::Sink => {
                seen += n;
                while seen >= BULK {
                    seen -= BULK;
                    // Flush: a TLS stream may hold the record until asked to.
                    if s.write_all(&[1]).await.is_err() || s.flush().await.is_err() {
                        return;
                    }
                }
            }
            Peer::Echo => {
                if s.write_all(&buf[..n]).await.is_err() || s.flush().await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The HBONE sink consumes data as HTTP/2 delivers it (as the forwarder does), without
/// copying it into a buffer of its own.
async fn hbone_sink(tunnel: meshkit_hbone::Tunnel) {
    let (mut recv, mut send) = tunnel.into_split();
    let mut seen = 0usize;
    while let Ok(Some(chunk)) = recv.chunk().await {
        seen += chunk.len();
        while seen >= BULK {
            seen -= BULK;
            if send.send(Bytes::from_static(&[1])).await.is_err() {
                return;
            }
        }
    }
}

/// A raw TCP server on `server` running `peer` for one connection.
fn tcp_server(server: &Handle, peer: Peer) -> SocketAddr {
    let (l, addr) = listener();
    server.spawn(async move {
        let (s, _) = TcpListener::from_std(l).unwrap().accept().await.unwrap();
        s.set_nodelay(true).unwrap();
        serve_peer(s, peer).await;
    });
    addr
}

async fn tcp_connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// A mutual-TLS 1.3 server on `server` (same provider, certificates and verifiers as HBONE)
/// running `peer` for one connection; `buffered` gives rustls the buffers HBONE gives it, so
/// that the two differ only by HTTP/2.
fn tls_server(server: &Handle, pki: &Pki, peer: Peer, buffered: bool) -> SocketAddr {
    let (l, addr) = listener();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(pki.server_tls()));
    server.spawn(async move {
        let (s, _) = TcpListener::from_std(l).unwrap().accept().await.unwrap();
        s.set_nodelay(true).unwrap();
        if buffered {
            let mut tls = acceptor
                .accept(BufReader::with_capacity(READ_BUFFER, s))
                .await
                .unwrap();
            tls.get_mut().1.set_buffer_limit(Some(WRITE_BUFFER));
            serve_peer(tls, peer).await;
        } else {
            serve_peer(acceptor.accept(s).await.unwrap(), peer).await;
        }
    });
    addr
}

async fn tls_connect<IO: AsyncRead + AsyncWrite + Unpin>(
    pki: &Pki,
    addr: SocketAddr,
    buffered: bool,
    wrap: impl FnOnce(TcpStream) -> IO,
) -> tokio_rustls::client::TlsStream<IO> {
    let s = tcp_connect(addr).await;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(pki.client_tls()))
        .connect(
            rustls::pki_types::ServerName::IpAddress(addr.ip().into()),
            wrap(s),
        )
        .await
        .unwrap();
    if buffered {
        tls.get_mut().1.set_buffer_limit(Some(WRITE_BUFFER));
    }
    tls
}

/// Sends `blocks` times the 1 MiB `block` (without copying), then END_STREAM; stops at the
/// first error.
async fn hbone_push(tunnel: meshkit_hbone::Tunnel, block: Bytes, blocks: usize) {
    let (_recv, mut send) = tunnel.into_split();
    for _ in 0..blocks {
        if send.send(block.clone()).await.is_err() {
            return;
        }
    }
    let _ = send.finish();
}

/// Reads `tunnel` until it ends, as HTTP/2 delivers it.
async fn drain(tunnel: meshkit_hbone::Tunnel) {
    let (mut recv, _send) = tunnel.into_split();
    while let Ok(Some(_)) = recv.chunk().await {}
}

/// Target port of a tunnel whose server pushes `BULK` bytes to the client, then ends.
const PUSH: u16 = 3;
/// Target port of a tunnel whose server pushes without end (its client never reads).
const PUSH_FOREVER: u16 = 4;
/// Target port of a tunnel whose server reads until the tunnel ends and sends nothing: the
/// least a handler does, for the tunnel-open groups.
const DRAIN: u16 = 5;

/// An HBONE server on `server` whose tunnels run `Peer::Sink` for target port 1, push to the
/// client for `PUSH` and `PUSH_FOREVER`, and run `Peer::Echo` else.
fn hbone_server(server: &Handle, pki: &Pki) -> SocketAddr {
    let (l, addr) = listener();
    let block = Bytes::from(vec![0x5au8; CHUNK]);
    let service = decide_fn(move |req: meshkit_hbone::ConnectRequest| {
        let block = block.clone();
        async move {
            match req.target.port() {
                1 => Decision::accept(hbone_sink),
                PUSH => Decision::accept(move |t| hbone_push(t, block, BULK / CHUNK)),
                PUSH_FOREVER => Decision::accept(move |t| hbone_push(t, block, usize::MAX)),
                DRAIN => Decision::accept(drain),
                _ => Decision::accept(|tunnel| serve_peer(tunnel, Peer::Echo)),
            }
        }
    });
    let hbone = Server::new(
        ServerConfig::default().with_h2(h2_settings()),
        SingleIdentity::new(pki.server_tls()),
        service,
    );
    server.spawn(async move { hbone.serve(TcpListener::from_std(l).unwrap()).await });
    addr
}

fn target(server: SocketAddr, peer: Peer) -> Target {
    let port = match peer {
        Peer::Sink => 1,
        Peer::Echo => 2,
    };
    Target::new(
        server,
        SocketAddr::from(([127, 0, 0, 1], port)),
        id(CLIENT),
        id(SERVER),
    )
}

/// Sends `BULK` bytes in `CHUNK` writes and waits for the acknowledgement.
async fn bulk<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, block: &[u8]) {
    for _ in 0..BULK / CHUNK {
        s.write_all(block).await.unwrap();
    }
    s.flush().await.unwrap();
    let mut ack = [0u8; 1];
    s.read_exact(&mut ack).await.unwrap();
}

fn bench_throughput(c: &mut Criterion) {
    let ends = Ends::new();
    let (rt, server) = (&ends.client, &ends.server);
    let pki = Pki::new();
    let block = vec![0x5au8; CHUNK];
    let shared = Bytes::from(block.clone());
    let hbone_addr = hbone_server(server, &pki);
    let tcp_addr = tcp_server(server, Peer::Sink);
    let tls_addr = tls_server(server, &pki, Peer::Sink, false);
    let tls_buffered_addr = tls_server(server, &pki, Peer::Sink, true);
    let (mut tcp, mut tls, mut tls_buffered, mut hbone, _client) =
        setup(rt, "bulk connects", async {
            let client = pki.client();
            let tunnel = client.open(target(hbone_addr, Peer::Sink)).await.unwrap();
            (
                tcp_connect(tcp_addr).await,
                tls_connect(&pki, tls_addr, false, |s| s).await,
                tls_connect(&pki, tls_buffered_addr, true, |s| {
                    BufReader::with_capacity(READ_BUFFER, s)
                })
                .await,
                tunnel,
                client,
            )
        });

    let mut g = c.benchmark_group("bulk_64mib");
    g.throughput(Throughput::Bytes(BULK as u64));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(8));
    g.bench_function("tcp", |b| b.iter(|| rt.block_on(bulk(&mut tcp, &block))));
    g.bench_function("tls", |b| b.iter(|| rt.block_on(bulk(&mut tls, &block))));
    g.bench_function("tls_buffered", |b| {
        b.iter(|| rt.block_on(bulk(&mut tls_buffered, &block)))
    });
    g.bench_function("hbone", |b| {
        b.iter(|| {
            rt.block_on(async {
                // The zero-copy path: the same 1 MiB buffer handed over as `Bytes` each time.
                let send = hbone.send_half();
                for _ in 0..BULK / CHUNK {
                    send.send(shared.clone()).await.unwrap();
                }
                let mut ack = [0u8; 1];
                hbone.read_exact(&mut ack).await.unwrap();
            })
        })
    });
    g.bench_function("hbone_asyncwrite", |b| {
        b.iter(|| rt.block_on(bulk(&mut hbone, &block)))
    });
    g.finish();
}

async fn ping<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, msg: &[u8], buf: &mut [u8]) {
    s.write_all(msg).await.unwrap();
    s.flush().await.unwrap();
    s.read_exact(buf).await.unwrap();
}

fn bench_round_trip(c: &mut Criterion) {
    let ends = Ends::new();
    round_trip_group(c, "round_trip_1kib", &ends.client, &ends.server);
    // Both ends on one thread: no wake-ups across threads, so the figure is the CPU each
    // transport spends per round trip.
    let one = current_thread();
    round_trip_group(c, "round_trip_1kib_1thread", &one, one.handle());
}

fn round_trip_group(c: &mut Criterion, name: &str, rt: &Runtime, server: &Handle) {
    let pki = Pki::new();
    let hbone_addr = hbone_server(server, &pki);
    let tcp_addr = tcp_server(server, Peer::Echo);
    let tls_addr = tls_server(server, &pki, Peer::Echo, false);
    let (tcp, tls, hbone, _client) = setup(rt, "round-trip connects", async {
        let client = pki.client();
        let tunnel = client.open(target(hbone_addr, Peer::Echo)).await.unwrap();
        (
            tcp_connect(tcp_addr).await,
            tls_connect(&pki, tls_addr, false, |s| s).await,
            tunnel,
            client,
        )
    });
    let (mut tcp, mut tls, mut hbone) = (Some(tcp), Some(tls), Some(hbone));
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(1));
    g.bench_function("tcp", |b| {
        b.iter_custom(|iters| round_trips::<_, 1024>(rt, &mut tcp, iters))
    });
    g.bench_function("tls", |b| {
        b.iter_custom(|iters| round_trips::<_, 1024>(rt, &mut tls, iters))
    });
    g.bench_function("hbone", |b| {
        b.iter_custom(|iters| round_trips::<_, 1024>(rt, &mut hbone, iters))
    });
    g.finish();
}

/// Times `iters` round trips of `N` bytes made by a spawned task, as an application's
/// connection handler makes them. (A future run by `block_on` itself would pay for an extra
/// non-blocking `epoll_wait` each time another task wakes it, which no spawned task does.)
fn round_trips<S, const N: usize>(rt: &Runtime, slot: &mut Option<S>, iters: u64) -> Duration
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut stream = slot.take().expect("stream returned by the previous run");
    let (stream, elapsed) = rt.block_on(async move {
        tokio::spawn(async move {
            let msg = [7u8; N];
            let mut buf = [0u8; N];
            let start = std::time::Instant::now();
            for _ in 0..iters {
                ping(&mut stream, &msg, &mut buf).await;
            }
            (stream, start.elapsed())
        })
        .await
        .unwrap()
    });
    *slot = Some(stream);
    elapsed
}

/// Opens and drops `iters` tunnels to `server` one after the other in a spawned task, as a
/// node proxy's connection handler opens them, and returns the time they took. The target is
/// built once and cloned per tunnel, as a proxy clones the identities it holds parsed.
fn serial_opens(rt: &Runtime, client: &Client, server: SocketAddr, iters: u64) -> Duration {
    let client = client.clone();
    let target = port_target(server, DRAIN);
    rt.block_on(async move {
        tokio::spawn(async move {
            let start = std::time::Instant::now();
            for _ in 0..iters {
                drop(client.open(target.clone()).await.unwrap());
            }
            start.elapsed()
        })
        .await
        .unwrap()
    })
}

/// Tunnels opened at once by `tunnel_open/warm_x100`: as many as one pooled connection takes
/// (the client's default `max_streams_per_connection`).
const BURST: usize = 100;

/// Opens `BURST` tunnels at once on `client`'s pool, `iters` times, and returns the time they
/// took: the rate a node proxy reaches when many workload connections arrive together.
fn burst_opens(rt: &Runtime, client: &Client, server: SocketAddr, iters: u64) -> Duration {
    let client = client.clone();
    let target = port_target(server, DRAIN);
    rt.block_on(async move {
        tokio::spawn(async move {
            let start = std::time::Instant::now();
            for _ in 0..iters {
                let mut opens = tokio::task::JoinSet::new();
                for _ in 0..BURST {
                    let (client, target) = (client.clone(), target.clone());
                    opens.spawn(async move { client.open(target).await });
                }
                while let Some(opened) = opens.join_next().await {
                    drop(opened.unwrap().unwrap());
                }
            }
            start.elapsed()
        })
        .await
        .unwrap()
    })
}

fn bench_open(c: &mut Criterion) {
    let ends = Ends::new();
    open_group(c, "tunnel_open", &ends.client, &ends.server);
    // Both ends on one thread: no wake-ups across threads, so the figures are the CPU a warm
    // open costs, the two ends together.
    let one = current_thread();
    open_group(c, "tunnel_open_1thread", &one, one.handle());
}

/// Warm opens (one at a time, and `BURST` at once) beside a 1-byte round trip on an HBONE
/// connection between the same ends; cold opens beside TCP + TLS.
fn open_group(c: &mut Criterion, name: &str, rt: &Runtime, handle: &Handle) {
    let pki = Pki::new();
    let server = hbone_server(handle, &pki);
    // The round trips' tunnel is on a client of its own, so that all of the warm client's
    // connection is free for the opens (`BURST` of them fill it).
    let (warm, tunnel, _other) = setup(rt, "warm client's first tunnel", async {
        let client = pki.client();
        drop(client.open(target(server, Peer::Echo)).await.unwrap());
        let other = pki.client();
        let tunnel = other.open(target(server, Peer::Echo)).await.unwrap();
        (client, tunnel, other)
    });
    let mut tunnel = Some(tunnel);

    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(1));
    // CONNECT + 200 on the pooled connection, then the tunnel dropped (RST_STREAM).
    g.bench_function("warm", |b| {
        b.iter_custom(|iters| serial_opens(rt, &warm, server, iters))
    });
    // The least an exchange on an HBONE connection costs, the baseline of a warm open (one
    // exchange too).
    g.bench_function("round_trip_1b", |b| {
        b.iter_custom(|iters| round_trips::<_, 1>(rt, &mut tunnel, iters))
    });
    g.throughput(Throughput::Elements(BURST as u64));
    g.bench_function("warm_x100", |b| {
        b.iter_custom(|iters| burst_opens(rt, &warm, server, iters))
    });
    g.throughput(Throughput::Elements(1));
    assert_eq!(
        warm.connections_opened(),
        1,
        "{name}: the warm opens, a burst too, share one connection"
    );
    let svid = pki.ca.issue(id(CLIENT));
    let bundles = Arc::new(pki.ca.bundle_set());
    // TCP + TLS 1.3 handshake + HTTP/2 handshake + CONNECT + 200, with a new client each time.
    g.bench_function("cold", |b| {
        b.iter(|| rt.block_on(cold_open(&svid, &bundles, server)))
    });
    // Baselines for "cold": TCP + the same mutual-TLS handshake, nothing else (done once the
    // client has sent its Finished, before the server has checked the client's certificate);
    // and the same followed by a 1-byte round trip, done once the server has accepted the
    // client, as a cold tunnel is when its 200 arrives.
    let tls_config = Arc::new(pki.client_tls());
    let tls_listener = tls_echo_listener(handle, &pki);
    g.bench_function("tls_handshake", |b| {
        b.iter(|| rt.block_on(tls_handshake(&tls_config, tls_listener, false)))
    });
    g.bench_function("tls_handshake_rtt", |b| {
        b.iter(|| rt.block_on(tls_handshake(&tls_config, tls_listener, true)))
    });
    g.finish();
}

/// Opens one tunnel to `server` with a new client (TCP, TLS, HTTP/2 and CONNECT) and drops
/// it with its client.
async fn cold_open(
    svid: &meshkit_identity::X509Svid,
    bundles: &Arc<TrustBundleSet>,
    server: SocketAddr,
) {
    let config = ClientConfig::default()
        .with_h2(h2_settings())
        .with_tls(tls_settings());
    let client = Client::new(config, svid.clone(), bundles.clone());
    drop(client.open(port_target(server, DRAIN)).await.unwrap());
}

/// A mutual-TLS server on `handle` that echoes on every connection it accepts.
fn tls_echo_listener(handle: &Handle, pki: &Pki) -> SocketAddr {
    let (l, addr) = listener();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(pki.server_tls()));
    handle.spawn(async move {
        let listener = TcpListener::from_std(l).unwrap();
        loop {
            let (s, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(s).await {
                    let mut byte = [0u8; 1];
                    while let Ok(1) = tls.read(&mut byte).await {
                        if tls.write_all(&byte).await.is_err() || tls.flush().await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

/// TCP + a mutual-TLS handshake with `addr`, then one byte sent; with `confirm`, waits for
/// its echo.
async fn tls_handshake(config: &Arc<rustls::ClientConfig>, addr: SocketAddr, confirm: bool) {
    let s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(config.clone())
        .connect(
            rustls::pki_types::ServerName::IpAddress(addr.ip().into()),
            s,
        )
        .await
        .unwrap();
    tls.write_all(b"x").await.unwrap();
    if confirm {
        tls.flush().await.unwrap();
        tls.read_exact(&mut [0u8; 1]).await.unwrap();
    }
}

/// A target on the HBONE server `server` at `port`.
fn port_target(server: SocketAddr, port: u16) -> Target {
    Target::new(
        server,
        SocketAddr::from(([127, 0, 0, 1], port)),
        id(CLIENT),
        id(SERVER),
    )
}

/// Opens a tunnel on `client` whose server pushes `BULK` bytes, and reads them to the end as
/// HTTP/2 delivers them.
async fn pull_bulk(client: &Client, server: SocketAddr) {
    let tunnel = client.open(port_target(server, PUSH)).await.unwrap();
    let (mut recv, _send) = tunnel.into_split();
    let mut seen = 0;
    while let Some(chunk) = recv.chunk().await.unwrap() {
        seen += chunk.len();
    }
    assert_eq!(seen, BULK);
}

/// 64 MiB to the client through an eleventh tunnel whose connection carries ten stalled
/// tunnels (their server pushes, their client never reads), beside the baseline: the same
/// through a tunnel on a connection of its own.
fn bench_stalled_readers(c: &mut Criterion) {
    let ends = Ends::new();
    let (rt, handle) = (&ends.client, &ends.server);
    let pki = Pki::new();
    let server = hbone_server(handle, &pki);
    let (alone, shared, _stalled) = setup(rt, "stalled tunnels", async {
        let (alone, shared) = (pki.client(), pki.client());
        pull_bulk(&alone, server).await;
        let mut stalled = Vec::new();
        for _ in 0..10 {
            stalled.push(
                shared
                    .open(port_target(server, PUSH_FOREVER))
                    .await
                    .unwrap(),
            );
        }
        // Let the ten fill their stream windows.
        tokio::time::sleep(Duration::from_millis(500)).await;
        (alone, shared, stalled)
    });
    let mut g = c.benchmark_group("stalled_readers");
    g.throughput(Throughput::Bytes(BULK as u64));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(8));
    g.bench_function("none", |b| {
        b.iter(|| rt.block_on(pull_bulk(&alone, server)))
    });
    g.bench_function("ten_stalled", |b| {
        b.iter(|| rt.block_on(pull_bulk(&shared, server)))
    });
    g.finish();
    assert_eq!(
        shared.connections_opened(),
        1,
        "the eleventh shares the stalled connection"
    );
}

criterion_group!(
    benches,
    bench_throughput,
    bench_round_trip,
    bench_open,
    bench_stalled_readers
);

/// `HBONE_PROFILE_RTT=tls:N` or `hbone:N`: runs N 1 KiB round trips on one thread and exits,
/// without criterion, so that `valgrind --tool=callgrind` can count the instructions each
/// transport spends per round trip (see docs/performance.md); `open:N` opens and drops N
/// tunnels on a warm connection instead, `cold:N` N cold tunnels, `handshake:N` N TCP + TLS
/// handshakes each confirmed by a 1-byte round trip.
fn profile_round_trips(spec: &str) {
    let (kind, n) = spec.split_once(':').expect("HBONE_PROFILE_RTT=KIND:COUNT");
    let n: usize = n.parse().expect("a round-trip count");
    let rt = current_thread();
    let pki = Pki::new();
    let tls_addr = tls_server(rt.handle(), &pki, Peer::Echo, false);
    let hbone_addr = hbone_server(rt.handle(), &pki);
    let n = n as u64;
    match kind {
        "tls" => {
            let tls = setup(
                &rt,
                "TLS connect",
                tls_connect(&pki, tls_addr, false, |s| s),
            );
            round_trips::<_, 1024>(&rt, &mut Some(tls), n);
        }
        "hbone" => {
            let client = pki.client();
            let tunnel = setup(
                &rt,
                "tunnel open",
                client.open(target(hbone_addr, Peer::Echo)),
            )
            .unwrap();
            round_trips::<_, 1024>(&rt, &mut Some(tunnel), n);
        }
        "cold" => {
            let (svid, bundles) = (pki.ca.issue(id(CLIENT)), Arc::new(pki.ca.bundle_set()));
            rt.block_on(async {
                for _ in 0..n {
                    cold_open(&svid, &bundles, hbone_addr).await;
                }
            });
        }
        "handshake" => {
            let config = Arc::new(pki.client_tls());
            let addr = tls_echo_listener(rt.handle(), &pki);
            rt.block_on(async {
                for _ in 0..n {
                    tls_handshake(&config, addr, true).await;
                }
            });
        }
        "open" => {
            let client = pki.client();
            drop(
                setup(
                    &rt,
                    "first tunnel",
                    client.open(target(hbone_addr, Peer::Echo)),
                )
                .unwrap(),
            );
            serial_opens(&rt, &client, hbone_addr, n);
        }
        other => panic!("unknown transport {other}"),
    }
}

fn main() {
    if let Ok(spec) = std::env::var("HBONE_PROFILE_RTT") {
        profile_round_trips(&spec);
        return;
    }
    let run = Run::start();
    benches();
    Criterion::default().configure_from_args().final_summary();
    run.report_ratios(&[
        Ratio {
            group: "bulk_64mib",
            subject: "hbone",
            baseline: "tls",
        },
        Ratio {
            group: "bulk_64mib",
            subject: "hbone",
            baseline: "tls_buffered",
        },
        Ratio {
            group: "bulk_64mib",
            subject: "hbone_asyncwrite",
            baseline: "tls",
        },
        Ratio {
            group: "bulk_64mib",
            subject: "tls",
            baseline: "tcp",
        },
        Ratio {
            group: "round_trip_1kib",
            subject: "hbone",
            baseline: "tls",
        },
        Ratio {
            group: "round_trip_1kib_1thread",
            subject: "hbone",
            baseline: "tls",
        },
        Ratio {
            group: "tunnel_open",
            subject: "warm",
            baseline: "round_trip_1b",
        },
        Ratio {
            group: "tunnel_open_1thread",
            subject: "warm",
            baseline: "round_trip_1b",
        },
        Ratio {
            group: "tunnel_open",
            subject: "cold",
            baseline: "tls_handshake",
        },
        Ratio {
            group: "tunnel_open",
            subject: "cold",
            baseline: "tls_handshake_rtt",
        },
        Ratio {
            group: "tunnel_open_1thread",
            subject: "cold",
            baseline: "tls_handshake",
        },
        Ratio {
            group: "tunnel_open_1thread",
            subject: "cold",
            baseline: "tls_handshake_rtt",
        },
        Ratio {
            group: "stalled_readers",
            subject: "ten_stalled",
            baseline: "none",
        },
    ]);
}
