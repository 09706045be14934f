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
