//! One request: route, pick an endpoint, forward over HBONE as HTTP/1.1.

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
use meshkit_hbone::Target;
use meshkit_identity::SpiffeId;
use tokio::sync::oneshot;

use super::Shared;

/// The body type of every gateway response.
pub(super) type Body = BoxBody<Bytes, hyper::Error>;

/// Response header naming the SPIFFE ID the backend's side of the tunnel presented.
pub const BACKEND_IDENTITY: &str = "x-meshkit-backend-identity";

/// Response header naming the workload that answered.
pub const BACKEND_WORKLOAD: &str = "x-meshkit-backend-workload";

/// How long a backend may take to answer once the request is sent.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

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

/// Serves one request from `client` that arrived over `scheme` (`http` or `https`).
pub(super) async fn handle(
    shared: &Shared,
    mut req: Request<Incoming>,
    client: SocketAddr,
    scheme: &'static str,
) -> Response<Body> {
    let Some(host) = request_host(&req) else {
        return error(StatusCode::BAD_REQUEST, "no host in the request");
    };
    let compiled = shared.current.borrow().clone();
    let path = req.uri().path().to_owned();
    let Some(route) = compiled.table.route(&host, &path) else {
        return error(StatusCode::NOT_FOUND, "no route");
    };
    let Some(backend) = route.backend().service.as_ref() else {
        return error(StatusCode::NOT_FOUND, "route has no service backend");
    };
    let namespace = route.namespace().to_owned();
    let name = backend.name.clone().unwrap_or_default();
    let port_number = backend
        .port
        .as_ref()
        .and_then(|p| p.number)
        .and_then(|n| u16::try_from(n).ok());
    let port_name = backend.port.as_ref().and_then(|p| p.name.clone());
    let Some(service) = compiled.index.service(&namespace, &name) else {
        tracing::info!(%namespace, service = %name, "backend service unknown");
        return error(StatusCode::SERVICE_UNAVAILABLE, "backend service unknown");
    };
    let Some(port) = service.port(port_number, port_name.as_deref()) else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "backend service has no such port",
        );
    };
    let endpoints = compiled.index.endpoints(service, port);
    if endpoints.is_empty() {
        return error(StatusCode::SERVICE_UNAVAILABLE, "no endpoints");
    }

    // The answer goes back in the client's version, whatever the backend spoke.
    let client_version = req.version();
    prepare(&mut req, &host, client, scheme);
    let start = shared.next_endpoint(&namespace, &name, port.port);
    for i in 0..endpoints.len() {
        let Some(ep) = endpoints.get(start.wrapping_add(i) % endpoints.len()) else {
            continue;
        };
        tracing::debug!(%host, %path, endpoint = %ep.address, identity = %ep.identity, "forwarding");
        let key = (ep.hbone, ep.address, ep.identity.clone());
        // An idle connection to this endpoint first. One that closed since it was pooled
        // gives the request back, and a new tunnel takes it.
        if let Some(mut sender) = shared.pool.checkout(&key) {
            match exchange(&mut sender, req).await {
                Exchange::Answered(resp) => {
                    shared.pool.put_back_when_ready(key, sender);
                    return answer(resp, ep, client_version);
                }
                Exchange::Failed(resp) => return answer(resp, ep, client_version),
                Exchange::NotSent(back) => req = back,
            }
        }
        // The tunnel carries no `Forwarded` header: it serves many clients in turn, and each
        // request names its own client in its HTTP headers.
        let target = Target::new(
            ep.hbone,
            ep.address,
            shared.settings.identity.clone(),
            ep.identity.clone(),
        );
        let tunnel = match shared.client.open(target).await {
            Ok(tunnel) => tunnel,
            Err(e) => {
                tracing::info!(endpoint = %ep.address, workload = %ep.workload, error = %e, "endpoint unreachable; trying the next");
                continue;
            }
        };
        let mut sender = match connect(tunnel).await {
            Ok(sender) => sender,
            Err(resp) => return answer(resp, ep, client_version),
        };
        return match exchange(&mut sender, req).await {
            Exchange::Answered(resp) => {
                shared.pool.put_back_when_ready(key, sender);
                answer(resp, ep, client_version)
            }
            Exchange::Failed(resp) => answer(resp, ep, client_version),
            Exchange::NotSent(_) => error(
                StatusCode::BAD_GATEWAY,
                "backend connection closed before the request",
            ),
        };
    }
    error(StatusCode::SERVICE_UNAVAILABLE, "no endpoint reachable")
}

/// The backend's answer in the client's HTTP version, naming the workload that answered and
/// the identity its end of the tunnel proved (the tunnel opens only when the peer presents
/// exactly this identity).
fn answer(
    mut resp: Response<Body>,
    ep: &crate::node_proxy::Endpoint,
    version: Version,
) -> Response<Body> {
    *resp.version_mut() = version;
    let headers = resp.headers_mut();
    if let Ok(value) = HeaderValue::from_str(ep.identity.as_ref()) {
        headers.insert(HeaderName::from_static(BACKEND_IDENTITY), value);
    }
    if let Ok(value) = HeaderValue::from_str(&ep.workload) {
        headers.insert(HeaderName::from_static(BACKEND_WORKLOAD), value);
    }
    resp
}

/// Idle HTTP/1.1 connections to backend workloads, each inside an HBONE tunnel of its own,
/// by (HBONE address, workload address, workload identity). A connection goes back to the pool
/// once its response has been read to the end and is taken again only if it is still open, so
/// a request costs a tunnel and an HTTP/1.1 handshake only when no idle connection is left. A
/// connection left idle for the pool's idle timeout is closed (its tunnel ends).
pub(super) struct BackendPool {
    idle: Mutex<HashMap<PoolKey, Vec<Idle>>>,
    idle_timeout: Duration,
    next_id: AtomicU64,
}

type PoolKey = (SocketAddr, SocketAddr, SpiffeId);

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
    pub(super) fn new(idle_timeout: Duration) -> Self {
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
    fn checkout(&self, key: &PoolKey) -> Option<SendRequest<Incoming>> {
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
    fn put_back_when_ready(self: &Arc<Self>, key: PoolKey, mut sender: SendRequest<Incoming>) {
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
    pub(super) fn clear(&self) {
        self.lock().clear();
    }
}

/// What became of a request given to a backend connection.
enum Exchange {
    /// The backend answered; the answer is ready for the client.
    Answered(Response<Body>),
    /// The request failed after it was sent: the client gets this error.
    Failed(Response<Body>),
    /// The connection could not take the request (it had closed); here it is back.
    NotSent(Request<Incoming>),
}

/// Speaks HTTP/1.1 over `tunnel`.
async fn connect(tunnel: meshkit_hbone::Tunnel) -> Result<SendRequest<Incoming>, Response<Body>> {
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
async fn exchange(sender: &mut SendRequest<Incoming>, req: Request<Incoming>) -> Exchange {
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

fn request_host<B>(req: &Request<B>) -> Option<String> {
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
fn prepare<B>(req: &mut Request<B>, host: &str, client: SocketAddr, scheme: &'static str) {
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
pub(super) fn error(status: StatusCode, message: &'static str) -> Response<Body> {
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
