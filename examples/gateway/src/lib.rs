//! The ingress gateway: HTTP/1.1 and HTTP/2 in (plain or TLS by SNI), routed by Kubernetes
//! Ingress rules, forwarded over HBONE to the backend workloads.
//!
//! - **Configuration.** [`GatewaySettings`] is fixed for a run (the gateway's own identity
//!   and trust domain); [`GatewayConfig`] (Ingresses, TLS Secrets, the mesh) comes through a
//!   `tokio::sync::watch` channel. Each new value is compiled once (route table, parsed
//!   certificates, mesh index) and used by requests that start after it; open connections
//!   are not dropped.
//! - **Routing.** [`RouteTable`] semantics; 404 when nothing matches (and no default backend).
//! - **Forwarding.** The backend `Service` (namespace of the Ingress, name, port by number or
//!   name) is resolved in the mesh to its endpoints; the gateway opens an HBONE tunnel to
//!   `ENDPOINT_IP:15008` expecting the endpoint workload's SPIFFE ID, presenting its own, and
//!   speaks HTTP/1.1 inside. Endpoints are taken round-robin per service port; an endpoint
//!   whose tunnel cannot be opened is skipped; 503 when none can. `X-Forwarded-For`,
//!   `X-Forwarded-Proto` and `Forwarded` name the client; a client's own `X-Forwarded-For`
//!   and `Forwarded` are kept only from [`GatewaySettings::trusted_proxies`] (default none:
//!   replaced). Answers name the backend ([`BACKEND_WORKLOAD`], [`BACKEND_IDENTITY`]) only
//!   with [`GatewaySettings::expose_backend_headers`].
//! - **Limits.** Connections, the protocol sniff, request heads, idle connections, HTTP/2
//!   PINGs and streams, request bodies (size and time), writes to a client that stopped
//!   reading, and the backend's answer are each bounded; [`GatewaySettings`] lists every bound with its default.
//! - **Connection reuse.** A backend connection (HTTP/1.1 in a tunnel of its own) goes back
//!   to a pool per endpoint once its response has been read to the end, and serves later
//!   requests from any client; one that closed meanwhile hands its request to a new tunnel.
//!   A connection idle for `backend_idle_timeout` (60 s) is closed, a new configuration
//!   empties the pool, and a node proxy closes pooled tunnels whose identity its policy stops
//!   admitting.
//! - **TLS.** The certificate comes from the Secret that `spec.tls` names for the SNI
//!   ([`RouteTable::tls_secret_for`]); ALPN offers `h2` and `http/1.1`.
//! - **Operating it.** [`Gateway::admin`] (or [`Gateway::readiness`],
//!   [`Gateway::register_metrics`] and [`Gateway::config_dump`] to mount them elsewhere)
//!   gives meshkit-admin's endpoint: `/healthz/ready` (the `first configuration` condition,
//!   any the program adds, 503 once draining), `/metrics` (`istio_requests_total` and
//!   `istio_request_duration_milliseconds` with Istio's labels and `route`, Envoy's
//!   [`DURATION_BUCKETS_MS`]; `meshkit_gateway_*` connection, tunnel, route and certificate
//!   gauges), `/config_dump`. Each request gets an info span (`request`, with its trace and
//!   span ids) and one access-log line ([`GatewaySettings::access_log`]); its W3C
//!   `traceparent` is continued (or started, or an invalid one replaced) with the gateway's
//!   span as parent, on the request to the backend and on the CONNECT of a tunnel it opens.
//!   [`Gateway::drain`] stops accepting, lets requests in flight finish until a deadline and
//!   closes the rest.
//!
//! ```no_run
//! use meshkit_gateway::{Gateway, GatewayConfig, GatewaySettings};
//! use meshkit_hbone::{Client, ClientConfig};
//! use meshkit_identity::{TrustDomain, test_util::TestCa};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let td = TrustDomain::new("cluster.local")?;
//! let ca = TestCa::new(td.clone());
//! let id = meshkit_identity::SpiffeId::from_istio(&td, "ingress", "gateway")?;
//! let client = Client::new(ClientConfig::default(), ca.issue(id.clone()), ca.bundle_set());
//! let (config_tx, config_rx) = tokio::sync::watch::channel(GatewayConfig::default());
//! let gateway = Gateway::new(GatewaySettings::new(id), client, config_rx);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! tokio::spawn(gateway.serve_http(listener));
//! # drop(config_tx);
//! # Ok(())
//! # }
//! ```

// docs.rs builds with `--cfg docsrs`: items behind a feature show it.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod conn;
mod dump;
pub mod feed;
mod metrics;
mod observe;
mod proxy;
pub mod stack;
mod tls;
mod trace;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshkit_admin::{AccessLog, Admin, Readiness, Registry};
use meshkit_hbone::Client;
use meshkit_hbone::fair::FairSlots;
use meshkit_identity::{SpiffeId, TrustDomain};
use meshkit_ingress_model::{Ingress, IngressClass, RouteTable};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

pub use meshkit_mesh::{Cidr, CidrError};
pub use metrics::DURATION_BUCKETS_MS;
pub use proxy::{BACKEND_IDENTITY, BACKEND_WORKLOAD, Body};

