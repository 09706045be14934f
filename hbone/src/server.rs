//! The HBONE server: TLS with a certificate chosen per connection, the client's SPIFFE
//! certificate required, HTTP/2, and each CONNECT handed to a `tower::Service` that decides.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use h2::RecvStream;
use h2::server::SendResponse;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use meshkit_identity::{AcceptError, BoxFuture, CertSelector, SpiffeId};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use crate::fair::{FairSlots, FairStats, source_key};
use tokio::time::Instant;
use tower_service::Service;

use crate::budget::SendBudget;
use crate::config::H2Settings;
use crate::error::{Error, Kind};
use crate::io::Frames;
use crate::keepalive::keepalive;
use crate::rt::{Exec, Executor};
use crate::tunnel::Tunnel;
use meshkit_identity::ErrorChain;

/// One CONNECT request, with what the server verified about it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ConnectRequest {
    /// The client's SPIFFE ID, verified in the TLS handshake.
    pub peer: SpiffeId,
    /// The client's address (the TCP peer of the HBONE connection).
    pub source: SocketAddr,
    /// The local address the client connected to.
    pub destination: SocketAddr,
    /// The `:authority` of the CONNECT: where the client wants its bytes to go.
    pub target: SocketAddr,
    /// The request headers (`Forwarded`, `traceparent`, `baggage`, ...).
    pub headers: HeaderMap,
}

/// What the service decides about a CONNECT.
pub enum Decision {
    /// Answer 200, then run the handler with the tunnel.
    Accept(Handler),
    /// Answer with this status and close the stream.
    Refuse(StatusCode),
}

/// What runs with an accepted tunnel.
pub struct Handler(Box<dyn FnOnce(Tunnel) -> BoxFuture<'static, ()> + Send>);

impl Decision {
    /// Accept, running `handler` with the tunnel once the 200 is sent.
    pub fn accept<F, Fut>(handler: F) -> Self
    where
        F: FnOnce(Tunnel) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Decision::Accept(Handler(Box::new(move |t| Box::pin(handler(t)))))
    }

    /// Refuse with `status` (403 for policy, 503 when the target is unreachable, ...).
    pub fn refuse(status: StatusCode) -> Self {
        Decision::Refuse(status)
    }
}

impl Handler {
    /// Runs the handler with `tunnel`: what the server does once the 200 is sent. A service
    /// that wraps another one's decision uses it to add to what runs with the tunnel (for
    /// example, to close the tunnel when a condition changes).
    pub fn run(self, tunnel: Tunnel) -> BoxFuture<'static, ()> {
        (self.0)(tunnel)
    }
}

impl fmt::Debug for Handler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Handler")
    }
}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Accept(_) => f.write_str("Accept"),
            Decision::Refuse(s) => f.debug_tuple("Refuse").field(s).finish(),
        }
    }
}

/// Server settings, with documented defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerConfig {
    /// HTTP/2 settings (windows, frame size, keepalive).
    pub h2: H2Settings,
    /// Time allowed for the TLS handshake. Default: 10 s.
    pub handshake_timeout: Duration,
    /// Time allowed, once TLS is done, for the client's whole HTTP/2 preface (the magic string
    /// and its SETTINGS frame); a connection that takes longer is closed. Default: 10 s.
    pub preface_timeout: Duration,
    /// Time allowed, once TLS is done, for the first CONNECT; a connection that opens no
    /// stream in time is closed. Default: 10 s.
    pub first_stream_timeout: Duration,
    /// Connections from one source (an IPv4 address, or an IPv6 /64) that may be in the TLS
    /// handshake at once (accepted and
    /// not yet authenticated); sockets past it are closed at once, so that one source cannot
    /// hold the connection slots. Default: 128.
    pub max_handshakes_per_source: usize,
    /// Concurrent streams allowed per connection, announced as SETTINGS_MAX_CONCURRENT_STREAMS;
    /// a stream past it is reset with REFUSED_STREAM before the service sees it.
    /// Default: 2,000.
    pub max_streams_per_connection: u32,
    /// Connections served at once, shared fairly among sources ([`crate::fair`]): when all
    /// are taken, a connection from a source holding fewer than the largest holder closes that
    /// holder's least recently active connection and takes its place; any other is closed at
    /// once. Default: 10,000.
    pub max_connections: usize,
    /// Connections one source (an IPv4 address, or an IPv6 /64) may have open at once, TLS
    /// handshakes included; one more is closed at once. Default: 1,000.
    pub max_connections_per_source: usize,
    /// A connection without streams for this long is closed with GOAWAY. Default: 5 min.
    pub idle_timeout: Duration,
    /// Runs each connection's and each stream's task. Default:
    /// [`TokioExecutor`](crate::TokioExecutor).
    executor: Exec,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            h2: H2Settings::default(),
            handshake_timeout: Duration::from_secs(10),
            preface_timeout: Duration::from_secs(10),
            first_stream_timeout: Duration::from_secs(10),
            max_handshakes_per_source: 128,
            max_streams_per_connection: 2_000,
            max_connections: 10_000,
            max_connections_per_source: 1_000,
            idle_timeout: Duration::from_secs(300),
            executor: Exec::default(),
        }
    }
}

