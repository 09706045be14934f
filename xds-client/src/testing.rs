//! A fake ADS server for tests (feature `test-util`), built on
//! [`meshkit_xds_server`]: binds `127.0.0.1:0`, serves both `StreamAggregatedResources` and
//! `DeltaAggregatedResources` from a [`Snapshot`], records every request, can push scripted
//! responses, and can be killed and restarted on the same port.
//!
//! What it sends follows the server library's push rules: a type not in the snapshot gets no
//! answer (so a client's does-not-exist timer runs), a State-of-the-World type is sent again
//! when its resources or its version change, and Delta sends only changed resources, with
//! subscribed names that do not exist reported once in `removed_resources`.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use envoy_types::pb::envoy::config::cluster::v3::Cluster;
//! use meshkit_xds_client::testing::{FakeServer, Snapshot, SnapshotExt};
//!
//! let server = FakeServer::start().await?;
//! let cluster = Cluster { name: "backend".into(), ..Default::default() };
//! server.set_snapshot(Snapshot::new().with_resources("v1", &[cluster]));
//! println!("serving on {}", server.uri());
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use futures::StreamExt;
use meshkit_xds_server::{AdsServer, RequestObserver, ServerConfig, SnapshotCache, TypeSnapshot};
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

use crate::resource::Resource;

/// The server library the fake is built on.
pub use meshkit_xds_server;
/// What a [`FakeServer`] serves: the server library's snapshot. Fill it with
/// [`SnapshotExt`], or with [`meshkit_xds_server::SnapshotBuilder`].
pub use meshkit_xds_server::Snapshot;

/// Test shorthands on [`Snapshot`]: whole types of [`Resource`]s or raw resources, each at an
/// explicit version (so a State-of-the-World client is sent the type again whenever the
/// version changes).
pub trait SnapshotExt: Sized {
    /// This snapshot with all resources of type `T` replaced by `resources`, at `version`.
    fn with_resources<T: Resource + Message>(self, version: &str, resources: &[T]) -> Self;

    /// This snapshot with the resources of `type_url` replaced by raw ones (for example
    /// invalid ones), by name, at `version`.
    fn with_raw(self, type_url: &str, version: &str, resources: Vec<(String, Any)>) -> Self;
}

/// A fake ADS server. Dropping it (or [`kill`](FakeServer::kill)) stops it.
#[derive(Debug)]
pub struct FakeServer {
    addr: SocketAddr,
    ads: AdsServer,
    cache: SnapshotCache,
    log: Arc<Log>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

/// Every request received, in order.
#[derive(Debug, Default)]
struct Log {
    sotw: Mutex<Vec<DiscoveryRequest>>,
    delta: Mutex<Vec<DeltaDiscoveryRequest>>,
}

// === impl SnapshotExt ===

impl SnapshotExt for Snapshot {
    fn with_resources<T: Resource + Message>(self, version: &str, resources: &[T]) -> Self {
        let anys = resources.iter().map(|r| {
            (
                r.name().to_owned(),
                Any {
                    type_url: T::TYPE_URL.to_owned(),
                    value: r.encode_to_vec(),
                },
            )
        });
        self.with_type(T::TYPE_URL, TypeSnapshot::new(anys).with_version(version))
    }

    fn with_raw(self, type_url: &str, version: &str, resources: Vec<(String, Any)>) -> Self {
        self.with_type(type_url, TypeSnapshot::new(resources).with_version(version))
    }
}

// === impl FakeServer ===

impl FakeServer {
    /// Starts on `127.0.0.1:0`.
    ///
    /// # Errors
    ///
    /// Binding fails.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// Starts on `addr`, for example the address of a killed server to restart it.
    ///
    /// # Errors
    ///
    /// Binding fails.
    pub async fn start_on(addr: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        // Nagle plus delayed ACKs would add tens of milliseconds to every small response.
        let incoming = TcpListenerStream::new(listener).map(|tcp| {
            let tcp = tcp?;
            tcp.set_nodelay(true)?;
            Ok::<_, std::io::Error>(tcp)
        });
        Ok(Self::serve(addr, incoming))
    }

