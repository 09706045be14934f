//! Shared fixtures: a PKI, HBONE servers on loopback, and TCP backends.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use meshkit_hbone::{
    Client, ClientConfig, ConnectRequest, Decision, Server, ServerConfig, ServerStats,
};
use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    Authorize, SingleIdentity, SpiffeId, SpiffeVerifier, TlsSettings, TrustDomain,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tower::Service;

pub const CLIENT: &str = "spiffe://cluster.local/ns/shop/sa/web";
pub const SERVER: &str = "spiffe://cluster.local/ns/shop/sa/db";

pub fn id(s: &str) -> SpiffeId {
    s.parse().unwrap()
}

pub struct Pki {
    pub ca: TestCa,
}

impl Pki {
    pub fn new() -> Self {
        Self {
            ca: TestCa::new(TrustDomain::new("cluster.local").unwrap()),
        }
    }

    /// A server TLS config for `me` that admits clients `allow` admits.
    pub fn server_tls(&self, me: &str, allow: Authorize) -> rustls::ServerConfig {
        self.server_tls_with(TlsSettings::default(), me, allow)
    }

    /// As [`Pki::server_tls`], from `settings` (another crypto provider, say).
    pub fn server_tls_with(
        &self,
        settings: TlsSettings,
        me: &str,
        allow: Authorize,
    ) -> rustls::ServerConfig {
        settings
            .server_config(
                self.ca.issue(id(me)),
                SpiffeVerifier::new(self.ca.bundle_set(), allow),
            )
            .unwrap()
    }

    pub fn client(&self, me: &str, config: ClientConfig) -> Client {
        Client::new(config, self.ca.issue(id(me)), self.ca.bundle_set())
    }
}

pub struct Running {
    pub addr: SocketAddr,
    pub stats: Arc<ServerStats>,
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
    pub shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Running {
    pub fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Starts an HBONE server presenting SERVER, admitting any trusted client, with `service`.
pub async fn start<S>(pki: &Pki, config: ServerConfig, service: S) -> Running
where
    S: Service<ConnectRequest, Response = Decision> + Clone + Send + Sync + 'static,
    S::Error: std::fmt::Display + Send,
    S::Future: Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    start_on(
        pki,
        listener,
        config,
        service,
        std::time::Duration::from_secs(5),
    )
    .await
}

pub async fn start_on<S>(
    pki: &Pki,
    listener: TcpListener,
    config: ServerConfig,
    service: S,
    drain: std::time::Duration,
) -> Running
where
    S: Service<ConnectRequest, Response = Decision> + Clone + Send + Sync + 'static,
    S::Error: std::fmt::Display + Send,
    S::Future: Send,
{
    let addr = listener.local_addr().unwrap();
    let selector = SingleIdentity::new(pki.server_tls(SERVER, Authorize::AnyTrusted));
    let server = Server::new(config, selector, service);
    let stats = server.stats();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.serve_with_shutdown(
        listener,
        async move {
            let _ = rx.await;
        },
        drain,
    ));
    Running {
        addr,
        stats,
        task,
        shutdown: Some(tx),
    }
}

/// A TCP echo server on loopback that echoes until EOF, then half-closes.
pub async fn echo_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut r, mut w) = sock.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

/// Writes `msg`, half-closes, reads to EOF, all within [`PATIENCE`].
pub async fn round_trip<T>(mut t: T, msg: &[u8]) -> Vec<u8>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    within("a round trip (write, half-close, read to the end)", async {
        t.write_all(msg).await.unwrap();
        t.shutdown().await.unwrap();
        let mut out = Vec::new();
        t.read_to_end(&mut out).await.unwrap();
        out
    })
    .await
}

/// What every wait of these tests allows: far above what any of them needs, so that a loaded
/// machine never fails a test, and a hang fails with a message instead of hanging.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// `fut`, or a panic naming `what` if it does not finish within [`PATIENCE`].
pub async fn within<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(PATIENCE, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: not done within {PATIENCE:?}"),
    }
}