impl ServerConfig {
    /// Sets the HTTP/2 settings.
    pub fn with_h2(mut self, h2: H2Settings) -> Self {
        self.h2 = h2;
        self
    }

    /// Sets the TLS handshake timeout.
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Sets the time allowed for the client's HTTP/2 preface once TLS is done.
    pub fn with_preface_timeout(mut self, timeout: Duration) -> Self {
        self.preface_timeout = timeout;
        self
    }

    /// Sets the time allowed for the first CONNECT once TLS is done.
    pub fn with_first_stream_timeout(mut self, timeout: Duration) -> Self {
        self.first_stream_timeout = timeout;
        self
    }

    /// Sets how many connections from one source IP may be in the TLS handshake at once (at
    /// least 1).
    pub fn with_max_handshakes_per_source(mut self, max: usize) -> Self {
        self.max_handshakes_per_source = max.max(1);
        self
    }

    /// Sets the concurrent streams allowed per connection.
    pub fn with_max_streams_per_connection(mut self, max: u32) -> Self {
        self.max_streams_per_connection = max;
        self
    }

    /// Sets how many connections are served at once.
    pub fn with_max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// Sets how many connections one source may have open at once (at least 1).
    pub fn with_max_connections_per_source(mut self, max: usize) -> Self {
        self.max_connections_per_source = max.max(1);
        self
    }

    /// Sets the idle timeout of connections.
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Sets the executor that runs the server's tasks: one per accepted connection
    /// ([`Server::serve`], [`Server::serve_with_shutdown`]) and one per CONNECT stream.
    /// Default: [`TokioExecutor`](crate::TokioExecutor), `tokio::spawn` on the runtime of the
    /// task that runs the server.
    pub fn with_executor(mut self, executor: impl Executor) -> Self {
        self.executor = Exec::new(executor);
        self
    }
}

/// Counters of a server, readable while it runs.
#[derive(Debug, Default)]
pub struct ServerStats {
    accepted: AtomicU64,
    open: AtomicUsize,
    handshake_failures: AtomicU64,
    refused_per_source: AtomicU64,
    streams: AtomicU64,
    /// The connection places ([`ServerConfig::max_connections`]), with their own counts.
    slots: Option<FairSlots>,
}

impl ServerStats {
    /// TCP connections accepted so far.
    pub fn connections_accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Connections open now.
    pub fn connections_open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Connections whose TLS handshake failed or timed out.
    pub fn handshake_failures(&self) -> u64 {
        self.handshake_failures.load(Ordering::Relaxed)
    }

    /// Sockets closed on accept because their source IP had
    /// [`ServerConfig::max_handshakes_per_source`] handshakes in progress.
    pub fn refused_per_source(&self) -> u64 {
        self.refused_per_source.load(Ordering::Relaxed)
    }

    /// Streams (requests) received so far.
    pub fn streams(&self) -> u64 {
        self.streams.load(Ordering::Relaxed)
    }

    /// What the fair share of connection places did: connections closed at accept because
    /// their source held [`ServerConfig::max_connections_per_source`] or every place was held
    /// fairly, and connections closed to give their place to a source holding fewer.
    pub fn connection_shares(&self) -> Option<&FairStats> {
        self.slots.as_ref().map(FairSlots::stats)
    }
}

/// An HBONE server.
///
/// `Sel` chooses the certificate per connection (see [`meshkit_identity::CertSelector`]); its
/// configurations must require client certificates (those from
/// [`meshkit_identity::TlsSettings::server_config`] do). `S` decides each CONNECT.
pub struct Server<Sel, S> {
    config: ServerConfig,
    selector: Arc<Sel>,
    service: S,
    stats: Arc<ServerStats>,
}