use meshkit_ingress_model::gateway::HttpRouteTable;
use meshkit_ingress_model::gateway::manifest::GatewayApiObjects;
use meshkit_mesh::{MeshConfig, MeshIndex};
use rustls::crypto::CryptoProvider;

/// A serving certificate from a `kubernetes.io/tls` Secret: a PEM certificate chain and its
/// PEM private key, by the Secret's namespace and name.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsCertificate {
    /// Namespace (the namespace of the Ingresses that name it).
    pub namespace: String,
    /// Secret name (`spec.tls[].secretName`).
    pub name: String,
    /// `tls.crt`: PEM certificates, leaf first.
    pub cert_pem: String,
    /// `tls.key`: the PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: String,
}

/// What the gateway routes by: the value carried by the watch channel.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GatewayConfig {
    /// The Ingresses (already filtered by IngressClass, or to be filtered with
    /// [`GatewaySettings::ingress_class`]).
    pub ingresses: Vec<Ingress>,
    /// The IngressClasses, to find the default class when
    /// [`GatewaySettings::ingress_class`] is set.
    pub ingress_classes: Vec<IngressClass>,
    /// TLS Secrets that `spec.tls` entries name.
    pub secrets: Vec<TlsCertificate>,
    /// Services and workloads, to find each backend's endpoints.
    pub mesh: MeshConfig,
    /// Gateway API objects: the Gateways whose class names
    /// [`GatewaySettings::gateway_controller`] are served beside the Ingresses.
    pub gateway_api: GatewayApiObjects,
}

