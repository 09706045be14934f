//! Inbound: HBONE from other nodes (and the gateway) to the workloads of this node.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use meshkit_hbone::{
    ConnectRequest, Decision, Reason, Server, ServerConfig, Side, copy_bidirectional, decide_fn,
};
use meshkit_identity::{
    Authorize, ByDestinationIp, CaError, SpiffeId, SpiffeVerifier, SvidCache, TlsSettings,
    TrustBundleSet, X509Svid,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

use super::AbortOnDrop;
use crate::telemetry::{
    Bytes, ConnRecord, Direction, FLAG_CONNECT, FLAG_DENY, FLAG_NONE, MeshView, OpenConnection,
    PeerLabels, Servers, Telemetry,
};
use crate::trace;

/// How long an inbound HBONE server may drain once told to: longer than any drain deadline,
/// since [`NodeProxy::drain`](crate::NodeProxy::drain) enforces its own and then drops the
/// servers.
const SERVER_DRAIN_BOUND: Duration = Duration::from_secs(24 * 60 * 60);

/// Which verified peers may open tunnels to this node's workloads.
///
/// Every peer must first present a certificate of the node's trust domain (checked in the TLS
/// handshake). Then `deny` refuses listed identities and, when `allow` is set, only listed
/// identities are admitted; refused CONNECTs get 403.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InboundPolicy {
    /// When set, only these identities are admitted.
    pub allow: Option<BTreeSet<SpiffeId>>,
    /// These identities are always refused.
    pub deny: BTreeSet<SpiffeId>,
}

impl InboundPolicy {
    /// Admits any identity of the trust domain (the default).
    pub fn any() -> Self {
        Self::default()
    }

    /// Also refuses `id`.
    pub fn deny(mut self, id: SpiffeId) -> Self {
        self.deny.insert(id);
        self
    }

    /// Also admits `id`, and from now on only the admitted identities.
    pub fn allow(mut self, id: SpiffeId) -> Self {
        self.allow.get_or_insert_with(BTreeSet::new).insert(id);
        self
    }

    /// Whether `peer` may open tunnels.
    pub fn admits(&self, peer: &SpiffeId) -> bool {
        self.refusal(peer).is_none()
    }

    /// Why `peer` may not open tunnels (the `reason` of the denials metric), if it may not.
    fn refusal(&self, peer: &SpiffeId) -> Option<&'static str> {
        if self.deny.contains(peer) {
            Some("denied_identity")
        } else if self
            .allow
            .as_ref()
            .is_some_and(|allow| !allow.contains(peer))
        {
            Some("not_allowed_identity")
        } else {
            None
        }
    }
}

/// What the inbound side decides with: the mesh now, and the policy now.
#[derive(Debug)]
pub(super) struct InboundState {
    pub(super) node: String,
    pub(super) index: watch::Receiver<Arc<MeshView>>,
    pub(super) policy: Arc<watch::Sender<InboundPolicy>>,
    /// Time allowed to connect to a CONNECT's target (504 when it passes).
    pub(super) connect_timeout: Duration,
    pub(super) telemetry: Telemetry,
    /// Accepted tunnels per (verified peer, target).
    pub(super) accepted: Mutex<BTreeMap<(SpiffeId, SocketAddr), u64>>,
    /// The inbound HBONE port, bound on every local workload address.
    pub(super) hbone_port: u16,
    /// The other addresses this process listens on (outbound listeners as bound, reserved
    /// addresses): never a tunnel's target.
    pub(super) own: Vec<SocketAddr>,
}

impl InboundState {
    /// Whether forwarding to `target` would reach one of this node proxy's own listeners: the
    /// HBONE port on any address (every local workload address has one), or a listener bound
    /// to `target`'s IP or to a wildcard address with `target`'s port.
    pub(super) fn is_own_listener(&self, target: SocketAddr) -> bool {
        target.port() == self.hbone_port
            || self.own.iter().any(|own| {
                own.port() == target.port()
                    && (own.ip() == target.ip() || own.ip().is_unspecified())
            })
    }

