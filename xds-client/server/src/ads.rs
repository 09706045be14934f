//! The ADS server: `envoy.service.discovery.v3.AggregatedDiscoveryService`, both
//! `StreamAggregatedResources` (State of the World) and `DeltaAggregatedResources`, serving
//! the current [`Snapshot`] of a [`SnapshotCache`].
//!
//! Each stream's protocol state is a plain struct ([`SotwStream`], [`DeltaStream`]) that takes
//! requests and snapshots and returns the responses to send; the tonic service is a thin loop
//! around it. The loop is the response stream itself (no task is spawned per stream): it
//! reads the next request or snapshot only when tonic asks for the next response, so a client
//! that does not read stalls only its own stream, and what it is sent when it reads again is
//! computed from the newest snapshot rather than queued.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status, Streaming};

use crate::access::{AccessPolicy, Guard};
use crate::admission::{Admission, AdmissionDeadline};
use crate::config::ServerConfig;
pub use crate::delta::DeltaStream;
use crate::error::RequestError;
pub use crate::grpc::AdsService;
use crate::io::Io;
use crate::limits::Gauge;
use crate::observer::RequestObserver;
use crate::snapshot::{Snapshot, SnapshotCache};
pub use crate::sotw::SotwStream;

/// The ADS service over a [`SnapshotCache`]: both protocol variants, every stream with its
/// own subscriptions, only changes pushed. Add [`AdsServer::into_service`] to a tonic server,
/// or use [`AdsServer::serve`] / [`AdsServer::serve_with_incoming`].
///
/// Clones share the open streams: [`inject_sotw`](Self::inject_sotw),
/// [`inject_delta`](Self::inject_delta) and [`abort`](Self::abort) on any clone reach the
/// streams of every clone. The `with_*` settings apply to the streams the configured value
/// serves.
#[derive(Clone)]
pub struct AdsServer {
    cache: SnapshotCache,
    stop: Option<watch::Receiver<bool>>,
    config: ServerConfig,
    observer: Option<Arc<dyn RequestObserver>>,
    /// Who may open a stream and what it sees; `None`: everyone, everything.
    access: Option<Arc<dyn AccessPolicy>>,
    hub: Arc<Hub>,
}

/// The open streams, for injection and abort.
struct Hub {
    next_id: AtomicU64,
    sotw: Slots<DiscoveryResponse>,
    delta: Slots<DeltaDiscoveryResponse>,
    /// Set once by [`AdsServer::abort`]; every stream, open or later, ends with it.
    abort: watch::Sender<Option<Status>>,
    /// Open streams, against [`ServerConfig::max_streams`].
    streams: Gauge,
}

type Slots<R> = Mutex<HashMap<u64, mpsc::Sender<R>>>;

/// One stream's loop: its protocol state and everything it waits on.
struct Driver<V: Variant> {
    state: V,
    requests: Streaming<V::Request>,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    stop: Option<watch::Receiver<bool>>,
    abort: watch::Receiver<Option<Status>>,
    injected: mpsc::Receiver<V::Response>,
    observer: Option<Arc<dyn RequestObserver>>,
    pending: VecDeque<V::Response>,
    finished: bool,
    /// Why the stream ended, for the log line when it closes; `None` while it runs, and when
    /// the transport dropped it (the client went away).
    ended: Option<String>,
    /// The stream's access rights, when the server has an [`AccessPolicy`].
    guard: Option<Guard>,
    _slot: SlotGuard<V>,
}

/// Removes a stream from the [`Hub`] when it ends.
struct SlotGuard<V: Variant> {
    hub: Arc<Hub>,
    id: u64,
    _variant: std::marker::PhantomData<fn() -> V>,
}

/// What the I/O loop needs of a protocol variant.
trait Variant: Send + Sized + 'static {
    type Request: Send + 'static;
    type Response: Clone + Send + 'static;

    /// `SotW` or `Delta`, for the logs.
    const NAME: &'static str;

    fn new(config: &ServerConfig) -> Self;
    fn observe(observer: &dyn RequestObserver, request: &Self::Request);
    fn observe_response(observer: &dyn RequestObserver, response: &Self::Response);
    fn node(request: &Self::Request) -> Option<&Node>;
    /// The node id the stream's state recorded; empty before one was named.
    fn stream_node(&self) -> &str;
    fn try_handle_request(&mut self, request: Self::Request) -> Result<(), RequestError>;
    fn poll(&mut self, snapshot: &Snapshot) -> Vec<Self::Response>;
    fn slots(hub: &Hub) -> &Slots<Self::Response>;
}