/// What is fixed for a gateway's run.
///
/// Besides identity and routing, it bounds what one client can hold (every bound has a
/// default and a `with_*` setter):
///
/// | setting | default | bounds |
/// |---|---|---|
/// | [`max_connections`](Self::max_connections) | 10,000 | client connections open at once, all listeners of the gateway together, shared fairly among sources ([`meshkit_hbone::fair`]); when all are open, one from a source holding fewer than the largest holder closes that holder's least recently active connection, and any other is closed at accept |
/// | [`max_connections_per_source`](Self::max_connections_per_source) | 1,000 | client connections of one source (an IPv4 address, or an IPv6 /64); more are closed at accept |
/// | [`max_tls_handshakes`](Self::max_tls_handshakes), [`max_tls_handshakes_per_source`](Self::max_tls_handshakes_per_source) | 1,024, 128 | TLS handshakes in progress, shared fairly among sources as connections are; a connection past them is closed at accept |
/// | [`tls_handshake_timeout`](Self::tls_handshake_timeout) | 10 s | TCP accept to a finished TLS handshake |
/// | [`sniff_timeout`](Self::sniff_timeout) | 10 s | the first bytes that tell HTTP/1 from HTTP/2 (after TLS, if any) |
/// | [`header_read_timeout`](Self::header_read_timeout) | 30 s | an HTTP/1 request head, and the wait for the next one on a keep-alive connection |
/// | [`max_header_bytes`](Self::max_header_bytes) | 32 KiB | an HTTP/1 request head (431), an HTTP/2 header list |
/// | [`idle_timeout`](Self::idle_timeout) | 60 s | a client connection with no request in flight |
/// | [`write_stall_timeout`](Self::write_stall_timeout) | 30 s | a write to a client that does not read (no byte taken) |
/// | [`http2_keepalive_interval`](Self::http2_keepalive_interval), [`http2_keepalive_timeout`](Self::http2_keepalive_timeout) | 30 s, 10 s | an HTTP/2 client that stops answering PINGs |
/// | [`http2_max_concurrent_streams`](Self::http2_max_concurrent_streams) | 200 | streams open at once on one HTTP/2 connection |
/// | [`max_request_body_bytes`](Self::max_request_body_bytes) | 16 MiB | a request body (413) |
/// | [`request_body_timeout`](Self::request_body_timeout) | 60 s | receiving a request body, from when it starts to go to the backend (its first read, once a tunnel is open) to its end (408) |
/// | [`response_timeout`](Self::response_timeout) | 30 s | the backend's answer, from the end of the request body to the response head (504) |
///
/// It also names the access log's format ([`access_log`](Self::access_log), text by
/// default) and the gateway's workload name in the metrics
/// ([`workload_name`](Self::workload_name), none by default: `unknown`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GatewaySettings {
    /// The identity the gateway presents to backends (its HBONE client must hold it).
    pub identity: SpiffeId,
    /// The trust domain of the backends' identities. Default: the identity's.
    pub trust_domain: TrustDomain,
    /// The HBONE port of the workloads. Default: 15008.
    pub hbone_port: u16,
    /// When set, only Ingresses of this IngressClass are routed. Default: all.
    pub ingress_class: Option<String>,
    /// How long a client connection may take to complete its TLS handshake. Default: 10 s.
    pub tls_handshake_timeout: Duration,
    /// How long a pooled backend connection may stay without a request before it (and its
    /// tunnel) is closed. Default: 60 s, as the HBONE client's idle connections.
    pub backend_idle_timeout: Duration,
    /// The crypto provider of the client-facing TLS listener and of the certificates it
    /// loads. Default: meshkit-identity's ring provider; a program passes the one all its TLS
    /// endpoints share.
    pub provider: Arc<CryptoProvider>,
    /// Client connections open at once, over all the listeners this gateway serves (TLS
    /// handshakes included); a connection accepted beyond it is closed at once. Default:
    /// 10,000 (the process's file descriptor limit must allow as many).
    pub max_connections: usize,
    /// Client connections one source (an IPv4 address, or an IPv6 /64) may have open.
    /// Default: 1,000 (clients behind one NAT share a source).
    pub max_connections_per_source: usize,
    /// TLS handshakes in progress at once, over all listeners, shared fairly among sources.
    /// Default: 1,024.
    pub max_tls_handshakes: usize,
    /// TLS handshakes in progress at once from one source. Default: 128.
    pub max_tls_handshakes_per_source: usize,
    /// How long a new connection (after its TLS handshake, if any) may take to send the
    /// bytes that tell HTTP/1 from HTTP/2 (up to the 24 bytes of the HTTP/2 preface); a
    /// connection that does not is closed. Default: 10 s.
    pub sniff_timeout: Duration,
    /// How long an HTTP/1 client may take to send a request head, counted from when the
    /// gateway starts waiting for it (so it also ends a keep-alive connection that sends no
    /// next request). A connection that does not is closed. Default: 30 s.
    pub header_read_timeout: Duration,
    /// The largest request head: HTTP/1's start line and headers (more: 431 and the
    /// connection closed), HTTP/2's header list (announced in SETTINGS; more: the stream is
    /// refused). Default: 32 KiB.
    pub max_header_bytes: usize,
    /// How long a client connection may stay with no request in flight (a response still
    /// being sent counts as in flight) before the gateway closes it: HTTP/2 with a GOAWAY,
    /// HTTP/1 at once. Default: 60 s.
    pub idle_timeout: Duration,
    /// How long a write to a client connection may wait without a byte taken (the client
    /// stopped reading, so its socket is full) before the gateway closes the connection and
    /// drops the backend connection the answer came from. Counted from the first write that
    /// has to wait; any progress starts it over, so a slow reader that keeps reading is not
    /// cut off. HTTP/1 and HTTP/2 alike (an HTTP/2 stream whose flow-control window is
    /// closed does not write, so it does not count). Default: 30 s.
    pub write_stall_timeout: Duration,
    /// How often the gateway PINGs an HTTP/2 client; `None`: never. Default: 30 s.
    pub http2_keepalive_interval: Option<Duration>,
    /// How long an HTTP/2 client may take to answer a PING before its connection is closed.
    /// Default: 10 s.
    pub http2_keepalive_timeout: Duration,
    /// Streams an HTTP/2 client may have open at once on one connection. Default: 200.
    pub http2_max_concurrent_streams: u32,
    /// The largest request body, in bytes. A `Content-Length` above it gets 413 before
    /// anything is forwarded; a body without one that grows past it is cut off and the
    /// client gets 413 (the backend sees the request fail). Default: 16 MiB.
    pub max_request_body_bytes: u64,
    /// How long the gateway waits for the whole request body, from when the body starts to
    /// go to the backend (its first read, once an endpoint is chosen and its tunnel open: that
    /// time is not the client's); a body that takes longer is cut off and the client gets 408.
    /// Separate from [`response_timeout`](Self::response_timeout), which starts only once
    /// the body has been sent. Default: 60 s.
    pub request_body_timeout: Duration,
    /// How long a backend may take to answer (its response head), counted from the end of
    /// the request body; longer: 504. A backend that stops reading the body (so the body
    /// never ends) gets it from the body's deadline. Default: 30 s.
    pub response_timeout: Duration,
    /// The peers whose `X-Forwarded-For` and `Forwarded` headers are kept (the gateway
    /// appends the peer to them). From any other peer the gateway drops both and names only
    /// the peer: a client cannot make a backend believe it comes from another address.
    /// Default: none (the gateway is the first hop that counts).
    pub trusted_proxies: Vec<Cidr>,
    /// Debugging aid: when set, answers carry [`BACKEND_WORKLOAD`] and [`BACKEND_IDENTITY`],
    /// naming the workload that answered and the SPIFFE ID its end of the tunnel proved.
    /// Default: off (they tell a client about the mesh's insides).
    pub expose_backend_headers: bool,
    /// The format of the access log: one line per request at info level on the
    /// `meshkit::access` target (turn it off with the log filter,
    /// `meshkit::access=off`). Default: `key=value` text.
    pub access_log: AccessLog,
    /// The gateway's workload name, its `source_workload` in the request metrics. Default:
    /// none (`unknown`).
    pub workload_name: Option<String>,
    /// The Gateway API controller whose GatewayClasses' Gateways this gateway serves; `None`
    /// serves every Gateway. Default [`meshkit_mesh::resources::GATEWAY_CONTROLLER`].
    pub gateway_controller: Option<String>,
}