/// Polls `condition` every 10 ms until it holds; panics naming `what` after [`PATIENCE`].
pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    within(what, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// A client TLS config presenting CLIENT and trusting any server of the test CA, for raw
/// peers that speak below the HBONE client.
pub fn raw_client_tls(pki: &Pki) -> Arc<rustls::ClientConfig> {
    Arc::new(
        TlsSettings::default()
            .client_config(
                pki.ca.issue(id(CLIENT)),
                SpiffeVerifier::new(pki.ca.bundle_set(), Authorize::AnyTrusted),
            )
            .unwrap(),
    )
}

/// A TCP connection to `server` from `from` (any loopback address), port chosen by the kernel.
pub async fn tcp_from(from: std::net::IpAddr, server: SocketAddr) -> tokio::net::TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::new(from, 0)).unwrap();
    sock.connect(server).await.unwrap()
}

/// Mutual TLS with `server` from 127.0.0.1 as CLIENT, and nothing above it.
pub async fn raw_tls(
    pki: &Pki,
    server: SocketAddr,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    raw_tls_from(pki, [127, 0, 0, 1].into(), server).await
}

/// Mutual TLS with `server` from the loopback address `from`, as CLIENT.
pub async fn raw_tls_from(
    pki: &Pki,
    from: std::net::IpAddr,
    server: SocketAddr,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let sock = tcp_from(from, server).await;
    tokio_rustls::TlsConnector::from(raw_client_tls(pki))
        .connect(
            rustls::pki_types::ServerName::IpAddress(server.ip().into()),
            sock,
        )
        .await
        .unwrap()
}

/// An h2 client over `io` with `builder`'s settings; its connection runs in a task whose handle
/// is returned beside the request handle.
pub async fn h2_over<IO>(
    builder: &h2::client::Builder,
    io: IO,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = builder.handshake(io).await.unwrap();
    (send, tokio::spawn(conn))
}

/// A CONNECT request for `target`, as the HBONE client sends it.
pub fn connect_request(target: SocketAddr) -> http::Request<()> {
    http::Request::builder()
        .method(http::Method::CONNECT)
        .uri(target.to_string())
        .body(())
        .unwrap()
}

/// Wraps an I/O object so that its reads can be stopped: a peer that keeps its socket open and
/// never reads it again.
pub struct Pausable<IO> {
    pub io: IO,
    pub paused: Arc<std::sync::atomic::AtomicBool>,
}

impl<IO: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Pausable<IO> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.paused.load(std::sync::atomic::Ordering::SeqCst) {
            // Never woken: this peer has stopped reading for good.
            return std::task::Poll::Pending;
        }
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Pausable<IO> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Raw HTTP/2 frames, for peers that send what the h2 crate never would.
#[allow(unused_imports)] // Not every test file sends raw frames.
pub use meshkit_test_support::h2_frame as frame;

/// Reads one HTTP/2 frame: its type, flags, stream and payload.
pub async fn read_frame<R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    r.read_exact(&mut head).await?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Ok((head[3], head[4], stream, payload))
}

/// An HTTP/2 server that is not meshkit's, on loopback, over mutual TLS presenting SERVER:
/// for tests of what the client does with what a server sends (GOAWAY, REFUSED_STREAM).
pub struct RawServer {
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub accepted: Arc<std::sync::atomic::AtomicUsize>,
    /// The client address of each accepted connection, in order.
    pub peers: Arc<std::sync::Mutex<Vec<SocketAddr>>>,
}

impl RawServer {
    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Starts a [`RawServer`]: each accepted connection, numbered from 0, is handed after TLS to
/// `serve` with its number, in a task of its own; the listener keeps accepting.
pub async fn raw_server<F, Fut>(pki: &Pki, serve: F) -> RawServer
where
    F: Fn(usize, tokio_rustls::server::TlsStream<tokio::net::TcpStream>) -> Fut
        + Send
        + Sync
        + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor =
        tokio_rustls::TlsAcceptor::from(Arc::new(pki.server_tls(SERVER, Authorize::AnyTrusted)));
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let peers = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (count, seen) = (accepted.clone(), peers.clone());
    let serve = Arc::new(serve);
    tokio::spawn(async move {
        while let Ok((sock, peer)) = listener.accept().await {
            let n = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            seen.lock().unwrap().push(peer);
            let (acceptor, serve) = (acceptor.clone(), serve.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(sock).await {
                    serve(n, tls).await;
                }
            });
        }
    });
    RawServer {
        addr,
        accepted,
        peers,
    }
}

