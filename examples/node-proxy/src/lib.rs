//! The node proxy: ztunnel's job on loopback.
//!
//! - **Configuration.** [`NodeProxyConfig`] holds what is fixed for a run (node name, trust
//!   domain, ports, outbound listeners, policy); [`MeshConfig`] (workloads and services, from
//!   meshkit-mesh) comes through a `tokio::sync::watch` channel, so the control plane's xDS
//!   stream ([`meshkit_mesh::feed::mesh_over_xds`]) or a file can feed it.
//! - **Certificates.** From an [`SvidCache`]: one SVID per identity of a local workload,
//!   fetched and rotated in the background, so that a slow CA never holds up a mesh update.
//! - **Inbound.** One HBONE listener per local workload, on `WORKLOAD_IP:15008`, all sharing a
//!   [`ByDestinationIp`] selector: the certificate served is
//!   the one of the workload whose address the peer connected to, as ztunnel does with the
//!   original destination of redirected traffic. Peers must belong to the trust domain and pass
//!   the [`InboundPolicy`]; the CONNECT target must be that same local workload, on a port it
//!   serves ([`meshkit_mesh::Workload::ports`]: for a workload learned over xDS, the target
//!   ports of its services, none when it backs none), and never one of the node proxy's own
//!   listeners (the HBONE port, the outbound listeners, [`NodeProxyConfig::reserved`]);
//!   otherwise 403. Listeners follow the watch channel: new local workloads are served,
//!   removed ones stop.
//! - **Inbound plaintext.** Optionally ([`NodeProxyConfig::inbound_plaintext`]), ztunnel's
//!   port 15006: TCP for a local workload that the platform redirects there (netfilter
//!   `REDIRECT`) without HBONE. The original destination names the workload; the mesh's
//!   policies decide the connection as one without an identity (a STRICT
//!   PeerAuthentication refuses it); an allowed one is spliced to the workload.
//! - **Outbound.** One plain-TCP listener per [`OutboundListener`]: the connection's source
//!   address names the local workload (whose identity is presented), the listener names the
//!   service; endpoints are tried round-robin, each over HBONE to `ENDPOINT_IP:15008`
//!   expecting the endpoint workload's SPIFFE ID. See `docs/node-proxy.md` for why listeners
//!   stand in for traffic redirection.
//! - **Operability.** A [`Telemetry`] per node proxy: readiness (certificates loaded, first
//!   mesh state arrived, every listener bound), Istio's `istio_tcp_*` metrics with the standard
//!   labels and the node proxy's own, a config dump without keys, and one access-log line per
//!   connection and direction at info on the `meshkit::access` target.
//!   [`Telemetry::admin`] gives the admin endpoint (`/healthz/ready`, `/metrics`,
//!   `/config_dump`, `/logging`) to serve or mount. Each connection runs in a span; an
//!   outbound one starts a W3C trace and sends its `traceparent` in the HBONE CONNECT, which
//!   the inbound side records.
//! - **Drain.** [`NodeProxy::drain`] turns readiness to 503, stops accepting (inbound HBONE
//!   listeners send GOAWAY), lets open connections finish until a deadline, then resets the
//!   rest.
//!
//! ```no_run
//! use std::sync::Arc;
//! use meshkit_mesh::MeshConfig;
//! use meshkit_node_proxy::{NodeProxy, NodeProxyConfig};
//! use meshkit_identity::{RotationConfig, SvidCache, TrustDomain, test_util::TestCa};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let td = TrustDomain::new("cluster.local")?;
//! let ca = Arc::new(TestCa::new(td.clone()));
//! let certs = SvidCache::new(ca.clone(), RotationConfig::default());
//! let (mesh_tx, mesh_rx) = tokio::sync::watch::channel(MeshConfig::default());
//! let proxy = NodeProxy::start(NodeProxyConfig::new("node-a", td), mesh_rx, certs, ca.bundle_set()).await?;
//! # drop((proxy, mesh_tx));
//! # Ok(())
//! # }
//! ```
//!
//! # Feature flags
//!
//! - `cli` (default): the `node-proxy` binary and what only it needs (argument parsing,
//!   logging, its allocator). Embedders turn it off with `default-features = false`.
//! - `aws-lc-rs`: the binary with aws-lc-rs as its crypto provider.
//!
//! # Stability
//!
//! Pre-1.0: the API may change between minor versions.

