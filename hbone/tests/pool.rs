//! The client's connection pool, counted in TCP connections actually opened.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use meshkit_hbone::{ClientConfig, Forward, ServerConfig, Target};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn target(server: SocketAddr, destination: SocketAddr) -> Target {
    Target::new(server, destination, id(CLIENT), id(SERVER))
}

#[tokio::test]
async fn sequential_tunnels_share_one_connection() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let client = pki.client(CLIENT, ClientConfig::default());
    for i in 0..10 {
        let t = client.open(target(server.addr, backend)).await.unwrap();
        let msg = format!("n{i}");
        assert_eq!(round_trip(t, msg.as_bytes()).await, msg.as_bytes());
    }
    assert_eq!(client.connections_opened(), 1);
    assert_eq!(server.stats.connections_accepted(), 1);
    assert_eq!(server.stats.streams(), 10);
}

#[tokio::test]
async fn stream_limit_opens_another_connection() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let client = pki.client(
        CLIENT,
        ClientConfig::default().with_max_streams_per_connection(3),
    );
    let mut held = Vec::new();
    for _ in 0..7 {
        held.push(client.open(target(server.addr, backend)).await.unwrap());
    }
    // 3 + 3 + 1.
    assert_eq!(client.connections_opened(), 3);
    assert_eq!(server.stats.connections_accepted(), 3);
    // Freed slots are reused before anything new is opened.
    held.truncate(2);
    for _ in 0..5 {
        held.push(client.open(target(server.addr, backend)).await.unwrap());
    }
    assert_eq!(client.connections_opened(), 3);
    for t in held.iter_mut() {
        t.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        within("an echo on a held tunnel", t.read_exact(&mut b))
            .await
            .unwrap();
        assert_eq!(&b, b"x");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_requests_share_one_handshake() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.open(target(server.addr, backend)).await.unwrap() })
        })
        .collect();
    let held = within("50 concurrent first tunnels", async {
        let mut held = Vec::new();
        for t in tasks {
            held.push(t.await.unwrap());
        }
        held
    })
    .await;
    assert_eq!(held.len(), 50);
    assert_eq!(client.connections_opened(), 1, "no connection storm");
    assert_eq!(server.stats.connections_accepted(), 1);
}

#[tokio::test]
async fn different_keys_get_different_connections() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let _a = client.open(target(server.addr, backend)).await.unwrap();
    // Same local identity and address, another set of acceptable peers: another key.
    let wider =
        target(server.addr, backend).or_peer_identity(id("spiffe://cluster.local/ns/x/sa/y"));
    let _b = client.open(wider).await.unwrap();
    // Another destination through the same peer shares the connection.
    let _c = client
        .open(target(server.addr, "127.0.0.1:7".parse().unwrap()))
        .await
        .err();
    assert_eq!(client.connections_opened(), 2);
}

#[tokio::test]
async fn a_tunnel_from_a_source_address_leaves_from_it_and_is_pooled_by_it() {
    // What the peer sees: a plain listener in its place records the connection's source.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let pki = Pki::new();
    let client = pki.client(CLIENT, ClientConfig::default());
    let source: std::net::IpAddr = "127.0.0.3".parse().unwrap();
    let opening = tokio::spawn({
        let client = client.clone();
        async move { client.open(target(addr, addr).from_source(source)).await }
    });
    let (sock, from) = within("the connection", listener.accept()).await.unwrap();
    assert_eq!(from.ip(), source);
    drop(sock);
    assert!(opening.await.unwrap().is_err(), "no HBONE server there");

    // Through a real server: one connection per source, shared by that source's tunnels.
    let backend = echo_backend().await;
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let from = |ip: &str| target(server.addr, backend).from_source(ip.parse().unwrap());
    let a = client.open(from("127.0.0.2")).await.unwrap();
    assert_eq!(round_trip(a, b"a").await, b"a");
    let b = client.open(from("127.0.0.3")).await.unwrap();
    assert_eq!(round_trip(b, b"b").await, b"b");
    let again = client.open(from("127.0.0.2")).await.unwrap();
    assert_eq!(round_trip(again, b"c").await, b"c");
    assert_eq!(server.stats.connections_accepted(), 2);
}

