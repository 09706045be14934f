//! The async client: a cloneable handle that creates watches, and a driver future that owns the
//! gRPC stream and the protocol core.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::{Channel, Endpoint};

use crate::error::{Chain, Error};
use crate::protocol::{Event, Mode, RemovalReason, Request, Response, Session, SessionConfig};
use crate::resource::{Resource, ResourceType};
use crate::watch::{self, Sink, Watch};

/// Configuration of an [`XdsClient`]. Built with [`ClientConfig::new`] and the builder methods;
/// every default is documented on its method.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    uri: String,
    mode: Mode,
    node: Node,
    does_not_exist_timeout: Duration,
    backoff_initial: Duration,
    backoff_max: Duration,
    connect_timeout: Duration,
    keepalive_interval: Duration,
    keepalive_timeout: Duration,
    max_message_size: usize,
    max_resources_per_type: usize,
    max_cached_bytes: usize,
    max_type_urls: usize,
    give_up_after: Option<Duration>,
    #[cfg(feature = "tls")]
    tls: Option<crate::tls::TlsConnector>,
    /// A caller-built channel used instead of connecting ([`ClientConfig::with_channel`]).
    pub(crate) channel: Option<Channel>,
    /// Added to every call ([`ClientConfig::with_credentials`]).
    pub(crate) credentials: Option<crate::transport::CallCredentials>,
}

/// A handle to an xDS client: creates watches. Cheap to clone. The client runs while its
/// [`Driver`] is polled and at least one handle or watch is alive.
#[derive(Clone, Debug)]
pub struct XdsClient {
    commands: mpsc::UnboundedSender<Command>,
    next_id: Arc<AtomicU64>,
}

/// The future that does the work: connects, keeps the stream up, applies responses and feeds
/// the watches. Spawn [`Driver::run`] on a tokio runtime.
#[derive(Debug)]
pub struct Driver {
    config: ClientConfig,
    commands: mpsc::UnboundedReceiver<Command>,
    router: Router,
    /// When the last response arrived (or the driver started), for `give_up_after`.
    last_response: Instant,
}

enum Command {
    Watch {
        id: u64,
        kind: ResourceType,
        name: Option<String>,
        sink: Sink,
    },
    Unwatch {
        id: u64,
    },
}

/// The protocol core plus the watchers it feeds; synchronous, so the driver stays a thin loop.
struct Router {
    session: Session,
    watchers: HashMap<u64, Watcher>,
    named: HashMap<&'static str, HashMap<String, Vec<u64>>>,
    wildcard: HashMap<&'static str, Vec<u64>>,
    outgoing: Option<Outgoing>,
}

struct Watcher {
    type_url: &'static str,
    name: Option<String>,
    sink: Sink,
}

/// The sending half of the current stream's request channel.
enum Outgoing {
    Sotw(mpsc::UnboundedSender<DiscoveryRequest>),
    Delta(mpsc::UnboundedSender<DeltaDiscoveryRequest>),
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<Response, tonic::Status>> + Send>>;
/// The RPC, resolved when the server sends response headers.
type PendingCall = Pin<Box<dyn Future<Output = Result<ResponseStream, tonic::Status>> + Send>>;

/// Exponential backoff with jitter; reset only when a response arrives, so a server that
/// accepts streams and then fails them is not hammered.
struct Backoff {
    initial: Duration,
    max: Duration,
    attempt: u32,
}

// === impl ClientConfig ===

impl ClientConfig {
    /// A client for the server at `uri` (`http://host:port`), speaking `mode`, as `node`.
    pub fn new(uri: impl Into<String>, mode: Mode, node: Node) -> Self {
        Self {
            uri: uri.into(),
            mode,
            node,
            does_not_exist_timeout: Duration::from_secs(15),
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            max_message_size: 64 << 20,
            max_resources_per_type: 100_000,
            max_cached_bytes: 256 << 20,
            max_type_urls: 32,
            give_up_after: None,
            #[cfg(feature = "tls")]
            tls: None,
            channel: None,
            credentials: None,
        }
    }

    /// Does-not-exist timeout for named resources (default 15 s).
    pub fn does_not_exist_timeout(mut self, d: Duration) -> Self {
        self.does_not_exist_timeout = d;
        self
    }

    /// Reconnect backoff: first delay (default 500 ms) and cap (default 30 s). Each delay is
    /// jittered to between half and all of its nominal value.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.backoff_initial = initial;
        self.backoff_max = max.max(initial);
        self
    }

