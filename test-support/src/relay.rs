//! A TCP relay a test can cut: a network partition between one client and its server.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

/// Relays every connection to its loopback address on to `upstream`, until
/// [`Relay::cut`]: then every relayed connection is closed and new ones are closed at once,
/// until [`Relay::restore`].
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

#[derive(Debug, Default)]
struct Shared {
    cut: AtomicBool,
    connections: Mutex<Vec<AbortHandle>>,
}

impl Relay {
    /// A relay to `upstream` on a free loopback port.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("its address");
        let shared = Arc::new(Shared::default());
        let accepting = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if accepting.cut.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let relay = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                let mut connections = accepting
                    .connections
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                connections.retain(|c| !c.is_finished());
                connections.push(relay.abort_handle());
            }
        });
        Self { addr, shared, task }
    }

    /// The relay's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every relayed connection, and every new one until [`Relay::restore`].
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        let connections = std::mem::take(
            &mut *self
                .shared
                .connections
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for connection in connections {
            connection.abort();
        }
    }

    /// Relays new connections again.
    pub fn restore(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}