impl GatewaySettings {
    /// Settings for a gateway presenting `identity`, with the defaults.
    pub fn new(identity: SpiffeId) -> Self {
        Self {
            trust_domain: identity.trust_domain(),
            identity,
            hbone_port: meshkit_hbone::HBONE_PORT,
            ingress_class: None,
            tls_handshake_timeout: Duration::from_secs(10),
            backend_idle_timeout: Duration::from_secs(60),
            provider: meshkit_identity::default_provider(),
            max_connections: 10_000,
            max_connections_per_source: 1_000,
            max_tls_handshakes: 1_024,
            max_tls_handshakes_per_source: 128,
            sniff_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(30),
            max_header_bytes: 32 * 1024,
            idle_timeout: Duration::from_secs(60),
            write_stall_timeout: Duration::from_secs(30),
            http2_keepalive_interval: Some(Duration::from_secs(30)),
            http2_keepalive_timeout: Duration::from_secs(10),
            http2_max_concurrent_streams: 200,
            max_request_body_bytes: 16 * 1024 * 1024,
            request_body_timeout: Duration::from_secs(60),
            response_timeout: Duration::from_secs(30),
            trusted_proxies: Vec::new(),
            expose_backend_headers: false,
            access_log: AccessLog::text(),
            workload_name: None,
            gateway_controller: Some(meshkit_mesh::resources::GATEWAY_CONTROLLER.to_owned()),
        }
    }

    /// Serves the Gateways of `controller`'s GatewayClasses (`None`: every Gateway).
    pub fn with_gateway_controller(mut self, controller: Option<String>) -> Self {
        self.gateway_controller = controller;
        self
    }

    /// Sets the access log's format ([`AccessLog::text`] or [`AccessLog::json`]).
    pub fn with_access_log(mut self, log: AccessLog) -> Self {
        self.access_log = log;
        self
    }

    /// Sets the gateway's workload name (the `source_workload` label).
    pub fn with_workload_name(mut self, name: impl Into<String>) -> Self {
        self.workload_name = Some(name.into());
        self
    }

    /// Sets the crypto provider of the client-facing TLS.
    pub fn with_provider(mut self, provider: Arc<CryptoProvider>) -> Self {
        self.provider = provider;
        self
    }

    /// Sets how long a pooled backend connection may stay idle.
    pub fn with_backend_idle_timeout(mut self, timeout: Duration) -> Self {
        self.backend_idle_timeout = timeout;
        self
    }

    /// Sets the HBONE port of the workloads.
    pub fn with_hbone_port(mut self, port: u16) -> Self {
        self.hbone_port = port;
        self
    }

    /// Routes only Ingresses of IngressClass `class`.
    pub fn with_ingress_class(mut self, class: impl Into<String>) -> Self {
        self.ingress_class = Some(class.into());
        self
    }

    /// Sets how long a client's TLS handshake may take.
    pub fn with_tls_handshake_timeout(mut self, timeout: Duration) -> Self {
        self.tls_handshake_timeout = timeout;
        self
    }

    /// Sets how many client connections may be open at once (at least 1).
    pub fn with_max_connections(mut self, max: usize) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// Sets how many client connections one source may have open (at least 1).
    pub fn with_max_connections_per_source(mut self, max: usize) -> Self {
        self.max_connections_per_source = max.max(1);
        self
    }

    /// Sets how many TLS handshakes may be in progress at once, in all and from one source
    /// (each at least 1).
    pub fn with_max_tls_handshakes(mut self, max: usize, per_source: usize) -> Self {
        self.max_tls_handshakes = max.max(1);
        self.max_tls_handshakes_per_source = per_source.max(1);
        self
    }

    /// Sets how long a new connection may take to show its HTTP version.
    pub fn with_sniff_timeout(mut self, timeout: Duration) -> Self {
        self.sniff_timeout = timeout;
        self
    }

    /// Sets how long an HTTP/1 client may take to send a request head.
    pub fn with_header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout;
        self
    }

    /// Sets the largest request head (raised to 8 KiB if below: HTTP/1 needs that much).
    pub fn with_max_header_bytes(mut self, max: usize) -> Self {
        self.max_header_bytes = max.max(8 * 1024);
        self
    }

    /// Sets how long a client connection may stay with no request in flight.
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Sets how long a write to a client may wait without progress.
    pub fn with_write_stall_timeout(mut self, timeout: Duration) -> Self {
        self.write_stall_timeout = timeout;
        self
    }

    /// Sets how often HTTP/2 clients are PINGed (`None`: never) and how long one may take to
    /// answer.
    pub fn with_http2_keepalive(mut self, interval: Option<Duration>, timeout: Duration) -> Self {
        self.http2_keepalive_interval = interval;
        self.http2_keepalive_timeout = timeout;
        self
    }

    /// Sets how many streams an HTTP/2 client may have open on one connection.
    pub fn with_http2_max_concurrent_streams(mut self, max: u32) -> Self {
        self.http2_max_concurrent_streams = max;
        self
    }

    /// Sets the largest request body, in bytes.
    pub fn with_max_request_body_bytes(mut self, max: u64) -> Self {
        self.max_request_body_bytes = max;
        self
    }

    /// Sets how long the gateway waits for a request body.
    pub fn with_request_body_timeout(mut self, timeout: Duration) -> Self {
        self.request_body_timeout = timeout;
        self
    }

    /// Sets how long a backend may take to answer once the request body has been sent.
    pub fn with_response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Sets the peers whose forwarding headers are kept.
    pub fn with_trusted_proxies(mut self, proxies: impl IntoIterator<Item = Cidr>) -> Self {
        self.trusted_proxies = proxies.into_iter().collect();
        self
    }

    /// Sends (`true`) or not the [`BACKEND_WORKLOAD`] and [`BACKEND_IDENTITY`] answer headers.
    pub fn with_backend_headers(mut self, expose: bool) -> Self {
        self.expose_backend_headers = expose;
        self
    }
}