    /// Connects to the workload at `target`, within the connect timeout: the socket, or the
    /// status that says why not (503 refused, 504 timed out), logged.
    pub(super) async fn dial(&self, target: SocketAddr) -> Result<TcpStream, StatusCode> {
        match tokio::time::timeout(self.connect_timeout, TcpStream::connect(target)).await {
            Ok(Ok(sock)) => {
                let _ = sock.set_nodelay(true);
                Ok(sock)
            }
            Ok(Err(e)) => {
                tracing::info!(%target, error = %e, "inbound target unreachable");
                Err(StatusCode::SERVICE_UNAVAILABLE)
            }
            Err(_) => {
                tracing::info!(%target, "inbound target connect timed out");
                Err(StatusCode::GATEWAY_TIMEOUT)
            }
        }
    }

    /// Why nothing may be forwarded to `target`, if so: one of the node proxy's own
    /// listeners, not a workload of this node, or a port the workload does not serve.
    pub(super) fn refusal(&self, target: SocketAddr) -> Option<&'static str> {
        if self.is_own_listener(target) {
            return Some("own_listener");
        }
        match self.index.borrow().workload(target.ip()) {
            Some((w, _)) if w.node == self.node => {
                (!w.serves_port(target.port())).then_some("port_not_served")
            }
            _ => Some("not_local_workload"),
        }
    }
}

/// Decides one CONNECT:
///
/// - the `:authority` IP is the destination IP the connection arrived on (the workload whose
///   certificate the peer verified); 400 otherwise, as ztunnel answers;
/// - the local [`InboundPolicy`] admits the peer, the target is not one of the node proxy's
///   own listeners, it is a workload of this node, and the port is one the workload serves
///   ([`Workload::serves_port`](meshkit_mesh::Workload::serves_port)); 403 otherwise;
/// - the mesh's authorization policies allow the connection
///   ([`MeshIndex::authorize`](meshkit_mesh::MeshIndex::authorize), ztunnel's rules); 401
///   otherwise. What the dry-run policies would have decided is logged.
///
/// Then the target is dialled (503 when it refuses, 504 when the connect timeout passes) and
/// the bytes copied both ways. An accepted tunnel lives as long as both policies admit it: a
/// change of either that refuses it closes it.
///
/// Everything runs in a span per tunnel, with the `traceparent` the CONNECT carried.
pub(super) async fn decide(state: &InboundState, req: ConnectRequest) -> Decision {
    let traceparent = req
        .headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() <= 512);
    let trace_id = traceparent.and_then(trace::trace_id);
    let span = tracing::info_span!(
        "inbound",
        peer = %req.peer,
        src = %req.source,
        target = %req.target,
        traceparent = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    if let Some(traceparent) = traceparent {
        span.record("traceparent", tracing::field::display(traceparent));
    }
    if let Some(id) = trace_id {
        span.record("trace_id", tracing::field::display(id));
    }
    let mut record = record(
        &state.index.borrow(),
        &req.peer,
        req.source,
        req.target,
        &req.headers,
    );
    record.trace_id = trace_id.map(str::to_owned);
    record.baggage = crate::baggage::read(req.headers.get("baggage"));
    decide_in(state, req, record, span.clone())
        .instrument(span)
        .await
}

