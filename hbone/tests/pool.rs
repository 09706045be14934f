//! The client's connection pool, counted in TCP connections actually opened.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

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
        t.read_exact(&mut b).await.unwrap();
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
    let mut held = Vec::new();
    for t in tasks {
        held.push(t.await.unwrap());
    }
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
async fn goaway_takes_the_connection_out_of_the_pool() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    // The server sends GOAWAY to connections idle for 200 ms.
    let server = start(
        &pki,
        ServerConfig::default().with_idle_timeout(Duration::from_millis(200)),
        Forward::new(),
    )
    .await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let t = client.open(target(server.addr, backend)).await.unwrap();
    assert_eq!(round_trip(t, b"one").await, b"one");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        client.pooled_connections(),
        0,
        "closed connection left the pool"
    );
    let t = client.open(target(server.addr, backend)).await.unwrap();
    assert_eq!(round_trip(t, b"two").await, b"two");
    assert_eq!(client.connections_opened(), 2);
}

#[tokio::test]
async fn idle_connections_are_closed_by_the_client() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let client = pki.client(
        CLIENT,
        ClientConfig::default().with_idle_timeout(Duration::from_millis(200)),
    );
    let t = client.open(target(server.addr, backend)).await.unwrap();
    // Busy connections are not idle, however long the tunnel lives.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(client.pooled_connections(), 1);
    assert_eq!(round_trip(t, b"x").await, b"x");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(client.pooled_connections(), 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while server.stats.connections_open() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        server.stats.connections_open(),
        0,
        "the server saw it close"
    );
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
    tokio::time::sleep(Duration::from_millis(100)).await;

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
