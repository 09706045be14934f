//! What an operator asks a running node proxy: readiness, Istio's TCP metrics and the node
//! proxy's own, a config dump, and one access-log line per connection.
//!
//! Costs on the data path: one label-set lookup per counter when a connection closes (the
//! label sets share their workload parts, built once per mesh update, behind `Arc`s), atomic
//! adds for the bytes at the end of a connection, and nothing per read or write.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use meshkit_admin::{AccessLog, Admin, Condition, Field, Readiness, Registry};
use meshkit_hbone::{Client, ServerStats, Side};
use meshkit_identity::{SpiffeId, SvidCache, TrustDomain};
use meshkit_mesh::{MeshConfig, MeshIndex, StandIn, Workload};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, LabelSetEncoder, MetricEncoder,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::{InboundPolicy, OutboundListener};

/// The `response_flags` of a connection that ended normally.
pub(crate) const FLAG_NONE: &str = "-";
/// Refused by the inbound policy or routing rules (403), or cut by a policy change.
pub(crate) const FLAG_DENY: &str = "DENY";
/// No upstream could be reached: the target refused or timed out (inbound), or no endpoint
/// answered the CONNECT (outbound).
pub(crate) const FLAG_CONNECT: &str = "CONNECT";
/// Outbound: nothing to route to (unknown source, service or port).
pub(crate) const FLAG_NO_ROUTE: &str = "NR";
/// Outbound: the service has no endpoints.
pub(crate) const FLAG_NO_HEALTHY_UPSTREAM: &str = "UH";
/// The downstream side (the application on outbound, the tunnel on inbound) failed mid-way.
pub(crate) const FLAG_DOWNSTREAM_TERMINATION: &str = "DC";
/// The upstream side (the tunnel on outbound, the application on inbound) failed mid-way.
pub(crate) const FLAG_UPSTREAM_TERMINATION: &str = "UC";
/// Cut by the node proxy itself: the drain deadline passed, or the proxy stopped.
pub(crate) const FLAG_LOCAL_RESET: &str = "LR";

/// The observable side of one node proxy: its [`Readiness`], its metrics (registered with
/// [`Telemetry::register`]), its config dump and the format of its access log. Clones share
/// it.
///
/// Create one before [`NodeProxy::start`](crate::NodeProxy::start) and pass it in
/// [`NodeProxyConfig::telemetry`](crate::NodeProxyConfig::telemetry), so that an admin
/// endpoint can answer (503) while the node proxy starts; or use the default one and reach it
/// through [`NodeProxy::telemetry`](crate::NodeProxy::telemetry). One node proxy per
/// `Telemetry`: a second one started with it takes over the config dump and the
/// pool and certificate figures.
///
/// ```no_run
/// # async fn demo() -> std::io::Result<()> {
/// use meshkit_node_proxy::Telemetry;
/// use meshkit_node_proxy::admin::{AccessLog, Registry};
///
/// let telemetry = Telemetry::new().with_access_log(AccessLog::json());
/// let admin = telemetry.admin(Registry::default());
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:15020").await?;
/// tokio::spawn(admin.serve(listener, std::future::pending()));
/// // NodeProxyConfig::new(..).with_telemetry(telemetry.clone()), then NodeProxy::start.
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<Inner>,
    access_log: AccessLog,
}

struct Inner {
    readiness: Readiness,
    certificates: Condition,
    mesh: Condition,
    listeners: Condition,
    metrics: Metrics,
    live: Mutex<Option<(u64, Live)>>,
    next_live: AtomicU64,
    /// Set once a drain passed its deadline: what is cut from then on is flagged `LR`.
    deadline_passed: AtomicBool,
}

/// The metric families, registered by [`Telemetry::register`].
#[derive(Clone)]
struct Metrics {
    opened: Family<TcpLabels, Counter>,
    closed: Family<TcpLabels, Counter>,
    sent: Family<TcpLabels, Counter>,
    received: Family<TcpLabels, Counter>,
    tunnels: Family<DirectionLabels, Gauge>,
    tunnels_inbound: Gauge,
    tunnels_outbound: Gauge,
    denials: Family<ReasonLabels, Counter>,
}

/// What the running node proxy lends the config dump and the pool and certificate figures.
pub(crate) struct Live {
    pub(crate) node: String,
    pub(crate) trust_domain: TrustDomain,
    pub(crate) hbone_port: u16,
    pub(crate) mesh: watch::Receiver<MeshConfig>,
    pub(crate) policy: Arc<watch::Sender<InboundPolicy>>,
    pub(crate) outbound: Vec<(OutboundListener, SocketAddr)>,
    pub(crate) inbound: watch::Receiver<BTreeSet<SocketAddr>>,
    pub(crate) client: Client,
    pub(crate) certs: SvidCache,
    pub(crate) servers: Servers,
}

