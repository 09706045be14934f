//! The HBONE client: a `tower::Service<Target>` that opens tunnels over pooled, multiplexed
//! mutual-TLS HTTP/2 connections.

use std::collections::BTreeSet;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode};
use meshkit_identity::{
    Authorize, BoxFuture, SpiffeId, SpiffeVerifier, SvidCache, SvidSource, TlsSettings,
    TrustBundleSet, X509Svid,
};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::time::Instant;
use tower_service::Service;

use crate::config::H2Settings;
use crate::error::{Error, Kind};
use crate::io::FinalFlight;
use crate::keepalive::keepalive;
use crate::rt::{Exec, Executor};
use crate::tunnel::Tunnel;
use meshkit_identity::ErrorChain;

/// Where a tunnel goes and who may be at the other end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The HBONE peer to connect to (usually the destination node's or workload's port 15008).
    pub peer: SocketAddr,
    /// The CONNECT `:authority`: the address the peer forwards the tunnel to.
    pub destination: SocketAddr,
    /// SPIFFE IDs the peer may present; any other identity fails the request.
    pub peer_identities: BTreeSet<SpiffeId>,
    /// The identity this side presents.
    pub local_identity: SpiffeId,
    /// Extra request headers (`Forwarded`, `traceparent`, `baggage`, ...).
    pub headers: HeaderMap,
    /// The local address the HBONE connection leaves from, so that the peer sees the
    /// original client's address as the connection's source (what a node proxy does for the
    /// workloads it serves, and what IP-block policies at the peer are written against);
    /// `None` (the default): the system's choice. The address must be one the host (or
    /// network namespace) holds. Connections are pooled per source.
    pub source: Option<IpAddr>,
}

impl Target {
    /// A tunnel to `destination` through the HBONE peer at `peer`, which must present
    /// `peer_identity`, presenting `local_identity`.
    pub fn new(
        peer: SocketAddr,
        destination: SocketAddr,
        local_identity: SpiffeId,
        peer_identity: SpiffeId,
    ) -> Self {
        Self {
            peer,
            destination,
            peer_identities: BTreeSet::from([peer_identity]),
            local_identity,
            headers: HeaderMap::new(),
            source: None,
        }
    }

    /// Opens the HBONE connection from the local address `source` ([`Target::source`]).
    pub fn from_source(mut self, source: IpAddr) -> Self {
        self.source = Some(source);
        self
    }

    /// Also accepts `id` as the peer's identity.
    pub fn or_peer_identity(mut self, id: SpiffeId) -> Self {
        self.peer_identities.insert(id);
        self
    }

    /// Adds a request header.
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.append(name, value);
        self
    }

    /// Sets `Forwarded: for="SOURCE"`, naming the original client.
    pub fn forwarded_for(self, source: SocketAddr) -> Self {
        let value = HeaderValue::try_from(format!("for=\"{source}\""))
            .unwrap_or_else(|_| HeaderValue::from_static("for=unknown"));
        self.with_header(http::header::FORWARDED, value)
    }

    /// Sets the W3C `traceparent` header.
    ///
    /// # Errors
    ///
    /// When `value` is not a valid header value.
    pub fn traceparent(self, value: &str) -> Result<Self, Error> {
        let value = HeaderValue::try_from(value)
            .map_err(|e| Error::new(Kind::InvalidTarget(format!("traceparent: {e}"))))?;
        Ok(self.with_header(HeaderName::from_static("traceparent"), value))
    }

    /// Sets the W3C `baggage` header.
    ///
    /// # Errors
    ///
    /// When `value` is not a valid header value.
    pub fn baggage(self, value: &str) -> Result<Self, Error> {
        let value = HeaderValue::try_from(value)
            .map_err(|e| Error::new(Kind::InvalidTarget(format!("baggage: {e}"))))?;
        Ok(self.with_header(HeaderName::from_static("baggage"), value))
    }

    fn pool_key(&self) -> PoolKey {
        PoolKey {
            local: self.local_identity.clone(),
            peers: self.peer_identities.clone(),
            address: self.peer,
            source: self.source,
        }
    }
}

/// Connections are shared only between tunnels that agree on all four.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PoolKey {
    local: SpiffeId,
    peers: BTreeSet<SpiffeId>,
    address: SocketAddr,
    source: Option<IpAddr>,
}