/// In memory and on paused time: the 200 ms idle timeouts below are exact.
#[tokio::test(start_paused = true)]
async fn a_connection_the_server_closes_when_idle_leaves_the_pool() {
    let pki = Pki::new();
    // The server sends GOAWAY to connections idle for 200 ms, then closes them.
    let (stats, client) = in_memory(
        &pki,
        ServerConfig::default().with_idle_timeout(Duration::from_millis(200)),
        echo_service(),
        ClientConfig::default(),
    );
    let addr: SocketAddr = "127.0.0.1:15008".parse().unwrap();
    let to = || target(addr, "127.0.0.1:1".parse().unwrap());
    let t = client.open(to()).await.unwrap();
    assert_eq!(round_trip(t, b"one").await, b"one");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        client.pooled_connections(),
        1,
        "not idle for long enough yet"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        client.pooled_connections(),
        0,
        "closed connection left the pool"
    );
    assert_eq!(stats.connections_open(), 0);
    let t = client.open(to()).await.unwrap();
    assert_eq!(round_trip(t, b"two").await, b"two");
    assert_eq!(client.connections_opened(), 2);
}

/// In memory and on paused time: a connection whose tunnel stays open past the server's idle
/// timeout is not idle; once the tunnel ends it is closed one idle timeout later, measured
/// from the tunnel's end and not from when the server last looked.
#[tokio::test(start_paused = true)]
async fn the_server_idle_timeout_counts_from_the_last_tunnel_end() {
    let pki = Pki::new();
    let (stats, client) = in_memory(
        &pki,
        ServerConfig::default().with_idle_timeout(Duration::from_millis(200)),
        echo_service(),
        ClientConfig::default(),
    );
    let addr: SocketAddr = "127.0.0.1:15008".parse().unwrap();
    let mut t = client
        .open(target(addr, "127.0.0.1:1".parse().unwrap()))
        .await
        .unwrap();
    // Busy for 650 ms: three idle periods and more, each looked at and found busy.
    for _ in 0..13 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        t.write_all(b"x").await.unwrap();
        let mut b = [0u8; 1];
        t.read_exact(&mut b).await.unwrap();
    }
    assert_eq!(stats.connections_open(), 1, "busy connections stay");
    drop(t);
    // The server last looked at 600 ms (busy) and set itself for 800 ms; the tunnel ended at
    // 650 ms, so the connection closes at 850 ms, not at 800.
    tokio::time::sleep(Duration::from_millis(190)).await;
    assert_eq!(
        stats.connections_open(),
        1,
        "idle for 190 ms only: the timeout counts from the tunnel's end"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(stats.connections_open(), 0, "idle for 210 ms: closed");
    assert_eq!(client.pooled_connections(), 0);
}

/// In memory and on paused time: the 200 ms idle timeout is exact.
#[tokio::test(start_paused = true)]
async fn idle_connections_are_closed_by_the_client() {
    let pki = Pki::new();
    let (stats, client) = in_memory(
        &pki,
        ServerConfig::default(),
        echo_service(),
        ClientConfig::default().with_idle_timeout(Duration::from_millis(200)),
    );
    let addr: SocketAddr = "127.0.0.1:15008".parse().unwrap();
    let t = client
        .open(target(addr, "127.0.0.1:1".parse().unwrap()))
        .await
        .unwrap();
    // Busy connections are not idle, however long the tunnel lives.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(client.pooled_connections(), 1);
    assert_eq!(round_trip(t, b"x").await, b"x");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        client.pooled_connections(),
        1,
        "not idle for long enough yet"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(client.pooled_connections(), 0);
    wait_until("the server seeing the idle connection close", || {
        stats.connections_open() == 0
    })
    .await;
}