/// The HBONE servers' statistics, per local workload address served.
pub(crate) type Servers = Arc<Mutex<HashMap<IpAddr, Arc<ServerStats>>>>;

/// Which way a connection goes through the node proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Direction {
    /// From a local workload, over HBONE to a service's endpoint: Istio's reporter `source`.
    Outbound,
    /// From an HBONE peer to a local workload: reporter `destination`.
    Inbound,
}

/// The workload labels of one side of a connection.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PeerLabels {
    pub(crate) workload: String,
    pub(crate) namespace: String,
    pub(crate) principal: String,
    pub(crate) canonical_service: String,
    pub(crate) canonical_revision: String,
}

/// The destination service labels of a connection.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ServiceLabels {
    pub(crate) host: String,
    pub(crate) name: String,
    pub(crate) namespace: String,
}

/// Istio's standard TCP labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct TcpLabels {
    direction: Direction,
    source: Arc<PeerLabels>,
    destination: Arc<PeerLabels>,
    service: Arc<ServiceLabels>,
    response_flags: &'static str,
    security: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet)]
struct DirectionLabels {
    direction: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, prometheus_client::encoding::EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// The mesh as the data path reads it: the index, and the label sets of its workloads and
/// services, built once per mesh update.
#[derive(Debug, Default)]
pub(crate) struct MeshView {
    index: MeshIndex,
    peers: HashMap<IpAddr, Arc<PeerLabels>>,
    /// The service a workload port serves, by (workload IP, target port).
    backs: HashMap<(IpAddr, u16), Arc<ServiceLabels>>,
    services: HashMap<String, Arc<ServiceLabels>>,
}

/// One connection through the node proxy, from its first byte to its access-log line.
#[derive(Debug, Clone)]
pub(crate) struct ConnRecord {
    pub(crate) direction: Direction,
    /// The client: the application's address (outbound), the original client the CONNECT
    /// names in `Forwarded`, else the HBONE peer's address (inbound).
    pub(crate) source_addr: SocketAddr,
    /// Where the bytes go: the endpoint's address (outbound), the CONNECT target (inbound);
    /// `None` when refused before one was chosen.
    pub(crate) destination_addr: Option<SocketAddr>,
    pub(crate) source: Arc<PeerLabels>,
    pub(crate) destination: Arc<PeerLabels>,
    pub(crate) service: Arc<ServiceLabels>,
    pub(crate) trace_id: Option<String>,
    /// The members of the peer's `baggage` that were kept (inbound; see [`crate::baggage`]).
    pub(crate) baggage: Option<Box<str>>,
    /// Whether the connection came without mutual TLS (inbound plaintext).
    pub(crate) plaintext: bool,
    pub(crate) start: Instant,
}

/// An open connection: counted in the tunnels gauge until it is dropped, and recorded as
/// closed by [`OpenConnection::finish`], or, when dropped unfinished (the task was cut), with
/// flag `LR`.
pub(crate) struct OpenConnection {
    telemetry: Telemetry,
    record: Option<ConnRecord>,
    gauge: Gauge,
}

/// Bytes of a connection, in Istio's sense (the same for both reporters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Bytes {
    /// From the source toward the destination (the request).
    pub(crate) received: u64,
    /// From the destination back to the source (the response).
    pub(crate) sent: u64,
}

// === impl Telemetry ===

impl Telemetry {
    /// A telemetry with no node proxy yet: unready (waiting for certificates, the first xDS
    /// state and listeners) and no traffic counted; access log as `key=value` text.
    pub fn new() -> Self {
        let readiness = Readiness::default();
        let certificates = readiness.condition("certificates");
        let mesh = readiness.condition("the first xDS state");
        let listeners = readiness.condition("listeners");
        let tunnels = Family::<DirectionLabels, Gauge>::default();
        let tunnels_inbound = tunnels
            .get_or_create(&DirectionLabels {
                direction: "inbound",
            })
            .clone();
        let tunnels_outbound = tunnels
            .get_or_create(&DirectionLabels {
                direction: "outbound",
            })
            .clone();
        Self {
            inner: Arc::new(Inner {
                readiness,
                certificates,
                mesh,
                listeners,
                metrics: Metrics {
                    opened: Family::default(),
                    closed: Family::default(),
                    sent: Family::default(),
                    received: Family::default(),
                    tunnels,
                    tunnels_inbound,
                    tunnels_outbound,
                    denials: Family::default(),
                },
                live: Mutex::new(None),
                next_live: AtomicU64::new(0),
                deadline_passed: AtomicBool::new(false),
            }),
            access_log: AccessLog::text(),
        }
    }