    /// Starts on `addr` (port 0 for any) and serves over TLS with `config` (features
    /// `test-util` and `tls`). Failed handshakes are dropped.
    ///
    /// # Errors
    ///
    /// Binding fails.
    #[cfg(feature = "tls")]
    pub async fn start_tls_on(
        addr: SocketAddr,
        config: Arc<rustls::ServerConfig>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let incoming = TcpListenerStream::new(listener).filter_map(move |tcp| {
            let acceptor = acceptor.clone();
            async move {
                let tcp = tcp.ok()?;
                tcp.set_nodelay(true).ok()?;
                let tls = acceptor.accept(tcp).await.ok()?;
                Some(Ok::<_, std::io::Error>(tls))
            }
        });
        Ok(Self::serve(addr, Box::pin(incoming)))
    }

    fn serve<I, IO>(addr: SocketAddr, incoming: I) -> Self
    where
        I: futures::Stream<Item = std::io::Result<IO>> + Send + 'static,
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let cache = SnapshotCache::default();
        let log = Arc::new(Log::default());
        // Tests send large snapshots and script bursts of responses.
        let config = ServerConfig::default()
            .max_decoding_message_size(usize::MAX)
            .channel_depth(1024);
        let ads = AdsServer::new(cache.clone())
            .with_config(config)
            .with_observer(Arc::clone(&log));
        let (tx, rx) = oneshot::channel();
        let server = ads.clone();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = rx.await;
            };
            if let Err(e) = server.serve_with_incoming(incoming, shutdown).await {
                tracing::debug!(error = %e, "fake ADS server stopped");
            }
        });
        Self {
            addr,
            ads,
            cache,
            log,
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, for [`ClientConfig::new`](crate::ClientConfig::new).
    pub fn uri(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Replaces what is served; open streams get the changes (nothing when `snapshot` equals
    /// what is served).
    pub fn set_snapshot(&self, snapshot: Snapshot) {
        self.cache.set(snapshot);
    }

    /// Sends a scripted SotW response, as it is, on every open SotW stream.
    pub fn send_sotw(&self, response: DiscoveryResponse) {
        self.ads.inject_sotw(response);
    }

    /// Sends a scripted Delta response, as it is, on every open Delta stream.
    pub fn send_delta(&self, response: DeltaDiscoveryResponse) {
        self.ads.inject_delta(response);
    }

    /// Every SotW request received so far.
    pub fn sotw_requests(&self) -> Vec<DiscoveryRequest> {
        lock(&self.log.sotw).clone()
    }

    /// Every Delta request received so far.
    pub fn delta_requests(&self) -> Vec<DeltaDiscoveryRequest> {
        lock(&self.log.delta).clone()
    }

    /// Waits until `pred` holds for the SotW requests received.
    ///
    /// # Panics
    ///
    /// After 10 s without `pred` holding, naming this as the failure.
    pub async fn wait_sotw(&self, pred: impl Fn(&[DiscoveryRequest]) -> bool) {
        wait(|| pred(&lock(&self.log.sotw))).await;
    }

    /// Waits until `pred` holds for the Delta requests received.
    ///
    /// # Panics
    ///
    /// After 10 s without `pred` holding, naming this as the failure.
    pub async fn wait_delta(&self, pred: impl Fn(&[DeltaDiscoveryRequest]) -> bool) {
        wait(|| pred(&lock(&self.log.delta))).await;
    }

    /// Stops the server as a crash would: open streams fail with `UNAVAILABLE` (and so does
    /// any stream opened meanwhile), the port is closed. Restart with
    /// [`FakeServer::start_on`] and [`addr`](Self::addr).
    pub async fn kill(mut self) {
        self.stop().await;
    }

    async fn stop(&mut self) {
        self.ads
            .abort(tonic::Status::unavailable("fake ADS server killed"));
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(Duration::from_secs(2), &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.ads
            .abort(tonic::Status::unavailable("fake ADS server dropped"));
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

// === impl Log ===

impl RequestObserver for Log {
    fn on_sotw_request(&self, request: &DiscoveryRequest) {
        lock(&self.sotw).push(request.clone());
    }

    fn on_delta_request(&self, request: &DeltaDiscoveryRequest) {
        lock(&self.delta).push(request.clone());
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn wait(mut pred: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !pred() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "fake ADS server: condition not met within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
