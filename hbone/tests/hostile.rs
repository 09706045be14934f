//! Hostile peers against the HBONE server, on loopback, each bounded in count and time: silent
//! peers before and after TLS, too many unauthenticated sockets from one source, rapid reset,
//! CONTINUATION flood, oversized headers, window starvation, a peer that never reads, resets
//! while the service decides, and stalled readers beside a working tunnel.
//!
//! Each test asserts that the server stays up, that honest traffic still flows, and, where a
//! peer could make the server hold memory, that the heap grows by less than a stated bound.
//! The heap is measured exactly by a counting global allocator (resident-set figures would
//! miss zeroed pages the kernel has not yet touched), so the memory tests run one at a time.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use meshkit_hbone::{ClientConfig, ConnectRequest, Decision, Forward, ServerConfig, decide_fn};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[global_allocator]
static ALLOC: meshkit_test_support::CountingAllocator = meshkit_test_support::CountingAllocator;

const MIB: isize = 1024 * 1024;

/// Bytes allocated and not yet freed, process-wide.
fn live_heap() -> isize {
    meshkit_test_support::CountingAllocator::live()
}

/// One test at a time: the heap counter is process-wide.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));
const OTHER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

/// An honest tunnel through `server` to the echo `backend`, with a fresh client (its own
/// connection), answered within a generous bound.
async fn honest_echo(pki: &Pki, server: SocketAddr, backend: SocketAddr) {
    let client = pki.client(CLIENT, ClientConfig::default());
    let t = meshkit_hbone::Target::new(server, backend, id(CLIENT), id(SERVER));
    let echoed = within("honest traffic beside the hostile peer", async {
        let tunnel = client.open(t).await.expect("honest tunnel opens");
        round_trip(tunnel, b"honest traffic").await
    })
    .await;
    assert_eq!(echoed, b"honest traffic");
}

/// An honest CONNECT from the loopback address `from`, over a raw h2 client.
async fn honest_echo_from(pki: &Pki, from: IpAddr, server: SocketAddr, backend: SocketAddr) {
    let echoed = within("honest traffic from another source", async {
        let tls = raw_tls_from(pki, from, server).await;
        let (send, _conn) = h2_over(&h2::client::Builder::new(), tls).await;
        let mut send = send.ready().await.unwrap();
        let (response, mut body) = send.send_request(connect_request(backend), false).unwrap();
        let response = response.await.unwrap();
        assert_eq!(response.status(), http::StatusCode::OK);
        body.send_data(Bytes::from_static(b"honest traffic"), true)
            .unwrap();
        let mut recv = response.into_body();
        let mut out = Vec::new();
        while let Some(chunk) = recv.data().await {
            let chunk = chunk.unwrap();
            let _ = recv.flow_control().release_capacity(chunk.len());
            out.extend_from_slice(&chunk);
        }
        out
    })
    .await;
    assert_eq!(echoed, b"honest traffic");
}