// === impl Server ===

impl<Sel, S> Server<Sel, S>
where
    Sel: CertSelector + 'static,
    S: Service<ConnectRequest, Response = Decision> + Clone + Send + Sync + 'static,
    S::Error: fmt::Display + Send,
    S::Future: Send,
{
    /// A server with `config`, choosing certificates with `selector`, deciding with `service`.
    pub fn new(config: ServerConfig, selector: impl Into<Arc<Sel>>, service: S) -> Self {
        let slots = FairSlots::new(config.max_connections, config.max_connections_per_source);
        Self {
            config,
            selector: selector.into(),
            service,
            stats: Arc::new(ServerStats {
                slots: Some(slots),
                ..ServerStats::default()
            }),
        }
    }

    /// The server's counters.
    pub fn stats(&self) -> Arc<ServerStats> {
        self.stats.clone()
    }

    /// Serves `listener` until `shutdown` completes, then drains: stops accepting, sends GOAWAY
    /// on every connection, lets open tunnels finish for up to `drain`, and closes what is
    /// left.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops accepting and closes every connection: each connection's task
    /// ends the next time its executor polls it.
    ///
    /// # Errors
    ///
    /// Only when accepting from the listener fails persistently; failures of single
    /// connections are logged and counted.
    pub async fn serve_with_shutdown(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
        drain: Duration,
    ) -> std::io::Result<()> {
        let this = Arc::new(self);
        let (drain_tx, drain_rx) = watch::channel(false);
        // Dropped at the drain deadline, or with this future: every connection task then ends.
        let (abort_tx, abort_rx) = watch::channel(());
        // Each connection task holds a sender, so `recv` returns `None` once all have ended,
        // whichever executor runs them.
        let (done_tx, mut done_rx) = mpsc::channel::<Infallible>(1);
        let slots = this.stats.slots.clone().unwrap_or_else(|| {
            FairSlots::new(
                this.config.max_connections,
                this.config.max_connections_per_source,
            )
        });
        let handshaking = Arc::new(Handshaking::default());
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let (sock, source) = tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            // The handshake count first: it evicts nobody, so a connection it refuses never
            // took another's place.
            let Some(admitted) =
                handshaking.admit(source.ip(), this.config.max_handshakes_per_source)
            else {
                this.stats
                    .refused_per_source
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%source, "too many handshakes from this source; closing");
                continue;
            };
            let slot = match slots.admit(source.ip()) {
                Ok(slot) => slot,
                Err(refusal) => {
                    tracing::debug!(%source, ?refusal, "no connection place for this source; closing");
                    continue;
                }
            };
            let _ = sock.set_nodelay(true);
            // One socket's failure is that connection's, never the listener's.
            let destination = match sock.local_addr() {
                Ok(destination) => destination,
                Err(e) => {
                    tracing::debug!(%source, error = %e, "accepted socket has no local address");
                    continue;
                }
            };
            let task = this.clone();
            let drain_rx = drain_rx.clone();
            let mut abort = abort_rx.clone();
            let done = done_tx.clone();
            let sock = slot.hold(sock);
            this.config.executor.execute(async move {
                let _done = done;
                tokio::select! {
                    result = task.serve_io(sock, source, destination, drain_rx, Some(admitted)) => {
                        if let Err(e) = result {
                            tracing::debug!(%source, error = %ErrorChain(&e), "HBONE connection ended with an error");
                        }
                    }
                    _ = abort.changed() => {}
                }
            });
        }
        drop(listener);
        drop(done_tx);
        let _ = drain_tx.send(true);
        let drained = tokio::time::timeout(drain, done_rx.recv()).await;
        if drained.is_err() {
            tracing::info!(
                remaining = this.stats.connections_open(),
                "drain deadline passed; closing remaining HBONE connections"
            );
            drop(abort_tx);
            done_rx.recv().await;
        }
        Ok(())
    }

    /// Serves `listener` until the task is dropped.
    ///
    /// # Errors
    ///
    /// As [`Server::serve_with_shutdown`].
    pub async fn serve(self, listener: TcpListener) -> std::io::Result<()> {
        self.serve_with_shutdown(listener, std::future::pending(), Duration::ZERO)
            .await
    }

    /// Serves one connection that was accepted elsewhere, over any transport (for example a
    /// tunnel, for HBONE inside HBONE). Returns when the connection closes.
    ///
    /// # Errors
    ///
    /// TLS or HTTP/2 failures of this connection.
    pub async fn serve_connection<IO>(
        &self,
        io: IO,
        source: SocketAddr,
        destination: SocketAddr,
    ) -> Result<(), Error>
    where
        IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (_tx, rx) = watch::channel(false);
        self.serve_io(io, source, destination, rx, None).await
    }

    async fn serve_io<IO>(
        &self,
        io: IO,
        source: SocketAddr,
        destination: SocketAddr,
        mut drain: watch::Receiver<bool>,
        admitted: Option<Admitted>,
    ) -> Result<(), Error>
    where
        IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
        let _open = OpenGuard::new(&self.stats);
        let handshake = tokio::time::timeout(
            self.config.handshake_timeout,
            // The read buffer stays small until TLS is done: a socket that never
            // authenticates costs little.
            crate::tls::accept(&*self.selector, io, source, destination),
        )
        .await;
        let tls = match handshake {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                self.stats
                    .handshake_failures
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%source, error = %ErrorChain(&e), "HBONE TLS handshake failed");
                return Err(match e {
                    AcceptError::PeerRejected(reason) => Error::new(Kind::PeerIdentity(reason)),
                    e => Error::new(Kind::Tls(std::io::Error::other(e))),
                });
            }
            Err(_) => {
                self.stats
                    .handshake_failures
                    .fetch_add(1, Ordering::Relaxed);
                return Err(Error::new(Kind::Timeout("TLS handshake")));
            }
        };
        // Authenticated (or failed): no longer counted against the source's handshakes.
        drop(admitted);
        let authenticated = Instant::now();
        let Some(peer) = tls.peer_spiffe_id().cloned() else {
            // Only reachable with a selector whose configs do not require SPIFFE clients.
            return Err(Error::new(Kind::Tls(std::io::Error::other(
                "client presented no SPIFFE certificate",
            ))));
        };

        let builder = self
            .config
            .h2
            .server_builder(self.config.max_streams_per_connection);
        let preface_done = Arc::new(AtomicBool::new(false));
        let budget = Arc::new(SendBudget::new(self.config.h2.max_connection_send_buffer));
        // However this connection ends, tunnels waiting for its budget are woken.
        let _budget_ends = ShutDownOnDrop(budget.clone());
        let tls = Frames::server(tls, preface_done.clone(), budget.clone());
        let cork = tls.cork();
        let preface_at = authenticated + self.config.preface_timeout;
        let mut conn = tokio::time::timeout_at(preface_at, builder.handshake::<_, Bytes>(tls))
            .await
            .map_err(|_| Error::new(Kind::Timeout("HTTP/2 preface")))??;
        let ping = conn.ping_pong();
        let alive = keepalive(
            ping,
            self.config.h2.keepalive_interval,
            self.config.h2.keepalive_timeout,
        );
        let mut alive = std::pin::pin!(alive);
        let activity = Arc::new(Activity::new());
        let idle_timeout = self.config.idle_timeout;
        // The timers live as long as the loop: timers made anew on every pass (the idle one at
        // least, and in the first seconds the preface's too) were registered with the timer
        // wheel and removed from it at every CONNECT (1.7% of a warm open).
        // Armed until the first CONNECT arrives:
        let first_stream =
            tokio::time::sleep_until(authenticated + self.config.first_stream_timeout);
        let mut first_stream = std::pin::pin!(first_stream);
        let mut awaiting_first_stream = true;
        // Armed until it has fired once, by when the client's SETTINGS must have come:
        let preface = tokio::time::sleep_until(preface_at);
        let mut preface = std::pin::pin!(preface);
        let mut awaiting_preface = true;
        // Fires at the earliest moment the connection can have been idle for the idle
        // timeout; then it looks, and sets itself for the next such moment if not.
        let idle = tokio::time::sleep_until(activity.idle_deadline(idle_timeout));
        let mut idle = std::pin::pin!(idle);
        let mut draining = *drain.borrow();
        if draining {
            conn.graceful_shutdown();
        }
        loop {
            // Biased: the connection first, then its timers and the drain signal.
            tokio::select! {
                biased;
                // Corked: the small writes of one poll of the connection (the answers of
                // many tunnels, each a DATA frame h2 flushes alone) leave in one write.
                next = std::future::poll_fn(|cx| cork.poll_with(cx, |cx| conn.poll_accept(cx))) => match next {
                    Some(Ok((request, respond))) => {
                        self.stats.streams.fetch_add(1, Ordering::Relaxed);
                        awaiting_first_stream = false;
                        let stream = Stream {
                            peer: peer.clone(),
                            source,
                            destination,
                            activity: activity.clone(),
                            budget: budget.clone(),
                        };
                        let task = stream.handle(self.service.clone(), request, respond);
                        self.config.executor.execute(task);
                    }
                    // Stop at the first error: h2 may keep yielding it.
                    Some(Err(e)) => return Err(e.into()),
                    None => return Ok(()),
                },
                () = &mut alive => {
                    tracing::info!(%source, %peer, "HBONE client stopped answering PINGs; closing");
                    return Err(Error::new(Kind::Timeout("keepalive PING")));
                }
                () = &mut preface, if awaiting_preface => {
                    if !preface_done.load(Ordering::Relaxed) {
                        tracing::debug!(%source, %peer, "no HTTP/2 SETTINGS in time; closing");
                        return Err(Error::new(Kind::Timeout("HTTP/2 preface")));
                    }
                    awaiting_preface = false;
                }
                () = &mut first_stream, if awaiting_first_stream => {
                    tracing::debug!(%source, %peer, "no CONNECT in time; closing");
                    return Err(Error::new(Kind::Timeout("first CONNECT")));
                }
                _ = drain.changed(), if !draining => {
                    draining = true;
                    conn.graceful_shutdown();
                }
                () = &mut idle, if !draining => {
                    if activity.is_idle(idle_timeout) {
                        tracing::debug!(%source, "closing idle HBONE connection");
                        draining = true;
                        conn.graceful_shutdown();
                    } else {
                        idle.as_mut().reset(activity.idle_deadline(idle_timeout));
                    }
                }
            }
        }
    }
}