/// The record of an inbound connection: the original client (from `Forwarded`) when the
/// workload at its address has the peer's verified identity, else the HBONE peer's address,
/// and the labels of both ends.
fn record(
    view: &MeshView,
    peer: &SpiffeId,
    peer_addr: SocketAddr,
    target: SocketAddr,
    headers: &http::HeaderMap,
) -> ConnRecord {
    let forwarded = headers
        .get(http::header::FORWARDED)
        .and_then(|v| v.to_str().ok())
        .and_then(forwarded_for);
    let verified = |addr: SocketAddr| {
        view.peer(addr.ip())
            .filter(|p| p.principal == peer.as_str())
            .cloned()
    };
    let (source_addr, source) = match forwarded.and_then(|a| Some((a, verified(a)?))) {
        Some((addr, labels)) => (addr, labels),
        // An address the peer names but does not hold is not taken: it would otherwise pick
        // the IP blocks that authorization policies match against.
        None => {
            let labels =
                verified(peer_addr).unwrap_or_else(|| Arc::new(PeerLabels::of_identity(peer)));
            (peer_addr, labels)
        }
    };
    let mut record = ConnRecord::new(Direction::Inbound, source_addr);
    record.source = source;
    record.set_destination(view, target);
    record
}

/// The address in a `Forwarded: for="ADDR"` header (the form the node proxies send).
fn forwarded_for(value: &str) -> Option<SocketAddr> {
    value.split([';', ',']).find_map(|pair| {
        let (key, v) = pair.trim().split_once('=')?;
        if !key.eq_ignore_ascii_case("for") {
            return None;
        }
        v.trim_matches('"').parse().ok()
    })
}

async fn decide_in(
    state: &InboundState,
    req: ConnectRequest,
    record: ConnRecord,
    span: tracing::Span,
) -> Decision {
    let telemetry = &state.telemetry;
    let deny = |reason: &'static str, record: ConnRecord| {
        telemetry.denied(reason);
        telemetry.refused(record, FLAG_DENY);
        Decision::refuse(StatusCode::FORBIDDEN)
    };
    if req.target.ip() != req.destination.ip() {
        tracing::info!(peer = %req.peer, target = %req.target, destination = %req.destination, "inbound CONNECT names another address than the one it arrived on");
        telemetry.denied("wrong_destination");
        telemetry.refused(record, FLAG_DENY);
        return Decision::refuse(StatusCode::BAD_REQUEST);
    }
    let mut policy = state.policy.subscribe();
    let refusal = policy.borrow_and_update().refusal(&req.peer);
    if let Some(reason) = refusal {
        tracing::info!(peer = %req.peer, target = %req.target, "inbound refused by policy");
        return deny(reason, record);
    }
    if let Some(reason) = state.refusal(req.target) {
        tracing::info!(peer = %req.peer, target = %req.target, reason, "inbound target refused");
        return deny(reason, record);
    }
    let facts = Facts {
        source: record.source_addr,
        target: req.target,
        peer: Some(req.peer.clone()),
        node: state.node.clone(),
    };
    let mut mesh = state.index.clone();
    if let Some(denial) = facts.denial(&mesh.borrow_and_update()) {
        tracing::info!(peer = %req.peer, source = %facts.source, target = %req.target, %denial, "inbound denied by authorization policy");
        telemetry.denied("authorization_policy");
        telemetry.refused(record, FLAG_DENY);
        return Decision::refuse(StatusCode::UNAUTHORIZED);
    }
    tracing::debug!(peer = %req.peer, source = %req.source, target = %req.target, "inbound tunnel");
    let (peer, target) = (req.peer.clone(), req.target);
    let upstream = match state.dial(target).await {
        Ok(sock) => sock,
        Err(status) => {
            telemetry.refused(record, FLAG_CONNECT);
            return Decision::refuse(status);
        }
    };
    *state
        .accepted
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry((peer.clone(), target))
        .or_default() += 1;
    let open = telemetry.open(record);
    let telemetry = telemetry.clone();
    Decision::accept(move |tunnel| {
        async move {
            // A tunnel cut by the policy is reset with CONNECT_ERROR, not CANCEL, so that the
            // peer reads an error rather than a clean end of the data. The reason is set
            // before the copy (and with it the tunnel) is dropped.
            let reset = tunnel.reset_reason();
            let revoked = async {
                tokio::select! {
                    () = refused(&mut policy, &peer) => {}
                    () = facts.revoked(&mut mesh) => {}
                }
                reset.set(Reason::CONNECT_ERROR);
            };
            tokio::select! {
                copied = copy_bidirectional(tunnel, upstream) => match copied {
                    Ok(copied) => {
                        tracing::debug!(%peer, %target, sent = copied.to_tunnel, received = copied.from_tunnel, "inbound tunnel closed");
                        open.finish(bytes(copied), FLAG_NONE);
                    }
                    Err(e) => {
                        tracing::debug!(%target, error = %meshkit_identity::ErrorChain(&e), "inbound tunnel reset");
                        // Downstream, for the destination's node proxy, is the tunnel.
                        let flag = OpenConnection::failure_flag(e.side(), Side::Tunnel);
                        open.finish(bytes(e.copied()), flag);
                    }
                },
                () = revoked => {
                    tracing::info!(%peer, %target, "closing inbound tunnel: the mesh or a policy no longer admits it");
                    telemetry.denied("policy_changed");
                    // The copy is dropped with its counts: the bytes are not known.
                    open.finish(Bytes::default(), FLAG_DENY);
                }
            }
        }
        .instrument(span)
    })
}