/// One configuration, compiled for lookups.
#[derive(Debug, Default)]
struct Compiled {
    table: RouteTable,
    /// The Gateway API routes of the Gateways served.
    http_routes: HttpRouteTable,
    index: MeshIndex,
    certs: tls::CertStore,
    /// What each TLS Secret's certificate is (names, expiry), for the config dump and the
    /// expiry gauge.
    certs_info: Vec<tls::CertInfo>,
    /// The configuration as `/config_dump` shows it (routes, backends, certificates).
    dump: serde_json::Value,
    /// The request metrics' handles by label set, for this configuration.
    stats: metrics::StatsCache,
}

/// What the steps of the request stack share.
struct Shared {
    settings: GatewaySettings,
    client: Client,
    current: watch::Receiver<Arc<Compiled>>,
    /// Round-robin position per (namespace, service, port); kept across configurations.
    positions: Mutex<Positions>,
    /// The position in the weights of each Gateway API rule ([`Shared::next_roll`]), by the
    /// rule's key in the current configuration; emptied when a configuration replaces it.
    rolls: Arc<Mutex<std::collections::HashMap<usize, u64>>>,
    /// Idle backend connections, reused across requests.
    pool: Arc<proxy::BackendPool>,
    /// The client connections' places, [`GatewaySettings::max_connections`] in all.
    connections: FairSlots,
    /// The places of TLS handshakes in progress.
    handshakes: FairSlots,
    metrics: metrics::Metrics,
    /// The gateway's own labels in the request metrics.
    source: observe::Source,
    readiness: Readiness,
    /// `Some(deadline)` once the drain has started: stop accepting, let connections finish
    /// until the deadline, then close them.
    drain: watch::Sender<Option<tokio::time::Instant>>,
    /// How many `serve_*` loops are running (the drain waits for them to end).
    serving: watch::Sender<usize>,
}

/// A running gateway: cheap to clone, serves any number of listeners.
#[derive(Clone)]
pub struct Gateway {
    shared: Arc<Shared>,
    stack: stack::Stack,
    _compiler: Arc<CompilerTask>,
}

/// Stops compiling configurations when the last [`Gateway`] clone is dropped.
struct CompilerTask(tokio::task::AbortHandle);

impl Drop for CompilerTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

// === impl Gateway ===

impl Gateway {
    /// A gateway presenting `settings.identity` through `client` and routing by the newest
    /// value of `config`.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (it spawns the task that compiles configurations).
    pub fn new(
        settings: GatewaySettings,
        client: Client,
        mut config: watch::Receiver<GatewayConfig>,
    ) -> Self {
        let compile = {
            let settings = settings.clone();
            move |c: &GatewayConfig| Arc::new(compile(&settings, c))
        };
        let readiness = Readiness::default();
        let configured = readiness.condition("first configuration");
        let initial = config.borrow_and_update().clone();
        // A configuration given at start counts as the first one; the default (empty) value a
        // feed starts with does not.
        if initial != GatewayConfig::default() {
            configured.set_ready();
        }
        let (tx, rx) = watch::channel(compile(&initial));
        drop(initial);
        let pool = Arc::new(proxy::BackendPool::new(settings.backend_idle_timeout));
        let connections = FairSlots::new(
            settings.max_connections,
            settings.max_connections_per_source,
        );
        let handshakes = FairSlots::new(
            settings.max_tls_handshakes,
            settings.max_tls_handshakes_per_source,
        );
        let idle = pool.clone();
        let rolls: Arc<Mutex<std::collections::HashMap<usize, u64>>> = Arc::default();
        let stale_rolls = rolls.clone();
        let task = tokio::spawn(async move {
            while config.changed().await.is_ok() {
                let next = compile(&config.borrow_and_update());
                tracing::info!(
                    routes = next.table.route_count(),
                    "gateway configuration applied"
                );
                tx.send_replace(next);
                // Ready once requests route by it, not before.
                configured.set_ready();
                // Endpoints may have moved or changed identity: new connections for all.
                idle.clear();
                // The rules' keys were the old configuration's.
                stale_rolls
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clear();
            }
            // The feed ended. The condition stays as it is, for as long as the readiness
            // lives: a feed that ended before its first configuration leaves the gateway
            // unready (dropping the condition would remove it, and so read as ready).
            std::mem::forget(configured);
        });
        let shared = Arc::new(Shared {
            source: observe::Source::new(&settings),
            settings,
            client,
            current: rx,
            positions: Mutex::default(),
            rolls,
            pool,
            connections,
            handshakes,
            metrics: metrics::Metrics::default(),
            readiness,
            drain: watch::Sender::new(None),
            serving: watch::Sender::new(0),
        });
        Self {
            stack: stack::build(shared.clone()),
            shared,
            _compiler: Arc::new(CompilerTask(task.abort_handle())),
        }
    }