/// Opens the transport under an HBONE connection: TCP, or a tunnel for HBONE in HBONE.
pub trait Connect: Clone + Send + Sync + 'static {
    /// The transport.
    type Io: AsyncRead + AsyncWrite + Send + Unpin + 'static;

    /// Connects to `addr`.
    fn connect(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<Self::Io>>;

    /// Connects to `addr` from the local address `source` ([`Target::source`]). A transport
    /// that cannot choose its source address refuses (the default): a connection from the
    /// wrong address would be judged by the peer as someone else's.
    fn connect_from(
        &self,
        addr: SocketAddr,
        source: IpAddr,
    ) -> BoxFuture<'static, io::Result<Self::Io>> {
        let _ = addr;
        Box::pin(async move {
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("this transport cannot open a connection from {source}"),
            ))
        })
    }
}

/// Plain TCP with `TCP_NODELAY`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpConnector;

impl Connect for TcpConnector {
    type Io = TcpStream;

    fn connect(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<TcpStream>> {
        Box::pin(async move {
            let sock = TcpStream::connect(addr).await?;
            sock.set_nodelay(true)?;
            Ok(sock)
        })
    }

    fn connect_from(
        &self,
        addr: SocketAddr,
        source: IpAddr,
    ) -> BoxFuture<'static, io::Result<TcpStream>> {
        Box::pin(async move {
            let socket = match addr {
                SocketAddr::V4(_) => TcpSocket::new_v4()?,
                SocketAddr::V6(_) => TcpSocket::new_v6()?,
            };
            // Port 0: the system picks the port; only the address is the client's.
            socket.bind(SocketAddr::new(source, 0))?;
            let sock = socket.connect(addr).await?;
            sock.set_nodelay(true)?;
            Ok(sock)
        })
    }
}

/// Opens the transport as a tunnel through another HBONE client: HBONE inside HBONE.
#[derive(Clone)]
pub struct TunnelConnector<C: Connect> {
    outer: Client<C>,
    target: Arc<dyn Fn(SocketAddr) -> Target + Send + Sync>,
}

impl<C: Connect> TunnelConnector<C> {
    /// Connects through `outer`, turning each address into the outer tunnel's target with
    /// `target`.
    pub fn new(
        outer: Client<C>,
        target: impl Fn(SocketAddr) -> Target + Send + Sync + 'static,
    ) -> Self {
        Self {
            outer,
            target: Arc::new(target),
        }
    }
}

impl<C: Connect> Connect for TunnelConnector<C> {
    type Io = Tunnel;

    fn connect(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<Tunnel>> {
        let outer = self.outer.clone();
        let target = (self.target)(addr);
        Box::pin(async move { outer.open(target).await.map_err(io::Error::other) })
    }
}

impl<C: Connect> fmt::Debug for TunnelConnector<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TunnelConnector").finish_non_exhaustive()
    }
}

/// Where the client gets the certificate of the identity a target asks it to present.
pub trait IdentityProvider: Send + Sync + 'static {
    /// The SVID source for `id`.
    ///
    /// # Errors
    ///
    /// Why the certificate of `id` cannot be had.
    fn svid(&self, id: &SpiffeId) -> BoxFuture<'static, Result<SvidSource, LocalIdentityError>>;
}

/// Why an [`IdentityProvider`] has no certificate for an identity.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocalIdentityError {
    /// The provider holds one identity, and it is another.
    #[error("this client only holds {held}, not {asked}")]
    NotHeld {
        /// The identity held.
        held: SpiffeId,
        /// The identity asked for.
        asked: SpiffeId,
    },
    /// The certificate could not be obtained (for example, the CA refused or cannot be
    /// reached).
    #[error("the certificate of {id} could not be obtained")]
    Unavailable {
        /// The identity.
        id: SpiffeId,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl IdentityProvider for SvidCache {
    fn svid(&self, id: &SpiffeId) -> BoxFuture<'static, Result<SvidSource, LocalIdentityError>> {
        let cache = self.clone();
        let id = id.clone();
        Box::pin(async move {
            match cache.get(&id).await {
                Ok(svid) => Ok(SvidSource::Rotating(svid)),
                Err(e) => Err(LocalIdentityError::Unavailable {
                    id,
                    source: Box::new(e),
                }),
            }
        })
    }
}

