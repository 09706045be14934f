//! Inbound plaintext: TCP for a local workload redirected to the node proxy without HBONE,
//! as ztunnel's port 15006 takes it (a netfilter `REDIRECT` of the workload's ports; the
//! redirection itself is the platform's, not the node proxy's).
//!
//! The original destination (`SO_ORIGINAL_DST`) names the workload and port. The connection
//! carries no identity, so the mesh's policies decide it as one without a principal, from the
//! client's address: a STRICT PeerAuthentication, translated to a DENY of connections
//! without a principal, refuses it. An allowed connection is spliced to the workload, each
//! end's FIN passed on, and re-checked when the policies change, as HBONE tunnels are. A
//! refused or failed connection is reset, so that the client never reads a clean end.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use meshkit_hbone::fair::{FairSlots, Refusal, Slot};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tracing::Instrument;

use crate::inbound::{Facts, InboundState};
use crate::telemetry::{
    Bytes, ConnRecord, Direction, FLAG_CONNECT, FLAG_DENY, FLAG_DOWNSTREAM_TERMINATION, FLAG_NONE,
    FLAG_UPSTREAM_TERMINATION,
};

/// The copy buffer of each direction of a connection.
const BUFFER: usize = 16 * 1024;

/// Connections one plaintext listener holds at most (each two sockets and two buffers),
/// shared fairly among sources ([`meshkit_hbone::fair`]): when all are held, a connection from
/// a source holding fewer than the largest holder resets that holder's least recently active
/// connection (`plaintext_evicted`) and takes its place; any other is reset at once
/// (`plaintext_limit`).
pub(crate) const MAX_CONNECTIONS: usize = 4096;

/// Connections one source (an IPv4 address, or an IPv6 /64) holds at most on one plaintext
/// listener; one more is reset at once (`plaintext_source_share`).
pub(crate) const MAX_CONNECTIONS_PER_SOURCE: usize = 1024;

/// Accepts redirected connections on `listener` until the node proxy drains (then waits for
/// the open ones to end) or the task is dropped (which drops them).
pub(super) async fn serve(
    listener: TcpListener,
    state: Arc<InboundState>,
    drain: watch::Receiver<bool>,
) {
    let slots = FairSlots::new(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_SOURCE);
    crate::accept::until_drained(listener, drain, "inbound plaintext", |sock, source, _| {
        // An IPv4 client of a dual-stack listener, as IPv4.
        let source = SocketAddr::new(source.ip().to_canonical(), source.port());
        let slot = match slots.admit(source.ip()) {
            Ok(slot) => slot,
            Err(refusal) => {
                let reason = match refusal {
                    Refusal::SourceShare => "plaintext_source_share",
                    Refusal::Full => "plaintext_limit",
                };
                tracing::warn!(%source, reason, "inbound plaintext connection refused");
                state.telemetry.denied(reason);
                reset(&sock);
                return None;
            }
        };
        let _ = sock.set_nodelay(true);
        let span =
            tracing::info_span!("inbound_plaintext", src = %source, dst = tracing::field::Empty);
        Some(connection(state.clone(), sock, source, slot).instrument(span))
    })
    .await;
}