    /// Serves plain HTTP (HTTP/1.1, and HTTP/2 with prior knowledge) on `listener`.
    /// Dropping the future closes the listener and every connection it accepted.
    ///
    /// # Errors
    ///
    /// Never in practice: failed accepts are logged and retried.
    pub async fn serve_http(self, listener: TcpListener) -> std::io::Result<()> {
        self.serve(listener, None, false).await
    }

    /// Serves HTTPS on `listener`, with the certificate chosen by SNI; HTTP/2 or HTTP/1.1
    /// by ALPN. Dropping the future closes the listener and every connection it accepted.
    ///
    /// # Errors
    ///
    /// When the TLS configuration cannot be built.
    pub async fn serve_https(self, listener: TcpListener) -> std::io::Result<()> {
        self.serve_tls(listener, false).await
    }

    /// HTTPS on `listener`: by the Ingresses' `spec.tls`, or (`gateway_api`) by the Gateway
    /// listener of its port.
    async fn serve_tls(self, listener: TcpListener, gateway_api: bool) -> std::io::Result<()> {
        let port = listener.local_addr()?.port();
        let config = tls::server_config(
            tls::SniResolver {
                current: self.shared.current.clone(),
                gateway_api: gateway_api.then_some(port),
            },
            self.shared.settings.provider.clone(),
        )
        .map_err(std::io::Error::other)?;
        self.serve(
            listener,
            Some(TlsAcceptor::from(Arc::new(config))),
            gateway_api,
        )
        .await
    }

