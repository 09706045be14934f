//! Forwarding to a backend over HBONE as HTTP/1.1: the backend connection pool, the
//! HTTP/1.1 exchange, and the header rewrites a proxy owes the backend.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use meshkit_identity::SpiffeId;
use tokio::sync::{oneshot, watch};

use crate::metrics::Metrics;
use crate::observe::Flag;

/// The body type of every gateway response.
pub type Body = BoxBody<Bytes, hyper::Error>;

/// Response header naming the SPIFFE ID the backend's side of the tunnel presented.
pub const BACKEND_IDENTITY: &str = "x-meshkit-backend-identity";

/// Response header naming the workload that answered.
pub const BACKEND_WORKLOAD: &str = "x-meshkit-backend-workload";

/// `X-Forwarded-For`: the client, after the earlier hops a trusted proxy named.
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// `X-Forwarded-Proto`: the scheme the client spoke.
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

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
    idle: Mutex<IdleMap>,
    idle_timeout: Duration,
    next_id: AtomicU64,
}

pub(crate) type PoolKey = (SocketAddr, SocketAddr, SpiffeId);

/// The idle connections by endpoint. Keyed by addresses and an identity the gateway's own
/// mesh configuration names, not by anything a client sends: a fast hash will do.
type IdleMap = HashMap<PoolKey, Vec<Idle>, foldhash::fast::RandomState>;

/// A pooled connection, with the number that its idle timer removes it by. Dropping the entry
/// (taken for a request, closed, or the pool cleared) drops `_timer`, which ends the timer.
struct Idle {
    id: u64,
    sender: SendRequest<RequestBody>,
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

    fn lock(&self) -> MutexGuard<'_, IdleMap> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An idle connection to `key` that can take a request now; closed ones are dropped.
    pub(crate) fn checkout(&self, key: &PoolKey) -> Option<SendRequest<RequestBody>> {
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
        mut sender: SendRequest<RequestBody>,
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

    /// Idle connections in the pool now.
    pub(crate) fn idle_count(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }
}

/// What became of a request given to a backend connection.
pub(crate) enum Exchange {
    /// The backend answered; the answer is ready for the client.
    Answered(Response<Body>),
    /// The request failed after it was sent: the client gets this error, and the flag says
    /// what failed.
    Failed(Response<Body>, Flag),
    /// The connection could not take the request (it had closed); here it is back.
    NotSent(Request<RequestBody>),
}

/// How far a request body has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Upload {
    /// Still arriving.
    Sending,
    /// Arrived to its end.
    Done,
    /// Grew past the size limit: cut off (413).
    TooLarge,
    /// Did not arrive within the body timeout: cut off (408).
    TimedOut,
    /// The client's side failed.
    Failed,
}

/// How far a request body has come, and its bytes so far (counted when it ends, and when it
/// is dropped unfinished: its readers do not wake for every frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Where the body is.
    pub(crate) state: Upload,
    /// Bytes of it that went to the backend.
    pub(crate) received: u64,
}

/// A client's request body on its way to the backend, within the gateway's size and time
/// limits; it reports how far it got through a watch channel.
pub(crate) struct RequestBody {
    inner: Incoming,
    received: u64,
    limit: u64,
    timeout: Duration,
    /// Started at the first poll, when the body begins to go to the backend: the time to
    /// pick an endpoint and open its tunnel is not the client's.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    progress: watch::Sender<Progress>,
}