// docs.rs builds with `--cfg docsrs`: items behind a feature show it.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod accept;
mod baggage;
mod inbound;
mod outbound;
mod plaintext;
mod telemetry;
mod trace;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshkit_hbone::{Client, ClientConfig, ServerConfig};
use meshkit_identity::{ByDestinationIp, SpiffeId, SvidCache, TrustBundleSet, TrustDomain};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use inbound::InboundPolicy;
/// The admin endpoint's pieces ([`Telemetry::admin`] builds one): meshkit-admin.
pub use meshkit_admin as admin;
use meshkit_mesh::MeshConfig;
pub use outbound::OutboundListener;
pub use telemetry::Telemetry;

use inbound::{Inbound, InboundState};
use telemetry::{Live, MeshView};

/// What is fixed for a node proxy's run.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeProxyConfig {
    /// This node's name: workloads whose `node` is this name are served inbound.
    pub node: String,
    /// The mesh's trust domain: peers must belong to it; workload IDs are built in it.
    pub trust_domain: TrustDomain,
    /// The HBONE port, on every workload address. Default: 15008.
    pub hbone_port: u16,
    /// Outbound listeners. Default: none.
    pub outbound: Vec<OutboundListener>,
    /// Inbound authorization. Default: any identity of the trust domain.
    pub policy: InboundPolicy,
    /// HBONE client settings (outbound). Their TLS settings (crypto provider, ALPN) also build
    /// the inbound listeners' TLS configs, so both directions use one provider. Default:
    /// [`ClientConfig::default`] (ring); a program shares its own provider through
    /// [`NodeProxyConfig::with_client`].
    pub client: ClientConfig,
    /// HBONE server settings (inbound).
    pub server: ServerConfig,
    /// How long to wait before retrying workloads that could not be served (CA down, address
    /// taken). Default: 2 s.
    pub retry_interval: Duration,
    /// How long [`NodeProxy::start`] waits for the first certificates of the local workloads
    /// before it returns; workloads still waiting are served when theirs arrive. Default: 10 s.
    pub startup_timeout: Duration,
    /// Other addresses of this process that an inbound tunnel must never reach (an admin or
    /// metrics listener, say). The HBONE port (on any address) and the outbound listeners are
    /// always refused. A wildcard address (`0.0.0.0`, `[::]`) covers its port on every
    /// address. Default: none.
    pub reserved: Vec<SocketAddr>,
    /// Readiness, metrics, config dump and access-log format. Default: a new
    /// [`Telemetry`] (text access log), reachable through [`NodeProxy::telemetry`].
    pub telemetry: Telemetry,
    /// Whether the mesh given to [`NodeProxy::start`] is a placeholder (an xDS feed's empty
    /// start): then readiness waits for the first update of the channel. Default: false (the
    /// mesh given is current, as a mesh file's).
    pub wait_for_first_mesh: bool,
    /// Whether an outbound HBONE connection leaves from the source workload's own address,
    /// so that the peer sees the workload, not the node, as the connection's source (what
    /// IP-block policies at the peer are written against; ztunnel's in-pod mode does the
    /// same). The workload addresses must then be addresses of this host or network
    /// namespace; a connection that cannot bind to its workload's address fails. Connections
    /// are pooled per workload address. Default: false (the system's choice of address).
    pub preserve_source_address: bool,
    /// Where to take plaintext TCP redirected to the node proxy for its local workloads
    /// (ztunnel's `[::]:15006`), decided by the mesh's policies as a connection without an
    /// identity. Linux only: the original destination comes from `SO_ORIGINAL_DST`, set by a
    /// netfilter `REDIRECT`; a connection without one is refused. The port is never a
    /// forwarding target. Default: none.
    pub inbound_plaintext: Option<SocketAddr>,
}

impl NodeProxyConfig {
    /// A node proxy for node `node` of `trust_domain`, with the defaults.
    pub fn new(node: impl Into<String>, trust_domain: TrustDomain) -> Self {
        Self {
            node: node.into(),
            trust_domain,
            hbone_port: meshkit_hbone::HBONE_PORT,
            outbound: Vec::new(),
            policy: InboundPolicy::default(),
            client: ClientConfig::default(),
            server: ServerConfig::default(),
            retry_interval: Duration::from_secs(2),
            startup_timeout: Duration::from_secs(10),
            reserved: Vec::new(),
            telemetry: Telemetry::new(),
            wait_for_first_mesh: false,
            preserve_source_address: false,
            inbound_plaintext: None,
        }
    }

