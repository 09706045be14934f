//! The executor option: background tasks of the client and the server run where the caller
//! says, and the default (tokio::spawn) still works.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use meshkit_hbone::{
    BoxFuture, ClientConfig, Executor, Forward, ServerConfig, Target, TokioExecutor,
};
use support::*;
use tokio::io::AsyncReadExt;

/// Counts the tasks it is given and runs them with `tokio::spawn`.
#[derive(Default)]
struct Counting {
    started: AtomicUsize,
}

impl Executor for Counting {
    fn execute(&self, task: BoxFuture<'static, ()>) {
        self.started.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(task);
    }
}

impl Counting {
    fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }
}

fn target(server: std::net::SocketAddr, destination: std::net::SocketAddr) -> Target {
    Target::new(server, destination, id(CLIENT), id(SERVER))
}

#[tokio::test]
async fn custom_executors_run_every_background_task() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server_exec = Arc::new(Counting::default());
    let client_exec = Arc::new(Counting::default());
    let server = start(
        &pki,
        ServerConfig::default().with_executor(server_exec.clone()),
        Forward::new(),
    )
    .await;
    let client = pki.client(
        CLIENT,
        ClientConfig::default().with_executor(client_exec.clone()),
    );
    for i in 0..3 {
        let tunnel = client.open(target(server.addr, backend)).await.unwrap();
        let msg = format!("hello {i}");
        assert_eq!(round_trip(tunnel, msg.as_bytes()).await, msg.as_bytes());
    }
    assert_eq!(client.connections_opened(), 1);
    // One driver per client connection.
    assert_eq!(client_exec.started(), 1);
    // One task for the connection, one per CONNECT stream.
    assert_eq!(server.stats.streams(), 3);
    assert_eq!(server_exec.started(), 1 + 3);
}

#[tokio::test]
async fn default_executor_is_tokio_spawn() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    assert_eq!(
        ServerConfig::default(),
        ServerConfig::default().with_h2(Default::default()),
        "default configs compare equal"
    );
    assert_ne!(
        ServerConfig::default(),
        ServerConfig::default().with_executor(TokioExecutor),
        "an explicit executor is a different configuration"
    );
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let tunnel = client.open(target(server.addr, backend)).await.unwrap();
    assert_eq!(round_trip(tunnel, b"ping").await, b"ping");
    // Explicitly the provided executor, and a runtime handle.
    let explicit = pki.client(CLIENT, ClientConfig::default().with_executor(TokioExecutor));
    let tunnel = explicit.open(target(server.addr, backend)).await.unwrap();
    assert_eq!(round_trip(tunnel, b"pong").await, b"pong");
    let handle = tokio::runtime::Handle::current();
    let on_handle = pki.client(CLIENT, ClientConfig::default().with_executor(handle));
    let tunnel = on_handle.open(target(server.addr, backend)).await.unwrap();
    assert_eq!(round_trip(tunnel, b"pang").await, b"pang");
}

#[tokio::test]
async fn dropping_the_serve_future_closes_connections_run_elsewhere() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let exec = Arc::new(Counting::default());
    let server = start(
        &pki,
        ServerConfig::default().with_executor(exec.clone()),
        Forward::new(),
    )
    .await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let mut tunnel = client.open(target(server.addr, backend)).await.unwrap();
    assert_eq!(exec.started(), 2);
    // The connection task runs on the executor, not inside the serve future; dropping the
    // serve future must still end it.
    server.task.abort();
    let mut buf = Vec::new();
    let read = within(
        "the tunnel's end once the server is dropped",
        tunnel.read_to_end(&mut buf),
    )
    .await;
    let err = read.expect_err("a dropped connection is no clean EOF");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    wait_until("the connection task's end", || {
        server.stats.connections_open() == 0
    })
    .await;
}

#[test]
fn configs_stay_send_sync_clone() {
    fn assert_traits<T: Send + Sync + Clone + std::fmt::Debug>() {}
    assert_traits::<ClientConfig>();
    assert_traits::<ServerConfig>();
    assert_traits::<TokioExecutor>();
}