    /// Writes access-log lines in `format` (JSON or `key=value` text, the default).
    pub fn with_access_log(mut self, format: AccessLog) -> Self {
        self.access_log = format;
        self
    }

    /// The readiness of the node proxy: ready once the certificates of every local workload
    /// are loaded, the first mesh state has arrived and every listener (the outbound ones and
    /// one HBONE listener per local workload) is bound; unready for good once it drains.
    pub fn readiness(&self) -> &Readiness {
        &self.inner.readiness
    }

    /// Registers the node proxy's metrics with `registry` (the list is in
    /// `docs/operations.md`): Istio's `istio_tcp_*` counters, the tunnels open, inbound
    /// denials by reason, the HBONE pool and the certificates' expiry.
    pub fn register(&self, registry: &mut Registry) {
        let m = &self.inner.metrics;
        registry.register(
            "istio_tcp_connections_opened",
            "TCP connections opened, with Istio's standard labels",
            m.opened.clone(),
        );
        registry.register(
            "istio_tcp_connections_closed",
            "TCP connections closed, with Istio's standard labels",
            m.closed.clone(),
        );
        registry.register(
            "istio_tcp_sent_bytes",
            "Bytes sent from the destination back to the source (the response), counted when a connection closes",
            m.sent.clone(),
        );
        registry.register(
            "istio_tcp_received_bytes",
            "Bytes received from the source for the destination (the request), counted when a connection closes",
            m.received.clone(),
        );
        registry.register(
            "meshkit_node_proxy_tunnels_open",
            "Connections open now, inbound (HBONE tunnels to local workloads) and outbound (from local workloads)",
            m.tunnels.clone(),
        );
        registry.register(
            "meshkit_node_proxy_policy_denials",
            "Inbound CONNECTs refused, and open tunnels cut by a policy change, by reason",
            m.denials.clone(),
        );
        registry.register_collector(Box::new(LiveCollector(self.clone())));
    }

    /// The admin endpoint of this node proxy: [`Telemetry::register`] into `registry`, the
    /// readiness and the config dump. Add a log filter with
    /// [`Admin::with_log_filter`], then serve it or mount [`Admin::handle`].
    pub fn admin(&self, mut registry: Registry) -> Admin {
        self.register(&mut registry);
        let dump = self.clone();
        Admin::new("node-proxy", registry)
            .with_readiness(self.inner.readiness.clone())
            .with_config_dump(move || dump.config_dump())
    }

    /// The node proxy's configuration now, as JSON: node and trust domain, readiness,
    /// listeners, inbound policy, the mesh's workloads (each marked `local` or not) and
    /// services, and the identity and validity of each certificate held (never a key).
    pub fn config_dump(&self) -> Value {
        let readiness = match self.inner.readiness.check() {
            Ok(()) => json!({"ready": true, "reasons": []}),
            Err(reasons) => json!({"ready": false, "reasons": reasons}),
        };
        let draining = self.inner.readiness.is_draining();
        let live = lock(&self.inner.live);
        let Some((_, live)) = live.as_ref() else {
            return json!({"running": false, "draining": draining, "readiness": readiness});
        };
        let mesh = live.mesh.borrow().clone();
        let policy = live.policy.borrow().clone();
        let workloads: Vec<Value> = mesh
            .workloads
            .iter()
            .map(|w| {
                let mut value = serde_json::to_value(w).unwrap_or(Value::Null);
                if let Value::Object(map) = &mut value {
                    map.insert("local".into(), Value::Bool(w.node == live.node));
                }
                value
            })
            .collect();
        let now = SystemTime::now();
        let mut identities = live.certs.identities();
        identities.sort();
        let certificates: Vec<Value> = identities
            .iter()
            .filter_map(|id| live.certs.current(id))
            .map(|svid| {
                let expires_in = svid
                    .not_after()
                    .duration_since(now)
                    .map_or(0, |d| d.as_secs());
                json!({
                    "identity": svid.spiffe_id().as_str(),
                    "not_before": unix_seconds(svid.not_before()),
                    "not_after": unix_seconds(svid.not_after()),
                    "expires_in_seconds": expires_in,
                })
            })
            .collect();
        let outbound: Vec<Value> = live
            .outbound
            .iter()
            .map(|(rule, bound)| {
                json!({
                    "listen": rule.listen.to_string(),
                    "bound": bound.to_string(),
                    "service": rule.service,
                    "port": rule.port,
                })
            })
            .collect();
        let inbound: Vec<String> = live
            .inbound
            .borrow()
            .iter()
            .map(|a| a.to_string())
            .collect();
        let ids = |set: &BTreeSet<SpiffeId>| -> Vec<String> {
            set.iter().map(|id| id.as_str().to_owned()).collect()
        };
        json!({
            "running": true,
            "draining": draining,
            "readiness": readiness,
            "node": live.node,
            "trust_domain": live.trust_domain.as_str(),
            "listeners": {
                "hbone_port": live.hbone_port,
                "inbound": inbound,
                "outbound": outbound,
            },
            "policy": {
                "allow": policy.allow.as_ref().map(ids),
                "deny": ids(&policy.deny),
            },
            "workloads": workloads,
            "services": mesh.services,
            "authorization_policies": mesh.policies,
            "rejected_authorization_policies": mesh.rejected_policies,
            "certificates": certificates,
        })
    }

