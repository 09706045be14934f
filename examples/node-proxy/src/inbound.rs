//! Inbound: HBONE from other nodes (and the gateway) to the workloads of this node.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use http::StatusCode;
use meshkit_hbone::{ConnectRequest, Decision, Forward, Reason, Server, ServerConfig, decide_fn};
use meshkit_identity::{
    Authorize, ByDestinationIp, CaError, SpiffeId, SpiffeVerifier, SvidCache, TlsSettings,
    TrustBundleSet, X509Svid,
};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

use super::AbortOnDrop;
use meshkit_mesh::MeshIndex;

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
        !self.deny.contains(peer) && self.allow.as_ref().is_none_or(|allow| allow.contains(peer))
    }
}

/// What the inbound side decides with: the mesh now, and the policy now.
#[derive(Debug)]
pub(super) struct InboundState {
    pub(super) node: String,
    pub(super) index: watch::Receiver<Arc<MeshIndex>>,
    pub(super) policy: Arc<watch::Sender<InboundPolicy>>,
    pub(super) forward: Forward,
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
}

/// Decides one CONNECT: the peer is admitted, the target is not one of the node proxy's own
/// listeners, it is a workload of this node, it is the workload whose certificate the peer
/// verified (the destination IP of the connection), and the port is one the workload serves
/// ([`Workload::serves_port`](meshkit_mesh::Workload::serves_port)). Anything else is 403.
/// An accepted tunnel lives as long as the policy admits its peer: a policy change that
/// refuses the peer closes it.
pub(super) async fn decide(state: &InboundState, req: ConnectRequest) -> Decision {
    let mut policy = state.policy.subscribe();
    if !policy.borrow_and_update().admits(&req.peer) {
        tracing::info!(peer = %req.peer, target = %req.target, "inbound refused by policy");
        return Decision::refuse(StatusCode::FORBIDDEN);
    }
    if state.is_own_listener(req.target) {
        tracing::info!(peer = %req.peer, target = %req.target, "inbound target is one of the node proxy's own listeners");
        return Decision::refuse(StatusCode::FORBIDDEN);
    }
    let local = {
        let index = state.index.borrow();
        index.workload(req.target.ip()).is_some_and(|(w, _)| {
            w.node == state.node
                && req.target.ip() == req.destination.ip()
                && w.serves_port(req.target.port())
        })
    };
    if !local {
        tracing::info!(peer = %req.peer, target = %req.target, "inbound target is not a local workload");
        return Decision::refuse(StatusCode::FORBIDDEN);
    }
    tracing::debug!(peer = %req.peer, source = %req.source, target = %req.target, "inbound tunnel");
    let (peer, target) = (req.peer.clone(), req.target);
    match state.forward.decide(req).await {
        Decision::Accept(handler) => {
            *state
                .accepted
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry((peer.clone(), target))
                .or_default() += 1;
            Decision::accept(move |tunnel| async move {
                // A tunnel cut by the policy is reset with CONNECT_ERROR, not CANCEL, so that
                // the peer reads an error rather than a clean end of the data. The reason is
                // set before the handler (and with it the tunnel) is dropped.
                let reset = tunnel.reset_reason();
                let revoked = async {
                    refused(&mut policy, &peer).await;
                    reset.set(Reason::CONNECT_ERROR);
                };
                tokio::select! {
                    () = handler.run(tunnel) => {}
                    () = revoked => {
                        tracing::info!(%peer, %target, "closing inbound tunnel: the policy no longer admits its peer");
                    }
                }
            })
        }
        other => other,
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
    pub(super) serving: HashMap<IpAddr, (SpiffeId, AbortOnDrop)>,
    /// Workloads whose certificate is being fetched, with the task fetching it.
    pub(super) pending: HashMap<IpAddr, (SpiffeId, AbortOnDrop)>,
    pub(super) fetched: mpsc::UnboundedSender<Fetched>,
    pub(super) published: watch::Sender<BTreeSet<SocketAddr>>,
}

impl Inbound {
    /// Brings the listeners in line with the workloads of this node in `index`, at once:
    /// stops serving the workloads that left, and starts fetching the certificates of new ones
    /// (served when [`Inbound::fetched`] gets them).
    pub(super) fn reconcile(&mut self, index: &MeshIndex) {
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
            if let Some((id, _task)) = self.serving.remove(&ip) {
                tracing::info!(%ip, %id, "stopped serving inbound");
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
        for (ip, id) in wanted {
            if !self.serving.contains_key(&ip) && !self.pending.contains_key(&ip) {
                self.fetch(ip, id);
            }
        }
        self.publish();
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
        self.pending
            .insert(ip, (id, AbortOnDrop(task.abort_handle())));
    }

    fn publish(&self) {
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
    ) -> Result<AbortOnDrop, Box<dyn std::error::Error + Send + Sync>> {
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
        let task = tokio::spawn(async move {
            if let Err(e) = server.serve(listener).await {
                tracing::warn!(%ip, error = %e, "inbound listener failed");
            }
        });
        Ok(AbortOnDrop(task.abort_handle()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(sa: &str) -> SpiffeId {
        format!("spiffe://cluster.local/ns/shop/sa/{sa}")
            .parse()
            .expect("id")
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