    /// TCP and HTTP/2 connect timeout (default 5 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// HTTP/2 keepalive: PING every `interval` (default 30 s), even when idle, and drop the
    /// connection when no answer comes within `timeout` (default 10 s). A black-holed
    /// connection is noticed within `interval + timeout`.
    pub fn keepalive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keepalive_interval = interval;
        self.keepalive_timeout = timeout;
        self
    }

    /// Largest response accepted (default 64 MiB).
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// The most resources of one type the client holds (default 100,000); a response with
    /// more is NACKed whole, a resource that would add a name beyond it is NACKed by name.
    /// See [`SessionConfig::max_resources_per_type`].
    pub fn max_resources_per_type(mut self, max: usize) -> Self {
        self.max_resources_per_type = max;
        self
    }

    /// The most bytes of resources the client caches over all types (default 256 MiB, each
    /// resource counted as its encoded size, name and version); beyond it resources are
    /// NACKed. See [`SessionConfig::max_cached_bytes`].
    pub fn max_cached_bytes(mut self, bytes: usize) -> Self {
        self.max_cached_bytes = bytes;
        self
    }

    /// The most type URLs the client keeps state for (default 32); a response for a further
    /// type that nobody watches is NACKed and nothing of it is kept. See
    /// [`SessionConfig::max_type_urls`].
    pub fn max_type_urls(mut self, max: usize) -> Self {
        self.max_type_urls = max;
        self
    }

    /// Stop with an error when connecting or the stream fails and no response has arrived for
    /// this long (default: never; the client retries forever and serves its cache meanwhile).
    /// A healthy stream on which the server has nothing to send is not a failure.
    pub fn give_up_after(mut self, d: Duration) -> Self {
        self.give_up_after = Some(d);
        self
    }

    /// Speaks TLS with `config` (feature `tls`). The server name checked and sent as SNI is
    /// `server_name`, or else the URI's host. The URI may say `https` or `http`; the stream is
    /// TLS either way.
    #[cfg(feature = "tls")]
    pub fn tls(
        mut self,
        config: std::sync::Arc<rustls::ClientConfig>,
        server_name: Option<rustls::pki_types::ServerName<'static>>,
    ) -> Self {
        self.tls = Some(crate::tls::TlsConnector::new(config, server_name));
        self
    }

    /// SPIFFE mutual TLS (feature `identity`): presents `svid` and accepts only a server that
    /// `verifier` accepts (its trust domain's roots, then its authorizer), over TLS 1.3 with ALPN
    /// `h2`, as meshkit-identity's `TlsSettings::client_config` builds it.
    ///
    /// # Errors
    ///
    /// The rustls configuration cannot be built (the crypto provider lacks TLS 1.3).
    #[cfg(feature = "identity")]
    pub fn spiffe_mtls(
        self,
        svid: impl Into<meshkit_identity::SvidSource>,
        verifier: meshkit_identity::SpiffeVerifier,
    ) -> Result<Self, Error> {
        let config = meshkit_identity::TlsSettings::default()
            .client_config(svid, verifier)
            .map_err(Error::config)?;
        Ok(self.tls(std::sync::Arc::new(config), None))
    }

    fn endpoint(&self) -> Result<Endpoint, Error> {
        // With our own TLS connector, tonic must not try TLS itself (it would refuse `https`
        // without its own TLS features); the scheme only ends up in the `:scheme` header.
        #[cfg(feature = "tls")]
        let uri = match (&self.tls, self.uri.strip_prefix("https://")) {
            (Some(_), Some(rest)) => format!("http://{rest}"),
            _ => self.uri.clone(),
        };
        #[cfg(not(feature = "tls"))]
        let uri = self.uri.clone();
        let ep = Endpoint::from_shared(uri).map_err(Error::config)?;
        Ok(ep
            .connect_timeout(self.connect_timeout)
            .http2_keep_alive_interval(self.keepalive_interval)
            .keep_alive_timeout(self.keepalive_timeout)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true))
    }
}

// === impl XdsClient ===

