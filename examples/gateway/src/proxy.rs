//! Forwarding to a backend over HBONE as HTTP/1.1: the backend connection pool, the
//! HTTP/1.1 exchange, and the header rewrites a proxy owes the backend.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use meshkit_identity::SpiffeId;
use tokio::sync::oneshot;

/// The body type of every gateway response.
pub type Body = BoxBody<Bytes, hyper::Error>;

/// Response header naming the SPIFFE ID the backend's side of the tunnel presented.
pub const BACKEND_IDENTITY: &str = "x-meshkit-backend-identity";

/// Response header naming the workload that answered.
pub const BACKEND_WORKLOAD: &str = "x-meshkit-backend-workload";

/// How long a backend may take to answer once the request is sent.
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

/// Headers that belong to one connection and are not forwarded (RFC 9110, 7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

/// Names the workload that answered and the identity its end of the tunnel proved, in the
/// [`BACKEND_WORKLOAD`] and [`BACKEND_IDENTITY`] response headers.
pub(crate) fn name_backend(headers: &mut HeaderMap, ep: &meshkit_mesh::Endpoint) {
    if let Ok(value) = HeaderValue::from_str(ep.identity.as_ref()) {
        headers.insert(HeaderName::from_static(BACKEND_IDENTITY), value);
    }
    if let Ok(value) = HeaderValue::from_str(&ep.workload) {
        headers.insert(HeaderName::from_static(BACKEND_WORKLOAD), value);
    }
}

/// Idle HTTP/1.1 connections to backend workloads, each inside an HBONE tunnel of its own,
/// by (HBONE address, workload address, workload identity). A connection goes back to the pool
/// once its response has been read to the end and is taken again only if it is still open, so
/// a request costs a tunnel and an HTTP/1.1 handshake only when no idle connection is left. A
/// connection left idle for the pool's idle timeout is closed (its tunnel ends).
pub(crate) struct BackendPool {
    idle: Mutex<HashMap<PoolKey, Vec<Idle>>>,
    idle_timeout: Duration,
    next_id: AtomicU64,
}

pub(crate) type PoolKey = (SocketAddr, SocketAddr, SpiffeId);

/// A pooled connection, with the number that its idle timer removes it by. Dropping the entry
/// (taken for a request, closed, or the pool cleared) drops `_timer`, which ends the timer.
struct Idle {
    id: u64,
    sender: SendRequest<Incoming>,
    _timer: oneshot::Sender<()>,
}

/// Idle connections kept per endpoint; more are closed when their response ends.
const MAX_IDLE_PER_ENDPOINT: usize = 64;

impl BackendPool {
    /// An empty pool whose connections close after `idle_timeout` without a request.
    pub(crate) fn new(idle_timeout: Duration) -> Self {
        Self {
            idle: Mutex::default(),
            idle_timeout,
            next_id: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<PoolKey, Vec<Idle>>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An idle connection to `key` that can take a request now; closed ones are dropped.
    pub(crate) fn checkout(&self, key: &PoolKey) -> Option<SendRequest<Incoming>> {
        let mut idle = self.lock();
        let list = idle.get_mut(key)?;
        let mut found = None;
        while let Some(entry) = list.pop() {
            if entry.sender.is_ready() {
                found = Some(entry.sender);
                break;
            }
        }
        if list.is_empty() {
            idle.remove(key);
        }
        found
    }

    /// Returns `sender` to the pool once it can take the next request (its response was read
    /// to the end); drops it if its connection ends first, or once it has been idle for the
    /// idle timeout.
    pub(crate) fn put_back_when_ready(
        self: &Arc<Self>,
        key: PoolKey,
        mut sender: SendRequest<Incoming>,
    ) {
        let pool = Arc::downgrade(self);
        tokio::spawn(async move {
            if sender.ready().await.is_err() {
                return;
            }
            let (timer, taken) = oneshot::channel();
            let (id, idle_timeout) = {
                let Some(pool) = pool.upgrade() else { return };
                let id = pool.next_id.fetch_add(1, Ordering::Relaxed);
                let mut idle = pool.lock();
                let list = idle.entry(key.clone()).or_default();
                list.retain(|entry| !entry.sender.is_closed());
                if list.len() >= MAX_IDLE_PER_ENDPOINT {
                    return;
                }
                list.push(Idle {
                    id,
                    sender,
                    _timer: timer,
                });
                (id, pool.idle_timeout)
            };
            // The timer lives as long as the entry: a connection taken for a request ends it
            // at once, so there is one timer per idle connection, not one per request.
            tokio::select! {
                _ = taken => return,
                () = tokio::time::sleep(idle_timeout) => {}
            }
            // Still in the pool (no request took it meanwhile): close it.
            let Some(pool) = pool.upgrade() else { return };
            let mut idle = pool.lock();
            if let Some(list) = idle.get_mut(&key) {
                list.retain(|entry| entry.id != id);
                if list.is_empty() {
                    idle.remove(&key);
                }
            }
        });
    }

    /// Closes every idle connection (their tunnels end as the senders drop).
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }
}

/// What became of a request given to a backend connection.
pub(crate) enum Exchange {
    /// The backend answered; the answer is ready for the client.
    Answered(Response<Body>),
    /// The request failed after it was sent: the client gets this error.
    Failed(Response<Body>),
    /// The connection could not take the request (it had closed); here it is back.
    NotSent(Request<Incoming>),
}

/// Speaks HTTP/1.1 over `tunnel`.
pub(crate) async fn connect(
    tunnel: meshkit_hbone::Tunnel,
) -> Result<SendRequest<Incoming>, Response<Body>> {
    let (sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(tunnel)).await {
        Ok(pair) => pair,
        Err(e) => {
            tracing::info!(error = %e, "HTTP/1.1 handshake over the tunnel failed");
            return Err(error(StatusCode::BAD_GATEWAY, "backend handshake failed"));
        }
    };
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "backend connection ended with an error");
        }
    });
    Ok(sender)
}