    // --- what the node proxy reports (crate-private) ---

    pub(crate) fn attach(&self, live: Live) -> u64 {
        let token = self.inner.next_live.fetch_add(1, Ordering::Relaxed);
        *lock(&self.inner.live) = Some((token, live));
        token
    }

    pub(crate) fn detach(&self, token: u64) {
        let mut live = lock(&self.inner.live);
        if live.as_ref().is_some_and(|(t, _)| *t == token) {
            *live = None;
        }
    }

    pub(crate) fn set_mesh_ready(&self) {
        self.inner.mesh.set_ready();
    }

    pub(crate) fn set_certificates_ready(&self, ready: bool) {
        set(&self.inner.certificates, ready);
    }

    pub(crate) fn set_listeners_ready(&self, ready: bool) {
        set(&self.inner.listeners, ready);
    }

    pub(crate) fn mark_deadline_passed(&self) {
        self.inner.deadline_passed.store(true, Ordering::Relaxed);
    }

    /// Connections open now, both directions.
    pub(crate) fn tunnels_open(&self) -> u64 {
        let m = &self.inner.metrics;
        u64::try_from(m.tunnels_inbound.get() + m.tunnels_outbound.get()).unwrap_or(0)
    }

    /// Counts an inbound refusal for `reason`.
    pub(crate) fn denied(&self, reason: &'static str) {
        self.inner
            .metrics
            .denials
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// A connection refused before any byte moved: opened and closed at once, with `flag`.
    pub(crate) fn refused(&self, record: ConnRecord, flag: &'static str) {
        self.count_opened(&record);
        self.closed(&record, Bytes::default(), flag);
    }

    /// A connection whose bytes start moving now.
    pub(crate) fn open(&self, record: ConnRecord) -> OpenConnection {
        self.count_opened(&record);
        let gauge = match record.direction {
            Direction::Inbound => self.inner.metrics.tunnels_inbound.clone(),
            Direction::Outbound => self.inner.metrics.tunnels_outbound.clone(),
        };
        gauge.inc();
        OpenConnection {
            telemetry: self.clone(),
            record: Some(record),
            gauge,
        }
    }

    fn count_opened(&self, record: &ConnRecord) {
        self.inner
            .metrics
            .opened
            .get_or_create(&record.labels(FLAG_NONE))
            .inc();
    }

    fn closed(&self, record: &ConnRecord, bytes: Bytes, flag: &'static str) {
        let m = &self.inner.metrics;
        let labels = record.labels(flag);
        m.closed.get_or_create(&labels).inc();
        if bytes.sent > 0 {
            m.sent.get_or_create(&labels).inc_by(bytes.sent);
        }
        if bytes.received > 0 {
            m.received.get_or_create(&labels).inc_by(bytes.received);
        }
        if tracing::enabled!(target: "meshkit::access", tracing::Level::INFO) {
            let duration = record.start.elapsed();
            let line = record.access_line(&self.access_log, bytes, duration, flag);
            tracing::info!(target: "meshkit::access", "{line}");
        }
    }

    /// `flag`, unless a drain deadline passed: then a failure is the node proxy's own reset.
    fn flag(&self, flag: &'static str) -> &'static str {
        if flag != FLAG_NONE && self.inner.deadline_passed.load(Ordering::Relaxed) {
            FLAG_LOCAL_RESET
        } else {
            flag
        }
    }
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry")
            .field("readiness", &self.inner.readiness)
            .field("access_log", &self.access_log)
            .finish_non_exhaustive()
    }
}

fn set(condition: &Condition, ready: bool) {
    if ready {
        condition.set_ready();
    } else {
        condition.set_unready();
    }
}

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// === impl OpenConnection ===

impl OpenConnection {
    /// Records the end of the connection: `bytes` moved, and `flag` (`-` when it ended well).
    pub(crate) fn finish(mut self, bytes: Bytes, flag: &'static str) {
        if let Some(record) = self.record.take() {
            let flag = self.telemetry.flag(flag);
            self.telemetry.closed(&record, bytes, flag);
        }
    }