impl XdsClient {
    /// A client handle and the driver to spawn. Nothing happens until the driver runs.
    pub fn new(config: ClientConfig) -> (XdsClient, Driver) {
        let (tx, rx) = mpsc::unbounded_channel();
        let session = Session::new(
            SessionConfig::new(config.mode)
                .node(config.node.clone())
                .does_not_exist_timeout(config.does_not_exist_timeout)
                .max_resources_per_type(config.max_resources_per_type)
                .max_cached_bytes(config.max_cached_bytes)
                .max_type_urls(config.max_type_urls),
        );
        (
            XdsClient {
                commands: tx,
                next_id: Arc::new(AtomicU64::new(0)),
            },
            Driver {
                config,
                commands: rx,
                router: Router::new(session),
                last_response: Instant::now(),
            },
        )
    }

    /// Watches one resource by name. A resource already cached is delivered at once.
    pub fn watch<T: Resource>(&self, name: &str) -> Watch<T> {
        self.watch_inner(Some(name.to_owned()))
    }

    /// Watches every resource of type `T` (an explicit `*` subscription).
    pub fn watch_all<T: Resource>(&self) -> Watch<T> {
        self.watch_inner(None)
    }

    fn watch_inner<T: Resource>(&self, name: Option<String>) -> Watch<T> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let commands = self.commands.clone();
        let (sink, watch) = watch::channel::<T>(Box::new(move || {
            let _ = commands.send(Command::Unwatch { id });
        }));
        // If the driver is gone, the sink is dropped with the command and the watch ends.
        let _ = self.commands.send(Command::Watch {
            id,
            kind: ResourceType::of::<T>(),
            name,
            sink,
        });
        watch
    }
}

// === impl Driver ===

impl Driver {
    /// Runs the client until every [`XdsClient`] handle and [`Watch`] is dropped (then
    /// `Ok(())`), or until it gives up.
    ///
    /// # Errors
    ///
    /// An unusable configuration ([`Error::is_config`]), or no response within
    /// [`ClientConfig::give_up_after`] ([`Error::is_timeout`]). Transient failures are retried.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops the client; watches then end.
    pub async fn run(mut self) -> Result<(), Error> {
        let endpoint = self.config.endpoint()?;
        let mut backoff = Backoff {
            initial: self.config.backoff_initial,
            max: self.config.backoff_max,
            attempt: 0,
        };
        self.last_response = Instant::now();
        loop {
            let failure = match self.serve_one_stream(&endpoint, &mut backoff).await {
                Ok(Some(failure)) => failure,
                Ok(None) => return Ok(()),
                Err(e) => return Err(e),
            };
            tracing::debug!(error = %Chain(&failure), "xds: stream ended");
            if let Some(limit) = self.config.give_up_after
                && self.last_response.elapsed() >= limit
            {
                return Err(Error::gave_up(failure));
            }
            let delay = backoff.next_delay();
            let sleep = tokio::time::sleep(delay);
            if self.idle_until(sleep).await.is_none() {
                return Ok(());
            }
        }
    }

    /// One connect-and-stream cycle. `Ok(Some(e))`: the stream failed with `e`; `Ok(None)`:
    /// everyone is gone.
    async fn serve_one_stream(
        &mut self,
        endpoint: &Endpoint,
        backoff: &mut Backoff,
    ) -> Result<Option<Error>, Error> {
        let connect = self.connect(endpoint);
        let channel = match self.idle_until(connect).await {
            None => return Ok(None),
            Some(Err(e)) => return Ok(Some(Error::connect(e))),
            Some(Ok(c)) => c,
        };
        let (outgoing, call) = self.open_call(channel);
        // Queue the first requests before awaiting response headers: some servers send
        // headers only with their first response.
        self.router.outgoing = Some(outgoing);
        self.router.session.on_connected(now());
        self.router.flush();
        let mut responses = match self.idle_until(call).await {
            None => return Ok(None),
            Some(Err(status)) => {
                self.router.disconnected();
                return Ok(Some(Error::stream(status)));
            }
            Some(Ok(stream)) => stream,
        };
        let result = loop {
            let deadline = self.router.session.poll_timeout();
            tokio::select! {
                biased;
                cmd = self.commands.recv() => match cmd {
                    Some(cmd) => self.router.command(cmd),
                    None => break None,
                },
                msg = responses.next() => match msg {
                    Some(Ok(resp)) => {
                        backoff.attempt = 0;
                        self.last_response = Instant::now();
                        self.router.session.handle_response(now(), resp);
                    }
                    Some(Err(status)) => break Some(Error::stream(status)),
                    None => break Some(Error::stream("the server closed the stream")),
                },
                () = sleep_until(deadline) => self.router.session.handle_timeout(now()),
            }
            self.router.flush();
        };
        self.router.disconnected();
        Ok(result)
    }