async fn connection(state: Arc<InboundState>, client: TcpStream, source: SocketAddr, slot: Slot) {
    let telemetry = &state.telemetry;
    let mut record = ConnRecord::new(Direction::Inbound, source);
    record.plaintext = true;
    // Where the client was going; a connection made to the listener itself was not
    // redirected and names no workload.
    // (An IPv4-mapped local address of a dual-stack listener is compared as IPv4.)
    let local = client
        .local_addr()
        .ok()
        .map(|a| SocketAddr::new(a.ip().to_canonical(), a.port()));
    let target = original_destination(&client).filter(|dst| local != Some(*dst));
    let Some(target) = target else {
        tracing::info!("inbound plaintext connection was not redirected: no original destination");
        telemetry.denied("not_redirected");
        telemetry.refused(record, FLAG_DENY);
        reset(&client);
        return;
    };
    tracing::Span::current().record("dst", tracing::field::display(target));
    record.set_destination(&state.index.borrow(), target);
    if let Some(reason) = state.refusal(target) {
        tracing::info!(%target, reason, "inbound plaintext refused");
        telemetry.denied(reason);
        telemetry.refused(record, FLAG_DENY);
        reset(&client);
        return;
    }
    let facts = Facts {
        source,
        target,
        peer: None,
        node: state.node.clone(),
    };
    let mut mesh = state.index.clone();
    if let Some(denial) = facts.denial(&mesh.borrow_and_update()) {
        tracing::info!(%source, %target, %denial, "inbound plaintext denied by authorization policy");
        telemetry.denied("authorization_policy");
        telemetry.refused(record, FLAG_DENY);
        reset(&client);
        return;
    }
    let Ok(upstream) = state.dial(target).await else {
        telemetry.refused(record, FLAG_CONNECT);
        reset(&client);
        return;
    };
    let open = telemetry.open(record);
    // From here, both sockets are reset when dropped, unless the splice ended cleanly: also
    // when the task is cut (the drain's deadline, the node proxy dropped).
    let mut pair = Pair {
        client,
        upstream,
        clean: false,
    };
    let mut copied = Bytes::default();
    let outcome = tokio::select! {
        spliced = splice(&mut pair.client, &mut pair.upstream, &mut copied, &slot) => Some(spliced),
        () = facts.revoked(&mut mesh) => None,
        () = slot.evicted() => Some(Err(End::Evicted)),
    };
    match outcome {
        Some(Ok(())) => {
            tracing::debug!(%target, received = copied.received, sent = copied.sent, "inbound plaintext closed");
            pair.clean = true;
            open.finish(copied, FLAG_NONE);
        }
        Some(Err(End::Evicted)) => {
            tracing::info!(%source, %target, "closing inbound plaintext connection: its place went to a client of another source");
            telemetry.denied("plaintext_evicted");
            open.finish(copied, FLAG_DENY);
        }
        Some(Err(end)) => {
            tracing::debug!(%target, failed = ?end, "inbound plaintext reset");
            let flag = match end {
                End::Client => FLAG_DOWNSTREAM_TERMINATION,
                End::Workload | End::Evicted => FLAG_UPSTREAM_TERMINATION,
            };
            open.finish(copied, flag);
        }
        None => {
            tracing::info!(%source, %target, "closing inbound plaintext connection: a policy no longer admits it");
            telemetry.denied("policy_changed");
            open.finish(copied, FLAG_DENY);
        }
    }
}

/// A client's socket and its workload's, reset on drop unless `clean`.
struct Pair {
    client: TcpStream,
    upstream: TcpStream,
    clean: bool,
}

impl Drop for Pair {
    fn drop(&mut self) {
        if !self.clean {
            reset(&self.client);
            reset(&self.upstream);
        }
    }
}

/// Which end of a splice failed first, or that the connection lost its place.
#[derive(Debug, Clone, Copy)]
enum End {
    Client,
    Workload,
    Evicted,
}

/// Copies both ways between `client` and `upstream` until both have ended, passing each
/// end's FIN on; counts into `copied` as it goes (Istio's sense: received from the client,
/// sent to it).
async fn splice(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    copied: &mut Bytes,
    slot: &Slot,
) -> Result<(), End> {
    let (mut client_read, mut client_write) = client.split();
    let (mut upstream_read, mut upstream_write) = upstream.split();
    let Bytes { received, sent } = copied;
    tokio::try_join!(
        pump(
            &mut client_read,
            &mut upstream_write,
            received,
            (End::Client, End::Workload),
            slot
        ),
        pump(
            &mut upstream_read,
            &mut client_write,
            sent,
            (End::Workload, End::Client),
            slot
        ),
    )?;
    Ok(())
}

/// Copies `from` into `to` until `from` ends, then shuts `to`'s write side; an error is
/// blamed on the end it came from (`ends`: the reader's, the writer's). Each copy marks the
/// connection's place as active, so that a fair eviction picks an idle connection first.
async fn pump(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    count: &mut u64,
    (reader, writer): (End, End),
    slot: &Slot,
) -> Result<(), End> {
    let mut buf = vec![0; BUFFER];
    loop {
        let n = from.read(&mut buf).await.map_err(|_| reader)?;
        if n == 0 {
            return to.shutdown().await.map_err(|_| writer);
        }
        to.write_all(&buf[..n]).await.map_err(|_| writer)?;
        *count += n as u64;
        slot.touch();
    }
}

/// Makes the socket's close a reset, so that its peer reads an error rather than a clean end.
fn reset(sock: &TcpStream) {
    let _ = socket2::SockRef::from(sock).set_linger(Some(Duration::ZERO));
}

/// The destination the connection was redirected from (`SO_ORIGINAL_DST`); `None` where the
/// system keeps none.
#[cfg(target_os = "linux")]
fn original_destination(sock: &TcpStream) -> Option<SocketAddr> {
    let sock = socket2::SockRef::from(sock);
    let local = sock.local_addr().ok()?.as_socket()?;
    // IPv4 on a dual-stack socket (an IPv4-mapped local address) is tracked as IPv4.
    let v4 = match local {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(v6) => v6.ip().to_ipv4_mapped().is_some(),
    };
    let original = if v4 {
        sock.original_dst_v4()
    } else {
        sock.original_dst_v6()
    };
    original.ok()?.as_socket()
}

#[cfg(not(target_os = "linux"))]
fn original_destination(_: &TcpStream) -> Option<SocketAddr> {
    None
}
