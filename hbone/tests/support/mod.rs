//! Shared fixtures: a PKI, HBONE servers on loopback, and TCP backends.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;

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
        TlsSettings::default()
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

/// Writes `msg`, half-closes, reads to EOF.
pub async fn round_trip<T>(mut t: T, msg: &[u8]) -> Vec<u8>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    t.write_all(msg).await.unwrap();
    t.shutdown().await.unwrap();
    let mut out = Vec::new();
    t.read_to_end(&mut out).await.unwrap();
    out
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