#[tokio::test]
async fn dead_server_connection_is_replaced() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let first = start_on(
        &pki,
        listener,
        ServerConfig::default(),
        Forward::new(),
        Duration::ZERO,
    )
    .await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let t = client.open(target(addr, backend)).await.unwrap();
    assert_eq!(round_trip(t, b"before").await, b"before");

    // The server process dies: its connections are dropped without GOAWAY.
    first.task.abort();
    let _ = first.task.await;
    wait_until("the dead server's connections closing", || {
        first.stats.connections_open() == 0
    })
    .await;

    let listener = TcpListener::bind(addr).await.unwrap();
    let _second = start_on(
        &pki,
        listener,
        ServerConfig::default(),
        Forward::new(),
        Duration::ZERO,
    )
    .await;
    let t = client.open(target(addr, backend)).await.unwrap();
    assert_eq!(round_trip(t, b"after").await, b"after");
    assert_eq!(client.connections_opened(), 2);
}

/// A transport whose server end can be frozen: once frozen, it neither reads nor writes.
mod freeze {
    use std::pin::Pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Context, Poll};

    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

    pub(crate) struct Freezable<T> {
        pub(crate) io: T,
        pub(crate) frozen: Arc<AtomicBool>,
    }

    impl<T: AsyncRead + Unpin> AsyncRead for Freezable<T> {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            if self.frozen.load(Ordering::SeqCst) {
                return Poll::Pending;
            }
            Pin::new(&mut self.io).poll_read(cx, buf)
        }
    }

    impl<T: AsyncWrite + Unpin> AsyncWrite for Freezable<T> {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            if self.frozen.load(Ordering::SeqCst) {
                return Poll::Pending;
            }
            Pin::new(&mut self.io).poll_write(cx, buf)
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.io).poll_flush(cx)
        }
        fn poll_shutdown(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<std::io::Result<()>> {
            Pin::new(&mut self.io).poll_shutdown(cx)
        }
    }
}

#[tokio::test(start_paused = true)]
async fn keepalive_detects_a_peer_that_stops_answering() {
    use meshkit_hbone::{Client, Connect, H2Settings, Server};
    use meshkit_identity::{Authorize, SingleIdentity};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    /// Hands out one end of an in-memory pipe.
    #[derive(Clone)]
    struct Pipe(Arc<Mutex<Option<tokio::io::DuplexStream>>>);
    impl Connect for Pipe {
        type Io = tokio::io::DuplexStream;
        fn connect(
            &self,
            _addr: SocketAddr,
        ) -> meshkit_hbone::BoxFuture<'static, std::io::Result<Self::Io>> {
            let io = self.0.lock().unwrap().take();
            Box::pin(async move { io.ok_or_else(|| std::io::Error::other("used")) })
        }
    }

    let pki = Pki::new();
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let frozen = Arc::new(AtomicBool::new(false));
    let server_io = freeze::Freezable {
        io: server_io,
        frozen: frozen.clone(),
    };
    let server = Server::new(
        ServerConfig::default(),
        SingleIdentity::new(pki.server_tls(SERVER, Authorize::AnyTrusted)),
        Forward::new(),
    );
    let addr: SocketAddr = "127.0.0.1:15008".parse().unwrap();
    let _serving =
        tokio::spawn(async move { server.serve_connection(server_io, addr, addr).await });
    let h2 = H2Settings::default().with_keepalive(Duration::from_secs(10), Duration::from_secs(20));
    let client = Client::with_connector(
        // Idle closing is not what this test is about.
        ClientConfig::default()
            .with_h2(h2)
            .with_idle_timeout(Duration::from_secs(3600)),
        Pipe(Arc::new(Mutex::new(Some(client_io)))),
        pki.ca.issue(id(CLIENT)),
        pki.ca.bundle_set(),
    );
    // Nothing listens on port 9 (503): only the connection matters here.
    let refused = client
        .open(target(addr, "127.0.0.1:9".parse().unwrap()))
        .await;
    assert!(refused.is_err());
    assert_eq!(client.pooled_connections(), 1);

    // PINGs are answered while the server runs.
    tokio::time::sleep(Duration::from_secs(45)).await;
    assert_eq!(client.pooled_connections(), 1, "a live peer is kept");

    // The server end stops reading and writing, as a black-holed connection does.
    frozen.store(true, Ordering::SeqCst);
    // The first unanswered PING goes out within one interval; it times out 20 s later.
    tokio::time::sleep(Duration::from_secs(19)).await;
    assert_eq!(
        client.pooled_connections(),
        1,
        "not before the PING timeout"
    );
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(
        client.pooled_connections(),
        0,
        "dead connection left the pool"
    );
}

