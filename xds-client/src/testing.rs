//! A fake ADS server for tests (feature `test-util`): binds `127.0.0.1:0`, serves both
//! `StreamAggregatedResources` and `DeltaAggregatedResources` from a [`Snapshot`], records
//! every request, can push scripted responses, and can be killed and restarted on the same port.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use envoy_types::pb::envoy::config::cluster::v3::Cluster;
//! use meshkit_xds_client::testing::{FakeServer, Snapshot};
//!
//! let server = FakeServer::start().await?;
//! let cluster = Cluster { name: "backend".into(), ..Default::default() };
//! server.set_snapshot(Snapshot::new().with_resources("v1", &[cluster]));
//! println!("serving on {}", server.uri());
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hasher;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    Resource as Wrapped,
};
use envoy_types::pb::google::protobuf::Any;
use futures::{Stream, StreamExt};
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};

use crate::resource::Resource;

/// The resources a [`FakeServer`] serves, per type URL, each type with a version.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    types: BTreeMap<String, Arc<TypeSnapshot>>,
}

#[derive(Debug, Clone, Default)]
struct TypeSnapshot {
    version: String,
    resources: BTreeMap<String, Any>,
}

/// A fake ADS server. Dropping it (or [`kill`](FakeServer::kill)) stops it.
#[derive(Debug)]
pub struct FakeServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    snapshot: watch::Sender<Snapshot>,
    sotw_log: Mutex<Vec<DiscoveryRequest>>,
    delta_log: Mutex<Vec<DeltaDiscoveryRequest>>,
    scripted_sotw: broadcast::Sender<DiscoveryResponse>,
    scripted_delta: broadcast::Sender<DeltaDiscoveryResponse>,
    kill: watch::Sender<bool>,
    nonce: std::sync::atomic::AtomicU64,
}

#[derive(Clone)]
struct Service {
    shared: Arc<Shared>,
}

type Out<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

// === impl Snapshot ===

impl Snapshot {
    /// An empty snapshot (no types: the server answers nothing).
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets all resources of type `T`, at `version`.
    pub fn with_resources<T: Resource + Message>(mut self, version: &str, resources: &[T]) -> Self {
        let anys = resources.iter().map(|r| {
            (
                r.name().to_owned(),
                Any {
                    type_url: T::TYPE_URL.to_owned(),
                    value: r.encode_to_vec(),
                },
            )
        });
        self.types.insert(
            T::TYPE_URL.to_owned(),
            Arc::new(TypeSnapshot {
                version: version.to_owned(),
                resources: anys.collect(),
            }),
        );
        self
    }