impl<Sel, S: fmt::Debug> fmt::Debug for Server<Sel, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("config", &self.config)
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

/// Connections in the TLS handshake, per source IP.
#[derive(Default)]
struct Handshaking(Mutex<HashMap<IpAddr, usize>>);

/// One connection counted in [`Handshaking`] until it is dropped.
struct Admitted {
    table: Arc<Handshaking>,
    ip: IpAddr,
}

impl Handshaking {
    /// Counts a handshake from `ip`, unless `ip` has `max` in progress.
    fn admit(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<Admitted> {
        let ip = source_key(ip);
        let mut table = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let count = table.entry(ip).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(Admitted {
            table: self.clone(),
            ip,
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut table = self.table.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = table.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                table.remove(&self.ip);
            }
        }
    }
}

/// Counts a connection as open while alive.
/// Shuts a connection's send budget down when the connection's task ends.
struct ShutDownOnDrop(Arc<SendBudget>);

impl Drop for ShutDownOnDrop {
    fn drop(&mut self) {
        self.0.shut_down();
    }
}

struct OpenGuard(Arc<ServerStats>);

impl OpenGuard {
    fn new(stats: &Arc<ServerStats>) -> Self {
        stats.open.fetch_add(1, Ordering::Relaxed);
        Self(stats.clone())
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Streams in flight on one connection, and when the last one ended.
struct Activity {
    active: AtomicUsize,
    idle_since: Mutex<Instant>,
}

impl Activity {
    fn new() -> Self {
        Self {
            active: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        }
    }

    fn start(self: &Arc<Self>) -> ActiveStream {
        self.active.fetch_add(1, Ordering::SeqCst);
        ActiveStream(self.clone())
    }

    /// The earliest moment the connection can have been idle for `timeout`: one timeout
    /// from now while streams are open, one after the last stream ended otherwise.
    fn idle_deadline(&self, timeout: Duration) -> Instant {
        if self.active.load(Ordering::SeqCst) > 0 {
            return Instant::now() + timeout;
        }
        let since = *self.idle_since.lock().unwrap_or_else(|e| e.into_inner());
        since + timeout
    }

    fn is_idle(&self, timeout: Duration) -> bool {
        self.active.load(Ordering::SeqCst) == 0
            && self
                .idle_since
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .elapsed()
                >= timeout
    }
}

struct ActiveStream(Arc<Activity>);

impl Drop for ActiveStream {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::SeqCst) == 1 {
            *self.0.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        }
    }
}

/// One request on a connection.
struct Stream {
    peer: SpiffeId,
    source: SocketAddr,
    destination: SocketAddr,
    activity: Arc<Activity>,
    budget: Arc<SendBudget>,
}

impl Stream {
    async fn handle<S>(
        self,
        mut service: S,
        request: Request<RecvStream>,
        mut respond: SendResponse<Bytes>,
    ) where
        S: Service<ConnectRequest, Response = Decision>,
        S::Error: fmt::Display,
    {
        let active = self.activity.start();
        if request.method() != Method::CONNECT {
            return refuse(&mut respond, StatusCode::METHOD_NOT_ALLOWED);
        }
        let Some(target) = request
            .uri()
            .authority()
            .and_then(|a| a.as_str().parse::<SocketAddr>().ok())
        else {
            return refuse(&mut respond, StatusCode::BAD_REQUEST);
        };
        let (parts, body) = request.into_parts();
        let connect = ConnectRequest {
            peer: self.peer,
            source: self.source,
            destination: self.destination,
            target,
            headers: parts.headers,
        };
        let decide = async {
            match std::future::poll_fn(|cx| service.poll_ready(cx)).await {
                Ok(()) => service.call(connect).await,
                Err(e) => Err(e),
            }
        };
        // A peer that resets the stream while the service decides cancels the decision (and
        // whatever it is doing, such as dialing the target).
        let decision = tokio::select! {
            decision = decide => decision,
            reset = std::future::poll_fn(|cx| respond.poll_reset(cx)) => {
                tracing::debug!(%target, reset = ?reset.ok(), "client reset the stream before the answer");
                return;
            }
        };
        match decision {
            Ok(Decision::Accept(Handler(handler))) => {
                let response = Response::builder()
                    .status(StatusCode::OK)
                    .body(())
                    .unwrap_or_default();
                match respond.send_response(response, false) {
                    Ok(send) => {
                        let guard: crate::tunnel::Guard = Arc::new(active);
                        let mut tunnel = Tunnel::new(send, body, Some(guard));
                        tunnel.set_send_budget(self.budget);
                        handler(tunnel).await;
                    }
                    Err(e) => tracing::debug!(error = %e, "client went away before 200"),
                }
            }
            Ok(Decision::Refuse(status)) => refuse(&mut respond, status),
            Err(e) => {
                tracing::warn!(%target, error = %e, "HBONE service failed");
                refuse(&mut respond, StatusCode::INTERNAL_SERVER_ERROR);
            }
        }
    }
}

fn refuse(respond: &mut SendResponse<Bytes>, status: StatusCode) {
    let mut response = Response::new(());
    *response.status_mut() = status;
    let _ = respond.send_response(response, true);
}

/// A [`Decision`] service from a closure, for tests and small servers.
#[derive(Clone)]
pub struct DecideFn<F>(F);

/// Wraps `f` (a `ConnectRequest` to a future of `Decision`) as a service.
pub fn decide_fn<F, Fut>(f: F) -> DecideFn<F>
where
    F: FnMut(ConnectRequest) -> Fut,
    Fut: Future<Output = Decision>,
{
    DecideFn(f)
}

impl<F, Fut> Service<ConnectRequest> for DecideFn<F>
where
    F: FnMut(ConnectRequest) -> Fut,
    Fut: Future<Output = Decision> + Send + 'static,
{
    type Response = Decision;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Decision, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ConnectRequest) -> Self::Future {
        let fut = (self.0)(req);
        Box::pin(async move { Ok(fut.await) })
    }
}

impl<F> fmt::Debug for DecideFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DecideFn")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_source_limit_counts_ipv4_addresses_and_ipv6_prefixes() {
        let table = Arc::new(Handshaking::default());
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        let held: Vec<_> = [a, b].iter().filter_map(|ip| table.admit(*ip, 2)).collect();
        assert_eq!(held.len(), 2);
        assert!(table.admit(a, 2).is_none(), "a third from the same /64");
        assert!(
            table.admit(other, 2).is_some(),
            "another /64 is another source"
        );
        let v4: IpAddr = "127.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let _one = table.admit(v4, 1).unwrap();
        assert!(
            table.admit(mapped, 1).is_none(),
            "a mapped IPv4 address is that address"
        );
        drop(held);
        assert!(
            table.admit(a, 2).is_some(),
            "counts drop with the handshakes"
        );
    }
}