/// Sends `req` over `sender` and relays the answer.
pub(crate) async fn exchange(
    sender: &mut SendRequest<Incoming>,
    req: Request<Incoming>,
) -> Exchange {
    match tokio::time::timeout(RESPONSE_TIMEOUT, sender.try_send_request(req)).await {
        Ok(Ok(resp)) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            parts.headers.remove(header::TRANSFER_ENCODING);
            Exchange::Answered(Response::from_parts(parts, body.boxed()))
        }
        Ok(Err(mut e)) => match e.take_message() {
            Some(req) => Exchange::NotSent(req),
            None => {
                tracing::info!(error = %e.error(), "backend request failed");
                Exchange::Failed(error(StatusCode::BAD_GATEWAY, "backend request failed"))
            }
        },
        Err(_) => Exchange::Failed(error(StatusCode::GATEWAY_TIMEOUT, "backend timed out")),
    }
}

pub(crate) fn request_host<B>(req: &Request<B>) -> Option<String> {
    if let Some(authority) = req.uri().authority() {
        // Host and port only: userinfo has no place in routing or in `Host`.
        return Some(match authority.port_u16() {
            Some(port) => format!("{}:{port}", authority.host()),
            None => authority.host().to_owned(),
        });
    }
    req.headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
}

/// Rewrites the request for an HTTP/1.1 backend: origin-form URI, `Host`, no hop-by-hop
/// headers, and `X-Forwarded-For`, `X-Forwarded-Proto` and `Forwarded` naming the client.
pub(crate) fn prepare<B>(
    req: &mut Request<B>,
    host: &str,
    client: SocketAddr,
    scheme: &'static str,
) {
    let path = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    if let Ok(uri) = path.parse::<Uri>() {
        *req.uri_mut() = uri;
    }
    *req.version_mut() = Version::HTTP_11;
    let headers = req.headers_mut();
    strip_hop_by_hop(headers);
    if let Ok(value) = HeaderValue::from_str(host) {
        headers.insert(header::HOST, value);
    }
    let ip = client.ip().to_string();
    let xff = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(previous) => format!("{previous}, {ip}"),
        None => ip.clone(),
    };
    if let Ok(value) = HeaderValue::from_str(&xff) {
        headers.insert(HeaderName::from_static("x-forwarded-for"), value);
    }
    headers.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static(scheme),
    );
    let node = if client.is_ipv6() {
        format!("\"[{ip}]\"")
    } else {
        ip
    };
    // A quoted-string must not end early: leave out what would need escaping.
    let quoted_host: String = host.chars().filter(|c| *c != '"' && *c != '\\').collect();
    let element = format!("for={node};host=\"{quoted_host}\";proto={scheme}");
    let forwarded = match headers.get(header::FORWARDED).and_then(|v| v.to_str().ok()) {
        Some(previous) => format!("{previous}, {element}"),
        None => element,
    };
    if let Ok(value) = HeaderValue::from_str(&forwarded) {
        headers.insert(header::FORWARDED, value);
    }
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Headers named in `Connection` are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// A short plain-text answer from the gateway itself.
pub(crate) fn error(status: StatusCode, message: &'static str) -> Response<Body> {
    let body = Full::new(Bytes::from_static(message.as_bytes()))
        .map_err(|never| match never {})
        .boxed();
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_rewrites_for_an_http1_backend() {
        let mut req = Request::builder()
            .version(Version::HTTP_2)
            .uri("https://shop.example.com/a/b?c=d")
            .header("connection", "x-private, keep-alive")
            .header("x-private", "secret")
            .header("keep-alive", "timeout=5")
            .header("te", "trailers")
            .header("x-forwarded-for", "10.0.0.1")
            .header("forwarded", "for=10.0.0.1")
            .body(())
            .expect("request");
        prepare(
            &mut req,
            "shop.example.com",
            "[::1]:4000".parse().expect("addr"),
            "https",
        );
        assert_eq!(req.version(), Version::HTTP_11);
        assert_eq!(req.uri(), "/a/b?c=d");
        let h = req.headers();
        assert_eq!(h["host"], "shop.example.com");
        for gone in ["connection", "x-private", "keep-alive", "te"] {
            assert!(!h.contains_key(gone), "{gone} forwarded");
        }
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, ::1");
        assert_eq!(h["x-forwarded-proto"], "https");
        assert_eq!(
            h["forwarded"],
            "for=10.0.0.1, for=\"[::1]\";host=\"shop.example.com\";proto=https"
        );
    }

    #[test]
    fn host_comes_from_the_authority_then_the_host_header() {
        let req = Request::get("http://user@a.example:81/x")
            .header("host", "b.example")
            .body(())
            .expect("request");
        assert_eq!(request_host(&req).as_deref(), Some("a.example:81"));
        let req = Request::get("/x")
            .header("host", "b.example:8080")
            .body(())
            .expect("request");
        assert_eq!(request_host(&req).as_deref(), Some("b.example:8080"));
        let req = Request::get("/x").body(()).expect("request");
        assert_eq!(request_host(&req), None);
    }
}
