//! The accept loop the node proxy's plain-TCP listeners share (outbound, inbound plaintext).

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Accepts on `listener` until `drain` turns true, then closes it and waits for the
/// connections it started to end. Dropping the future drops them: they run in a set owned
/// here. `start` gets each accepted socket, its peer and the number of connections open, and
/// returns the connection's task, or `None` when it refused the connection. A failed accept
/// (out of file descriptors) is logged and retried 50 ms later. `what` names the listener in
/// the logs.
pub(crate) async fn until_drained<F>(
    listener: TcpListener,
    mut drain: watch::Receiver<bool>,
    what: &'static str,
    mut start: impl FnMut(TcpStream, SocketAddr, usize) -> Option<F>,
) where
    F: Future<Output = ()> + Send + 'static,
{
    let listen = listener.local_addr().ok();
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = drain.wait_for(|draining| *draining) => break,
        };
        match accepted {
            Ok((sock, peer)) => {
                if let Some(task) = start(sock, peer, connections.len()) {
                    connections.spawn(task);
                }
            }
            Err(e) => {
                tracing::warn!(listener = what, listen = ?listen, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    drop(listener);
    tracing::info!(listener = what, listen = ?listen, open = connections.len(), "listener closed for the drain");
    while connections.join_next().await.is_some() {}
}