/// Waits until `read` on `sock` sees EOF or an error, for at most `within`; true if it did.
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(sock: &mut S, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    tokio::time::timeout(within, async {
        loop {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    })
    .await
    .is_ok()
}

// === Silent and slow peers (issue 12, items 2 and 3) ===

#[tokio::test]
async fn silent_peer_after_tls_is_closed_within_the_preface_timeout() {
    let _serial = SERIAL.lock().await;
    let pki = Pki::new();
    let backend = echo_backend().await;
    let config = ServerConfig::default()
        .with_preface_timeout(Duration::from_millis(300))
        .with_idle_timeout(Duration::from_secs(600));
    let server = start(&pki, config, Forward::new()).await;
    // TLS completes with a valid client certificate; then not a byte of HTTP/2.
    let mut silent = raw_tls(&pki, server.addr).await;
    assert!(
        closed_within(&mut silent, PATIENCE).await,
        "a peer silent after TLS is closed within the preface timeout"
    );
    // Half a preface is no better (slowloris after TLS).
    let mut slow = raw_tls(&pki, server.addr).await;
    slow.write_all(&frame::PREFACE[..10]).await.unwrap();
    slow.flush().await.unwrap();
    assert!(
        closed_within(&mut slow, PATIENCE).await,
        "half a preface is closed within the preface timeout"
    );
    // The preface without SETTINGS neither: SETTINGS is part of the client's preface.
    let mut no_settings = raw_tls(&pki, server.addr).await;
    no_settings.write_all(frame::PREFACE).await.unwrap();
    no_settings.flush().await.unwrap();
    assert!(
        closed_within(&mut no_settings, PATIENCE).await,
        "a preface without SETTINGS is closed within the preface timeout"
    );
    honest_echo(&pki, server.addr, backend).await;
}

#[tokio::test]
async fn connection_without_a_connect_is_closed_within_the_first_stream_timeout() {
    let _serial = SERIAL.lock().await;
    let pki = Pki::new();
    let backend = echo_backend().await;
    let config = ServerConfig::default()
        .with_first_stream_timeout(Duration::from_millis(300))
        .with_idle_timeout(Duration::from_secs(600));
    let server = start(&pki, config, Forward::new()).await;
    // A complete HTTP/2 handshake (preface, SETTINGS, PINGs answered), and no request.
    let tls = raw_tls(&pki, server.addr).await;
    let (_send, conn) = h2_over(&h2::client::Builder::new(), tls).await;
    within("the server ending a connection that opens no stream", conn)
        .await
        .unwrap()
        .ok();
    honest_echo(&pki, server.addr, backend).await;
}

#[tokio::test]
async fn unauthenticated_sockets_per_source_are_limited() {
    let _serial = SERIAL.lock().await;
    let pki = Pki::new();
    let backend = echo_backend().await;
    let config = ServerConfig::default()
        .with_handshake_timeout(Duration::from_secs(20))
        .with_max_handshakes_per_source(4);
    let server = start(&pki, config, Forward::new()).await;
    // Ten silent TCP sockets from 127.0.0.1: four wait in the TLS handshake, six are closed.
    let mut silent = Vec::new();
    for _ in 0..10 {
        silent.push(tcp_from(LOCAL, server.addr).await);
    }
    wait_until("the server refusing the six past the limit", || {
        server.stats.refused_per_source() >= 6
    })
    .await;
    // The six are closed by now; the four in the handshake stay open (for 20 s), which a
    // one-second look at each, all at once, shows.
    let mut looks = tokio::task::JoinSet::new();
    for mut sock in silent {
        looks.spawn(async move {
            let closed = closed_within(&mut sock, Duration::from_secs(1)).await;
            (sock, closed)
        });
    }
    let (mut silent, mut closed) = (Vec::new(), 0);
    while let Some(look) = looks.join_next().await {
        let (sock, was_closed) = look.unwrap();
        closed += usize::from(was_closed);
        silent.push(sock);
    }
    assert_eq!(
        closed, 6,
        "the sockets past the per-source limit are closed at once"
    );
    assert_eq!(server.stats.refused_per_source(), 6);
    // Another source is served all the while.
    honest_echo_from(&pki, OTHER, server.addr, backend).await;
    // A source whose handshakes complete frees its slots: 127.0.0.1 itself gets in once its
    // silent sockets are gone.
    drop(silent);
    wait_until("the server seeing the silent sockets go", || {
        server.stats.connections_open() == 0
    })
    .await;
    honest_echo(&pki, server.addr, backend).await;
}

#[tokio::test]
async fn no_read_buffer_is_allocated_before_tls() {
    let _serial = SERIAL.lock().await;
    let pki = Pki::new();
    let backend = echo_backend().await;
    let config = ServerConfig::default()
        .with_handshake_timeout(Duration::from_secs(20))
        .with_max_handshakes_per_source(1_000);
    let server = start(&pki, config, Forward::new()).await;
    let before = live_heap();
    let mut silent = Vec::new();
    for _ in 0..200 {
        silent.push(TcpStream::connect(server.addr).await.unwrap());
    }
    wait_until("the server accepting the 200 silent sockets", || {
        server.stats.connections_accepted() >= 200
    })
    .await;
    let grown = heap_after(before, Duration::from_millis(100)).await;
    // Bound: 32 KiB per silent socket (both ends' sockets, the connection task, rustls's
    // acceptor: about 12 KiB measured); a 64 KiB read buffer each would add 12.5 MiB.
    assert!(
        grown < 200 * 32 * 1024,
        "200 silent sockets hold {grown} bytes of heap"
    );
    drop(silent);
    honest_echo(&pki, server.addr, backend).await;
}

#[tokio::test]
async fn slowloris_before_tls_is_closed_by_the_handshake_timeout() {
    let _serial = SERIAL.lock().await;
    let pki = Pki::new();
    let backend = echo_backend().await;
    let config = ServerConfig::default().with_handshake_timeout(Duration::from_millis(300));
    let server = start(&pki, config, Forward::new()).await;
    // A ClientHello record header, then one byte at a time.
    let mut slow = TcpStream::connect(server.addr).await.unwrap();
    // Nine bytes 100 ms apart outlast the 300 ms timeout however slow the machine is.
    within("the server cutting a trickling ClientHello", async {
        for b in [0x16u8, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc] {
            if slow.write_all(&[b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut buf = [0u8; 64];
        let _ = slow.read(&mut buf).await;
    })
    .await;
    wait_until("the server counting the timed-out handshake", || {
        server.stats.handshake_failures() >= 1
    })
    .await;
    assert_eq!(server.stats.handshake_failures(), 1);
    honest_echo(&pki, server.addr, backend).await;
}

// === Resets while the service decides (issue 12, item 5) ===

/// Sets its flag when dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_reset_after_the_connect_cancels_the_service() {
    let _serial = SERIAL.lock().await;
    let pki = Pki::new();
    let backend = echo_backend().await;
    let cancelled = Arc::new(AtomicBool::new(false));
    let flag = cancelled.clone();
    let forward = Forward::new();
    let (deciding_tx, mut deciding) = tokio::sync::mpsc::unbounded_channel::<()>();
    // Port 1: a service that takes a minute to decide (an upstream dial that hangs).
    let service = decide_fn(move |req: ConnectRequest| {
        let flag = flag.clone();
        let mut forward = forward.clone();
        let deciding_tx = deciding_tx.clone();
        async move {
            if req.target.port() == 1 {
                let _guard = DropFlag(flag);
                let _ = deciding_tx.send(());
                tokio::time::sleep(Duration::from_secs(60)).await;
                Decision::refuse(http::StatusCode::GATEWAY_TIMEOUT)
            } else {
                tower::Service::call(&mut forward, req).await.unwrap()
            }
        }
    });
    let server = start(&pki, ServerConfig::default(), service).await;
    let tls = raw_tls(&pki, server.addr).await;
    let (send, _conn) = h2_over(&h2::client::Builder::new(), tls).await;
    let mut send = send.ready().await.unwrap();
    let (_response, mut stream) = send
        .send_request(connect_request("127.0.0.1:1".parse().unwrap()), false)
        .unwrap();
    within("the service starting to decide", deciding.recv())
        .await
        .unwrap();
    assert!(!cancelled.load(Ordering::SeqCst), "the service is deciding");
    stream.send_reset(h2::Reason::CANCEL);
    wait_until("the peer's reset cancelling the service's future", || {
        cancelled.load(Ordering::SeqCst)
    })
    .await;
    honest_echo(&pki, server.addr, backend).await;
}

// === Memory a peer can pin, and stalled readers (issue 12, items 5 and 6) ===

/// What the pushing services write, from one static buffer: the tunnel copies only what it is
/// allowed to send, so what the server holds is what HTTP/2 and TLS hold.
static ZEROS: [u8; 1024 * 1024] = [0u8; 1024 * 1024];

/// A service whose tunnels to port 1 push zeros until the stream fails (counting in `pushed`
/// the MiB handed over), to port 2 push `PUSH_BYTES` and finish, and to other ports forward.
fn pushing_service(
    pushed: Arc<std::sync::atomic::AtomicUsize>,
) -> impl tower::Service<
    ConnectRequest,
    Response = Decision,
    Error = std::convert::Infallible,
    Future = meshkit_hbone::BoxFuture<'static, Result<Decision, std::convert::Infallible>>,
> + Clone
+ Send
+ Sync
+ 'static {
    let forward = Forward::new();
    decide_fn(move |req: ConnectRequest| {
        let mut forward = forward.clone();
        let pushed = pushed.clone();
        async move {
            match req.target.port() {
                1 => Decision::accept(|mut tunnel| async move {
                    while tunnel.write_all(&ZEROS).await.is_ok() {
                        pushed.fetch_add(1, Ordering::SeqCst);
                    }
                }),
                2 => Decision::accept(|mut tunnel| async move {
                    for _ in 0..PUSH_BYTES / ZEROS.len() {
                        if tunnel.write_all(&ZEROS).await.is_err() {
                            return;
                        }
                    }
                    let _ = tunnel.shutdown().await;
                }),
                _ => tower::Service::call(&mut forward, req).await.unwrap(),
            }
        }
    })
}

const PUSH_BYTES: usize = 64 * 1024 * 1024;

/// A raw client over TLS that sends `frames` after the preface and its SETTINGS, then never
/// reads its socket again. Returns the socket, kept open.
async fn never_reading_peer(
    pki: &Pki,
    server: SocketAddr,
    settings: &[(u16, u32)],
    frames: Vec<u8>,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut tls = raw_tls(pki, server).await;
    let mut out = frame::PREFACE.to_vec();
    out.extend(frame::settings(settings));
    out.extend(frames);
    tls.write_all(&out).await.unwrap();
    tls.flush().await.unwrap();
    tls
}

/// HEADERS frames opening `n` CONNECT streams (1, 3, 5, ...) to `authority`.
fn connects(n: u32, authority: &str) -> Vec<u8> {
    let block = frame::connect_block(authority);
    (0..n)
        .flat_map(|i| frame::frame(frame::HEADERS, frame::END_HEADERS, 2 * i + 1, &block))
        .collect()
}

/// Waits `settle`, then returns the heap growth since `before`.
async fn heap_after(before: isize, settle: Duration) -> isize {
    tokio::time::sleep(settle).await;
    let grown = live_heap() - before;
    eprintln!("heap grew by {} KiB", grown / 1024);
    grown
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_reads_pins_only_the_connection_send_budget() {
    let _serial = SERIAL.lock().await;
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(
        &pki,
        ServerConfig::default(),
        pushing_service(Arc::default()),
    )
    .await;
    let before = live_heap();
    // 200 streams, every window as large as HTTP/2 allows, and the socket never read: without
    // a connection budget each stream would queue its 1 MiB send buffer (200 MiB).
    let mut frames = frame::frame(
        frame::WINDOW_UPDATE,
        0,
        0,
        &(0x7fff_ffffu32 - 65_535).to_be_bytes(),
    );
    frames.extend(connects(200, "127.0.0.1:1"));
    let _peer = never_reading_peer(&pki, server.addr, &[(0x4, 0x7fff_ffff)], frames).await;
    wait_until("the server accepting the 200 streams", || {
        server.stats.streams() >= 200
    })
    .await;
    // Then the pushers fill what they may.
    let grown = heap_after(before, Duration::from_secs(2)).await;
    // Bound: the 16 MiB budget, rustls's 256 KiB, and the streams' state; 48 MiB leaves room.
    assert!(
        grown < 48 * MIB,
        "a never-reading peer with 200 streams pins {} MiB",
        grown / MIB
    );
    assert_eq!(server.stats.streams(), 200, "every stream was accepted");
    honest_echo(&pki, server.addr, backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_stalled_readers_leave_an_eleventh_tunnel_moving() {
    let _serial = SERIAL.lock().await;
    let pki = Pki::new();
    let pushed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let server = start(
        &pki,
        ServerConfig::default(),
        pushing_service(pushed.clone()),
    )
    .await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let to = |port: u16| {
        meshkit_hbone::Target::new(
            server.addr,
            SocketAddr::from(([127, 0, 0, 1], port)),
            id(CLIENT),
            id(SERVER),
        )
    };
    // Ten tunnels whose server pushes and whose client never reads, until each has filled its
    // 4 MiB stream window (the tunnel hands HTTP/2 only what flow control allows).
    let mut stalled = Vec::new();
    for _ in 0..10 {
        stalled.push(client.open(to(1)).await.unwrap());
    }
    wait_until("ten stalled tunnels filling their windows", || {
        pushed.load(Ordering::SeqCst) >= 10 * 4
    })
    .await;
    // The eleventh, on the same connection, receives 64 MiB.
    let moved = tokio::time::timeout(PATIENCE, async {
        let mut t = client.open(to(2)).await.unwrap();
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0;
        loop {
            match t.read(&mut buf).await.unwrap() {
                0 => return total,
                n => total += n,
            }
        }
    })
    .await
    .expect("the eleventh tunnel is not held up by the ten stalled ones");
    assert_eq!(moved, PUSH_BYTES);
    assert_eq!(client.connections_opened(), 1, "all on one connection");
    drop(stalled);
}

// === Hostile HTTP/2 (the continuous checks of issue 12) ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapid_reset_leaves_the_server_serving() {
    let _serial = SERIAL.lock().await;
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let before = live_heap();
    // Open and reset 5,000 streams as fast as h2 lets us, on one connection.
    let tls = raw_tls(&pki, server.addr).await;
    let (send, conn) = h2_over(&h2::client::Builder::new(), tls).await;
    let flood = tokio::time::timeout(PATIENCE, async move {
        let mut send = send;
        for _ in 0..5_000 {
            send = match send.ready().await {
                Ok(send) => send,
                Err(_) => return, // the server gave up on us: fine
            };
            match send.send_request(connect_request(backend), false) {
                Ok((_response, mut stream)) => stream.send_reset(h2::Reason::CANCEL),
                Err(_) => return,
            }
        }
    })
    .await;
    assert!(flood.is_ok(), "the flood ends (served or refused) in time");
    honest_echo(&pki, server.addr, backend).await;
    conn.abort();
    let grown = heap_after(before, Duration::from_millis(500)).await;
    assert!(grown < 16 * MIB, "rapid reset left {} MiB", grown / MIB);
}

#[tokio::test]
async fn continuation_flood_is_cut_off() {
    let _serial = SERIAL.lock().await;
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let before = live_heap();
    let tls = raw_tls(&pki, server.addr).await;
    let (mut reader, mut writer) = tokio::io::split(tls);
    // HEADERS without END_HEADERS, then up to 64 MiB of CONTINUATION that never ends it.
    let flood = tokio::spawn(async move {
        let mut out = frame::PREFACE.to_vec();
        out.extend(frame::settings(&[]));
        let mut block = frame::connect_block("127.0.0.1:9");
        frame::literal(&mut block, b"x-pad", &[b'a'; 100]);
        out.extend(frame::frame(frame::HEADERS, 0, 1, &block));
        if writer.write_all(&out).await.is_err() {
            return;
        }
        let mut junk = Vec::new();
        while junk.len() < 16_000 {
            frame::literal(&mut junk, b"x-flood", &[b'b'; 200]);
        }
        let continuation = frame::frame(frame::CONTINUATION, 0, 1, &junk);
        for _ in 0..4_096 {
            if writer.write_all(&continuation).await.is_err() {
                return;
            }
        }
    });
    assert!(
        closed_within(&mut reader, PATIENCE).await,
        "the server closes a connection that floods CONTINUATION"
    );
    flood.abort();
    honest_echo(&pki, server.addr, backend).await;
    let grown = heap_after(before, Duration::from_millis(200)).await;
    assert!(
        grown < 8 * MIB,
        "CONTINUATION flood left {} MiB",
        grown / MIB
    );
}

#[tokio::test]
async fn oversized_headers_are_refused_without_harm() {
    let _serial = SERIAL.lock().await;
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let before = live_heap();
    // A CONNECT carrying 1 MiB of headers (the limit is 64 KiB), in HEADERS + CONTINUATION.
    let mut block = frame::connect_block("127.0.0.1:9");
    for i in 0..1024 {
        frame::literal(&mut block, format!("x-big-{i}").as_bytes(), &[b'c'; 1000]);
    }
    let mut frames = Vec::new();
    let pieces: Vec<&[u8]> = block.chunks(16_000).collect();
    for (i, piece) in pieces.iter().enumerate() {
        let kind = if i == 0 {
            frame::HEADERS
        } else {
            frame::CONTINUATION
        };
        let flags = if i + 1 == pieces.len() {
            frame::END_HEADERS
        } else {
            0
        };
        frames.extend(frame::frame(kind, flags, 1, piece));
    }
    let mut tls = raw_tls(&pki, server.addr).await;
    let mut out = frame::PREFACE.to_vec();
    out.extend(frame::settings(&[]));
    out.extend(frames);
    let (mut reader, mut writer) = tokio::io::split(&mut tls);
    // The server answers (431, RST_STREAM or GOAWAY) or closes; it never opens a tunnel. (It
    // reads the whole 1 MiB or closes, so the write ends too.)
    within("the server's answer to oversized headers", async {
        let write = async {
            // The server may close before it has read it all.
            let _ = writer.write_all(&out).await;
        };
        tokio::join!(write, async {
            let mut buf = vec![0u8; 64 * 1024];
            let _ = reader.read(&mut buf).await;
        })
    })
    .await;
    assert_eq!(server.stats.streams(), 0, "no request reached the service");
    honest_echo(&pki, server.addr, backend).await;
    let grown = heap_after(before, Duration::from_millis(200)).await;
    assert!(
        grown < 8 * MIB,
        "oversized headers left {} MiB",
        grown / MIB
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_starvation_holds_no_data() {
    let _serial = SERIAL.lock().await;
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(
        &pki,
        ServerConfig::default(),
        pushing_service(Arc::default()),
    )
    .await;
    let before = live_heap();
    // A peer that advertises zero stream windows, never gives credit, and opens 500 tunnels
    // whose server side wants to push without end.
    let tls = raw_tls(&pki, server.addr).await;
    let mut builder = h2::client::Builder::new();
    builder.initial_window_size(0);
    let (send, _conn) = h2_over(&builder, tls).await;
    let (_send, responses, _streams) = within("500 streams opened", async move {
        let (mut send, mut responses, mut streams) = (send, Vec::new(), Vec::new());
        for _ in 0..500 {
            send = send.ready().await.unwrap();
            let (response, stream) = send
                .send_request(connect_request("127.0.0.1:1".parse().unwrap()), false)
                .unwrap();
            responses.push(response);
            streams.push(stream);
        }
        (send, responses, streams)
    })
    .await;
    let mut bodies = Vec::new();
    for response in responses {
        let response = within("the answer to a starved stream", response)
            .await
            .unwrap();
        assert_eq!(response.status(), http::StatusCode::OK);
        // Kept, never read: the streams stay open with no credit.
        bodies.push(response.into_body());
    }
    let grown = heap_after(before, Duration::from_secs(1)).await;
    // Nothing can be sent, so nothing is buffered: the streams' state only.
    assert!(
        grown < 24 * MIB,
        "500 starved streams hold {} MiB",
        grown / MIB
    );
    honest_echo(&pki, server.addr, backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_send_budget_comes_back_after_resets_and_ends() {
    let _serial = SERIAL.lock().await;
    let pki = Pki::new();
    // A 2 MiB budget: a few leaked streams' worth would stop the connection.
    let h2 = meshkit_hbone::H2Settings::default().with_send_buffers(1024 * 1024, 2 * 1024 * 1024);
    let server = start(
        &pki,
        ServerConfig::default().with_h2(h2),
        pushing_service(Arc::default()),
    )
    .await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let to = |port: u16| {
        meshkit_hbone::Target::new(
            server.addr,
            SocketAddr::from(([127, 0, 0, 1], port)),
            id(CLIENT),
            id(SERVER),
        )
    };
    // Fifty tunnels cut by the client mid-push (RST_STREAM CANCEL while the server has data
    // queued), then two that run to their end, 64 MiB each.
    let moved = tokio::time::timeout(PATIENCE, async {
        for _ in 0..50 {
            let mut t = client.open(to(1)).await.unwrap();
            let mut buf = vec![0u8; 64 * 1024];
            t.read_exact(&mut buf).await.unwrap();
            drop(t);
        }
        for _ in 0..2 {
            let mut t = client.open(to(2)).await.unwrap();
            let mut sink = tokio::io::sink();
            assert_eq!(
                tokio::io::copy(&mut t, &mut sink).await.unwrap(),
                PUSH_BYTES as u64
            );
        }
    })
    .await;
    assert!(moved.is_ok(), "the connection's send budget was given back");
    assert_eq!(client.connections_opened(), 1);
}
