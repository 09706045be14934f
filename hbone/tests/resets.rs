//! Resets cross the tunnel as resets (RFC 9113 section 8.5), over real sockets on the whole
//! path a user runs: application → local socket → `copy_bidirectional` (what `hbone-connect`
//! and the node proxy's outbound side run) → HBONE → `Forward` → application.
//!
//! Only END_STREAM is a FIN. A TCP reset on either application's socket reaches the other
//! application as a reset, after a byte-exact prefix of what was sent, never as a clean EOF.

mod support;

use std::io::ErrorKind;
use std::net::SocketAddr;

use meshkit_hbone::{
    Client, ClientConfig, ConnectRequest, Copied, CopyError, Decision, Forward, ServerConfig, Side,
    Target, copy_bidirectional, decide_fn,
};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Byte `i` of every stream these tests send: a prefix check finds any lost or moved byte.
fn pattern(offset: usize, len: usize) -> Vec<u8> {
    (offset..offset + len).map(|i| (i % 251) as u8).collect()
}

/// A local listener that opens a tunnel to `destination` through `server` for each
/// connection and copies, reporting each copy's outcome.
async fn local_proxy(
    client: Client,
    server: SocketAddr,
    destination: SocketAddr,
) -> (
    SocketAddr,
    mpsc::UnboundedReceiver<Result<Copied, CopyError>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let tunnel = client
                .open(Target::new(server, destination, id(CLIENT), id(SERVER)))
                .await
                .unwrap();
            let tx = tx.clone();
            tokio::spawn(async move {
                let _ = tx.send(copy_bidirectional(tunnel, sock).await);
            });
        }
    });
    (addr, rx)
}

/// Both applications of one path: the one that connects locally, and the one `Forward`
/// dialed behind the HBONE server.
struct Path {
    client_app: TcpStream,
    server_app: TcpStream,
    copies: mpsc::UnboundedReceiver<Result<Copied, CopyError>>,
    _server: Running,
}

async fn path() -> Path {
    let pki = Pki::new();
    let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let (local, copies) = local_proxy(client, server.addr, backend.local_addr().unwrap()).await;
    let client_app = TcpStream::connect(local).await.unwrap();
    let (server_app, _) = tokio::time::timeout(PATIENCE, backend.accept())
        .await
        .unwrap()
        .unwrap();
    Path {
        client_app,
        server_app,
        copies,
        _server: server,
    }
}

/// Resets `sock`: SO_LINGER 0, then close, so the kernel sends RST.
fn reset(sock: TcpStream) {
    sock.set_zero_linger().unwrap();
    drop(sock);
}

/// Reads until the end and returns what arrived and how it ended.
async fn read_all(sock: &mut TcpStream) -> (Vec<u8>, std::io::Result<usize>) {
    let mut got = Vec::new();
    let end = tokio::time::timeout(PATIENCE, sock.read_to_end(&mut got))
        .await
        .expect("the reader saw neither an end nor an error");
    (got, end)
}

fn assert_reset_after_prefix(got: &[u8], end: &std::io::Result<usize>, sent: usize) {
    let err = end
        .as_ref()
        .expect_err("a reset must not read as a clean end");
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    assert!(
        got.len() <= sent,
        "{} bytes arrived of {sent} sent",
        got.len()
    );
    assert!(
        got == pattern(0, got.len()),
        "the bytes that arrived are not what was sent"
    );
}

/// Reads exactly `len` bytes and checks that they are what was sent.
async fn read_exactly(sock: &mut TcpStream, len: usize) {
    let mut got = vec![0u8; len];
    tokio::time::timeout(PATIENCE, sock.read_exact(&mut got))
        .await
        .expect("the bytes sent before the reset arrive")
        .unwrap();
    assert!(
        got == pattern(0, len),
        "the bytes that arrived are not what was sent"
    );
}

/// The copy's future, dropped mid-transfer (a policy revoked, the proxy stopping), resets the
/// application's socket: a FIN would make the cut look like the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_copy_resets_the_socket() {
    let pki = Pki::new();
    let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let local = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut app = TcpStream::connect(local.local_addr().unwrap())
        .await
        .unwrap();
    let (sock, _) = within("the local connection", local.accept())
        .await
        .unwrap();
    let tunnel = client
        .open(Target::new(
            server.addr,
            backend.local_addr().unwrap(),
            id(CLIENT),
            id(SERVER),
        ))
        .await
        .unwrap();
    let copy = tokio::spawn(copy_bidirectional(tunnel, sock));
    let (mut upstream, _) = within("the forwarded connection", backend.accept())
        .await
        .unwrap();
    upstream.write_all(&pattern(0, 4096)).await.unwrap();
    read_exactly(&mut app, 4096).await;
    copy.abort();
    let (got, end) = read_all(&mut app).await;
    assert_reset_after_prefix(&got, &end, 0);
}