/// Istio's bytes of an inbound copy: received from the tunnel, sent back into it.
fn bytes(copied: meshkit_hbone::Copied) -> Bytes {
    Bytes {
        received: copied.from_tunnel,
        sent: copied.to_tunnel,
    }
}

/// What the mesh decides a connection by, at its start and at every change while it is open.
pub(super) struct Facts {
    /// The client: for a tunnel, the original one the CONNECT names when verified, else the
    /// HBONE peer; for plaintext, the connection's source.
    pub(super) source: SocketAddr,
    pub(super) target: SocketAddr,
    /// The verified peer; `None` for plaintext.
    pub(super) peer: Option<SpiffeId>,
    /// This node: the destination workload must run on it.
    pub(super) node: String,
}

impl Facts {
    /// Why the mesh no longer admits the connection, if it does not: its destination workload
    /// is gone, runs on another node, or no longer serves the port; or the mesh's policies
    /// deny it (the deciding policy). The first three are refused before this is asked at the
    /// start ([`InboundState::refusal`], with reasons of their own), so that a change that
    /// would have refused a connection also ends it once it is open. Logs what the dry-run
    /// policies would decide.
    pub(super) fn denial(&self, view: &MeshView) -> Option<String> {
        let Some((workload, _)) = view.workload(self.target.ip()) else {
            return Some("the destination workload is no longer in the mesh".to_owned());
        };
        if workload.node != self.node {
            return Some(format!(
                "the destination workload moved to node {:?}",
                workload.node
            ));
        }
        if !workload.serves_port(self.target.port()) {
            return Some(format!(
                "the destination workload no longer serves port {}",
                self.target.port()
            ));
        }
        let conn = meshkit_mesh::authz::Connection {
            source: self.source,
            destination: self.target,
            identity: self.peer.as_ref(),
        };
        let evaluation = view.authorize(workload, &conn);
        if let Some(dry_run) = evaluation.dry_run {
            tracing::info!(
                peer = self.peer.as_ref().map_or("none", SpiffeId::as_str),
                target = %self.target,
                decision = %evaluation.decision,
                dry_run = %dry_run,
                "dry-run authorization policies evaluated",
            );
        }
        (!evaluation.decision.is_allowed()).then(|| evaluation.decision.to_string())
    }

    /// Completes when a mesh update no longer admits the connection ([`Facts::denial`]); never
    /// if the mesh can no longer change.
    pub(super) async fn revoked(&self, mesh: &mut watch::Receiver<Arc<MeshView>>) {
        loop {
            if mesh.changed().await.is_err() {
                return std::future::pending().await;
            }
            let view = mesh.borrow_and_update().clone();
            if let Some(denial) = self.denial(&view) {
                tracing::info!(peer = self.peer.as_ref().map_or("none", SpiffeId::as_str), target = %self.target, %denial, "a mesh change no longer admits an open connection");
                return;
            }
        }
    }
}