    /// The flag for a copy that failed on `side`, given which side is downstream.
    pub(crate) fn failure_flag(side: Side, downstream: Side) -> &'static str {
        if side == downstream {
            FLAG_DOWNSTREAM_TERMINATION
        } else {
            FLAG_UPSTREAM_TERMINATION
        }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.gauge.dec();
        if let Some(record) = self.record.take() {
            // The task was cut (drain deadline, shutdown): the bytes it moved are unknown.
            self.telemetry
                .closed(&record, Bytes::default(), FLAG_LOCAL_RESET);
        }
    }
}

// === impl Direction ===

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Direction::Outbound => "outbound",
            Direction::Inbound => "inbound",
        }
    }

    fn reporter(self) -> &'static str {
        match self {
            Direction::Outbound => "source",
            Direction::Inbound => "destination",
        }
    }
}

// === impl PeerLabels ===

pub(crate) const UNKNOWN: &str = "unknown";

impl PeerLabels {
    /// A workload of the mesh. Its canonical service and revision are Istio's defaults for a
    /// workload without canonical-service labels (the mesh carries no labels): the workload's
    /// name and `latest`.
    pub(crate) fn of_workload(workload: &Workload, id: &SpiffeId) -> Self {
        Self {
            workload: workload.name.clone(),
            namespace: workload.namespace.clone(),
            principal: id.as_str().to_owned(),
            canonical_service: workload.name.clone(),
            canonical_revision: "latest".to_owned(),
        }
    }

    /// A verified peer that is no workload of the mesh (a gateway, say): its principal, and
    /// the namespace of its Istio-form identity.
    pub(crate) fn of_identity(id: &SpiffeId) -> Self {
        Self {
            workload: UNKNOWN.to_owned(),
            namespace: id.namespace().unwrap_or(UNKNOWN).to_owned(),
            principal: id.as_str().to_owned(),
            canonical_service: UNKNOWN.to_owned(),
            canonical_revision: UNKNOWN.to_owned(),
        }
    }

    /// Nothing known.
    pub(crate) fn unknown() -> Arc<Self> {
        static UNKNOWN_PEER: OnceLock<Arc<PeerLabels>> = OnceLock::new();
        UNKNOWN_PEER
            .get_or_init(|| {
                Arc::new(PeerLabels {
                    workload: UNKNOWN.to_owned(),
                    namespace: UNKNOWN.to_owned(),
                    principal: UNKNOWN.to_owned(),
                    canonical_service: UNKNOWN.to_owned(),
                    canonical_revision: UNKNOWN.to_owned(),
                })
            })
            .clone()
    }
}

// === impl ServiceLabels ===

impl ServiceLabels {
    /// Only the host name is known (an outbound listener's service that the mesh lacks).
    pub(crate) fn host_only(host: &str) -> Arc<Self> {
        Arc::new(Self {
            host: host.to_owned(),
            name: UNKNOWN.to_owned(),
            namespace: UNKNOWN.to_owned(),
        })
    }

    /// Nothing known.
    pub(crate) fn unknown() -> Arc<Self> {
        static UNKNOWN_SERVICE: OnceLock<Arc<ServiceLabels>> = OnceLock::new();
        UNKNOWN_SERVICE
            .get_or_init(|| {
                Arc::new(ServiceLabels {
                    host: UNKNOWN.to_owned(),
                    name: UNKNOWN.to_owned(),
                    namespace: UNKNOWN.to_owned(),
                })
            })
            .clone()
    }
}

// === impl TcpLabels ===

impl EncodeLabelSet for TcpLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), fmt::Error> {
        let (s, d, svc) = (&*self.source, &*self.destination, &*self.service);
        let labels: [(&str, &str); 17] = [
            ("reporter", self.direction.reporter()),
            ("source_workload", &s.workload),
            ("source_canonical_service", &s.canonical_service),
            ("source_canonical_revision", &s.canonical_revision),
            ("source_workload_namespace", &s.namespace),
            ("source_principal", &s.principal),
            ("destination_service", &svc.host),
            ("destination_service_namespace", &svc.namespace),
            ("destination_service_name", &svc.name),
            ("destination_workload", &d.workload),
            ("destination_canonical_service", &d.canonical_service),
            ("destination_canonical_revision", &d.canonical_revision),
            ("destination_workload_namespace", &d.namespace),
            ("destination_principal", &d.principal),
            ("request_protocol", "tcp"),
            ("response_flags", self.response_flags),
            ("connection_security_policy", self.security),
        ];
        EncodeLabelSet::encode(&labels, encoder)
    }
}

