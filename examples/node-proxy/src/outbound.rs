//! Outbound: plain TCP from local workloads, tunnelled over HBONE to a service's endpoints.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use meshkit_hbone::{Client, Side, Target, copy_bidirectional};
use meshkit_identity::ErrorChain;
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tracing::Instrument;

use crate::telemetry::{
    Bytes, ConnRecord, Direction, FLAG_CONNECT, FLAG_DENY, FLAG_NO_HEALTHY_UPSTREAM, FLAG_NO_ROUTE,
    FLAG_NONE, MeshView, OpenConnection, PeerLabels, ServiceLabels, Telemetry,
};
use crate::trace;

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

/// What one outbound listener's task works with.
pub(super) struct Outbound {
    pub(super) rule: OutboundListener,
    pub(super) node: String,
    pub(super) view: watch::Receiver<Arc<MeshView>>,
    pub(super) client: Client,
    pub(super) telemetry: Telemetry,
    /// Turns true when the node proxy drains: stop accepting, let the connections finish.
    pub(super) drain: watch::Receiver<bool>,
    /// Tunnels leave from the source workload's address
    /// ([`NodeProxyConfig::preserve_source_address`](crate::NodeProxyConfig::preserve_source_address)).
    pub(super) preserve_source_address: bool,
}

/// What an accepted connection will try, decided when it is accepted.
struct Plan {
    source: Arc<PeerLabels>,
    service: Arc<ServiceLabels>,
    /// The endpoints to try, in order, with their workload labels.
    targets: Vec<(Target, Arc<PeerLabels>)>,
}

/// Why an accepted connection is refused, with what is known of it.
struct Refusal {
    reason: &'static str,
    flag: &'static str,
    source: Arc<PeerLabels>,
    service: Arc<ServiceLabels>,
}

/// Accepts connections for one outbound listener until the node proxy drains (then waits for
/// the open connections to end) or the task is dropped (which drops them).
pub(super) async fn serve(listener: TcpListener, ctx: Outbound) {
    let next = Arc::new(AtomicUsize::new(0));
    let drain = ctx.drain.clone();
    crate::accept::until_drained(listener, drain, "outbound", |sock, source, _open| {
        let _ = sock.set_nodelay(true);
        // No HTTP at L4, so no trace to continue: each connection starts one.
        let (traceparent, trace_id) = trace::start();
        let plan = plan(
            &ctx.view.borrow(),
            &ctx.rule,
            &ctx.node,
            source,
            &next,
            &traceparent,
            ctx.preserve_source_address,
        );
        let span = tracing::info_span!(
            "outbound",
            src = %source,
            service = %ctx.rule.service,
            trace_id = %trace_id,
            dst = tracing::field::Empty,
            dst_identity = tracing::field::Empty,
        );
        let mut record = ConnRecord::new(Direction::Outbound, source);
        record.trace_id = Some(trace_id);
        let (client, telemetry) = (ctx.client.clone(), ctx.telemetry.clone());
        Some(connection(sock, record, plan, client, telemetry).instrument(span))
    })
    .await;
}

/// The plan for a connection from `source`: every endpoint, starting at the next one in turn.
fn plan(
    view: &MeshView,
    rule: &OutboundListener,
    node: &str,
    source: SocketAddr,
    next: &AtomicUsize,
    traceparent: &str,
    preserve_source_address: bool,
) -> Result<Plan, Refusal> {
    let service = view
        .service_labels(&rule.service)
        .cloned()
        .unwrap_or_else(|| ServiceLabels::host_only(&rule.service));
    let refuse = |reason, flag, source| Refusal {
        reason,
        flag,
        source,
        service: service.clone(),
    };
    // The source address names the local workload whose identity the tunnel presents.
    let Some((workload, local_id)) = view.workload(source.ip()) else {
        return Err(refuse(
            "source is not a known workload",
            FLAG_NO_ROUTE,
            PeerLabels::unknown(),
        ));
    };
    let source_labels = view
        .peer(source.ip())
        .cloned()
        .unwrap_or_else(|| Arc::new(PeerLabels::of_workload(workload, local_id)));
    if workload.node != node {
        return Err(refuse(
            "source is not a workload of this node",
            FLAG_NO_ROUTE,
            source_labels,
        ));
    }
    let Some(mesh_service) = view.service_by_host(&rule.service) else {
        return Err(refuse("unknown service", FLAG_NO_ROUTE, source_labels));
    };
    let Some(port) = mesh_service.port(Some(rule.port), None) else {
        return Err(refuse(
            "service has no such port",
            FLAG_NO_ROUTE,
            source_labels,
        ));
    };
    let endpoints = view.endpoints(mesh_service, port);
    if endpoints.is_empty() {
        return Err(refuse(
            "service has no endpoints",
            FLAG_NO_HEALTHY_UPSTREAM,
            source_labels,
        ));
    }
    let baggage = crate::baggage::of(&source_labels);
    let start = next.fetch_add(1, Ordering::Relaxed);
    let targets = (0..endpoints.len())
        .filter_map(|i| endpoints.get(start.wrapping_add(i) % endpoints.len()))
        .map(|ep| {
            let target = Target::new(ep.hbone, ep.address, local_id.clone(), ep.identity.clone())
                .forwarded_for(source);
            let target = if preserve_source_address {
                target.from_source(source.ip())
            } else {
                target
            };
            // A traceparent of our own making is always a valid header value.
            let target = target.clone().traceparent(traceparent).unwrap_or(target);
            let target = match &baggage {
                Some(b) => target.clone().baggage(b).unwrap_or(target),
                None => target,
            };
            let labels = view
                .peer(ep.address.ip())
                .cloned()
                .unwrap_or_else(PeerLabels::unknown);
            (target, labels)
        })
        .collect();
    Ok(Plan {
        source: source_labels,
        service,
        targets,
    })
}