    /// Sets raw resources of a type (for example invalid ones), by name.
    pub fn with_raw(
        mut self,
        type_url: &str,
        version: &str,
        resources: Vec<(String, Any)>,
    ) -> Self {
        self.types.insert(
            type_url.to_owned(),
            Arc::new(TypeSnapshot {
                version: version.to_owned(),
                resources: resources.into_iter().collect(),
            }),
        );
        self
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
            Ok(tcp)
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
                Some(Ok::<_, std::io::Error>(tls_io::TlsIo(tls)))
            }
        });
        Ok(Self::serve(addr, Box::pin(incoming)))
    }

    fn serve<I, IO>(addr: SocketAddr, incoming: I) -> Self
    where
        I: Stream<Item = std::io::Result<IO>> + Send + 'static,
        IO: tokio::io::AsyncRead
            + tokio::io::AsyncWrite
            + tonic::transport::server::Connected
            + Unpin
            + Send
            + 'static,
    {
        let shared = Arc::new(Shared {
            snapshot: watch::channel(Snapshot::new()).0,
            sotw_log: Mutex::default(),
            delta_log: Mutex::default(),
            scripted_sotw: broadcast::channel(1024).0,
            scripted_delta: broadcast::channel(1024).0,
            kill: watch::channel(false).0,
            nonce: std::sync::atomic::AtomicU64::new(0),
        });
        let (tx, rx) = oneshot::channel();
        let svc = AggregatedDiscoveryServiceServer::new(Service {
            shared: Arc::clone(&shared),
        })
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
        let task = tokio::spawn(async move {
            let result = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await;
            if let Err(e) = result {
                tracing::debug!(error = %e, "fake ADS server stopped");
            }
        });
        Self {
            addr,
            shared,
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

    /// Replaces what is served; open streams get the changes.
    pub fn set_snapshot(&self, snapshot: Snapshot) {
        self.shared.snapshot.send_replace(snapshot);
    }

    /// Sends a scripted SotW response on every open SotW stream.
    pub fn send_sotw(&self, response: DiscoveryResponse) {
        let _ = self.shared.scripted_sotw.send(response);
    }

    /// Sends a scripted Delta response on every open Delta stream.
    pub fn send_delta(&self, response: DeltaDiscoveryResponse) {
        let _ = self.shared.scripted_delta.send(response);
    }

    /// Every SotW request received so far.
    pub fn sotw_requests(&self) -> Vec<DiscoveryRequest> {
        lock(&self.shared.sotw_log).clone()
    }

    /// Every Delta request received so far.
    pub fn delta_requests(&self) -> Vec<DeltaDiscoveryRequest> {
        lock(&self.shared.delta_log).clone()
    }

    /// Waits until `pred` holds for the SotW requests received.
    ///
    /// # Panics
    ///
    /// After 10 s without `pred` holding, naming this as the failure.
    pub async fn wait_sotw(&self, pred: impl Fn(&[DiscoveryRequest]) -> bool) {
        wait(|| pred(&lock(&self.shared.sotw_log))).await;
    }

    /// Waits until `pred` holds for the Delta requests received.
    ///
    /// # Panics
    ///
    /// After 10 s without `pred` holding, naming this as the failure.
    pub async fn wait_delta(&self, pred: impl Fn(&[DeltaDiscoveryRequest]) -> bool) {
        wait(|| pred(&lock(&self.shared.delta_log))).await;
    }

    /// Stops the server as a crash would: open streams fail with `UNAVAILABLE`, the port is
    /// closed. Restart with [`FakeServer::start_on`] and [`addr`](Self::addr).
    pub async fn kill(mut self) {
        self.stop().await;
    }

    async fn stop(&mut self) {
        self.shared.kill.send_replace(true);
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
        self.shared.kill.send_replace(true);
        if let Some(task) = self.task.take() {
            task.abort();
        }
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

// === impl Service ===

#[tonic::async_trait]
impl AggregatedDiscoveryService for Service {
    type StreamAggregatedResourcesStream = Out<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Out<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(sotw_stream(
            Arc::clone(&self.shared),
            request.into_inner(),
            tx,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(delta_stream(
            Arc::clone(&self.shared),
            request.into_inner(),
            tx,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

impl Shared {
    fn nonce(&self) -> String {
        let n = self
            .nonce
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("n{n}")
    }
}

/// Per stream, per type: what the client subscribed to.
#[derive(Default)]
struct Sub {
    wildcard: bool,
    names: BTreeSet<String>,
    /// SotW: version last sent. Delta: name to version the client holds.
    sent_version: Option<String>,
    known: HashMap<String, String>,
}

impl Sub {
    fn covers(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }
}

async fn sotw_stream(
    shared: Arc<Shared>,
    mut requests: Streaming<DiscoveryRequest>,
    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>,
) {
    let mut snapshots = shared.snapshot.subscribe();
    let mut kill = shared.kill.subscribe();
    let mut scripted = shared.scripted_sotw.subscribe();
    let mut subs: BTreeMap<String, Sub> = BTreeMap::new();
    loop {
        // Whether anything may have to be sent: a subscription or the snapshot changed. ACKs
        // and NACKs alone never cause a response.
        let need = tokio::select! {
            () = killed(&mut kill) => {
                let _ = tx.send(Err(Status::unavailable("server killed"))).await;
                return;
            }
            msg = requests.message() => {
                let Ok(Some(req)) = msg else { return };
                lock(&shared.sotw_log).push(req.clone());
                let first = !subs.contains_key(&req.type_url);
                let sub = subs.entry(req.type_url.clone()).or_default();
                let mut names: BTreeSet<String> = req.resource_names.iter().cloned().collect();
                let wildcard = names.remove("*") || (first && names.is_empty());
                let changed = first || wildcard != sub.wildcard || names != sub.names;
                sub.wildcard = wildcard;
                sub.names = names;
                if changed {
                    sub.sent_version = None;
                }
                changed || snapshots.has_changed().unwrap_or(false)
            }
            r = scripted.recv() => {
                if let Ok(resp) = r
                    && tx.send(Ok(resp)).await.is_err() { return; }
                continue;
            }
            r = snapshots.changed() => {
                if r.is_err() { return; }
                true
            }
        };
        if !need {
            continue;
        }
        // A snapshot change may be first seen here while handling a request: look at every type.
        let to_send: Vec<String> = subs.keys().cloned().collect();
        let snapshot = snapshots.borrow_and_update().clone();
        for url in to_send {
            let (Some(sub), Some(ts)) = (subs.get_mut(&url), snapshot.types.get(&url)) else {
                continue;
            };
            if sub.sent_version.as_deref() == Some(ts.version.as_str()) {
                continue;
            }
            sub.sent_version = Some(ts.version.clone());
            let resources = ts
                .resources
                .iter()
                .filter(|(n, _)| sub.covers(n))
                .map(|(_, a)| a.clone())
                .collect();
            let resp = DiscoveryResponse {
                version_info: ts.version.clone(),
                resources,
                type_url: url.clone(),
                nonce: shared.nonce(),
                ..Default::default()
            };
            if tx.send(Ok(resp)).await.is_err() {
                return;
            }
        }
    }
}

async fn delta_stream(
    shared: Arc<Shared>,
    mut requests: Streaming<DeltaDiscoveryRequest>,
    tx: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
) {
    let mut snapshots = shared.snapshot.subscribe();
    let mut kill = shared.kill.subscribe();
    let mut scripted = shared.scripted_delta.subscribe();
    let mut subs: BTreeMap<String, Sub> = BTreeMap::new();
    loop {
        let need = tokio::select! {
            () = killed(&mut kill) => {
                let _ = tx.send(Err(Status::unavailable("server killed"))).await;
                return;
            }
            msg = requests.message() => {
                let Ok(Some(req)) = msg else { return };
                lock(&shared.delta_log).push(req.clone());
                let first = !subs.contains_key(&req.type_url);
                let sub = subs.entry(req.type_url.clone()).or_default();
                if first {
                    sub.known = req.initial_resource_versions.clone();
                }
                for n in &req.resource_names_subscribe {
                    if n == "*" { sub.wildcard = true } else { sub.names.insert(n.clone()); }
                }
                for n in &req.resource_names_unsubscribe {
                    if n == "*" { sub.wildcard = false } else { sub.names.remove(n); }
                }
                let changed = first
                    || !req.resource_names_subscribe.is_empty()
                    || !req.resource_names_unsubscribe.is_empty();
                if !req.resource_names_unsubscribe.is_empty() {
                    let unsubscribed: Vec<String> =
                        sub.known.keys().filter(|n| !sub.covers(n)).cloned().collect();
                    for n in unsubscribed {
                        sub.known.remove(&n);
                    }
                }
                changed || snapshots.has_changed().unwrap_or(false)
            }
            r = scripted.recv() => {
                if let Ok(resp) = r
                    && tx.send(Ok(resp)).await.is_err() { return; }
                continue;
            }
            r = snapshots.changed() => {
                if r.is_err() { return; }
                true
            }
        };
        if !need {
            continue;
        }
        // A snapshot change may be first seen here while handling a request: look at every type.
        let to_send: Vec<String> = subs.keys().cloned().collect();
        let snapshot = snapshots.borrow_and_update().clone();
        for url in to_send {
            let (Some(sub), Some(ts)) = (subs.get_mut(&url), snapshot.types.get(&url)) else {
                continue;
            };
            let mut resources = Vec::new();
            for (name, any) in &ts.resources {
                if !sub.covers(name) {
                    continue;
                }
                let version = content_version(any);
                if sub.known.get(name) != Some(&version) {
                    sub.known.insert(name.clone(), version.clone());
                    resources.push(Wrapped {
                        name: name.clone(),
                        version,
                        resource: Some(any.clone()),
                        ..Default::default()
                    });
                }
            }
            let removed: Vec<String> = sub
                .known
                .keys()
                .filter(|n| !ts.resources.contains_key(*n))
                .cloned()
                .collect();
            for n in &removed {
                sub.known.remove(n);
            }
            if resources.is_empty() && removed.is_empty() {
                continue;
            }
            let resp = DeltaDiscoveryResponse {
                system_version_info: ts.version.clone(),
                resources,
                type_url: url.clone(),
                removed_resources: removed,
                nonce: shared.nonce(),
                ..Default::default()
            };
            if tx.send(Ok(resp)).await.is_err() {
                return;
            }
        }
    }
}

async fn killed(kill: &mut watch::Receiver<bool>) {
    let _ = kill.wait_for(|k| *k).await;
}

fn content_version(any: &Any) -> String {
    let mut h = std::hash::DefaultHasher::new();
    h.write(&any.value);
    format!("{:016x}", h.finish())
}

#[cfg(feature = "tls")]
mod tls_io {
    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio::net::TcpStream;
    use tokio_rustls::server::TlsStream;

    /// A server-side TLS stream that tonic can serve (it needs `Connected`).
    pub(super) struct TlsIo(pub(super) TlsStream<TcpStream>);

    impl tonic::transport::server::Connected for TlsIo {
        type ConnectInfo = ();
        fn connect_info(&self) -> Self::ConnectInfo {}
    }

    impl AsyncRead for TlsIo {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for TlsIo {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.0).poll_write(cx, buf)
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_flush(cx)
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_shutdown(cx)
        }
    }
}