// === impl MeshView ===

impl MeshView {
    /// The view of `mesh`, with `hbone_port` as every workload's HBONE port.
    pub(crate) fn new(mesh: &MeshConfig, trust_domain: &TrustDomain, hbone_port: u16) -> Self {
        let index = mesh.index(trust_domain).with_hbone_port(hbone_port);
        let peers = mesh
            .workloads
            .iter()
            .filter_map(|w| {
                let (workload, id) = index.workload(w.ip)?;
                Some((w.ip, Arc::new(PeerLabels::of_workload(workload, id))))
            })
            .collect();
        let mut services: Vec<_> = mesh.services.iter().collect();
        // The first service by host name wins a workload port two services share.
        services.sort_by(|a, b| a.hostname.cmp(&b.hostname));
        let mut backs = HashMap::new();
        let mut by_host = HashMap::new();
        for s in services {
            let labels = Arc::new(ServiceLabels {
                host: s.hostname.clone(),
                name: s.name.clone(),
                namespace: s.namespace.clone(),
            });
            for ip in &s.endpoints {
                for port in &s.ports {
                    backs
                        .entry((*ip, port.target_port))
                        .or_insert_with(|| labels.clone());
                }
            }
            by_host
                .entry(s.hostname.to_ascii_lowercase())
                .or_insert(labels);
        }
        Self {
            index,
            peers,
            backs,
            services: by_host,
        }
    }

    /// The labels of the workload at `ip`.
    pub(crate) fn peer(&self, ip: IpAddr) -> Option<&Arc<PeerLabels>> {
        self.peers.get(&ip)
    }

    /// The service that port `port` of the workload at `ip` serves.
    pub(crate) fn service_of(&self, ip: IpAddr, port: u16) -> Option<&Arc<ServiceLabels>> {
        self.backs.get(&(ip, port))
    }

    /// The labels of the service with host name `host`.
    pub(crate) fn service_labels(&self, host: &str) -> Option<&Arc<ServiceLabels>> {
        self.services.get(&host.to_ascii_lowercase())
    }
}

impl Deref for MeshView {
    type Target = MeshIndex;

    fn deref(&self) -> &MeshIndex {
        &self.index
    }
}

// === impl ConnRecord ===

impl ConnRecord {
    /// A connection from `source_addr`, nothing else known yet.
    pub(crate) fn new(direction: Direction, source_addr: SocketAddr) -> Self {
        Self {
            direction,
            source_addr,
            destination_addr: None,
            source: PeerLabels::unknown(),
            destination: PeerLabels::unknown(),
            service: ServiceLabels::unknown(),
            trace_id: None,
            baggage: None,
            plaintext: false,
            start: Instant::now(),
        }
    }

    /// Records where the connection goes: `target`, with the labels of its workload and
    /// service in `view` (unknown when `view` has none).
    pub(crate) fn set_destination(&mut self, view: &MeshView, target: SocketAddr) {
        self.destination_addr = Some(target);
        self.destination = view
            .peer(target.ip())
            .cloned()
            .unwrap_or_else(PeerLabels::unknown);
        self.service = view
            .service_of(target.ip(), target.port())
            .cloned()
            .unwrap_or_else(ServiceLabels::unknown);
    }

    fn labels(&self, response_flags: &'static str) -> TcpLabels {
        TcpLabels {
            direction: self.direction,
            source: self.source.clone(),
            destination: self.destination.clone(),
            service: self.service.clone(),
            response_flags,
            // Istio's values: `none` for a connection without mutual TLS.
            security: if self.plaintext { "none" } else { "mutual_tls" },
        }
    }

