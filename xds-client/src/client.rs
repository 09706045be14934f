//! The async client: a cloneable handle that creates watches, and a driver future that owns the
//! gRPC stream and the protocol core.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
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
use crate::protocol::{
    Event, Failover, Mode, RemovalReason, Request, Response, Session, SessionConfig,
};
use crate::resource::{Resource, ResourceType};
use crate::watch::{self, Sink, Watch};

/// Configuration of an [`XdsClient`]. Built with [`ClientConfig::new`] and the builder methods;
/// every default is documented on its method.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    uri: String,
    /// Fallback servers, in priority order after `uri` (gRFC A71).
    fallback: Vec<String>,
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
    ignore_resource_deletion: bool,
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

/// The future that does the work: connects, keeps the stream up (falling back to the next
/// server when one fails, see [`ClientConfig::fallback_servers`]), applies responses and feeds
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
    /// Counts the changes of the subscriptions on the wire, so a probe whose requests are
    /// outdated is reopened.
    generation: u64,
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

type ConnectFuture = Pin<Box<dyn Future<Output = Result<Channel, Error>> + Send>>;
/// A probe's stream: resolves when the server sends its first response.
type ProbeFuture = Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>;

/// The active server's connection, stage by stage. Every future is boxed in place, so
/// [`Link::next`] is cancel safe.
enum Link {
    Idle,
    Connecting {
        server: usize,
        connect: ConnectFuture,
    },
    /// The session is connected from here on: its requests are queued on the call.
    Opening {
        server: usize,
        call: PendingCall,
    },
    Streaming {
        server: usize,
        responses: ResponseStream,
        answered: bool,
    },
}

enum LinkEvent {
    Connected(usize, Channel),
    Opened(usize, ResponseStream),
    Response(usize, Response),
    Ended {
        server: usize,
        /// The stream had sent a response: not a failure of the server (gRFC A71).
        answered: bool,
        /// Whether the session was connected to it (so must be told it is gone).
        session: bool,
        error: Error,
    },
}

/// A higher-priority server retried while a fallback serves (gRFC A71). Its stream carries
/// the session's subscriptions ([`Session::initial_requests`]) so that the server has
/// something to answer; its first response makes it the active server again.
struct Probe {
    server: usize,
    stage: ProbeStage,
}

enum ProbeStage {
    Connecting(ConnectFuture),
    Waiting {
        channel: Channel,
        /// [`Router::generation`] of the requests sent.
        generation: u64,
        stream: ProbeFuture,
    },
}

enum ProbeEvent {
    Connected(Channel),
    Answered,
    Failed(Error),
}

// === impl ClientConfig ===