async fn connection(
    sock: TcpStream,
    mut record: ConnRecord,
    plan: Result<Plan, Refusal>,
    client: Client,
    telemetry: Telemetry,
) {
    let source = record.source_addr;
    let plan = match plan {
        Ok(plan) => plan,
        Err(refusal) => {
            tracing::info!(%source, service = %refusal.service.host, reason = refusal.reason, "outbound refused; resetting the connection");
            record.source = refusal.source;
            record.service = refusal.service;
            telemetry.refused(record, refusal.flag);
            // As when no endpoint answers: a reset, never an empty answer that ends like a
            // complete one.
            let _ = sock.set_zero_linger();
            return;
        }
    };
    record.source = plan.source;
    record.service = plan.service;
    let service = record.service.host.clone();
    for (target, labels) in plan.targets {
        record.destination_addr = Some(target.destination);
        record.destination = labels;
        let destination = target.destination;
        match client.open(target).await {
            Ok(tunnel) => {
                let span = tracing::Span::current();
                span.record("dst", tracing::field::display(destination));
                span.record(
                    "dst_identity",
                    tracing::field::display(&record.destination.principal),
                );
                tracing::debug!(%source, %service, %destination, "outbound tunnel");
                let open = telemetry.open(record);
                match copy_bidirectional(tunnel, sock).await {
                    Ok(copied) => {
                        tracing::debug!(%source, sent = copied.to_tunnel, received = copied.from_tunnel, "outbound tunnel closed");
                        open.finish(bytes(copied), FLAG_NONE);
                    }
                    Err(e) => {
                        tracing::debug!(%source, error = %ErrorChain(&e), "outbound tunnel reset");
                        // Downstream, for the source's node proxy, is the application.
                        let flag = OpenConnection::failure_flag(e.side(), Side::Socket);
                        open.finish(bytes(e.copied()), flag);
                    }
                }
                return;
            }
            Err(e) if e.status() == Some(http::StatusCode::UNAUTHORIZED) => {
                // The mesh's authorization policies refused this source at the destination: a
                // decision about the caller, not a failed endpoint, so no other endpoint is
                // tried for it. (A 403 is about the endpoint: not a local workload, a port it
                // does not serve, a node-local policy; the next endpoint may take it.)
                tracing::info!(%source, %service, %destination, error = %e, "the destination refused the tunnel; resetting the connection");
                telemetry.refused(record, FLAG_DENY);
                let _ = sock.set_zero_linger();
                return;
            }
            Err(e) => {
                tracing::info!(%source, %service, %destination, error = %e, "endpoint unreachable; trying the next");
            }
        }
    }
    tracing::warn!(%source, %service, "no endpoint reachable; resetting the connection");
    telemetry.refused(record, FLAG_CONNECT);
    // A reset, not a FIN: the application must not read an empty answer as a complete one.
    let _ = sock.set_zero_linger();
}

/// Istio's bytes of an outbound copy: received from the application, sent back to it.
fn bytes(copied: meshkit_hbone::Copied) -> Bytes {
    Bytes {
        received: copied.to_tunnel,
        sent: copied.from_tunnel,
    }
}