    /// The access-log line of this connection.
    pub(crate) fn access_line(
        &self,
        format: &AccessLog,
        bytes: Bytes,
        duration: Duration,
        flag: &str,
    ) -> String {
        let src = self.source_addr.to_string();
        let dst = self
            .destination_addr
            .map_or_else(|| "-".to_owned(), |a| a.to_string());
        let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        let mut fields = vec![
            ("direction", Field::Str(self.direction.as_str())),
            ("src", Field::Str(&src)),
            ("src_identity", Field::Str(&self.source.principal)),
            ("src_workload", Field::Str(&self.source.workload)),
            ("src_namespace", Field::Str(&self.source.namespace)),
            ("dst", Field::Str(&dst)),
            ("dst_identity", Field::Str(&self.destination.principal)),
            ("dst_workload", Field::Str(&self.destination.workload)),
            ("dst_namespace", Field::Str(&self.destination.namespace)),
            ("dst_service", Field::Str(&self.service.host)),
            ("bytes_received", Field::Num(bytes.received)),
            ("bytes_sent", Field::Num(bytes.sent)),
            ("duration_ms", Field::Num(millis)),
            ("flags", Field::Str(flag)),
            (
                "trace_id",
                Field::Str(self.trace_id.as_deref().unwrap_or("-")),
            ),
        ];
        if let Some(baggage) = &self.baggage {
            fields.push(("src_baggage", Field::Str(baggage)));
        }
        format.line(&fields)
    }
}

// === the figures read at each scrape ===

/// The HBONE pool, the inbound HBONE connections and the certificates' expiry, read from the
/// running node proxy at each scrape.
#[derive(Debug)]
struct LiveCollector(Telemetry);

impl Collector for LiveCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let live = lock(&self.0.inner.live);
        let Some((_, live)) = live.as_ref() else {
            return Ok(());
        };
        let pooled =
            ConstGauge::new(i64::try_from(live.client.pooled_connections()).unwrap_or(i64::MAX));
        encode(
            &mut encoder,
            "meshkit_node_proxy_hbone_pooled_connections",
            "Outbound HBONE connections in the pool now",
            &pooled,
        )?;
        let opened = ConstCounter::new(live.client.connections_opened());
        encode(
            &mut encoder,
            "meshkit_node_proxy_hbone_connections_opened",
            "Outbound HBONE connections established (TLS and HTTP/2 handshakes done)",
            &opened,
        )?;
        let (inbound, shares) = {
            let servers = lock(&live.servers);
            let open: usize = servers.values().map(|s| s.connections_open()).sum();
            let mut shares = [0u64; 3];
            for fair in servers.values().filter_map(|s| s.connection_shares()) {
                shares[0] += fair.refused_share();
                shares[1] += fair.refused_full();
                shares[2] += fair.evicted();
            }
            (open, shares)
        };
        let mut family = encoder.encode_descriptor(
            "meshkit_node_proxy_inbound_hbone_connections_refused",
            "Inbound HBONE connections closed for the fair share of places among sources: at accept (source_share: the source holds its share; full: every place is held fairly), or open ones closed to give their place to a source holding fewer (evicted)",
            None,
            MetricType::Counter,
        )?;
        for (reason, count) in ["source_share", "full", "evicted"].into_iter().zip(shares) {
            let labels = [("reason", reason)];
            let metric: MetricEncoder<'_> = family.encode_family(&labels)?;
            ConstCounter::new(count).encode(metric)?;
        }
        encode(
            &mut encoder,
            "meshkit_node_proxy_inbound_hbone_connections",
            "Inbound HBONE connections open now, over every local workload's listener",
            &ConstGauge::new(i64::try_from(inbound).unwrap_or(i64::MAX)),
        )?;
        let (last_good, deny_all) = {
            let mesh = live.mesh.borrow();
            let deny_all = mesh
                .rejected_policies
                .iter()
                .filter(|r| r.enforced == StandIn::DenyAll)
                .count();
            (mesh.rejected_policies.len() - deny_all, deny_all)
        };
        let mut family = encoder.encode_descriptor(
            "meshkit_node_proxy_rejected_authorization_policies",
            "Authorization policies rejected on receipt now (alert when above 0), by what stands in for them: last_good (the last good version is enforced) or deny_all (it never had one: every connection in its scope is denied)",
            None,
            MetricType::Gauge,
        )?;
        for (stand_in, count) in [("last_good", last_good), ("deny_all", deny_all)] {
            let labels = [("stand_in", stand_in)];
            let metric: MetricEncoder<'_> = family.encode_family(&labels)?;
            ConstGauge::new(i64::try_from(count).unwrap_or(i64::MAX)).encode(metric)?;
        }
        let mut identities = live.certs.identities();
        identities.sort();
        let expiries: Vec<(SpiffeId, i64)> = identities
            .into_iter()
            .filter_map(|id| {
                let svid = live.certs.current(&id)?;
                let at = i64::try_from(unix_seconds(svid.not_after())).unwrap_or(i64::MAX);
                Some((id, at))
            })
            .collect();
        if !expiries.is_empty() {
            let mut family = encoder.encode_descriptor(
                "meshkit_node_proxy_certificate_expiry_timestamp_seconds",
                "When the certificate held for each identity expires, in seconds since the Unix epoch",
                None,
                MetricType::Gauge,
            )?;
            for (id, at) in &expiries {
                let labels = [("identity", id.as_str())];
                let metric: MetricEncoder<'_> = family.encode_family(&labels)?;
                ConstGauge::new(*at).encode(metric)?;
            }
        }
        Ok(())
    }
}