impl IdentityProvider for X509Svid {
    fn svid(&self, id: &SpiffeId) -> BoxFuture<'static, Result<SvidSource, LocalIdentityError>> {
        let result = if self.spiffe_id() == id {
            Ok(SvidSource::Fixed(self.clone()))
        } else {
            Err(LocalIdentityError::NotHeld {
                held: self.spiffe_id().clone(),
                asked: id.clone(),
            })
        };
        Box::pin(std::future::ready(result))
    }
}

/// Client settings, with documented defaults.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// HTTP/2 settings (windows, frame size, keepalive).
    pub h2: H2Settings,
    /// Tunnels per connection before another connection is opened. Default: 100. A peer that
    /// allows fewer concurrent streams (SETTINGS_MAX_CONCURRENT_STREAMS) gets as many as it
    /// allows per connection.
    pub max_streams_per_connection: usize,
    /// A pooled connection without tunnels for this long is closed. Default: 60 s.
    pub idle_timeout: Duration,
    /// Time allowed to connect the transport. Default: 10 s.
    pub connect_timeout: Duration,
    /// Time allowed for the TLS and HTTP/2 handshakes. Default: 10 s.
    pub handshake_timeout: Duration,
    /// Time allowed for the CONNECT response. Default: 15 s.
    pub response_timeout: Duration,
    /// TLS provider and ALPN (default: ring, `h2`).
    pub tls: TlsSettings,
    /// Runs each connection's driver task. Default: [`TokioExecutor`](crate::TokioExecutor).
    executor: Exec,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            h2: H2Settings::default(),
            max_streams_per_connection: 100,
            idle_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            response_timeout: Duration::from_secs(15),
            tls: TlsSettings::default(),
            executor: Exec::default(),
        }
    }
}

impl ClientConfig {
    /// Sets the TLS settings: the crypto provider and the ALPN protocols offered.
    pub fn with_tls(mut self, tls: TlsSettings) -> Self {
        self.tls = tls;
        self
    }

    /// Sets the HTTP/2 settings.
    pub fn with_h2(mut self, h2: H2Settings) -> Self {
        self.h2 = h2;
        self
    }

    /// Sets the tunnels per connection.
    pub fn with_max_streams_per_connection(mut self, max: usize) -> Self {
        self.max_streams_per_connection = max.max(1);
        self
    }