/// Completes when the policy seen through `policy` stops admitting `peer`; never if the
/// policy can no longer change.
async fn refused(policy: &mut watch::Receiver<InboundPolicy>, peer: &SpiffeId) {
    loop {
        if !policy.borrow_and_update().admits(peer) {
            return;
        }
        if policy.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// A certificate fetched in the background for a workload to serve.
pub(super) struct Fetched {
    ip: IpAddr,
    id: SpiffeId,
    result: Result<watch::Receiver<Arc<X509Svid>>, CaError>,
}

/// The HBONE listeners of this node, one per local workload address, sharing one certificate
/// selector keyed by destination IP.
///
/// Reconciling never waits for the CA: a workload to serve first gets its certificate in a
/// task of its own, which reports on `fetched`; the listener is opened when it arrives
/// ([`Inbound::fetched`]). A slow or silent CA so delays only the new workloads, never the
/// removal of old ones or the mesh the rest of the proxy sees.
pub(super) struct Inbound {
    pub(super) trust_domain: meshkit_identity::TrustDomain,
    pub(super) port: u16,
    pub(super) server: ServerConfig,
    /// Crypto provider and ALPN of the listeners' TLS configs.
    pub(super) tls: TlsSettings,
    pub(super) certs: SvidCache,
    pub(super) bundles: Arc<TrustBundleSet>,
    pub(super) selector: Arc<ByDestinationIp>,
    pub(super) state: Arc<InboundState>,
    pub(super) serving: HashMap<IpAddr, (SpiffeId, Served)>,
    /// Workloads whose certificate is being fetched, with the task fetching it.
    pub(super) pending: HashMap<IpAddr, (SpiffeId, AbortOnDrop)>,
    pub(super) fetched: mpsc::UnboundedSender<Fetched>,
    pub(super) published: watch::Sender<BTreeSet<SocketAddr>>,
    /// The local workloads of the last reconcile.
    pub(super) wanted: HashMap<IpAddr, SpiffeId>,
    /// The local workloads whose certificate has arrived (served, or waiting for a retry of
    /// their listener).
    pub(super) certified: HashSet<IpAddr>,
    /// The statistics of the HBONE server of each workload served.
    pub(super) servers: Servers,
    /// Turns true when the node proxy drains: each server stops accepting and sends GOAWAY.
    pub(super) drain: watch::Receiver<bool>,
}

impl Inbound {
    /// Brings the listeners in line with the workloads of this node in `index`, at once:
    /// stops serving the workloads that left, and starts fetching the certificates of new ones
    /// (served when [`Inbound::fetched`] gets them).
    pub(super) fn reconcile(&mut self, index: &MeshView) {
        let wanted: HashMap<IpAddr, SpiffeId> = index
            .workloads_on(&self.state.node)
            .map(|(w, id)| (w.ip, id.clone()))
            .collect();
        let mut dropped = Vec::new();
        let gone: Vec<IpAddr> = self
            .serving
            .iter()
            .filter(|(ip, (id, _))| wanted.get(ip) != Some(id))
            .map(|(ip, _)| *ip)
            .collect();
        for ip in gone {
            self.selector.remove(&ip);
            lock(&self.servers).remove(&ip);
            if let Some((id, served)) = self.serving.remove(&ip) {
                tracing::info!(%ip, %id, "stopped serving inbound");
                served.leave();
                dropped.push(id);
            }
        }
        self.pending.retain(|ip, (id, _task)| {
            let keep = wanted.get(ip) == Some(id);
            if !keep {
                tracing::info!(%ip, %id, "no longer waiting for a certificate: the workload left");
                dropped.push(id.clone());
            }
            keep
        });
        for id in dropped {
            if !wanted.values().any(|w| *w == id) {
                self.certs.forget(&id);
            }
        }
        for (ip, id) in &wanted {
            if !self.serving.contains_key(ip) && !self.pending.contains_key(ip) {
                if self.wanted.get(ip) != Some(id) {
                    self.certified.remove(ip);
                }
                self.fetch(*ip, id.clone());
            }
        }
        self.certified.retain(|ip| wanted.contains_key(ip));
        self.wanted = wanted;
        self.publish();
    }

    /// Tells readiness whether every local workload has its certificate and its listener.
    fn report_readiness(&self) {
        let telemetry = &self.state.telemetry;
        telemetry.set_certificates_ready(self.wanted.keys().all(|ip| self.certified.contains(ip)));
        telemetry.set_listeners_ready(self.wanted.keys().all(|ip| self.serving.contains_key(ip)));
    }

    /// Waits for every HBONE server to finish its drain (each stops accepting and sends GOAWAY
    /// once [`Inbound::drain`] turns true, and ends when its tunnels have).
    pub(super) async fn drained(&mut self) {
        self.pending.clear();
        for (_, served) in self.serving.values_mut() {
            served.task.join().await;
        }
    }

    /// Whether certificates are still being fetched.
    pub(super) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Serves the workload a fetched certificate is for, if it is still wanted. Returns false
    /// when it could not be served (no certificate, address in use): retry later.
    pub(super) fn fetched(&mut self, fetched: Fetched) -> bool {
        let Fetched { ip, id, result } = fetched;
        if self
            .pending
            .get(&ip)
            .is_none_or(|(wanted, _)| *wanted != id)
        {
            // The workload left (or changed identity) while its certificate was on the way.
            return true;
        }
        self.pending.remove(&ip);
        if result.is_ok() {
            self.certified.insert(ip);
        }
        let served = result
            .map_err(Into::into)
            .and_then(|svid| self.serve(ip, svid));
        let ok = match served {
            Ok(task) => {
                tracing::info!(%ip, %id, port = self.port, "serving inbound HBONE");
                self.serving.insert(ip, (id, task));
                true
            }
            Err(e) => {
                tracing::warn!(%ip, %id, error = %meshkit_identity::ErrorChain(&*e), "cannot serve inbound yet");
                false
            }
        };
        self.publish();
        ok
    }

    fn fetch(&mut self, ip: IpAddr, id: SpiffeId) {
        let (certs, report, task_id) = (self.certs.clone(), self.fetched.clone(), id.clone());
        let task = tokio::spawn(async move {
            let result = certs.get(&task_id).await;
            let _ = report.send(Fetched {
                ip,
                id: task_id,
                result,
            });
        });
        self.pending.insert(ip, (id, AbortOnDrop::new(task)));
    }

    fn publish(&self) {
        self.report_readiness();
        let addrs: BTreeSet<SocketAddr> = self
            .serving
            .keys()
            .map(|ip| SocketAddr::new(*ip, self.port))
            .collect();
        self.published.send_if_modified(|current| {
            let changed = *current != addrs;
            *current = addrs;
            changed
        });
    }

    fn serve(
        &self,
        ip: IpAddr,
        svid: watch::Receiver<Arc<X509Svid>>,
    ) -> Result<Served, Box<dyn std::error::Error + Send + Sync>> {
        let verifier = SpiffeVerifier::new(
            self.bundles.clone(),
            Authorize::TrustDomain(self.trust_domain.clone()),
        );
        let tls = self.tls.server_config(svid, verifier)?;
        // Bound without waiting (std sets SO_REUSEADDR on Unix as tokio does), so that serving
        // stays a step of the reconcile loop.
        let listener = std::net::TcpListener::bind(SocketAddr::new(ip, self.port))?;
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        self.selector.insert(ip, tls);
        let state = self.state.clone();
        let service = decide_fn(move |req: ConnectRequest| {
            let state = state.clone();
            async move { decide(&state, req).await }
        });
        let server =
            Server::<ByDestinationIp, _>::new(self.server.clone(), self.selector.clone(), service);
        lock(&self.servers).insert(ip, server.stats());
        let mut drain = self.drain.clone();
        let (leave, left) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let shutdown = async move {
                tokio::select! {
                    _ = drain.wait_for(|draining| *draining) => {}
                    _ = left => {}
                }
            };
            if let Err(e) = server
                .serve_with_shutdown(listener, shutdown, SERVER_DRAIN_BOUND)
                .await
            {
                tracing::warn!(%ip, error = %e, "inbound listener failed");
            }
        });
        Ok(Served {
            task: AbortOnDrop::new(task),
            leave,
        })
    }
}