/// Echoes one stream of an h2 server: answers 200, sends back what arrives until
/// END_STREAM, then ends its own side.
pub async fn h2_echo(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<bytes::Bytes>,
) {
    let Ok(mut send) = respond.send_response(http::Response::new(()), false) else {
        return;
    };
    let mut body = request.into_body();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
        if send.send_data(chunk, false).is_err() {
            return;
        }
    }
    let _ = send.send_data(bytes::Bytes::new(), true);
}

/// Serves every stream of an HTTP/2 connection with [`h2_echo`], counting them in `streams`.
pub async fn h2_echo_connection<IO>(io: IO, streams: Arc<std::sync::atomic::AtomicUsize>)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let Ok(mut conn) = h2::server::handshake(io).await else {
        return;
    };
    while let Some(Ok((request, respond))) = conn.accept().await {
        streams.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::spawn(h2_echo(request, respond));
    }
}

/// An HBONE service whose tunnels echo what they receive until END_STREAM, then end, without
/// a socket: for servers on in-memory transports and paused time.
pub fn echo_service() -> meshkit_hbone::DecideFn<
    impl FnMut(ConnectRequest) -> std::future::Ready<Decision> + Clone + Send + Sync + 'static,
> {
    meshkit_hbone::decide_fn(|_req: ConnectRequest| {
        std::future::ready(Decision::accept(|tunnel| async move {
            let (mut r, mut w) = tokio::io::split(tunnel);
            if tokio::io::copy(&mut r, &mut w).await.is_ok() {
                let _ = w.shutdown().await;
            }
        }))
    })
}

/// A transport in memory: each connection is a duplex pipe whose other end `server` serves
/// (as from 127.0.0.1:1 to the address dialed). No socket, so tests can run on paused time.
pub struct InMemory<S>(pub Arc<Server<SingleIdentity, S>>);

impl<S> Clone for InMemory<S> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<S> meshkit_hbone::Connect for InMemory<S>
where
    S: Service<ConnectRequest, Response = Decision> + Clone + Send + Sync + 'static,
    S::Error: std::fmt::Display + Send,
    S::Future: Send,
{
    type Io = tokio::io::DuplexStream;

    fn connect(
        &self,
        addr: SocketAddr,
    ) -> meshkit_hbone::BoxFuture<'static, std::io::Result<tokio::io::DuplexStream>> {
        let (ours, theirs) = tokio::io::duplex(1 << 20);
        let server = self.0.clone();
        tokio::spawn(async move {
            let source = SocketAddr::from(([127, 0, 0, 1], 1));
            let _ = server.serve_connection(theirs, source, addr).await;
        });
        Box::pin(std::future::ready(Ok(ours)))
    }
}

/// A server presenting SERVER, admitting any trusted client, reached through [`InMemory`],
/// and a client (presenting CLIENT) that dials it so.
pub fn in_memory<S>(
    pki: &Pki,
    server: ServerConfig,
    service: S,
    client: ClientConfig,
) -> (Arc<ServerStats>, Client<InMemory<S>>)
where
    S: Service<ConnectRequest, Response = Decision> + Clone + Send + Sync + 'static,
    S::Error: std::fmt::Display + Send,
    S::Future: Send,
{
    let selector = SingleIdentity::new(pki.server_tls(SERVER, Authorize::AnyTrusted));
    let server = Server::new(server, selector, service);
    let stats = server.stats();
    let client = Client::with_connector(
        client,
        InMemory(Arc::new(server)),
        pki.ca.issue(id(CLIENT)),
        pki.ca.bundle_set(),
    );
    (stats, client)
}