    /// Sets the idle timeout of pooled connections.
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Sets the executor that runs the background task of each connection (it polls the
    /// HTTP/2 connection, sends keepalive PINGs and closes the connection when idle). Default:
    /// [`TokioExecutor`](crate::TokioExecutor), `tokio::spawn` on the runtime of the task that
    /// opens the connection.
    pub fn with_executor(mut self, executor: impl Executor) -> Self {
        self.executor = Exec::new(executor);
        self
    }

    /// Sets the connect, handshake and response timeouts.
    pub fn with_timeouts(
        mut self,
        connect: Duration,
        handshake: Duration,
        response: Duration,
    ) -> Self {
        self.connect_timeout = connect;
        self.handshake_timeout = handshake;
        self.response_timeout = response;
        self
    }
}

/// An HBONE client: opens [`Tunnel`]s to [`Target`]s over pooled connections.
///
/// - Connections are keyed by (local identity, acceptable peer identities, peer address) and
///   carry up to [`ClientConfig::max_streams_per_connection`] tunnels each, or as many as the
///   peer allows at once if that is fewer; then another connection is opened.
/// - One handshake per key runs at a time; other callers for that key wait for it and then
///   share the new connection.
/// - Connections that failed, stopped answering PINGs or stayed idle past the idle timeout
///   leave the pool. So does one that received GOAWAY, at the latest when a request finds it
///   so; the tunnels open on it go on until they end.
/// - A request that finds its pooled connection gone (GOAWAY, I/O error) is sent once more, on
///   another connection. So is a request the peer did not process (REFUSED_STREAM, or left out
///   by a GOAWAY), even on a connection made for it, as RFC 9113 section 8.7 allows: at most
///   two attempts per [`Client::open`].
/// - A key whose local identity's certificate source has ended (a rotating SVID whose
///   [`SvidCache`] forgot the identity) is dropped with its connections and cached TLS
///   configuration: the next tunnel for it asks the [`IdentityProvider`] again, on a new
///   connection. [`Client::forget_identity`] does the same on demand.
/// - The pool's map stays bounded while identities and peers come and go: whenever it has
///   grown to twice its size after the last sweep (and to at least 64 keys), keys
///   without live connections or with an ended identity are dropped
///   ([`Client::pool_entries`]).
///
/// Cheap to clone; clones share the pool.
pub struct Client<C: Connect = TcpConnector> {
    inner: Arc<Inner<C>>,
}

struct Inner<C> {
    config: ClientConfig,
    connector: C,
    identities: Arc<dyn IdentityProvider>,
    bundles: Arc<TrustBundleSet>,
    pool: Mutex<Pool>,
    opened: AtomicU64,
}

/// The pool's keys, and the size at which it is next swept. Hashed with foldhash (seeded per
/// process): SipHash over the identities and addresses of the key was 1.4% of a warm open.
#[derive(Default)]
struct Pool {
    entries: foldhash::HashMap<PoolKey, Arc<Entry>>,
    sweep_at: usize,
}

/// The pool is swept of unused keys once it holds this many (or twice as many as after the
/// last sweep, whichever is more). Stated in [`Client`]'s docs.
const POOL_SWEEP_MIN: usize = 64;

#[derive(Default)]
struct Entry {
    conns: Mutex<Vec<Arc<Conn>>>,
    /// Held while a connection for this key is being established.
    connecting: tokio::sync::Mutex<()>,
    /// The TLS configuration for this key, and the rotating SVID it presents (if it rotates).
    tls: OnceLock<(Arc<rustls::ClientConfig>, Option<Rotating>)>,
}

/// The channel of a rotating SVID: ended when its sender (the renewal task) is gone.
type Rotating = watch::Receiver<Arc<X509Svid>>;

impl Entry {
    /// Whether the SVID this key presents is no longer renewed: its rotating source ended.
    fn identity_ended(&self) -> bool {
        self.tls
            .get()
            .and_then(|(_, rx)| rx.as_ref())
            .is_some_and(|rx| rx.has_changed().is_err())
    }

    fn has_live_connections(&self) -> bool {
        lock(&self.conns)
            .iter()
            .any(|c| !c.state.closed.load(Ordering::SeqCst))
    }
}

impl Pool {
    /// The entry for `key`, a fresh one if its identity ended; sweeps first when due.
    fn entry(&mut self, key: PoolKey) -> Arc<Entry> {
        if self.entries.len() >= self.sweep_at.max(POOL_SWEEP_MIN) {
            self.sweep();
        }
        let entry = self.entries.entry(key).or_default();
        if entry.identity_ended() {
            *entry = Arc::default();
        }
        entry.clone()
    }

    /// Drops the keys no caller holds that have no live connection, and those whose identity
    /// ended. An entry held by a caller (a handshake in progress) stays, so that one key
    /// never has two handshakes at once.
    fn sweep(&mut self) {
        self.entries.retain(|_, entry| {
            let unused = Arc::strong_count(entry) == 1 && !entry.has_live_connections();
            !unused && !entry.identity_ended()
        });
        self.sweep_at = self.entries.len() * 2;
    }
}

struct Conn {
    send: h2::client::SendRequest<Bytes>,
    state: Arc<ConnState>,
}

struct ConnState {
    closed: AtomicBool,
    active: AtomicUsize,
    idle_since: Mutex<Instant>,
}

/// Holds one stream slot of a connection; frees it when the tunnel is dropped.
struct Slot(Arc<ConnState>);

impl Drop for Slot {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            *lock(&self.0.idle_since) = Instant::now();
        }
    }
}

/// Marks a connection closed when its driver task ends or is dropped.
struct MarkClosed(Arc<ConnState>);