type Out<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// How long to pause after an accept error that is not about one connection (such as running
/// out of file descriptors), so the accept loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

// === impl AdsServer ===

impl AdsServer {
    /// Serves `cache`, with [`ServerConfig::default`].
    pub fn new(cache: SnapshotCache) -> Self {
        Self {
            cache,
            stop: None,
            config: ServerConfig::default(),
            observer: None,
            access: None,
            hub: Arc::new(Hub {
                next_id: AtomicU64::new(0),
                sotw: Mutex::default(),
                delta: Mutex::default(),
                abort: watch::channel(None).0,
                streams: Gauge::default(),
            }),
        }
    }

    /// Uses `config` for streams opened from now on, and for [`into_service`](Self::into_service)
    /// and the `serve` methods.
    pub fn with_config(mut self, config: ServerConfig) -> Self {
        self.config = config;
        self
    }

    /// Ends every open stream (with status OK) when `stop` turns true, so that a graceful
    /// server shutdown does not wait for clients to hang up. Streams opened after that end at
    /// once.
    pub fn with_stop(mut self, stop: watch::Receiver<bool>) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Calls `observer` with every request received (see [`RequestObserver`]). An `Arc` of an
    /// observer is an observer too, so the caller can keep a handle on it.
    pub fn with_observer(mut self, observer: impl RequestObserver) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// Authenticates and scopes every stream opened from now on with `policy` (see
    /// [`AccessPolicy`]): a stream it refuses ends before any request is read, a request whose
    /// node it refuses ends its stream, and each stream is served only its view of the
    /// snapshot. Without one, every stream is served everything.
    pub fn with_access(mut self, policy: impl AccessPolicy) -> Self {
        self.access = Some(Arc::new(policy));
        self
    }

    /// Queues `response` as it is (nonce, version and all) on every open State-of-the-World
    /// stream, for scripted or faulty responses in tests. It bypasses the streams' protocol
    /// state: the snapshot-driven responses carry on as if it had not been sent. Returns how
    /// many streams it was queued on; a stream whose queue is full
    /// ([`ServerConfig::channel_depth`]) is skipped.
    pub fn inject_sotw(&self, response: DiscoveryResponse) -> usize {
        inject(&self.hub.sotw, response)
    }

    /// Queues `response` on every open Delta stream, as [`inject_sotw`](Self::inject_sotw)
    /// does for State of the World.
    pub fn inject_delta(&self, response: DeltaDiscoveryResponse) -> usize {
        inject(&self.hub.delta, response)
    }

    /// Ends every stream, open now or opened later, with `status` (for example
    /// `Status::unavailable(..)`, as a crashing server would), dropping responses not yet
    /// sent. This is for a server that is going away: follow it with the shutdown of the
    /// tonic server. The graceful alternative is [`with_stop`](Self::with_stop).
    pub fn abort(&self, status: Status) {
        self.hub.abort.send_replace(Some(status));
    }

    /// The number of open streams, both variants.
    pub fn open_streams(&self) -> usize {
        lock(&self.hub.sotw).len() + lock(&self.hub.delta).len()
    }

    /// The tonic service, with the message size limits of the [`ServerConfig`]. Each
    /// response is encoded into a buffer of its own size, freed once written
    /// ([`AdsService`]).
    pub fn into_service(self) -> AdsService {
        let (decode, encode) = (
            self.config.max_decoding_message_size,
            self.config.max_encoding_message_size,
        );
        AdsService::new(self, decode, encode)
    }