impl ClientConfig {
    /// A client for the server at `uri` (`http://host:port`), speaking `mode`, as `node`.
    pub fn new(uri: impl Into<String>, mode: Mode, node: Node) -> Self {
        Self {
            uri: uri.into(),
            fallback: Vec::new(),
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
            ignore_resource_deletion: false,
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

    /// Reconnect backoff, per server: first delay (default 500 ms) and cap (default 30 s).
    /// Each delay is jittered to between half and all of its nominal value; a server's backoff
    /// resets when it sends a response.
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

    /// Fallback servers (gRFC A71), in priority order after the one given to
    /// [`new`](Self::new) (default: none). The client streams from the first server it can
    /// use and moves to the next when the current one cannot be reached or its stream ends
    /// before a response (a stream that ends after one is reopened on the same server). While a
    /// fallback serves, every higher-priority server keeps being retried with its own backoff,
    /// on a stream that carries the client's subscriptions; the first to send a response
    /// becomes the active server again and the lower-priority streams are closed. The cache
    /// and the watches carry over every switch: no deletion and no does-not-exist comes from
    /// a switch itself, and the new server is asked for what the client holds (SotW: the last
    /// accepted version; Delta: `initial_resource_versions`). TLS, call credentials, node and
    /// timeouts apply to every server; [`with_channel`](Self::with_channel) replaces only the
    /// first server's connection.
    ///
    /// Unlike gRPC, the client falls back even when every watched resource is cached: it keeps
    /// receiving updates rather than serving a cache that no server refreshes.
    pub fn fallback_servers<I, S>(mut self, uris: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.fallback = uris.into_iter().map(Into::into).collect();
        self
    }

    /// State of the World: keep a Listener or Cluster that a response leaves out instead of
    /// deleting it (default false), as gRPC's `ignore_resource_deletion` server feature
    /// (gRFC A53). See [`SessionConfig::ignore_resource_deletion`].
    pub fn ignore_resource_deletion(mut self, ignore: bool) -> Self {
        self.ignore_resource_deletion = ignore;
        self
    }

    /// Stop with an error when connecting or the stream fails and no response has arrived for
    /// this long (default: never; the client retries forever and serves its cache meanwhile).
    /// A healthy stream on which the server has nothing to send is not a failure. With
    /// fallback servers, it is checked when the last server fails.
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

    /// The endpoint of every server, in priority order.
    fn endpoints(&self) -> Result<Vec<Endpoint>, Error> {
        std::iter::once(&self.uri)
            .chain(&self.fallback)
            .map(|uri| self.endpoint(uri))
            .collect()
    }

    fn endpoint(&self, uri: &str) -> Result<Endpoint, Error> {
        // With our own TLS connector, tonic must not try TLS itself (it would refuse `https`
        // without its own TLS features); the scheme only ends up in the `:scheme` header.
        #[cfg(feature = "tls")]
        let uri = match (&self.tls, uri.strip_prefix("https://")) {
            (Some(_), Some(rest)) => format!("http://{rest}"),
            _ => uri.to_owned(),
        };
        #[cfg(not(feature = "tls"))]
        let uri = uri.to_owned();
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
                .max_type_urls(config.max_type_urls)
                .ignore_resource_deletion(config.ignore_resource_deletion),
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
        let endpoints = self.config.endpoints()?;
        let last = endpoints.len() - 1;
        let mut servers = Failover::new(endpoints.len(), now())
            .with_backoff(self.config.backoff_initial, self.config.backoff_max);
        let mut link = Link::Idle;
        let mut probes: Vec<Probe> = Vec::new();
        self.last_response = Instant::now();
        loop {
            while let Some(server) = servers.poll_connect(now()) {
                let connect = self.connect(&endpoints[server], server);
                if server == servers.active() {
                    link = Link::Connecting { server, connect };
                } else {
                    tracing::debug!(server, "xds: probing a higher-priority server");
                    probes.push(Probe {
                        server,
                        stage: ProbeStage::Connecting(connect),
                    });
                }
            }
            self.refresh_probes(&mut probes);
            let deadline = self.router.session.poll_timeout();
            let retry = servers.poll_timeout();
            tokio::select! {
                biased;
                cmd = self.commands.recv() => match cmd {
                    Some(cmd) => self.router.command(cmd),
                    None => return Ok(()),
                },
                event = link.next() => match event {
                    LinkEvent::Connected(server, channel) => link = self.open(server, channel),
                    LinkEvent::Opened(server, responses) => {
                        link = Link::Streaming { server, responses, answered: false };
                    }
                    LinkEvent::Response(server, response) => {
                        self.last_response = Instant::now();
                        servers.on_response(server, now());
                        self.router.session.handle_response(now(), response);
                    }
                    LinkEvent::Ended { server, answered, session, error } => {
                        link = Link::Idle;
                        if session {
                            self.router.disconnected();
                        }
                        tracing::debug!(server, error = %Chain(&error), "xds: stream ended");
                        if answered {
                            servers.on_closed(server, now());
                        } else {
                            if server == last
                                && let Some(limit) = self.config.give_up_after
                                && self.last_response.elapsed() >= limit
                            {
                                return Err(Error::gave_up(error));
                            }
                            servers.on_failure(server, now());
                            if servers.active() != server {
                                tracing::info!(
                                    from = server,
                                    to = servers.active(),
                                    error = %Chain(&error),
                                    "xds: server failed before answering; falling back to the next"
                                );
                            }
                        }
                    }
                },
                (i, event) = poll_probes(&mut probes), if !probes.is_empty() => {
                    let server = probes[i].server;
                    match event {
                        ProbeEvent::Connected(channel) => {
                            probes[i].stage = self.probe_stream(channel);
                        }
                        ProbeEvent::Failed(error) => {
                            tracing::debug!(server, error = %Chain(&error), "xds: probe failed");
                            probes.swap_remove(i);
                            servers.on_failure(server, now());
                        }
                        ProbeEvent::Answered => {
                            let probe = probes.swap_remove(i);
                            if servers.on_response(server, now()) {
                                tracing::info!(server, "xds: a higher-priority server answers again; switching back to it");
                                probes.retain(|p| p.server < server);
                                if matches!(link, Link::Opening { .. } | Link::Streaming { .. }) {
                                    self.router.disconnected();
                                }
                                let ProbeStage::Waiting { channel, .. } = probe.stage else {
                                    unreachable!("a probe answers only once its stream is open");
                                };
                                // A fresh stream from the session: the probe's requests may be
                                // outdated (the cache moved on meanwhile).
                                link = self.open(server, channel);
                            }
                        }
                    }
                }
                () = sleep_until(deadline) => self.router.session.handle_timeout(now()),
                () = sleep_until(retry) => {}
            }
            self.router.flush();
        }
    }

    /// Opens the ADS call of the active server on `channel` and connects the session to it.
    fn open(&mut self, server: usize, channel: Channel) -> Link {
        let (outgoing, call) = self.open_call(channel);
        // Queue the first requests before awaiting response headers: some servers send
        // headers only with their first response.
        self.router.outgoing = Some(outgoing);
        self.router.session.on_connected(now());
        Link::Opening { server, call }
    }

    /// A probe's stream on `channel`, carrying the session's subscriptions as they are now.
    fn probe_stream(&self, channel: Channel) -> ProbeStage {
        let (outgoing, call) = self.open_call(channel.clone());
        for request in self.router.session.initial_requests() {
            // The receiver is the call's request stream, alive as long as `call`.
            let _ = match (&outgoing, request) {
                (Outgoing::Sotw(tx), Request::Sotw(r)) => tx.send(r).is_ok(),
                (Outgoing::Delta(tx), Request::Delta(r)) => tx.send(r).is_ok(),
                _ => false,
            };
        }
        let stream = async move {
            let _outgoing = outgoing;
            let mut responses = call.await.map_err(Error::stream)?;
            match responses.next().await {
                Some(Ok(_)) => Ok(()),
                Some(Err(status)) => Err(Error::stream(status)),
                None => Err(Error::stream("the server closed the stream")),
            }
        };
        ProbeStage::Waiting {
            channel,
            generation: self.router.generation,
            stream: Box::pin(stream),
        }
    }

    /// Reopens the stream of every probe still waiting whose requests predate a subscription
    /// change, so that a server which has only what was asked for since can answer.
    fn refresh_probes(&self, probes: &mut [Probe]) {
        for probe in probes {
            if let ProbeStage::Waiting {
                channel,
                generation,
                ..
            } = &probe.stage
                && *generation != self.router.generation
            {
                let channel = channel.clone();
                probe.stage = self.probe_stream(channel);
            }
        }
    }

    fn connect(&self, endpoint: &Endpoint, server: usize) -> ConnectFuture {
        let endpoint = endpoint.clone();
        #[cfg(feature = "tls")]
        let tls = self.config.tls.clone();
        // A caller-built channel replaces the first server's connection only.
        let channel = self.config.channel.clone().filter(|_| server == 0);
        Box::pin(async move {
            if let Some(channel) = channel {
                return Ok(channel);
            }
            #[cfg(feature = "tls")]
            if let Some(tls) = tls {
                return endpoint
                    .connect_with_connector(tls)
                    .await
                    .map_err(Error::connect);
            }
            endpoint.connect().await.map_err(Error::connect)
        })
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
}

// === impl Link ===

impl Link {
    /// What happens next on the link; pending forever when idle. Cancel safe. After an event
    /// the caller replaces the link (except after a response).
    async fn next(&mut self) -> LinkEvent {
        match self {
            Link::Idle => std::future::pending().await,
            Link::Connecting { server, connect } => match connect.await {
                Ok(channel) => LinkEvent::Connected(*server, channel),
                Err(error) => LinkEvent::Ended {
                    server: *server,
                    answered: false,
                    session: false,
                    error,
                },
            },
            Link::Opening { server, call } => match call.await {
                Ok(responses) => LinkEvent::Opened(*server, responses),
                Err(status) => LinkEvent::Ended {
                    server: *server,
                    answered: false,
                    session: true,
                    error: Error::stream(status),
                },
            },
            Link::Streaming {
                server,
                responses,
                answered,
            } => {
                let error = match responses.next().await {
                    Some(Ok(response)) => {
                        *answered = true;
                        return LinkEvent::Response(*server, response);
                    }
                    Some(Err(status)) => Error::stream(status),
                    None => Error::stream("the server closed the stream"),
                };
                LinkEvent::Ended {
                    server: *server,
                    answered: *answered,
                    session: true,
                    error,
                }
            }
        }
    }
}

/// The first probe with something to report, by index.
fn poll_probes(probes: &mut [Probe]) -> impl Future<Output = (usize, ProbeEvent)> + '_ {
    std::future::poll_fn(move |cx| {
        for (i, probe) in probes.iter_mut().enumerate() {
            let event = match &mut probe.stage {
                ProbeStage::Connecting(connect) => match connect.as_mut().poll(cx) {
                    Poll::Ready(Ok(channel)) => ProbeEvent::Connected(channel),
                    Poll::Ready(Err(e)) => ProbeEvent::Failed(e),
                    Poll::Pending => continue,
                },
                ProbeStage::Waiting { stream, .. } => match stream.as_mut().poll(cx) {
                    Poll::Ready(Ok(())) => ProbeEvent::Answered,
                    Poll::Ready(Err(e)) => ProbeEvent::Failed(e),
                    Poll::Pending => continue,
                },
            };
            return Poll::Ready((i, event));
        }
        Poll::Pending
    })
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
            generation: 0,
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
                    self.generation += 1;
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
                // After the cache: a watch of a type already synced learns it at once.
                if self.session.is_synced(url) {
                    sink.deliver(&Event::Synced { type_url: url });
                }
                let ids = self.wildcard.entry(url).or_default();
                ids.push(id);
                if ids.len() == 1 {
                    self.session.subscribe_wildcard(kind);
                    self.generation += 1;
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
                        self.generation += 1;
                    }
                }
            }
            None => {
                if let Some(ids) = self.wildcard.get_mut(w.type_url) {
                    ids.retain(|i| *i != id);
                    if ids.is_empty() {
                        self.wildcard.remove(w.type_url);
                        self.session.unsubscribe_wildcard(w.type_url);
                        self.generation += 1;
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
            // The wildcard subscription's state is whole: its watchers' news alone.
            None if matches!(ev, Event::Synced { .. }) => {}
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