    fn connect(
        &self,
        endpoint: &Endpoint,
    ) -> impl Future<Output = Result<Channel, tonic::transport::Error>> + use<> {
        let endpoint = endpoint.clone();
        #[cfg(feature = "tls")]
        let tls = self.config.tls.clone();
        let channel = self.config.channel.clone();
        async move {
            if let Some(channel) = channel {
                return Ok(channel);
            }
            #[cfg(feature = "tls")]
            if let Some(tls) = tls {
                return endpoint.connect_with_connector(tls).await;
            }
            endpoint.connect().await
        }
    }

    fn open_call(&self, channel: Channel) -> (Outgoing, PendingCall) {
        let credentials = self
            .config
            .credentials
            .clone()
            .unwrap_or_else(|| crate::transport::CallCredentials::from_fn(Ok));
        let mut client = AggregatedDiscoveryServiceClient::with_interceptor(channel, credentials)
            .max_decoding_message_size(self.config.max_message_size)
            .max_encoding_message_size(self.config.max_message_size);
        match self.config.mode {
            Mode::StateOfTheWorld => {
                let (tx, rx) = mpsc::unbounded_channel();
                let call = async move {
                    let resp = client
                        .stream_aggregated_resources(UnboundedReceiverStream::new(rx))
                        .await?;
                    let s: ResponseStream =
                        Box::pin(resp.into_inner().map(|r| r.map(Response::Sotw)));
                    Ok(s)
                };
                (Outgoing::Sotw(tx), Box::pin(call))
            }
            Mode::Delta => {
                let (tx, rx) = mpsc::unbounded_channel();
                let call = async move {
                    let resp = client
                        .delta_aggregated_resources(UnboundedReceiverStream::new(rx))
                        .await?;
                    let s: ResponseStream =
                        Box::pin(resp.into_inner().map(|r| r.map(Response::Delta)));
                    Ok(s)
                };
                (Outgoing::Delta(tx), Box::pin(call))
            }
        }
    }

    /// Waits for `fut` while still serving watch commands and timers. `None`: every handle and
    /// watch is gone.
    async fn idle_until<F: Future>(&mut self, fut: F) -> Option<F::Output> {
        tokio::pin!(fut);
        loop {
            let deadline = self.router.session.poll_timeout();
            tokio::select! {
                biased;
                cmd = self.commands.recv() => match cmd {
                    Some(cmd) => self.router.command(cmd),
                    None => return None,
                },
                out = &mut fut => return Some(out),
                () = sleep_until(deadline) => self.router.session.handle_timeout(now()),
            }
            self.router.flush();
        }
    }
}

fn now() -> std::time::Instant {
    Instant::now().into_std()
}

async fn sleep_until(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(Instant::from_std(d)).await,
        None => std::future::pending().await,
    }
}

// === impl Router ===