    /// Serves on `listener` until `shutdown` completes, then waits for open connections to
    /// close (end streams first with [`with_stop`](Self::with_stop) or
    /// [`abort`](Self::abort)). Accepted sockets get `TCP_NODELAY` per
    /// [`ServerConfig::tcp_nodelay`]; HTTP/2 keepalive is per [`ServerConfig::keepalive`].
    ///
    /// # Errors
    ///
    /// When the tonic server fails.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future closes the listener; connections already accepted run on their
    /// own tasks until they end.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        let nodelay = self.config.tcp_nodelay;
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).then(
            move |accepted| async move {
                match accepted {
                    Ok(tcp) => {
                        if let Err(e) = tcp.set_nodelay(nodelay) {
                            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
                        }
                        Ok(tcp)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "ADS accept failed");
                        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                        Err(e)
                    }
                }
            },
        );
        self.serve_with_incoming(incoming, shutdown).await
    }

    /// Serves the connections of `incoming` until `shutdown` completes, as
    /// [`serve`](Self::serve) does: for a TLS acceptor of your own, a Unix socket, or an
    /// in-memory transport. An `Err` item is logged and skipped.
    ///
    /// ```no_run
    /// # async fn demo(tls: tokio_rustls::TlsAcceptor) -> Result<(), tonic::transport::Error> {
    /// use futures::StreamExt;
    /// use meshkit_xds_server::{AdsServer, SnapshotCache};
    ///
    /// let listener = tokio::net::TcpListener::bind("127.0.0.1:15010").await.unwrap();
    /// let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).filter_map(
    ///     move |tcp| {
    ///         let tls = tls.clone();
    ///         // Failed handshakes are dropped; a slow one holds up the next accept, so a
    ///         // production server would hand handshakes to tasks.
    ///         async move { Some(Ok::<_, std::io::Error>(tls.accept(tcp.ok()?).await.ok()?)) }
    ///     },
    /// );
    /// AdsServer::new(SnapshotCache::default())
    ///     .serve_with_incoming(Box::pin(incoming), std::future::pending())
    ///     .await
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// When the tonic server fails.
    ///
    /// # Cancel safety
    ///
    /// As for [`serve`](Self::serve): dropping the future drops `incoming`.
    pub async fn serve_with_incoming<I, IO, IE>(
        self,
        incoming: I,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error>
    where
        I: Stream<Item = Result<IO, IE>> + Send,
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        IE: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (connections, max) = (Gauge::default(), self.config.max_connections);
        let first_stream = self.config.first_stream_timeout;
        let incoming = incoming.filter_map(move |io| {
            let io = match io {
                Ok(io) => match connections.try_acquire(max) {
                    Some(permit) => Some(Ok(Io {
                        io: AdmissionDeadline::new(io, first_stream),
                        _permit: Some(permit),
                    })),
                    None => {
                        // Dropped: closed before a byte is read.
                        tracing::warn!(max, "ADS connection closed: too many open connections");
                        None
                    }
                },
                Err(e) => Some(Err(e)),
            };
            std::future::ready(io)
        });
        tonic::transport::Server::builder()
            .max_concurrent_streams(self.config.max_streams_per_connection)
            .http2_keepalive_interval(self.config.keepalive_interval)
            .http2_keepalive_timeout(Some(self.config.keepalive_timeout))
            .add_service(self.into_service())
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
    }

    /// A new stream's loop, registered in the hub for injection.
    fn open<V: Variant>(
        &self,
        requests: Streaming<V::Request>,
        guard: Option<Guard>,
    ) -> Out<V::Response> {
        let (tx, injected) = mpsc::channel(self.config.channel_depth.max(1));
        let id = self.hub.next_id.fetch_add(1, Ordering::Relaxed);
        lock(V::slots(&self.hub)).insert(id, tx);
        let driver = Driver {
            state: V::new(&self.config),
            requests,
            snapshots: self.cache.subscribe(),
            stop: self.stop.clone(),
            abort: self.hub.abort.subscribe(),
            injected,
            observer: self.observer.clone(),
            pending: VecDeque::new(),
            finished: false,
            ended: None,
            guard,
            _slot: SlotGuard {
                hub: Arc::clone(&self.hub),
                id,
                _variant: std::marker::PhantomData,
            },
        };
        Box::pin(futures::stream::unfold(driver, |mut d| async move {
            let item = d.next().await?;
            Some((item, d))
        }))
    }
}

