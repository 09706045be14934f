//! A ready-made server service: dial the CONNECT target and copy bytes both ways.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use h2::Reason;
use http::StatusCode;
use meshkit_identity::BoxFuture;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tower_service::Service;

use crate::copy::copy_bidirectional;
use crate::proxy_protocol;
use crate::server::{ConnectRequest, Decision};

type Policy = Arc<dyn Fn(&ConnectRequest) -> bool + Send + Sync>;

/// Dials each CONNECT's `:authority` over TCP and, once connected, answers 200 and copies
/// bytes both ways with half-close.
///
/// Answers 403 when the policy refuses the request, 503 when the target refuses or cannot be
/// reached, and 504 when connecting takes longer than the connect timeout.
///
/// Without a policy every verified peer may reach every address this host can: give it one
/// (for example, only local workload addresses) before exposing it.
#[derive(Clone)]
pub struct Forward {
    connect_timeout: Duration,
    proxy_protocol: bool,
    policy: Option<Policy>,
}

impl Default for Forward {
    fn default() -> Self {
        Self::new()
    }
}

impl Forward {
    /// A forwarder with a 5 s connect timeout, no PROXY header and no policy.
    pub fn new() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            proxy_protocol: false,
            policy: None,
        }
    }

    /// Sets the connect timeout (504 when it passes).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sends a PROXY protocol v2 header with the client's address and SPIFFE ID (TLV 0xD0) to
    /// the target before any tunnel bytes.
    pub fn with_proxy_protocol(mut self, enabled: bool) -> Self {
        self.proxy_protocol = enabled;
        self
    }

    /// Refuses (403) every request for which `policy` returns false.
    pub fn with_policy(
        mut self,
        policy: impl Fn(&ConnectRequest) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.policy = Some(Arc::new(policy));
        self
    }
}

impl fmt::Debug for Forward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Forward")
            .field("connect_timeout", &self.connect_timeout)
            .field("proxy_protocol", &self.proxy_protocol)
            .field("policy", &self.policy.is_some())
            .finish()
    }
}

impl Service<ConnectRequest> for Forward {
    type Response = Decision;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Decision, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: ConnectRequest) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.decide(req).await) })
    }
}

impl Forward {
    /// Decides `req` as the service does: policy, then dial, then accept with a copying
    /// handler. Handy to wrap the forwarder in a service of one's own.
    pub async fn decide(&self, req: ConnectRequest) -> Decision {
        if let Some(policy) = &self.policy
            && !policy(&req)
        {
            tracing::info!(peer = %req.peer, target = %req.target, "HBONE CONNECT refused by policy");
            return Decision::refuse(StatusCode::FORBIDDEN);
        }
        let upstream = match tokio::time::timeout(
            self.connect_timeout,
            TcpStream::connect(req.target),
        )
        .await
        {
            Ok(Ok(sock)) => sock,
            Ok(Err(e)) => {
                tracing::info!(target = %req.target, error = %e, "HBONE target unreachable");
                return Decision::refuse(StatusCode::SERVICE_UNAVAILABLE);
            }
            Err(_) => {
                tracing::info!(target = %req.target, "HBONE target connect timed out");
                return Decision::refuse(StatusCode::GATEWAY_TIMEOUT);
            }
        };
        let _ = upstream.set_nodelay(true);
        let header = self
            .proxy_protocol
            .then(|| proxy_protocol::header(req.source, req.target, &req.peer));
        Decision::accept(move |mut tunnel| async move {
            let mut upstream = upstream;
            if let Some(header) = header
                && let Err(e) = upstream.write_all(&header).await
            {
                tracing::debug!(error = %e, "writing PROXY header failed");
                tunnel.reset(Reason::CONNECT_ERROR);
                let _ = upstream.set_zero_linger();
                return;
            }
            match copy_bidirectional(tunnel, upstream).await {
                Ok(copied) => tracing::debug!(
                    peer = %req.peer,
                    target = %req.target,
                    sent = copied.from_tunnel,
                    received = copied.to_tunnel,
                    "HBONE tunnel closed"
                ),
                Err(e) => tracing::debug!(
                    target = %req.target,
                    error = %meshkit_identity::ErrorChain(&e),
                    "HBONE tunnel reset"
                ),
            }
        })
    }
}