    /// The accept loop; `gateway_api`: the listener is one of [`Gateway::serve_gateway_api`]'s,
    /// routed by the Gateway API rules of its port (never by the Ingresses).
    async fn serve(
        self,
        listener: TcpListener,
        tls: Option<TlsAcceptor>,
        gateway_api: bool,
    ) -> std::io::Result<()> {
        let _serving = Serving::new(&self.shared);
        let port = listener.local_addr()?.port();
        let mut drain = self.shared.drain.subscribe();
        let mut connections = JoinSet::new();
        let deadline = loop {
            while connections.try_join_next().is_some() {}
            let accepted = tokio::select! {
                biased;
                deadline = async { drain.wait_for(Option::is_some).await.ok().and_then(|d| *d) } => {
                    match deadline {
                        Some(deadline) => break deadline,
                        // The gateway is gone: nothing can start a drain any more.
                        None => std::future::pending().await,
                    }
                }
                accepted = listener.accept() => accepted,
            };
            let (sock, client) = match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "gateway accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // At the cap, closed at once: a client learns now, not after a timeout. A TLS
            // connection needs two places; the connection's is checked before the handshake's
            // is taken (which may close another source's handshake), so that a connection never
            // evicts another and is then refused.
            let ip = client.ip();
            let handshake = match &tls {
                Some(_) if self.shared.connections.check(ip).is_ok() => {
                    match self.shared.handshakes.admit(ip) {
                        Ok(handshake) => Some(handshake),
                        Err(refusal) => {
                            tracing::debug!(%client, ?refusal, "no TLS handshake place for this client; closed");
                            continue;
                        }
                    }
                }
                _ => None,
            };
            let slot = match self.shared.connections.admit(ip) {
                Ok(slot) => slot,
                Err(refusal) => {
                    tracing::debug!(%client, ?refusal, "no connection place for this client; closed");
                    continue;
                }
            };
            let handshake = match (&tls, handshake) {
                // A place came back between the check and the admission.
                (Some(_), None) => match self.shared.handshakes.admit(ip) {
                    Ok(handshake) => Some(handshake),
                    Err(refusal) => {
                        tracing::debug!(%client, ?refusal, "no TLS handshake place for this client; closed");
                        continue;
                    }
                },
                (_, handshake) => handshake,
            };
            let _ = sock.set_nodelay(true);
            let sock = slot.hold(sock);
            let shared = self.shared.clone();
            let stack = self.stack.clone();
            let tls = tls.clone();
            // Whether the peer's forwarding headers count is decided once per connection.
            let trusted = shared
                .settings
                .trusted_proxies
                .iter()
                .any(|net| net.contains(client.ip()));
            connections.spawn(async move {
                let peer = |scheme| stack::Client {
                    addr: client,
                    port,
                    gateway_api,
                    scheme,
                    trusted_proxy: trusted,
                };
                match tls {
                    None => conn::serve(&shared, stack, sock, peer("http")).await,
                    Some(acceptor) => {
                        let timeout = shared.settings.tls_handshake_timeout;
                        let handshake = handshake.expect("a handshake place for TLS");
                        let accepted = tokio::select! {
                            accepted = tokio::time::timeout(timeout, acceptor.accept(sock)) => accepted,
                            () = handshake.evicted() => {
                                tracing::debug!(%client, "TLS handshake closed: its place went to a client of another source");
                                return;
                            }
                        };
                        drop(handshake);
                        match accepted {
                            Ok(Ok(stream)) => {
                                conn::serve(&shared, stack, stream, peer("https")).await;
                            }
                            Ok(Err(e)) => {
                                tracing::debug!(%client, error = %e, "TLS handshake failed");
                            }
                            Err(_) => tracing::debug!(%client, "TLS handshake timed out"),
                        }
                    }
                }
            });
        };
        // Draining: no new connections (the listener closes), the open ones were told to
        // finish (GOAWAY, `connection: close`) and get until the deadline.
        drop(listener);
        let finished = tokio::time::timeout_at(deadline, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if finished.is_err() {
            tracing::info!(
                remaining = connections.len(),
                "drain deadline passed; closing the remaining client connections"
            );
            connections.shutdown().await;
        }
        Ok(())
    }

    /// Serves the Gateway API listeners of the current configuration on `address`: one
    /// listener per port of the served Gateways (HTTP or HTTPS as the Gateway says), opened
    /// when a configuration adds the port and closed when one removes it. A port that cannot
    /// be bound is logged and tried again with the next configuration.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future closes every listener it opened, and their connections.
    pub async fn serve_gateway_api(self, address: IpAddr) {
        /// A port's serving task, aborted when dropped (so dropping the future closes the
        /// listeners it opened).
        struct PortTask {
            https: bool,
            task: tokio::task::JoinHandle<()>,
        }
        impl Drop for PortTask {
            fn drop(&mut self) {
                self.task.abort();
            }
        }
        let mut current = self.shared.current.clone();
        let mut serving: std::collections::BTreeMap<u16, PortTask> =
            std::collections::BTreeMap::new();
        loop {
            let ports = current.borrow_and_update().http_routes.ports();
            // Close what is gone, changed protocol, or stopped by itself (reopened below).
            let stale: Vec<u16> = serving
                .iter()
                .filter(|(port, t)| !ports.contains(&(**port, t.https)) || t.task.is_finished())
                .map(|(port, _)| *port)
                .collect();
            for port in stale {
                if let Some(mut old) = serving.remove(&port) {
                    old.task.abort();
                    // Until the task has ended, its listener holds the port.
                    let _ = (&mut old.task).await;
                    tracing::info!(port, "Gateway API listener closed");
                }
            }
            let wanted = ports.len();
            for (port, https) in ports {
                if serving.contains_key(&port) {
                    continue;
                }
                let listener = match TcpListener::bind(SocketAddr::new(address, port)).await {
                    Ok(listener) => listener,
                    Err(e) => {
                        tracing::warn!(%address, port, error = %e, "cannot open a Gateway API listener");
                        continue;
                    }
                };
                tracing::info!(%address, port, https, "Gateway API listener open");
                let gateway = self.clone();
                let task = tokio::spawn(async move {
                    let served = if https {
                        gateway.serve_tls(listener, true).await
                    } else {
                        gateway.serve(listener, None, true).await
                    };
                    if let Err(e) = served {
                        tracing::warn!(port, error = %e, "Gateway API listener failed");
                    }
                });
                serving.insert(port, PortTask { https, task });
            }
            // A new configuration, or a second to retry a port that could not be bound or
            // whose listener stopped.
            let retry = serving.len() < wanted;
            tokio::select! {
                changed = current.changed() => {
                    if changed.is_err() {
                        // The gateway is gone: keep serving what is open until dropped.
                        std::future::pending::<()>().await;
                    }
                }
                () = tokio::time::sleep(Duration::from_secs(1)), if retry => {}
            }
        }
    }

    /// The gateway's readiness (`/healthz/ready`): it holds the condition
    /// `first configuration` (met at once when [`Gateway::new`] is given a configuration
    /// other than the default, empty one, else when the first one arrives on the channel),
    /// and turns unready for good when the drain starts. A program adds its own conditions
    /// to it (the binary adds `certificates` and `listeners`).
    pub fn readiness(&self) -> &Readiness {
        &self.shared.readiness
    }

    /// Registers the gateway's metrics in `registry` (call it once per registry):
    /// `istio_requests_total` and `istio_request_duration_milliseconds` by response code,
    /// route, destination and flags, and the `meshkit_gateway_*` connection, tunnel, route
    /// and certificate gauges (docs/gateway.md, "Operating it", lists every name and
    /// label). The gateway counts whether or not they are registered.
    pub fn register_metrics(&self, registry: &mut Registry) {
        metrics::register(&self.shared, registry);
    }

    /// The gateway's current configuration as JSON: its identity, whether it is draining,
    /// the routes (with the `route` label each has in the metrics), the backend services
    /// with their endpoints and identities, and the TLS certificates' names and expiry.
    /// Never a private key.
    pub fn config_dump(&self) -> serde_json::Value {
        dump::config_dump(&self.shared)
    }

    /// An admin endpoint for this gateway (component `ingress-gateway`): `registry` with the
    /// gateway's metrics registered, its [`readiness`](Self::readiness) and its
    /// [`config_dump`](Self::config_dump). Add a log filter with
    /// [`Admin::with_log_filter`]; serve it with [`Admin::serve`] or mount
    /// [`Admin::handle`].
    pub fn admin(&self, mut registry: Registry) -> Admin {
        self.register_metrics(&mut registry);
        let gateway = self.clone();
        Admin::new("ingress-gateway", registry)
            .with_readiness(self.shared.readiness.clone())
            .with_config_dump(move || gateway.config_dump())
    }

    /// Drains the gateway: readiness turns 503 at once; every `serve_*` loop stops accepting
    /// (its listener closes, so new connections are refused); HTTP/2 connections get a
    /// GOAWAY and HTTP/1.1 connections close once their request in flight is answered (the
    /// answers say `connection: close`); requests in flight finish until `grace` has passed,
    /// then the connections left are closed. Returns when every `serve_*` loop has ended,
    /// and empties the backend connection pool. A later `serve_*` call returns at once.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future does not stop the drain, only the wait for it.
    pub async fn drain(&self, grace: Duration) {
        self.shared.readiness.start_draining();
        let deadline = tokio::time::Instant::now() + grace;
        self.shared.drain.send_if_modified(|d| {
            if d.is_none() {
                tracing::info!(grace_seconds = grace.as_secs_f64(), "draining");
                *d = Some(deadline);
                true
            } else {
                false
            }
        });
        let mut serving = self.shared.serving.subscribe();
        let _ = serving.wait_for(|n| *n == 0).await;
        self.shared.pool.clear();
    }
}

/// Counts one running `serve_*` loop.
struct Serving(Arc<Shared>);

impl Serving {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.serving.send_modify(|n| *n += 1);
        Self(shared.clone())
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.serving.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl std::fmt::Debug for TlsCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the private key.
        f.debug_struct("TlsCertificate")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("identity", &self.shared.settings.identity)
            .finish_non_exhaustive()
    }
}