impl Router {
    fn new(session: Session) -> Self {
        Self {
            session,
            watchers: HashMap::new(),
            named: HashMap::new(),
            wildcard: HashMap::new(),
            outgoing: None,
        }
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Watch {
                id,
                kind,
                name,
                sink,
            } => self.add_watch(id, kind, name, sink),
            Command::Unwatch { id } => self.remove_watch(id),
        }
    }

    fn add_watch(&mut self, id: u64, kind: ResourceType, name: Option<String>, sink: Sink) {
        let url = kind.type_url();
        match &name {
            Some(name) => {
                // What is known already goes to the new watcher at once.
                if let Some(value) = self.session.resource(url, name) {
                    let version = self.session.resource_version(url, name).unwrap_or_default();
                    sink.deliver(&Event::Updated {
                        type_url: url,
                        name: name.clone(),
                        version: version.to_owned(),
                        resource: Arc::clone(value),
                    });
                } else if self.session.is_absent(url, name) {
                    sink.deliver(&Event::Removed {
                        type_url: url,
                        name: name.clone(),
                        reason: RemovalReason::DoesNotExist,
                    });
                }
                let ids = self
                    .named
                    .entry(url)
                    .or_default()
                    .entry(name.clone())
                    .or_default();
                ids.push(id);
                if ids.len() == 1 {
                    self.session.subscribe(kind, name);
                }
            }
            None => {
                for (n, value) in self.session.resources(url) {
                    let version = self.session.resource_version(url, n).unwrap_or_default();
                    sink.deliver(&Event::Updated {
                        type_url: url,
                        name: n.to_owned(),
                        version: version.to_owned(),
                        resource: Arc::clone(value),
                    });
                }
                let ids = self.wildcard.entry(url).or_default();
                ids.push(id);
                if ids.len() == 1 {
                    self.session.subscribe_wildcard(kind);
                }
            }
        }
        self.watchers.insert(
            id,
            Watcher {
                type_url: url,
                name,
                sink,
            },
        );
    }

    fn remove_watch(&mut self, id: u64) {
        let Some(w) = self.watchers.remove(&id) else {
            return;
        };
        match &w.name {
            Some(name) => {
                let Some(by_name) = self.named.get_mut(w.type_url) else {
                    return;
                };
                if let Some(ids) = by_name.get_mut(name) {
                    ids.retain(|i| *i != id);
                    if ids.is_empty() {
                        by_name.remove(name);
                        self.session.unsubscribe(w.type_url, name);
                    }
                }
            }
            None => {
                if let Some(ids) = self.wildcard.get_mut(w.type_url) {
                    ids.retain(|i| *i != id);
                    if ids.is_empty() {
                        self.wildcard.remove(w.type_url);
                        self.session.unsubscribe_wildcard(w.type_url);
                    }
                }
            }
        }
    }

    /// Sends every queued request and delivers every queued event.
    fn flush(&mut self) {
        let now = now();
        while let Some(req) = self.session.poll_request(now) {
            let sent = match (&self.outgoing, req) {
                (Some(Outgoing::Sotw(tx)), Request::Sotw(r)) => tx.send(r).is_ok(),
                (Some(Outgoing::Delta(tx)), Request::Delta(r)) => tx.send(r).is_ok(),
                _ => false,
            };
            if !sent {
                // The stream is going away; the session resends everything on the next one.
                break;
            }
        }
        let mut gone = Vec::new();
        while let Some(ev) = self.session.poll_event() {
            self.dispatch(&ev, &mut gone);
        }
        for id in gone {
            self.remove_watch(id);
        }
    }

    fn dispatch(&self, ev: &Event, gone: &mut Vec<u64>) {
        let url = ev.type_url();
        let mut deliver = |id: &u64| {
            if let Some(w) = self.watchers.get(id)
                && !w.sink.deliver(ev)
            {
                gone.push(*id);
            }
        };
        match ev.name() {
            Some(name) => {
                if let Some(ids) = self.named.get(url).and_then(|m| m.get(name)) {
                    ids.iter().for_each(&mut deliver);
                }
            }
            // A rejection without a name concerns every watcher of the type.
            None => {
                if let Some(m) = self.named.get(url) {
                    m.values().flatten().for_each(&mut deliver);
                }
            }
        }
        if let Some(ids) = self.wildcard.get(url) {
            ids.iter().for_each(&mut deliver);
        }
    }

    fn disconnected(&mut self) {
        self.outgoing = None;
        self.session.on_disconnected();
        self.flush();
    }
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("session", &self.session)
            .field("watchers", &self.watchers.len())
            .finish_non_exhaustive()
    }
}

// === impl Backoff ===

impl Backoff {
    fn next_delay(&mut self) -> Duration {
        let exp = self.attempt.min(20);
        self.attempt = self.attempt.saturating_add(1);
        let nominal = self
            .initial
            .checked_mul(1u32 << exp)
            .unwrap_or(self.max)
            .min(self.max);
        // Jitter in [nominal/2, nominal] spreads clients that lost the same server.
        nominal.mul_f64(0.5 + fastrand::f64() * 0.5)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_up_to_the_cap() {
        let mut b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
            attempt: 0,
        };
        let nominal = [100u64, 200, 400, 800, 1600, 2000, 2000, 2000];
        for n in nominal {
            let d = b.next_delay();
            assert!(d >= Duration::from_millis(n / 2), "{d:?} < half of {n} ms");
            assert!(d <= Duration::from_millis(n), "{d:?} > {n} ms");
        }
        for _ in 0..100 {
            assert!(b.next_delay() <= Duration::from_secs(2));
        }
        b.attempt = 0;
        assert!(
            b.next_delay() <= Duration::from_millis(100),
            "reset starts over"
        );
    }
}