impl fmt::Debug for AdsServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdsServer")
            .field("config", &self.config)
            .field("stop", &self.stop.is_some())
            .field("observer", &self.observer.is_some())
            .field("open_streams", &self.open_streams())
            .finish_non_exhaustive()
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsServer {
    type StreamAggregatedResourcesStream = Out<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Out<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let permit = self.stream_permit()?;
        let guard = self.admit(request.metadata()).await?;
        admitted(&request);
        Ok(Response::new(Box::pin(permit.hold(
            self.open::<SotwStream>(request.into_inner(), guard),
        ))))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let permit = self.stream_permit()?;
        let guard = self.admit(request.metadata()).await?;
        admitted(&request);
        Ok(Response::new(Box::pin(permit.hold(
            self.open::<DeltaStream>(request.into_inner(), guard),
        ))))
    }
}

impl AdsServer {
    /// A place for one more stream, or `RESOURCE_EXHAUSTED` at [`ServerConfig::max_streams`].
    fn stream_permit(&self) -> Result<crate::limits::Permit, Status> {
        let max = self.config.max_streams;
        self.hub.streams.try_acquire(max).ok_or_else(|| {
            tracing::warn!(max, "ADS stream refused: too many open streams");
            Status::resource_exhausted(format!(
                "the server has its limit of {max} ADS streams open"
            ))
        })
    }