impl Drop for MarkClosed {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// === impl Client ===

impl Client<TcpConnector> {
    /// A client over TCP that presents identities from `identities` and verifies peers
    /// against `bundles`.
    pub fn new(
        config: ClientConfig,
        identities: impl IdentityProvider,
        bundles: impl Into<Arc<TrustBundleSet>>,
    ) -> Self {
        Self::with_connector(config, TcpConnector, identities, bundles)
    }
}

impl<C: Connect> Client<C> {
    /// A client over the transport `connector` opens.
    pub fn with_connector(
        config: ClientConfig,
        connector: C,
        identities: impl IdentityProvider,
        bundles: impl Into<Arc<TrustBundleSet>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                connector,
                identities: Arc::new(identities),
                bundles: bundles.into(),
                pool: Mutex::default(),
                opened: AtomicU64::new(0),
            }),
        }
    }

    /// Transport connections this client has established (successful handshakes).
    pub fn connections_opened(&self) -> u64 {
        self.inner.opened.load(Ordering::Relaxed)
    }

    /// Keys in the pool now (each with its connections and one cached TLS configuration).
    /// Bounded under churn: see the type's docs.
    pub fn pool_entries(&self) -> usize {
        lock(&self.inner.pool).entries.len()
    }

    /// Drops every pool key whose local identity is `id`, with its cached TLS configuration:
    /// the next tunnel presenting `id` asks the [`IdentityProvider`] again, on a new
    /// connection. Tunnels already open are not affected. Keys of a forgotten [`SvidCache`]
    /// identity are dropped without this call.
    pub fn forget_identity(&self, id: &SpiffeId) {
        lock(&self.inner.pool)
            .entries
            .retain(|key, _| key.local != *id);
    }

    /// Connections in the pool now, across all keys.
    pub fn pooled_connections(&self) -> usize {
        let entries: Vec<_> = lock(&self.inner.pool).entries.values().cloned().collect();
        entries
            .iter()
            .map(|e| {
                lock(&e.conns)
                    .iter()
                    .filter(|c| !c.state.closed.load(Ordering::SeqCst))
                    .count()
            })
            .sum()
    }

    /// Opens a tunnel to `target`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a connection being established when the future is dropped is kept for
    /// the next caller if it completes.
    ///
    /// # Errors
    ///
    /// [`Error`]: the transport, TLS (with [`Error::is_peer_identity`] when the peer is not one
    /// of the target's identities), HTTP/2, or a CONNECT status other than 200.
    pub async fn open(&self, target: Target) -> Result<Tunnel, Error> {
        let key = target.pool_key();
        let entry = lock(&self.inner.pool).entry(key);
        // A pooled connection may turn out to be gone (GOAWAY, reset): then try another once.
        // A request the peer did not process (REFUSED_STREAM, or left out by its GOAWAY) is
        // tried once more on another connection even when this one was made for it (RFC 9113
        // section 8.7); any other failure of a connection made for this request is final.
        for attempt in 0..2 {
            let (conn, slot, fresh) =
                match checkout(&entry, self.inner.config.max_streams_per_connection) {
                    Some((conn, slot)) => (conn, slot, false),
                    None => {
                        let _connecting = entry.connecting.lock().await;
                        match checkout(&entry, self.inner.config.max_streams_per_connection) {
                            Some((conn, slot)) => (conn, slot, false),
                            None => {
                                let conn = self.connect(&entry, &target).await?;
                                let slot = reserve(&conn);
                                lock(&entry.conns).push(conn.clone());
                                (conn, slot, true)
                            }
                        }
                    }
                };
            match self.open_stream(&conn, slot, &target).await {
                Err(e) if e.is_connection_gone() => {
                    conn.state.closed.store(true, Ordering::SeqCst);
                    if attempt == 1 || (fresh && !e.is_unprocessed()) {
                        return Err(e);
                    }
                    tracing::debug!(peer = %target.peer, error = %ErrorChain(&e), "HBONE request not served on this connection; retrying on another");
                }
                result => return result,
            }
        }
        Err(Error::new(Kind::Closed))
    }

    async fn connect(&self, entry: &Entry, target: &Target) -> Result<Arc<Conn>, Error> {
        let config = &self.inner.config;
        let tls = match entry.tls.get() {
            Some((tls, _)) => tls.clone(),
            None => {
                let source = self
                    .inner
                    .identities
                    .svid(&target.local_identity)
                    .await
                    .map_err(|e| Error::new(Kind::LocalIdentity(e)))?;
                let rotating = match &source {
                    SvidSource::Rotating(rx) => Some(rx.clone()),
                    SvidSource::Fixed(_) => None,
                };
                let verifier = SpiffeVerifier::new(
                    self.inner.bundles.clone(),
                    Authorize::OneOf(target.peer_identities.clone()),
                );
                let mut tls = config
                    .tls
                    .client_config(source, verifier)
                    .map_err(|e| Error::new(Kind::Tls(io::Error::other(e))))?;
                // Every connection verifies the peer in full: no session resumption.
                tls.resumption = rustls::client::Resumption::disabled();
                entry
                    .tls
                    .get_or_init(|| (Arc::new(tls), rotating))
                    .0
                    .clone()
            }
        };
        let io = tokio::time::timeout(
            config.connect_timeout,
            match target.source {
                None => self.inner.connector.connect(target.peer),
                Some(source) => self.inner.connector.connect_from(target.peer, source),
            },
        )
        .await
        .map_err(|_| Error::new(Kind::Timeout("connect")))?
        .map_err(|e| Error::new(Kind::Connect(e)))?;
        let name = ServerName::IpAddress(target.peer.ip().into());
        let flight = FinalFlight::new(io);
        let cork = flight.cork();
        let handshake = async {
            let tls = match crate::tls::connect(tls, name, flight).await {
                Ok(tls) => tls,
                Err((e, mut io)) => {
                    // The alert telling the server why is among what the layer held.
                    io.release();
                    let _ = io.flush().await;
                    return Err(Error::from_tls(e));
                }
            };
            let (send, connection) = config
                .h2
                .client_builder()
                .handshake::<_, Bytes>(tls)
                .await?;
            Ok::<_, Error>((send, connection))
        };
        let (send, mut connection) = tokio::time::timeout(config.handshake_timeout, handshake)
            .await
            .map_err(|_| Error::new(Kind::Timeout("TLS and HTTP/2 handshake")))??;
        self.inner.opened.fetch_add(1, Ordering::Relaxed);

        let state = Arc::new(ConnState {
            closed: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        });
        let driver_state = state.clone();
        let conn = Arc::new(Conn { send, state });
        let pooled = Arc::downgrade(&conn);
        let (interval, timeout, idle) = (
            config.h2.keepalive_interval,
            config.h2.keepalive_timeout,
            config.idle_timeout,
        );
        let peer = target.peer;
        config.executor.execute(async move {
            // Marks the connection closed however the task ends, dropped by its executor too.
            let _closed = MarkClosed(driver_state.clone());
            let alive = keepalive(connection.ping_pong(), interval, timeout);
            let mut alive = std::pin::pin!(alive);
            loop {
                let idle_at = *lock(&driver_state.idle_since) + idle;
                // Biased: the connection first, the timers after; no random start per poll.
                tokio::select! {
                    biased;
                    // Corked: what one poll of the connection writes leaves in one write.
                    // Once the pool has let go of the connection and no tunnel is left, h2
                    // resets the last stream in one poll and sends GOAWAY in the next, which
                    // the cork then makes one poll.
                    result = std::future::poll_fn(|cx| {
                        let closing = pooled.strong_count() == 0
                            && driver_state.active.load(Ordering::SeqCst) == 0;
                        cork.poll(&mut connection, cx, closing)
                    }) => {
                        if let Err(e) = result {
                            tracing::debug!(%peer, error = %e, "HBONE connection failed");
                        }
                        break;
                    }
                    () = &mut alive => {
                        tracing::info!(%peer, "HBONE peer stopped answering PINGs; closing");
                        break;
                    }
                    () = tokio::time::sleep_until(idle_at) => {
                        let idle_for = lock(&driver_state.idle_since).elapsed();
                        if driver_state.active.load(Ordering::SeqCst) == 0 && idle_for >= idle {
                            tracing::debug!(%peer, "closing idle HBONE connection");
                            break;
                        }
                        if driver_state.active.load(Ordering::SeqCst) > 0 {
                            // Busy: look again one idle period from now.
                            *lock(&driver_state.idle_since) = Instant::now();
                        }
                    }
                }
            }
        });
        Ok(conn)
    }

    async fn open_stream(&self, conn: &Conn, slot: Slot, target: &Target) -> Result<Tunnel, Error> {
        let mut send = conn.send.clone().ready().await?;
        let mut request = Request::builder()
            .method(Method::CONNECT)
            .uri(authority(target.destination))
            .body(())
            .map_err(|e| Error::new(Kind::InvalidTarget(e.to_string())))?;
        *request.headers_mut() = target.headers.clone();
        let (response, stream) = send.send_request(request, false)?;
        let response = tokio::time::timeout(self.inner.config.response_timeout, response)
            .await
            .map_err(|_| Error::new(Kind::Timeout("CONNECT response")))??;
        if response.status() != StatusCode::OK {
            return Err(Error::new(Kind::Status(response.status())));
        }
        let guard: crate::tunnel::Guard = Arc::new(slot);
        Ok(Tunnel::new(stream, response.into_body(), Some(guard)))
    }
}