fn encode(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    metric: &impl EncodeMetric,
) -> Result<(), fmt::Error> {
    let m = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    metric.encode(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(sa: &str) -> SpiffeId {
        format!("spiffe://cluster.local/ns/shop/sa/{sa}")
            .parse()
            .expect("id")
    }

    fn workload(name: &str) -> Workload {
        serde_json::from_value(json!({
            "name": name, "namespace": "shop", "service_account": name,
            "ip": "127.0.0.1", "node": "n",
        }))
        .expect("workload")
    }

    fn record() -> ConnRecord {
        let mut r = ConnRecord::new(Direction::Outbound, "127.0.0.11:40000".parse().unwrap());
        r.destination_addr = Some("127.0.0.12:8080".parse().unwrap());
        r.source = Arc::new(PeerLabels::of_workload(
            &workload("client-1"),
            &id("client"),
        ));
        r.destination = Arc::new(PeerLabels::of_workload(&workload("web-1"), &id("web")));
        r.service = Arc::new(ServiceLabels {
            host: "web.shop.svc.cluster.local".into(),
            name: "web".into(),
            namespace: "shop".into(),
        });
        r.trace_id = Some("4bf92f3577b34da6a3ce929d0e0e4736".into());
        r
    }

    #[test]
    fn the_access_line_names_both_ends_the_bytes_and_the_flag() {
        let bytes = Bytes {
            received: 1000,
            sent: 2000,
        };
        let line = record().access_line(&AccessLog::text(), bytes, Duration::from_millis(12), "-");
        assert_eq!(
            line,
            "direction=outbound src=127.0.0.11:40000 \
             src_identity=spiffe://cluster.local/ns/shop/sa/client src_workload=client-1 \
             src_namespace=shop dst=127.0.0.12:8080 dst_identity=spiffe://cluster.local/ns/shop/sa/web \
             dst_workload=web-1 dst_namespace=shop dst_service=web.shop.svc.cluster.local \
             bytes_received=1000 bytes_sent=2000 duration_ms=12 flags=- \
             trace_id=4bf92f3577b34da6a3ce929d0e0e4736"
        );
        let mut refused = ConnRecord::new(Direction::Inbound, "127.0.0.1:1".parse().unwrap());
        refused.source = Arc::new(PeerLabels::of_identity(&id("intruder")));
        let json = refused.access_line(
            &AccessLog::json(),
            Bytes::default(),
            Duration::ZERO,
            FLAG_DENY,
        );
        let v: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["direction"], "inbound");
        assert_eq!(v["dst"], "-");
        assert_eq!(
            v["src_identity"],
            "spiffe://cluster.local/ns/shop/sa/intruder"
        );
        assert_eq!(v["src_workload"], "unknown");
        assert_eq!(v["src_namespace"], "shop");
        assert_eq!(v["flags"], "DENY");
        assert_eq!(v["bytes_sent"], 0);
        assert_eq!(v["trace_id"], "-");
    }

    #[test]
    fn a_cut_connection_is_closed_with_lr_and_leaves_the_gauge() {
        let telemetry = Telemetry::new();
        let open = telemetry.open(record());
        assert_eq!(telemetry.tunnels_open(), 1);
        drop(open);
        assert_eq!(telemetry.tunnels_open(), 0);
        let labels = record().labels(FLAG_LOCAL_RESET);
        assert_eq!(
            telemetry.inner.metrics.closed.get_or_create(&labels).get(),
            1
        );
        // After a drain deadline, a failure is the node proxy's own reset too.
        telemetry.mark_deadline_passed();
        telemetry
            .open(record())
            .finish(Bytes::default(), FLAG_UPSTREAM_TERMINATION);
        assert_eq!(
            telemetry.inner.metrics.closed.get_or_create(&labels).get(),
            2
        );
        telemetry.open(record()).finish(Bytes::default(), FLAG_NONE);
        let ok = record().labels(FLAG_NONE);
        assert_eq!(telemetry.inner.metrics.closed.get_or_create(&ok).get(), 1);
    }
}