/// Why the gateway cut a request body off.
#[derive(Debug)]
struct BodyCut(&'static str);

impl std::fmt::Display for BodyCut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for BodyCut {}

// === impl RequestBody ===

impl RequestBody {
    /// `inner`, limited to `limit` bytes and to `timeout` from when it is first read.
    pub(crate) fn new(inner: Incoming, limit: u64, timeout: Duration) -> Self {
        let state = if inner.is_end_stream() {
            Upload::Done
        } else {
            Upload::Sending
        };
        Self {
            inner,
            received: 0,
            limit,
            timeout,
            deadline: None,
            progress: watch::Sender::new(Progress { state, received: 0 }),
        }
    }

    /// Follows the body's progress; the channel closes when the body is dropped.
    pub(crate) fn progress(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    fn state(&self) -> Upload {
        self.progress.borrow().state
    }

    /// When the body must have arrived.
    pub(crate) fn deadline(&self) -> tokio::time::Instant {
        match &self.deadline {
            Some(sleep) => sleep.deadline(),
            None => tokio::time::Instant::now() + self.timeout,
        }
    }

    fn end(&mut self, how: Upload) {
        self.progress.send_replace(Progress {
            state: how,
            received: self.received,
        });
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        // Unfinished (the backend answered without reading it all): its count so far, without
        // waking anyone, as the state has not changed.
        let received = self.received;
        self.progress.send_if_modified(|p| {
            p.received = received;
            false
        });
    }
}

impl HttpBody for RequestBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.state() != Upload::Sending {
            return Poll::Ready(None);
        }
        if this.deadline.is_none() {
            this.deadline = Some(Box::pin(tokio::time::sleep(this.timeout)));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received += data.len() as u64;
                    if this.received > this.limit {
                        this.end(Upload::TooLarge);
                        return Poll::Ready(Some(Err(Box::new(BodyCut(
                            "request body over the limit",
                        )))));
                    }
                }
                if this.inner.is_end_stream() {
                    this.end(Upload::Done);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.end(Upload::Failed);
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Ready(None) => {
                this.end(Upload::Done);
                Poll::Ready(None)
            }
            Poll::Pending => {
                let timeout = this.timeout;
                let deadline = this
                    .deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                if deadline.as_mut().poll(cx).is_ready() {
                    this.end(Upload::TimedOut);
                    return Poll::Ready(Some(Err(Box::new(BodyCut("request body timed out")))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.state() != Upload::Sending || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Speaks HTTP/1.1 over `tunnel`, counted in `metrics` as an open tunnel until the
/// connection ends.
pub(crate) async fn connect(
    tunnel: meshkit_hbone::Tunnel,
    metrics: &Metrics,
) -> Result<SendRequest<RequestBody>, Response<Body>> {
    let (sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(tunnel)).await {
        Ok(pair) => pair,
        Err(e) => {
            tracing::info!(error = %e, "HTTP/1.1 handshake over the tunnel failed");
            return Err(error(StatusCode::BAD_GATEWAY, "backend handshake failed"));
        }
    };
    metrics.tunnels_opened.inc();
    metrics.tunnels.inc();
    let open = metrics.tunnels.clone();
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "backend connection ended with an error");
        }
        open.dec();
    });
    Ok(sender)
}

/// Sends `req` over `sender` and relays the answer. The backend has `response_timeout` to
/// answer, counted from the end of the request body (whose own bounds its [`RequestBody`]
/// enforces): a slow upload is the client's delay, not the backend's.
pub(crate) async fn exchange(
    sender: &mut SendRequest<RequestBody>,
    req: Request<RequestBody>,
    response_timeout: Duration,
) -> Exchange {
    let mut upload = req.body().progress();
    // A backend that reads neither the body nor answers leaves the body unpolled, so its own
    // deadline never fires: past it, the backend still gets `response_timeout`, no more.
    let backstop = req.body().deadline() + response_timeout;
    let send = sender.try_send_request(req);
    let mut send = std::pin::pin!(send);
    let early = tokio::select! {
        biased;
        result = send.as_mut() => Some(Some(result)),
        // Ended, cut off, or dropped (the channel closes): the backend's turn.
        _ = upload.wait_for(|u| u.state != Upload::Sending) => None,
        () = tokio::time::sleep_until(backstop) => Some(None),
    };
    let result = match early {
        Some(Some(result)) => Some(result),
        Some(None) => None,
        None => tokio::time::timeout(response_timeout, send).await.ok(),
    };
    match result {
        Some(Ok(resp)) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            parts.headers.remove(header::TRANSFER_ENCODING);
            Exchange::Answered(Response::from_parts(parts, body.boxed()))
        }
        Some(Err(mut e)) => match e.take_message() {
            Some(req) => Exchange::NotSent(req),
            None => {
                let state = upload.borrow().state;
                match state {
                    Upload::TooLarge => Exchange::Failed(
                        error(StatusCode::PAYLOAD_TOO_LARGE, "request body too large"),
                        Flag::None,
                    ),
                    Upload::TimedOut => Exchange::Failed(
                        error(StatusCode::REQUEST_TIMEOUT, "request body timed out"),
                        Flag::None,
                    ),
                    Upload::Failed => Exchange::Failed(
                        error(StatusCode::BAD_REQUEST, "request body failed"),
                        Flag::DownstreamConnectionTermination,
                    ),
                    Upload::Sending | Upload::Done => {
                        tracing::info!(error = %e.error(), "backend request failed");
                        let flag = if e.error().is_parse() {
                            Flag::UpstreamProtocolError
                        } else {
                            Flag::UpstreamConnectionTermination
                        };
                        Exchange::Failed(
                            error(StatusCode::BAD_GATEWAY, "backend request failed"),
                            flag,
                        )
                    }
                }
            }
        },
        None => Exchange::Failed(
            error(StatusCode::GATEWAY_TIMEOUT, "backend timed out"),
            Flag::UpstreamRequestTimeout,
        ),
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
/// The client's own `X-Forwarded-For` and `Forwarded` are kept (and the client appended)
/// only when it is a `trusted` proxy; otherwise they are replaced by the client alone.
pub(crate) fn prepare<B>(
    req: &mut Request<B>,
    host: &str,
    client: SocketAddr,
    scheme: &'static str,
    trusted: bool,
) {
    // The path and query as they are (shared bytes: neither copied nor parsed again).
    let origin = req
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    *req.uri_mut() = Uri::from(origin);
    *req.version_mut() = Version::HTTP_11;
    let headers = req.headers_mut();
    strip_hop_by_hop(headers);
    if let Ok(value) = HeaderValue::from_str(host) {
        headers.insert(header::HOST, value);
    }
    if !trusted {
        // Whatever an untrusted peer claims about earlier hops is its own word.
        headers.remove(&X_FORWARDED_FOR);
        headers.remove(header::FORWARDED);
    }
    let mut xff = String::with_capacity(64);
    if let Some(previous) = headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        xff.push_str(previous);
        xff.push_str(", ");
    }
    let ip_at = xff.len();
    // Writing to a String cannot fail.
    let _ = write!(xff, "{}", client.ip());
    let mut forwarded = String::with_capacity(96);
    if let Some(previous) = headers.get(header::FORWARDED).and_then(|v| v.to_str().ok()) {
        forwarded.push_str(previous);
        forwarded.push_str(", ");
    }
    let ip = &xff[ip_at..];
    if client.is_ipv6() {
        forwarded.push_str("for=\"[");
        forwarded.push_str(ip);
        forwarded.push_str("]\"");
    } else {
        forwarded.push_str("for=");
        forwarded.push_str(ip);
    }
    forwarded.push_str(";host=\"");
    // A quoted-string must not end early: leave out what would need escaping.
    if host.contains(['"', '\\']) {
        forwarded.extend(host.chars().filter(|c| *c != '"' && *c != '\\'));
    } else {
        forwarded.push_str(host);
    }
    forwarded.push_str("\";proto=");
    forwarded.push_str(scheme);
    // From the strings themselves: no copy.
    if let Ok(value) = HeaderValue::try_from(xff) {
        headers.insert(X_FORWARDED_FOR, value);
    }
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(scheme));
    if let Ok(value) = HeaderValue::try_from(forwarded) {
        headers.insert(header::FORWARDED, value);
    }
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the names first: most messages carry none of them.
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    let mut gone: Vec<HeaderName> = headers
        .keys()
        .filter(|n| is_hop_by_hop(n))
        .cloned()
        .collect();
    // Headers named in `Connection` are hop-by-hop too.
    gone.extend(
        headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok()),
    );
    for name in gone {
        headers.remove(name);
    }
}

/// Whether `name` belongs to one connection and is not forwarded (RFC 9110, 7.6.1).
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "upgrade"
    )
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
            true,
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
    fn hop_by_hop_headers_are_told_by_name_and_by_connection() {
        let mut headers = HeaderMap::new();
        for name in [
            "connection",
            "keep-alive",
            "proxy-connection",
            "proxy-authenticate",
            "proxy-authorization",
            "te",
            "trailer",
            "upgrade",
            "x-kept",
            "x-named",
        ] {
            headers.insert(HeaderName::from_static(name), HeaderValue::from_static("v"));
        }
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("x-named, close"),
        );
        strip_hop_by_hop(&mut headers);
        let left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(left, ["x-kept"]);
        // Nothing to strip: the map is left as it was.
        let mut plain = HeaderMap::new();
        plain.insert(header::HOST, HeaderValue::from_static("a.example"));
        plain.insert(
            HeaderName::from_static("x-kept"),
            HeaderValue::from_static("v"),
        );
        let before = plain.clone();
        strip_hop_by_hop(&mut plain);
        assert_eq!(plain, before);
    }

    #[test]
    fn an_untrusted_client_cannot_claim_earlier_hops() {
        let mut req = Request::builder()
            .uri("/")
            .header("x-forwarded-for", "203.0.113.9")
            .header("forwarded", "for=203.0.113.9")
            .body(())
            .expect("request");
        prepare(
            &mut req,
            "shop.example.com",
            "192.0.2.1:4000".parse().expect("addr"),
            "http",
            false,
        );
        assert_eq!(req.headers()["x-forwarded-for"], "192.0.2.1");
        assert_eq!(
            req.headers()["forwarded"],
            "for=192.0.2.1;host=\"shop.example.com\";proto=http"
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