    /// Takes redirected plaintext TCP on `addr`
    /// ([`NodeProxyConfig::inbound_plaintext`]).
    pub fn with_inbound_plaintext(mut self, addr: SocketAddr) -> Self {
        self.inbound_plaintext = Some(addr);
        self
    }

    /// Opens outbound HBONE connections from the source workload's address
    /// ([`NodeProxyConfig::preserve_source_address`]).
    pub fn preserving_source_address(mut self) -> Self {
        self.preserve_source_address = true;
        self
    }

    /// Uses `telemetry` (made before the start, so that an admin endpoint answers while the
    /// node proxy starts).
    pub fn with_telemetry(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = telemetry;
        self
    }

    /// Waits for the first update of the mesh channel before readiness
    /// ([`NodeProxyConfig::wait_for_first_mesh`]): for a mesh that comes over xDS.
    pub fn waiting_for_first_mesh(mut self) -> Self {
        self.wait_for_first_mesh = true;
        self
    }

    /// Adds an address of this process that inbound tunnels must never reach
    /// ([`NodeProxyConfig::reserved`]).
    pub fn with_reserved(mut self, addr: SocketAddr) -> Self {
        self.reserved.push(addr);
        self
    }

    /// Adds an outbound listener.
    pub fn with_outbound(mut self, listener: OutboundListener) -> Self {
        self.outbound.push(listener);
        self
    }

    /// Sets the inbound policy.
    pub fn with_policy(mut self, policy: InboundPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Sets the HBONE port (15008 by default; tests may use another).
    pub fn with_hbone_port(mut self, port: u16) -> Self {
        self.hbone_port = port;
        self
    }

    /// Sets the HBONE client settings.
    pub fn with_client(mut self, client: ClientConfig) -> Self {
        self.client = client;
        self
    }
}

/// A running node proxy. Dropping it stops every listener and drops every tunnel;
/// [`NodeProxy::drain`] lets them finish first.
#[derive(Debug)]
pub struct NodeProxy {
    tasks: Vec<AbortOnDrop>,
    outbound: Vec<SocketAddr>,
    inbound: watch::Receiver<BTreeSet<SocketAddr>>,
    policy: Arc<watch::Sender<InboundPolicy>>,
    state: Arc<InboundState>,
    telemetry: Telemetry,
    /// This run's hold on the telemetry's live figures, released on drop.
    live: u64,
    drain: watch::Sender<bool>,
    /// The inbound HBONE servers' statistics, by workload IP.
    servers: telemetry::Servers,
}

/// How a [`NodeProxy::drain`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Drained {
    /// Connections still open at the deadline, which were reset; 0 when every one finished.
    pub reset: u64,
}

/// Completes at `at`, or never.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Aborts a task when dropped, so that owning a handle means owning the task.
#[derive(Debug)]
struct AbortOnDrop(Option<JoinHandle<()>>);

impl AbortOnDrop {
    fn new(task: JoinHandle<()>) -> Self {
        Self(Some(task))
    }