// === What the pool does with GOAWAY and REFUSED_STREAM, against a server that is not meshkit's ===

/// What the first connection of the GOAWAY test sends on its open stream once its GOAWAY is
/// queued: frames leave in order, so a client that reads this has processed the GOAWAY.
const AFTER_GOAWAY: &[u8] = b"GOAWAY sent\n";

/// Serves connection 0 of the GOAWAY test: answers its first stream with 200, sends GOAWAY
/// when `goaway` fires, then [`AFTER_GOAWAY`] on the open stream, echoes it to its end, and
/// counts in `late` any stream opened after the GOAWAY. `closed` fires when the connection
/// has ended.
async fn goaway_connection<IO>(
    io: IO,
    goaway: tokio::sync::oneshot::Receiver<()>,
    late: Arc<AtomicUsize>,
    closed: tokio::sync::oneshot::Sender<()>,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let mut conn = h2::server::handshake(io).await.unwrap();
    let (request, mut respond) = conn.accept().await.unwrap().unwrap();
    let (sent_tx, sent_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut send = respond
            .send_response(http::Response::new(()), false)
            .unwrap();
        if sent_rx.await.is_err() {
            return;
        }
        if send
            .send_data(Bytes::from_static(AFTER_GOAWAY), false)
            .is_err()
        {
            return;
        }
        let mut body = request.into_body();
        while let Some(Ok(chunk)) = body.data().await {
            let _ = body.flow_control().release_capacity(chunk.len());
            if send.send_data(chunk, false).is_err() {
                return;
            }
        }
        let _ = send.send_data(Bytes::new(), true);
    });
    let mut goaway = std::pin::pin!(async move {
        let _ = goaway.await;
    });
    let mut sent_tx = Some(sent_tx);
    loop {
        tokio::select! {
            () = &mut goaway, if sent_tx.is_some() => {
                conn.graceful_shutdown();
                let _ = sent_tx.take().unwrap().send(());
            }
            next = conn.accept() => match next {
                Some(Ok(_)) => {
                    late.fetch_add(1, Ordering::SeqCst);
                }
                Some(Err(_)) | None => break,
            },
        }
    }
    let _ = closed.send(());
}