    /// Asks the [`AccessPolicy`], if any, whether a stream with `metadata` may open.
    async fn admit(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Option<Guard>, Status> {
        match &self.access {
            None => Ok(None),
            Some(policy) => match policy.open(metadata).await {
                Ok(access) => Ok(Some(Guard::new(access))),
                Err(status) => {
                    tracing::warn!(%status, "ADS stream refused");
                    Err(status)
                }
            },
        }
    }
}

/// Lifts the first-stream deadline of the connection `request` came on.
fn admitted<T>(request: &Request<T>) {
    if let Some(admission) = request.extensions().get::<Admission>() {
        admission.admit();
    }
}

fn inject<R: Clone>(slots: &Slots<R>, response: R) -> usize {
    let slots = lock(slots);
    let mut queued = 0;
    for tx in slots.values() {
        match tx.try_send(response.clone()) {
            Ok(()) => queued += 1,
            Err(_) => tracing::warn!("injected response dropped: the stream's queue is full"),
        }
    }
    queued
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// === impl Driver ===

impl<V: Variant> Driver<V> {
    /// The next item of the response stream; `None` ends it with status OK. A response is
    /// shown to the observer as it is handed to the transport.
    async fn next(&mut self) -> Option<Result<V::Response, Status>> {
        let item = self.next_item().await;
        if let (Some(Ok(response)), Some(observer)) = (&item, &self.observer) {
            V::observe_response(&**observer, response);
        }
        item
    }

    /// Ends the stream, saying why in the log line of its close.
    fn finish(&mut self, why: impl Into<String>) {
        self.finished = true;
        self.ended = Some(why.into());
    }

    async fn next_item(&mut self) -> Option<Result<V::Response, Status>> {
        if self.finished {
            return None;
        }
        loop {
            // An abort wins over anything queued, as a crash would.
            let aborted = self.abort.borrow_and_update().clone();
            if let Some(status) = aborted {
                self.finish(format!("aborted: {}", status.message()));
                return Some(Err(status));
            }
            if let Some(response) = self.pending.pop_front() {
                return Some(Ok(response));
            }
            tokio::select! {
                biased;
                changed = self.abort.changed() => {
                    if changed.is_err() {
                        // The hub is gone, so is the server.
                        self.finish("the server is gone");
                        return None;
                    }
                }
                () = stopped(&mut self.stop) => {
                    self.finish("the server is stopping");
                    return None;
                }
                Some(response) = self.injected.recv() => return Some(Ok(response)),
                msg = self.requests.message() => match msg {
                    Ok(Some(req)) => {
                        if let Some(observer) = &self.observer {
                            V::observe(&**observer, &req);
                        }
                        if let Some(guard) = &mut self.guard
                            && let Err(status) = guard.check(V::node(&req))
                        {
                            tracing::warn!(%status, "ADS stream refused: node not accepted");
                            self.finish(format!("refused: {}", status.message()));
                            return Some(Err(status));
                        }
                        if let Err(e) = self.state.try_handle_request(req) {
                            tracing::warn!(error = %e, "ADS stream refused");
                            self.finish(format!("refused: {e}"));
                            return Some(Err(e.into()));
                        }
                        let snapshot = self.view();
                        self.pending.extend(self.state.poll(&snapshot));
                    }
                    Ok(None) => {
                        self.finish("the client ended it");
                        return None;
                    }
                    Err(status) => {
                        tracing::debug!(%status, "ADS stream ended");
                        self.finish(format!("the client's side failed: {}", status.message()));
                        return Some(Err(status));
                    }
                },
                changed = self.snapshots.changed() => {
                    if changed.is_err() {
                        self.finish("the snapshot cache is gone");
                        return None;
                    }
                    let snapshot = self.view();
                    self.pending.extend(self.state.poll(&snapshot));
                }
            }
        }
    }
}

impl<V: Variant> Driver<V> {
    /// The newest snapshot as this stream may see it.
    fn view(&mut self) -> Arc<Snapshot> {
        let snapshot = self.snapshots.borrow_and_update().clone();
        match &mut self.guard {
            Some(guard) => guard.view(&snapshot),
            None => snapshot,
        }
    }
}

/// Completes when `stop` turns true; never without one.
async fn stopped(stop: &mut Option<watch::Receiver<bool>>) {
    match stop {
        Some(rx) => {
            if rx.wait_for(|s| *s).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// The close of a stream is logged at info with its node, as its open is ("... ADS stream
/// opened"), so that an operator sees every client come and go.
impl<V: Variant> Drop for Driver<V> {
    fn drop(&mut self) {
        let node = self.state.stream_node();
        let why = self.ended.as_deref().unwrap_or("the client went away");
        if node.is_empty() {
            tracing::debug!(reason = %why, "{} ADS stream closed before naming its node", V::NAME);
        } else {
            tracing::info!(%node, reason = %why, "{} ADS stream closed", V::NAME);
        }
    }
}

impl<V: Variant> Drop for SlotGuard<V> {
    fn drop(&mut self) {
        lock(V::slots(&self.hub)).remove(&self.id);
    }
}

// === impl Variant ===

impl Variant for SotwStream {
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;
    const NAME: &'static str = "SotW";

    fn new(config: &ServerConfig) -> Self {
        SotwStream::new(config)
    }
    fn observe(observer: &dyn RequestObserver, request: &DiscoveryRequest) {
        observer.on_sotw_request(request);
    }
    fn observe_response(observer: &dyn RequestObserver, response: &DiscoveryResponse) {
        observer.on_sotw_response(response);
    }
    fn node(request: &DiscoveryRequest) -> Option<&Node> {
        request.node.as_ref()
    }
    fn stream_node(&self) -> &str {
        self.node_id()
    }
    fn try_handle_request(&mut self, request: DiscoveryRequest) -> Result<(), RequestError> {
        SotwStream::try_handle_request(self, request)
    }
    fn poll(&mut self, snapshot: &Snapshot) -> Vec<DiscoveryResponse> {
        SotwStream::poll(self, snapshot)
    }
    fn slots(hub: &Hub) -> &Slots<DiscoveryResponse> {
        &hub.sotw
    }
}

impl Variant for DeltaStream {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;
    const NAME: &'static str = "Delta";

    fn new(config: &ServerConfig) -> Self {
        DeltaStream::new(config)
    }
    fn observe(observer: &dyn RequestObserver, request: &DeltaDiscoveryRequest) {
        observer.on_delta_request(request);
    }
    fn observe_response(observer: &dyn RequestObserver, response: &DeltaDiscoveryResponse) {
        observer.on_delta_response(response);
    }
    fn node(request: &DeltaDiscoveryRequest) -> Option<&Node> {
        request.node.as_ref()
    }
    fn stream_node(&self) -> &str {
        self.node_id()
    }
    fn try_handle_request(&mut self, request: DeltaDiscoveryRequest) -> Result<(), RequestError> {
        DeltaStream::try_handle_request(self, request)
    }
    fn poll(&mut self, snapshot: &Snapshot) -> Vec<DeltaDiscoveryResponse> {
        DeltaStream::poll(self, snapshot)
    }
    fn slots(hub: &Hub) -> &Slots<DeltaDiscoveryResponse> {
        &hub.delta
    }
}