fn compile(settings: &GatewaySettings, config: &GatewayConfig) -> Compiled {
    let mut builder = RouteTable::builder();
    if let Some(class) = &settings.ingress_class {
        builder = builder
            .ingress_class(class.clone())
            .ingress_classes(&config.ingress_classes);
    }
    let table = builder.build(&config.ingresses);
    let http_routes = gateway_api_table(settings, config);
    let index = config
        .mesh
        .index(&settings.trust_domain)
        .with_hbone_port(settings.hbone_port);
    let certs = tls::load(&config.secrets, &settings.provider);
    let certs_info = tls::describe(&config.secrets, &certs);
    let dump = dump::compiled(&builder, config, &index, &certs_info);
    Compiled {
        table,
        http_routes,
        index,
        certs,
        certs_info,
        dump,
        stats: metrics::StatsCache::default(),
    }
}

/// The Gateway API route table of `config`: the Gateways of the configured controller's
/// classes, with the mesh's services as the Services that exist.
fn gateway_api_table(settings: &GatewaySettings, config: &GatewayConfig) -> HttpRouteTable {
    let mut builder = HttpRouteTable::builder().services(
        config
            .mesh
            .services
            .iter()
            .map(|s| (s.namespace.clone(), s.name.clone())),
    );
    if let Some(controller) = &settings.gateway_controller {
        builder = builder.controller(controller.clone());
    }
    builder.build_objects(&config.gateway_api)
}

// === impl Shared ===

impl Shared {
    /// The next number for the weighted choice of the rule `rule_key` names: consecutive
    /// requests of one rule walk its weights in turn, so each backend gets exactly its share
    /// of every round of the total weight.
    fn next_roll(&self, rule_key: usize) -> u64 {
        let mut rolls = self.rolls.lock().unwrap_or_else(|e| e.into_inner());
        let roll = rolls.entry(rule_key).or_insert(0);
        let current = *roll;
        *roll = roll.wrapping_add(1);
        current
    }

    fn next_endpoint(&self, namespace: &str, service: &str, port: u16) -> usize {
        let mut positions = self.positions.lock().unwrap_or_else(|e| e.into_inner());
        let key = PositionKey(namespace, service, port);
        let slot = match positions.get_mut(&key) {
            Some(slot) => slot,
            None => positions
                .entry((namespace.to_owned(), service.to_owned(), port))
                .or_insert(0),
        };
        let current = *slot;
        *slot = slot.wrapping_add(1);
        current
    }
}

/// Round-robin positions by (namespace, service, port); looked up by [`PositionKey`], so that
/// a request allocates no key.
type Positions = hashbrown::HashMap<(String, String, u16), usize, foldhash::fast::RandomState>;

/// A [`Positions`] key by reference; it hashes as the owned key does (a tuple hashes its
/// fields in order).
#[derive(Hash)]
struct PositionKey<'a>(&'a str, &'a str, u16);

impl hashbrown::Equivalent<(String, String, u16)> for PositionKey<'_> {
    fn equivalent(&self, key: &(String, String, u16)) -> bool {
        self.0 == key.0 && self.1 == key.1 && self.2 == key.2
    }
}