/// GOAWAY alone: the server sends it while a tunnel is open and keeps the connection up for
/// that tunnel. The open tunnel finishes byte-exact on its connection; the same client's next
/// tunnel goes over a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_lets_the_open_tunnel_finish_and_sends_the_next_over_a_new_connection() {
    let pki = Pki::new();
    let (goaway_tx, goaway_rx) = tokio::sync::oneshot::channel::<()>();
    let (closed_tx, mut closed_rx) = tokio::sync::oneshot::channel::<()>();
    let first = Arc::new(std::sync::Mutex::new(Some((goaway_rx, closed_tx))));
    let late = Arc::new(AtomicUsize::new(0));
    let later_streams = Arc::new(AtomicUsize::new(0));
    let (late_in, later_in) = (late.clone(), later_streams.clone());
    let server = raw_server(&pki, move |n, tls| {
        let first = first.lock().unwrap().take();
        let (late, later) = (late_in.clone(), later_in.clone());
        async move {
            match (n, first) {
                (0, Some((goaway, closed))) => goaway_connection(tls, goaway, late, closed).await,
                _ => h2_echo_connection(tls, later).await,
            }
        }
    })
    .await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let destination = "127.0.0.1:1".parse().unwrap();
    let mut open = client.open(target(server.addr, destination)).await.unwrap();

    goaway_tx.send(()).unwrap();
    let mut marker = vec![0u8; AFTER_GOAWAY.len()];
    within(
        "the data sent after the GOAWAY",
        open.read_exact(&mut marker),
    )
    .await
    .unwrap();
    assert_eq!(marker, AFTER_GOAWAY);

    // The next tunnel of the same client: on a new connection, which works.
    let next = within(
        "the tunnel opened after the GOAWAY",
        client.open(target(server.addr, destination)),
    )
    .await
    .expect("a GOAWAY of a pooled connection sends the next tunnel to a new one");
    assert_eq!(round_trip(next, b"next").await, b"next");
    assert!(
        matches!(
            closed_rx.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty)
        ),
        "the first connection is still up: GOAWAY alone, no close"
    );
    assert_eq!(server.accepted(), 2, "a second connection was made");
    assert_eq!(client.connections_opened(), 2);
    let peers = server.peers.lock().unwrap().clone();
    assert_ne!(peers[0], peers[1], "from another client port");
    assert_eq!(
        later_streams.load(Ordering::SeqCst),
        1,
        "on the new connection"
    );
    assert_eq!(
        late.load(Ordering::SeqCst),
        0,
        "no stream opened on the connection after its GOAWAY"
    );

    // The tunnel open at the GOAWAY finishes on its connection, every byte in order.
    const SENT: usize = 1024 * 1024 + 7;
    let payload = meshkit_test_support::pattern(SENT);
    let echoed = round_trip(&mut open, &payload).await;
    assert!(
        echoed.len() == SENT && echoed == payload,
        "{} bytes of {SENT} back",
        echoed.len()
    );
    drop(open);
    within(
        "the end of the first connection once its tunnel ended",
        closed_rx,
    )
    .await
    .unwrap();
    assert_eq!(server.accepted(), 2);
}

/// A connection whose streams `refuse` says to refuse with RST_STREAM(REFUSED_STREAM) (by
/// their index on the connection, from 0), and echoes the others. Counts the streams it saw.
async fn refusing_connection<IO>(
    io: IO,
    refuse: impl Fn(usize) -> bool + Send + 'static,
    streams: Arc<AtomicUsize>,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Ok(mut conn) = h2::server::handshake(io).await else {
        return;
    };
    let mut i = 0;
    while let Some(Ok((request, mut respond))) = conn.accept().await {
        streams.fetch_add(1, Ordering::SeqCst);
        if refuse(i) {
            respond.send_reset(h2::Reason::REFUSED_STREAM);
        } else {
            tokio::spawn(h2_echo(request, respond));
        }
        i += 1;
    }
}

/// The h2 error under an HBONE error, if any.
fn h2_reason(err: &meshkit_hbone::Error) -> Option<h2::Reason> {
    std::error::Error::source(err)?
        .downcast_ref::<h2::Error>()?
        .reason()
}

/// RFC 9113 section 8.7: a refused stream was not processed, so the client sends it again,
/// once, on another connection, even when the refusing connection was made for it.
#[tokio::test]
async fn a_refused_stream_on_a_new_connection_is_retried_on_another() {
    let pki = Pki::new();
    let streams = Arc::new(AtomicUsize::new(0));
    let seen = streams.clone();
    // Connection 0 refuses its first stream; every other stream, on any connection, is echoed.
    let server = raw_server(&pki, move |n, tls| {
        refusing_connection(tls, move |i| n == 0 && i == 0, seen.clone())
    })
    .await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let tunnel = within(
        "a tunnel whose first stream was refused",
        client.open(target(server.addr, "127.0.0.1:1".parse().unwrap())),
    )
    .await
    .expect("the refused stream is sent again on another connection");
    assert_eq!(round_trip(tunnel, b"again").await, b"again");
    assert_eq!(
        streams.load(Ordering::SeqCst),
        2,
        "the refused one and its retry"
    );
    assert_eq!(
        server.accepted(),
        2,
        "the retry went over another connection"
    );
}

