//! Outbound: plain TCP from local workloads, tunnelled over HBONE to a service's endpoints.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use meshkit_hbone::{Client, Target, copy_bidirectional};
use meshkit_identity::ErrorChain;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use meshkit_mesh::MeshIndex;

/// A local listener that stands for one service port: what a client connects to instead of
/// the service's address, since loopback offers no traffic redirection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboundListener {
    /// Where the node proxy listens (usually the node's IP and the service port). Port 0
    /// picks a free port; see [`NodeProxy::outbound_addrs`](super::NodeProxy::outbound_addrs).
    pub listen: SocketAddr,
    /// Host name of the service, as in [`MeshService::hostname`](meshkit_mesh::MeshService::hostname).
    pub service: String,
    /// The service port to reach.
    pub port: u16,
}

impl OutboundListener {
    /// A listener on `listen` for port `port` of service `service`.
    pub fn new(listen: SocketAddr, service: impl Into<String>, port: u16) -> Self {
        Self {
            listen,
            service: service.into(),
            port,
        }
    }
}

/// Accepts connections for one outbound listener until the task is dropped.
pub(super) async fn serve(
    listener: TcpListener,
    rule: OutboundListener,
    node: String,
    index: watch::Receiver<Arc<MeshIndex>>,
    client: Client,
) {
    let next = Arc::new(AtomicUsize::new(0));
    // Owned here so that dropping the listener task drops its tunnels too.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let (sock, source) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(listen = %rule.listen, error = %e, "outbound accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        let targets = targets(&index.borrow(), &rule, &node, source, &next);
        let client = client.clone();
        let service = rule.service.clone();
        connections.spawn(async move {
            match targets {
                Ok(targets) => tunnel(sock, source, &service, targets, client).await,
                Err(reason) => {
                    tracing::info!(%source, %service, reason, "outbound refused; resetting the connection");
                    // As when no endpoint answers: a reset, never an empty answer that ends
                    // like a complete one.
                    let _ = sock.set_zero_linger();
                }
            }
        });
    }
}

/// The targets to try, in order: every endpoint, starting at the next one in turn.
fn targets(
    index: &MeshIndex,
    rule: &OutboundListener,
    node: &str,
    source: SocketAddr,
    next: &AtomicUsize,
) -> Result<Vec<Target>, &'static str> {
    // The source address names the local workload whose identity the tunnel presents.
    let (workload, local_id) = index
        .workload(source.ip())
        .ok_or("source is not a known workload")?;
    if workload.node != node {
        return Err("source is not a workload of this node");
    }
    let service = index
        .service_by_host(&rule.service)
        .ok_or("unknown service")?;
    let port = service
        .port(Some(rule.port), None)
        .ok_or("service has no such port")?;
    let endpoints = index.endpoints(service, port);
    if endpoints.is_empty() {
        return Err("service has no endpoints");
    }
    let start = next.fetch_add(1, Ordering::Relaxed);
    Ok((0..endpoints.len())
        .filter_map(|i| endpoints.get(start.wrapping_add(i) % endpoints.len()))
        .map(|ep| {
            Target::new(ep.hbone, ep.address, local_id.clone(), ep.identity.clone())
                .forwarded_for(source)
        })
        .collect())
}

async fn tunnel(
    sock: TcpStream,
    source: SocketAddr,
    service: &str,
    targets: Vec<Target>,
    client: Client,
) {
    for target in targets {
        match client.open(target.clone()).await {
            Ok(tunnel) => {
                tracing::debug!(%source, %service, destination = %target.destination, "outbound tunnel");
                match copy_bidirectional(tunnel, sock).await {
                    Ok(copied) => {
                        tracing::debug!(%source, sent = copied.to_tunnel, received = copied.from_tunnel, "outbound tunnel closed")
                    }
                    Err(e) => {
                        tracing::debug!(%source, error = %ErrorChain(&e), "outbound tunnel reset")
                    }
                }
                return;
            }
            Err(e) => {
                tracing::info!(%source, %service, destination = %target.destination, error = %e, "endpoint unreachable; trying the next");
            }
        }
    }
    tracing::warn!(%source, %service, "no endpoint reachable; resetting the connection");
    // A reset, not a FIN: the application must not read an empty answer as a complete one.
    let _ = sock.set_zero_linger();
}