/// How long the HBONE server of a workload that left the node may take to end its
/// connections (GOAWAY, then the tunnels' own ends: the mesh change that removed the workload
/// resets each with CONNECT_ERROR) before they are closed outright.
const LEAVING_GRACE: Duration = Duration::from_secs(2);

/// The HBONE server of one local workload address.
pub(super) struct Served {
    task: AbortOnDrop,
    /// Stops the server: it closes its listener at once and ends its connections.
    leave: tokio::sync::oneshot::Sender<()>,
}

impl Served {
    /// Stops serving a workload that left: the listener closes at once, and the open
    /// connections get [`LEAVING_GRACE`] to end, so that their tunnels' resets reach the peers
    /// before the connections close.
    fn leave(self) {
        let Self { mut task, leave } = self;
        let _ = leave.send(());
        tokio::spawn(async move {
            let _ = tokio::time::timeout(LEAVING_GRACE, task.join()).await;
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(sa: &str) -> SpiffeId {
        format!("spiffe://cluster.local/ns/shop/sa/{sa}")
            .parse()
            .expect("id")
    }

    /// The source that authorization policies see: the `Forwarded` address only when the
    /// workload there has the peer's identity, else the HBONE peer's own address.
    #[test]
    fn a_forwarded_address_counts_only_when_the_peer_holds_it() {
        let mesh: meshkit_mesh::MeshConfig = serde_json::from_value(serde_json::json!({
            "workloads": [
                {"name": "web-1", "namespace": "shop", "service_account": "web",
                 "ip": "127.0.0.11", "node": "a"},
                {"name": "api-1", "namespace": "shop", "service_account": "api",
                 "ip": "127.0.0.13", "node": "b"},
            ]
        }))
        .expect("mesh");
        let td = meshkit_identity::TrustDomain::new("cluster.local").expect("td");
        let view = MeshView::new(&mesh, &td, 15008);
        let peer_addr: SocketAddr = "127.0.0.2:40000".parse().expect("addr");
        let record_for = |forwarded: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(
                http::header::FORWARDED,
                http::HeaderValue::from_str(forwarded).expect("value"),
            );
            let target = "127.0.0.13:9090".parse().expect("addr");
            record(&view, &id("web"), peer_addr, target, &headers)
        };
        // web-1 is the peer's identity: its address is the source.
        let held = record_for("for=\"127.0.0.11:5000\"");
        assert_eq!(held.source_addr, "127.0.0.11:5000".parse().expect("addr"));
        // An address the peer does not hold (another workload's, or none's) is not taken.
        for claimed in ["for=\"127.0.0.13:5000\"", "for=\"10.9.9.9:5000\""] {
            assert_eq!(record_for(claimed).source_addr, peer_addr, "{claimed}");
        }
    }

    #[test]
    fn policy_denies_then_allows() {
        let any = InboundPolicy::any();
        assert!(any.admits(&id("web")));
        let deny = InboundPolicy::any().deny(id("intruder"));
        assert!(deny.admits(&id("web")));
        assert!(!deny.admits(&id("intruder")));
        let allow = InboundPolicy::any()
            .allow(id("gateway"))
            .deny(id("gateway"));
        assert!(!allow.admits(&id("gateway")), "deny wins");
        let allow = InboundPolicy::any().allow(id("gateway"));
        assert!(allow.admits(&id("gateway")));
        assert!(!allow.admits(&id("web")));
    }
}