/// The CONNECT `:authority` naming `addr`: `192.0.2.1:80`, `[2001:db8::1]:80`. IPv4 (what
/// nearly every tunnel names) is written digit by digit: `Display` for `SocketAddrV4` goes
/// through a padding-aware scratch buffer and cost 1.9% of a warm open.
fn authority(addr: SocketAddr) -> String {
    let SocketAddr::V4(v4) = addr else {
        return addr.to_string();
    };
    let mut s = String::with_capacity(21);
    for (i, octet) in v4.ip().octets().into_iter().enumerate() {
        if i > 0 {
            s.push('.');
        }
        push_decimal(&mut s, u32::from(octet));
    }
    s.push(':');
    push_decimal(&mut s, u32::from(v4.port()));
    s
}

fn push_decimal(s: &mut String, mut n: u32) {
    let mut digits = [0u8; 10];
    let mut start = digits.len();
    loop {
        start -= 1;
        // `n % 10` is below 10: the cast keeps it exactly.
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    s.extend(digits[start..].iter().map(|&d| char::from(d)));
}

/// A usable pooled connection with a free slot, reserved; drops connections that closed.
///
/// A connection's slots are the fewer of `max_streams` and the streams its peer allows at
/// once (its SETTINGS_MAX_CONCURRENT_STREAMS, unlimited until its SETTINGS arrive): a tunnel
/// past the peer's limit would only wait, in h2, for another tunnel to end.
fn checkout(entry: &Entry, max_streams: usize) -> Option<(Arc<Conn>, Slot)> {
    let mut conns = lock(&entry.conns);
    conns.retain(|c| !c.state.closed.load(Ordering::SeqCst));
    let conn = conns
        .iter()
        .find(|c| {
            // A peer that allows no stream at all is given one slot: the tunnel waits on this
            // connection (and times out) instead of a new connection being dialled per open.
            let slots = max_streams.min(c.send.current_max_send_streams().max(1));
            c.state.active.load(Ordering::SeqCst) < slots
        })?
        .clone();
    let slot = reserve(&conn);
    Some((conn, slot))
}

fn reserve(conn: &Conn) -> Slot {
    conn.state.active.fetch_add(1, Ordering::SeqCst);
    Slot(conn.state.clone())
}

impl<C: Connect> Clone for Client<C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<C: Connect> fmt::Debug for Client<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("config", &self.inner.config)
            .field("connections_opened", &self.connections_opened())
            .finish_non_exhaustive()
    }
}