    /// Waits for the task to end. Cancel safe: the task stays owned until it has ended.
    async fn join(&mut self) {
        if let Some(task) = &mut self.0 {
            let _ = task.await;
            self.0 = None;
        }
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

// === impl NodeProxy ===

impl NodeProxy {
    /// Starts the node proxy: binds the outbound listeners, serves inbound for the local
    /// workloads of the current mesh (waiting up to [`NodeProxyConfig::startup_timeout`] for
    /// their certificates), then follows `mesh`.
    ///
    /// Mesh updates apply at once: certificates are fetched in the background, so a slow or
    /// silent CA delays only the workloads waiting for one.
    ///
    /// # Errors
    ///
    /// When an outbound listener cannot be bound. Inbound listeners that cannot be served yet
    /// (CA unavailable, address in use) are logged and retried.
    pub async fn start(
        config: NodeProxyConfig,
        mut mesh: watch::Receiver<MeshConfig>,
        certs: SvidCache,
        bundles: impl Into<Arc<TrustBundleSet>>,
    ) -> std::io::Result<Self> {
        let bundles = bundles.into();
        let telemetry = config.telemetry.clone();
        // A channel updated since its receiver was made has delivered a real state already.
        if !config.wait_for_first_mesh || mesh.has_changed().unwrap_or(false) {
            telemetry.set_mesh_ready();
        }
        let td = config.trust_domain.clone();
        let hbone_port = config.hbone_port;
        let build = move |m: &MeshConfig| Arc::new(MeshView::new(m, &td, hbone_port));
        let (index_tx, index_rx) = watch::channel(build(&mesh.borrow_and_update()));
        let (drain_tx, drain_rx) = watch::channel(false);

        let client = Client::new(config.client.clone(), certs.clone(), bundles.clone());
        let mut tasks = Vec::new();
        let mut outbound = Vec::new();
        for rule in &config.outbound {
            let listener = TcpListener::bind(rule.listen).await.map_err(|e| {
                std::io::Error::new(e.kind(), format!("outbound listener {}: {e}", rule.listen))
            })?;
            let addr = listener.local_addr()?;
            tracing::info!(listen = %addr, service = %rule.service, port = rule.port, "outbound listener");
            outbound.push(addr);
            let task = tokio::spawn(outbound::serve(
                listener,
                outbound::Outbound {
                    rule: rule.clone(),
                    node: config.node.clone(),
                    view: index_rx.clone(),
                    client: client.clone(),
                    telemetry: telemetry.clone(),
                    drain: drain_rx.clone(),
                    preserve_source_address: config.preserve_source_address,
                },
            ));
            tasks.push(AbortOnDrop::new(task));
        }

        let plaintext = match config.inbound_plaintext {
            Some(addr) => {
                let listener = TcpListener::bind(addr).await.map_err(|e| {
                    std::io::Error::new(e.kind(), format!("inbound plaintext listener {addr}: {e}"))
                })?;
                tracing::info!(listen = %listener.local_addr()?, "inbound plaintext listener");
                Some(listener)
            }
            None => None,
        };
        let plaintext_addr = plaintext
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?;
        let policy = Arc::new(watch::Sender::new(config.policy.clone()));
        let (published, inbound_rx) = watch::channel(BTreeSet::new());
        let state = Arc::new(InboundState {
            node: config.node.clone(),
            index: index_rx.clone(),
            policy: policy.clone(),
            connect_timeout: Duration::from_secs(5),
            telemetry: telemetry.clone(),
            accepted: Mutex::default(),
            hbone_port: config.hbone_port,
            own: outbound
                .iter()
                .chain(&config.reserved)
                .chain(&plaintext_addr)
                .copied()
                .collect(),
        });
        if let Some(listener) = plaintext {
            let task = tokio::spawn(plaintext::serve(listener, state.clone(), drain_rx.clone()));
            tasks.push(AbortOnDrop::new(task));
        }
        let servers = telemetry::Servers::default();
        let server_stats = servers.clone();
        let live = telemetry.attach(Live {
            node: config.node.clone(),
            trust_domain: config.trust_domain.clone(),
            hbone_port: config.hbone_port,
            mesh: mesh.clone(),
            policy: policy.clone(),
            outbound: config
                .outbound
                .iter()
                .cloned()
                .zip(outbound.clone())
                .collect(),
            inbound: inbound_rx.clone(),
            client: client.clone(),
            certs: certs.clone(),
            servers: servers.clone(),
        });
        let (fetched_tx, mut fetched) = tokio::sync::mpsc::unbounded_channel();
        let mut inbound = Inbound {
            trust_domain: config.trust_domain.clone(),
            port: config.hbone_port,
            server: config.server.clone(),
            tls: config.client.tls.clone(),
            certs,
            bundles,
            selector: Arc::new(ByDestinationIp::new()),
            state: state.clone(),
            serving: HashMap::new(),
            pending: HashMap::new(),
            fetched: fetched_tx,
            published,
            wanted: HashMap::new(),
            certified: Default::default(),
            servers,
            drain: drain_rx.clone(),
        };
        let first = index_rx.borrow().clone();
        inbound.reconcile(&first);
        let retry = config.retry_interval;
        // A workload that could not be served is retried once `retry_at` passes.
        let mut retry_at = None;
        let startup = tokio::time::Instant::now() + config.startup_timeout;
        while inbound.has_pending() {
            match tokio::time::timeout_at(startup, fetched.recv()).await {
                Ok(Some(done)) => {
                    if !inbound.fetched(done) {
                        retry_at.get_or_insert(tokio::time::Instant::now() + retry);
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        let first_mesh = telemetry.clone();
        let mut drain = drain_rx;
        let task = tokio::spawn(async move {
            // When the configuration source goes away, keep serving the last mesh.
            let mut source_open = true;
            // Whether a mesh update arrived (readiness waits for one after the reconcile,
            // so that it never reads ready before the new workloads are accounted for).
            let mut arrived = false;
            loop {
                tokio::select! {
                    _ = drain.wait_for(|draining| *draining) => break,
                    changed = mesh.changed(), if source_open => {
                        if changed.is_err() {
                            source_open = false;
                            continue;
                        }
                        let next = build(&mesh.borrow_and_update());
                        index_tx.send_replace(next);
                        arrived = true;
                    }
                    Some(done) = fetched.recv() => {
                        if !inbound.fetched(done) {
                            retry_at.get_or_insert(tokio::time::Instant::now() + retry);
                        }
                        continue;
                    }
                    () = sleep_until(retry_at) => retry_at = None,
                }
                let index = index_tx.borrow().clone();
                inbound.reconcile(&index);
                if arrived {
                    first_mesh.set_mesh_ready();
                }
            }
            // Draining: the mesh no longer changes what is served; the servers finish.
            inbound.drained().await;
        });
        tasks.push(AbortOnDrop::new(task));
        Ok(Self {
            tasks,
            outbound,
            inbound: inbound_rx,
            policy,
            state,
            telemetry,
            live,
            drain: drain_tx,
            servers: server_stats,
        })
    }

    /// TLS handshakes that failed or timed out on the inbound HBONE listener of the local
    /// workload `ip` (a client certificate refused, for one), since that listener started;
    /// `None` when the node proxy serves no listener for `ip`.
    pub fn inbound_handshake_failures(&self, ip: std::net::IpAddr) -> Option<u64> {
        self.servers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&ip)
            .map(|stats| stats.handshake_failures())
    }

    /// The bound addresses of the outbound listeners, in the order of
    /// [`NodeProxyConfig::outbound`].
    pub fn outbound_addrs(&self) -> &[SocketAddr] {
        &self.outbound
    }

    /// The inbound HBONE addresses served now.
    pub fn inbound_addrs(&self) -> BTreeSet<SocketAddr> {
        self.inbound.borrow().clone()
    }

    /// A channel that follows [`NodeProxy::inbound_addrs`].
    pub fn watch_inbound(&self) -> watch::Receiver<BTreeSet<SocketAddr>> {
        self.inbound.clone()
    }

    /// Replaces the inbound policy. New CONNECTs are decided by it, and open inbound tunnels
    /// whose peer it no longer admits are closed.
    pub fn set_policy(&self, policy: InboundPolicy) {
        self.policy.send_replace(policy);
    }

    /// Tunnels accepted so far, per verified peer identity and target address: which
    /// identities this node admitted to which workloads.
    pub fn accepted_tunnels(&self) -> BTreeMap<(SpiffeId, SocketAddr), u64> {
        self.state
            .accepted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The node proxy's [`Telemetry`]: readiness, metrics, config dump.
    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// Drains the node proxy, as ztunnel does on SIGTERM: readiness turns 503 at once; the
    /// outbound listeners stop accepting, and so do the inbound HBONE listeners, which send
    /// GOAWAY on every connection; open connections (both directions) may finish until
    /// `deadline`; then what is left is reset (access-logged with flag `LR`) and the node
    /// proxy stops.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops the node proxy at once, as dropping it would.
    pub async fn drain(mut self, deadline: Duration) -> Drained {
        self.telemetry.readiness().start_draining();
        tracing::info!(deadline = ?deadline, open = self.telemetry.tunnels_open(), "draining: no new connections; open ones may finish");
        self.drain.send_replace(true);
        let tasks = &mut self.tasks;
        let finished = tokio::time::timeout(deadline, async {
            for task in tasks.iter_mut() {
                task.join().await;
            }
        })
        .await
        .is_ok();
        let reset = if finished {
            0
        } else {
            self.telemetry.mark_deadline_passed();
            let reset = self.telemetry.tunnels_open();
            tracing::info!(
                reset,
                "drain deadline passed; resetting the connections left"
            );
            reset
        };
        drop(self);
        Drained { reset }
    }

    /// Stops the node proxy (the same as dropping it).
    pub fn shutdown(self) {
        drop(self);
    }
}

impl Drop for NodeProxy {
    fn drop(&mut self) {
        self.telemetry.detach(self.live);
    }
}
