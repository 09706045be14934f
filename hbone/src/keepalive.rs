//! HTTP/2 keepalive: a PING every interval; no PONG within the timeout means the peer is gone.

use std::time::Duration;

use h2::{Ping, PingPong};

/// Completes when the peer failed to answer a PING in time. Never completes while the peer
/// answers, nor when PINGs cannot be sent (the connection is closing and reports that itself).
pub(crate) async fn keepalive(ping: Option<PingPong>, interval: Duration, timeout: Duration) {
    let Some(mut ping) = ping else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(interval).await;
        if ping.send_ping(Ping::opaque()).is_err() {
            return std::future::pending().await;
        }
        let pong = std::future::poll_fn(|cx| ping.poll_pong(cx));
        match tokio::time::timeout(timeout, pong).await {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return std::future::pending().await,
            Err(_) => return,
        }
    }
}