impl<C: Connect> Service<Target> for Client<C> {
    type Response = Tunnel;
    type Error = Error;
    type Future = BoxFuture<'static, Result<Tunnel, Error>>;

    /// Always ready: backpressure is per connection (stream limits), applied in `call`.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, target: Target) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.open(target).await })
    }
}

#[cfg(test)]
mod tests {
    use super::authority;
    use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

    #[test]
    fn the_authority_is_what_display_writes() {
        // Every octet value in every position, with ports from 0 to 65535 (a stride that
        // covers each digit count), and IPv6, which falls back to `Display`.
        for v in 0..=255u8 {
            for (i, port) in [0u16, 9, 10, 99, 100, 8080, 15008, 65535]
                .into_iter()
                .enumerate()
            {
                let mut octets = [1, 22, 203, 0];
                octets[i % 4] = v;
                let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(octets), port));
                assert_eq!(authority(addr), addr.to_string());
            }
        }
        let mut x = 0x9e37_79b9_u32;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let addr = SocketAddr::from((Ipv4Addr::from(x), (x >> 7) as u16));
            assert_eq!(authority(addr), addr.to_string());
        }
        for addr in ["[::1]:15008", "[2001:db8::7]:80", "[::ffff:10.0.0.1]:1"] {
            let addr: SocketAddr = addr.parse().unwrap();
            assert_eq!(authority(addr), addr.to_string());
        }
    }
}