#[tokio::test]
async fn a_refused_stream_on_a_pooled_connection_is_retried_and_its_other_tunnels_go_on() {
    let pki = Pki::new();
    let streams = Arc::new(AtomicUsize::new(0));
    let seen = streams.clone();
    // Connection 0 serves its first stream and refuses its second.
    let server = raw_server(&pki, move |n, tls| {
        refusing_connection(tls, move |i| n == 0 && i == 1, seen.clone())
    })
    .await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let destination = "127.0.0.1:1".parse().unwrap();
    let mut first = client.open(target(server.addr, destination)).await.unwrap();
    let second = within(
        "a tunnel whose stream a pooled connection refused",
        client.open(target(server.addr, destination)),
    )
    .await
    .expect("the refused stream is sent again on another connection");
    assert_eq!(round_trip(second, b"second").await, b"second");
    assert_eq!(server.accepted(), 2);
    // The tunnel already open on the refusing connection is untouched.
    assert_eq!(round_trip(&mut first, b"first").await, b"first");
    assert_eq!(streams.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_server_that_refuses_every_stream_gets_one_retry_then_the_refusal() {
    let pki = Pki::new();
    let streams = Arc::new(AtomicUsize::new(0));
    let seen = streams.clone();
    let server = raw_server(&pki, move |_, tls| {
        refusing_connection(tls, |_| true, seen.clone())
    })
    .await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let err = within(
        "a tunnel every stream of which is refused",
        client.open(target(server.addr, "127.0.0.1:1".parse().unwrap())),
    )
    .await
    .expect_err("a server that refuses every stream is not reached");
    assert!(err.is_h2(), "{err:?}");
    assert_eq!(h2_reason(&err), Some(h2::Reason::REFUSED_STREAM), "{err:?}");
    assert_eq!(
        streams.load(Ordering::SeqCst),
        2,
        "one stream and one retry"
    );
    assert_eq!(server.accepted(), 2, "the retry on a connection of its own");
}

/// A connection that answers the client's preface with SETTINGS and GOAWAY(last stream 0)
/// in raw frames, then reads and drops whatever comes until the client closes it.
async fn goaway_at_once<IO>(mut io: IO)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    if io.read_exact(&mut preface).await.is_err() {
        return;
    }
    let mut out = frame::settings(&[]);
    // GOAWAY: last stream 0, NO_ERROR.
    out.extend(frame::frame(0x7, 0, 0, &[0; 8]));
    if io.write_all(&out).await.is_err() || io.flush().await.is_err() {
        return;
    }
    let mut sink = vec![0u8; 16 * 1024];
    while matches!(io.read(&mut sink).await, Ok(n) if n > 0) {}
}

/// A GOAWAY that arrives on a connection made for the request, before it was processed,
/// sends the request again on another connection (once).
#[tokio::test]
async fn a_goaway_before_the_first_stream_sends_it_over_another_connection() {
    let pki = Pki::new();
    let later_streams = Arc::new(AtomicUsize::new(0));
    let later = later_streams.clone();
    let server = raw_server(&pki, move |n, tls| {
        let later = later.clone();
        async move {
            if n == 0 {
                goaway_at_once(tls).await;
            } else {
                h2_echo_connection(tls, later).await;
            }
        }
    })
    .await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let tunnel = within(
        "a tunnel whose first connection said GOAWAY",
        client.open(target(server.addr, "127.0.0.1:1".parse().unwrap())),
    )
    .await
    .expect("the request the GOAWAY left unprocessed is sent again");
    assert_eq!(round_trip(tunnel, b"elsewhere").await, b"elsewhere");
    assert_eq!(server.accepted(), 2);
    assert_eq!(later_streams.load(Ordering::SeqCst), 1);
}