async fn next_copy(
    copies: &mut mpsc::UnboundedReceiver<Result<Copied, CopyError>>,
) -> Result<Copied, CopyError> {
    within("the copy's outcome", copies.recv())
        .await
        .expect("the proxy reports every copy")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_reset_behind_the_server_reaches_the_client_as_a_reset() {
    const SENT: usize = 1024 * 1024;
    let mut path = path().await;
    // 1 MiB of a longer answer arrives whole; then the server's application resets its
    // socket, and the client reads a reset, not an end.
    path.server_app.write_all(&pattern(0, SENT)).await.unwrap();
    read_exactly(&mut path.client_app, SENT).await;
    reset(path.server_app);
    let (got, end) = read_all(&mut path.client_app).await;
    assert_reset_after_prefix(&got, &end, 0);
    let copy = next_copy(&mut path.copies).await.unwrap_err();
    assert_eq!(copy.side(), Side::Tunnel, "{copy}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reset_reaches_the_server_application_as_a_reset() {
    const SENT: usize = 1024 * 1024;
    let mut path = path().await;
    path.client_app.write_all(&pattern(0, SENT)).await.unwrap();
    read_exactly(&mut path.server_app, SENT).await;
    reset(path.client_app);
    let (got, end) = read_all(&mut path.server_app).await;
    assert_reset_after_prefix(&got, &end, 0);
    let copy = next_copy(&mut path.copies).await.unwrap_err();
    assert_eq!(copy.side(), Side::Socket, "{copy}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fins_end_each_direction_cleanly_and_byte_exact() {
    const UP: usize = 3 * 1024 * 1024 + 17;
    const DOWN: usize = 2 * 1024 * 1024 + 5;
    let mut path = path().await;
    let (mut client_read, mut client_write) = path.client_app.into_split();
    let (mut server_read, mut server_write) = path.server_app.into_split();
    let up = tokio::spawn(async move {
        client_write.write_all(&pattern(0, UP)).await.unwrap();
        client_write.shutdown().await.unwrap();
        let mut got = Vec::new();
        server_read.read_to_end(&mut got).await.unwrap();
        got
    });
    let down = tokio::spawn(async move {
        server_write.write_all(&pattern(0, DOWN)).await.unwrap();
        server_write.shutdown().await.unwrap();
        let mut got = Vec::new();
        client_read.read_to_end(&mut got).await.unwrap();
        got
    });
    let (up, down) = tokio::time::timeout(PATIENCE, async { (up.await, down.await) })
        .await
        .unwrap();
    assert!(up.unwrap() == pattern(0, UP));
    assert!(down.unwrap() == pattern(0, DOWN));
    let copied = next_copy(&mut path.copies).await.unwrap();
    assert_eq!(
        copied,
        Copied {
            to_tunnel: UP as u64,
            from_tunnel: DOWN as u64
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reset_of_the_tunnel_before_end_stream_resets_the_socket() {
    // An HBONE server whose handler sends 64 KiB and then resets the stream with the code the
    // target port names: graceful codes too are a cut, not an end.
    const SENT: usize = 64 * 1024;
    let codes = [
        h2::Reason::NO_ERROR,
        h2::Reason::CANCEL,
        h2::Reason::CONNECT_ERROR,
        h2::Reason::INTERNAL_ERROR,
    ];
    let pki = Pki::new();
    let service = decide_fn(|req: ConnectRequest| async move {
        let reason = h2::Reason::from(u32::from(req.target.port()) - 1);
        Decision::accept(move |mut tunnel| async move {
            tunnel.write_all(&pattern(0, SENT)).await.unwrap();
            let mut ack = [0u8; 1];
            let _ = tunnel.read_exact(&mut ack).await;
            tunnel.reset(reason);
        })
    });
    let server = start(&pki, ServerConfig::default(), service).await;
    for code in codes {
        let client = pki.client(CLIENT, ClientConfig::default());
        let destination = SocketAddr::from(([127, 0, 0, 1], (u32::from(code) + 1) as u16));
        let (local, mut copies) = local_proxy(client, server.addr, destination).await;
        let mut app = TcpStream::connect(local).await.unwrap();
        let mut first = vec![0u8; SENT];
        within("the data before the reset", app.read_exact(&mut first))
            .await
            .unwrap();
        assert!(first == pattern(0, SENT));
        app.write_all(b"!").await.unwrap();
        let (rest, end) = read_all(&mut app).await;
        assert!(
            rest.is_empty(),
            "{code:?}: {} bytes after the reset",
            rest.len()
        );
        let err = end.expect_err("a reset of the tunnel must not read as a clean end");
        assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{code:?}: {err}");
        let copy = next_copy(&mut copies).await.unwrap_err();
        assert_eq!(copy.side(), Side::Tunnel, "{code:?}: {copy}");
    }
}
