//! A gateway on loopback in front of one backend: an HTTP/1.1 app behind an HBONE server,
//! and clients that misbehave on purpose.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use meshkit_gateway::{Gateway, GatewayConfig, GatewaySettings, TlsCertificate};
use meshkit_hbone::{Client, ClientConfig, Forward, Server, ServerConfig};
use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    Authorize, SingleIdentity, SpiffeId, SpiffeVerifier, TlsSettings, TrustDomain,
};
use meshkit_mesh::{MeshConfig, MeshService, ServicePort, Workload};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// The routed host.
pub const HOST: &str = "shop.example.com";

const INGRESS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: shop, namespace: shop}
spec:
  tls:
  - hosts: ["shop.example.com"]
    secretName: shop-tls
  rules:
  - host: shop.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
"#;

/// A running gateway and its backend.
pub struct Harness {
    /// The plain HTTP listener.
    pub http: SocketAddr,
    /// The HTTPS listener (certificate for [`HOST`]).
    pub https: SocketAddr,
    /// Roots that trust the HTTPS listener's certificate.
    pub roots: Arc<rustls::RootCertStore>,
    /// The gateway (its readiness, metrics, drain).
    pub gateway: Gateway,
    /// The gateway's configuration channel.
    pub config: tokio::sync::watch::Sender<GatewayConfig>,
    /// The configuration the gateway was started with, or (with
    /// [`start_without_config`]) the one it was not given yet.
    pub prepared: GatewayConfig,
    /// The headers of every CONNECT the backend's HBONE server accepted, in order.
    pub connects: Arc<Mutex<Vec<http::HeaderMap>>>,
    /// Each permit lets one `/slow` answer finish (or one `/slow-head` answer start).
    pub release: Arc<Semaphore>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn id(s: &str) -> SpiffeId {
    s.parse().expect("spiffe id")
}

/// Starts the backend app, an HBONE server in front of it, and a gateway with the settings
/// `tune` makes of the defaults (the HBONE port already set).
pub async fn start(tune: impl FnOnce(GatewaySettings) -> GatewaySettings) -> Harness {
    start_with(tune, |_| {}).await
}

/// Bound on a wait for something that must happen: far above what it needs, so that a loaded
/// machine does not fail it.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// [`start`], with the gateway's configuration as `configure` makes it of the default one:
/// [`HOST`] routed to service `web` (port 80, named `http`, to the app), whose one endpoint is
/// workload `web-1` on 127.0.0.1 with identity `ns/shop/sa/web`. The HBONE server on
/// 127.0.0.1 presents that identity and forwards to any port of 127.0.0.1, so a service
/// whose endpoint is 127.0.0.1 with another target port reaches whatever listens there.
pub async fn start_with(
    tune: impl FnOnce(GatewaySettings) -> GatewaySettings,
    configure: impl FnOnce(&mut GatewayConfig),
) -> Harness {
    start_inner(tune, configure, false).await
}

/// [`start_with`], the gateway started with the default (empty) configuration: the one it
/// would route by is in [`Harness::prepared`], for the test to send on [`Harness::config`].
pub async fn start_without_config(
    tune: impl FnOnce(GatewaySettings) -> GatewaySettings,
    configure: impl FnOnce(&mut GatewayConfig),
) -> Harness {
    start_inner(tune, configure, true).await
}

async fn start_inner(
    tune: impl FnOnce(GatewaySettings) -> GatewaySettings,
    configure: impl FnOnce(&mut GatewayConfig),
    empty: bool,
) -> Harness {
    let td = TrustDomain::new("cluster.local").expect("td");
    let ca = TestCa::new(td.clone());
    let gateway_id = id("spiffe://cluster.local/ns/istio-system/sa/ingress-gateway");
    let web_id = id("spiffe://cluster.local/ns/shop/sa/web");
    let mut tasks = Vec::new();

    let app = TcpListener::bind("127.0.0.1:0").await.expect("bind app");
    let app_port = app.local_addr().expect("addr").port();
    let release = Arc::new(Semaphore::new(0));
    tasks.push(tokio::spawn(serve_app_with(app, release.clone())));

    let tls = TlsSettings::default()
        .server_config(
            ca.issue(web_id.clone()),
            SpiffeVerifier::new(ca.bundle_set(), Authorize::AnyTrusted),
        )
        .expect("hbone tls");
    let hbone = TcpListener::bind("127.0.0.1:0").await.expect("bind hbone");
    let hbone_port = hbone.local_addr().expect("addr").port();
    let connects = Arc::new(Mutex::new(Vec::new()));
    let seen = connects.clone();
    let server = Server::new(
        ServerConfig::default(),
        SingleIdentity::new(tls),
        Forward::new().with_policy(move |req| {
            seen.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(req.headers.clone());
            true
        }),
    );
    tasks.push(tokio::spawn(async move {
        let _ = server.serve(hbone).await;
    }));

    let cert = rcgen::generate_simple_self_signed(vec![HOST.to_owned()]).expect("cert");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.cert.der().clone()).expect("root");
    let mut config = GatewayConfig {
        ingresses: meshkit_ingress_model::manifest::from_yaml_str(INGRESS).expect("ingress"),
        secrets: vec![TlsCertificate {
            namespace: "shop".into(),
            name: "shop-tls".into(),
            cert_pem: cert.cert.pem(),
            key_pem: cert.signing_key.serialize_pem(),
        }],
        mesh: MeshConfig {
            policies: Vec::new(),
            rejected_policies: Vec::new(),
            workloads: vec![Workload {
                authorization_policies: Vec::new(),
                name: "web-1".into(),
                namespace: "shop".into(),
                service_account: "web".into(),
                ip: "127.0.0.1".parse().expect("ip"),
                node: "node".into(),
                ports: vec![app_port].into(),
            }],
            services: vec![MeshService {
                name: "web".into(),
                namespace: "shop".into(),
                hostname: "web.shop.svc.cluster.local".into(),
                vip: None,
                ports: vec![ServicePort {
                    name: Some("http".into()),
                    port: 80,
                    target_port: app_port,
                }],
                endpoints: vec!["127.0.0.1".parse().expect("ip")],
            }],
        },
        ..GatewayConfig::default()
    };
    configure(&mut config);
    let prepared = config.clone();
    let initial = if empty {
        GatewayConfig::default()
    } else {
        config
    };
    let (config_tx, config_rx) = tokio::sync::watch::channel(initial);
    let client = Client::new(
        ClientConfig::default(),
        ca.issue(gateway_id.clone()),
        ca.bundle_set(),
    );
    let settings = tune(GatewaySettings::new(gateway_id).with_hbone_port(hbone_port));
    let gateway = Gateway::new(settings, client, config_rx);
    let http = TcpListener::bind("127.0.0.1:0").await.expect("bind http");
    let https = TcpListener::bind("127.0.0.1:0").await.expect("bind https");
    let (http_addr, https_addr) = (
        http.local_addr().expect("addr"),
        https.local_addr().expect("addr"),
    );
    let serve_http = gateway.clone().serve_http(http);
    tasks.push(tokio::spawn(async move {
        let _ = serve_http.await;
    }));
    let serve_https = gateway.clone().serve_https(https);
    tasks.push(tokio::spawn(async move {
        let _ = serve_https.await;
    }));
    Harness {
        http: http_addr,
        https: https_addr,
        roots: Arc::new(roots),
        gateway,
        config: config_tx,
        prepared,
        connects,
        release,
        tasks,
    }
}

/// The test app (see [`serve_app`] and its `/slow` paths) on `ip`, a free port: the port,
/// and the semaphore whose permits release its slow answers.
pub async fn app_on(ip: &str) -> (u16, Arc<Semaphore>, JoinHandle<()>) {
    let listener = TcpListener::bind((ip, 0)).await.expect("bind app");
    let port = listener.local_addr().expect("addr").port();
    let release = Arc::new(Semaphore::new(0));
    let task = tokio::spawn(serve_app_with(listener, release.clone()));
    (port, release, task)
}

/// Serves the gateway's admin endpoint on a loopback port; its address.
pub async fn admin(h: &mut Harness) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind admin");
    let addr = listener.local_addr().expect("addr");
    let admin = h.gateway.admin(meshkit_admin::Registry::default());
    h.tasks.push(tokio::spawn(async move {
        let _ = admin.serve(listener, std::future::pending()).await;
    }));
    addr
}

/// [`meshkit_test_support::http_get`] off the runtime's threads.
pub async fn admin_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || meshkit_test_support::http_get(addr, &path))
        .await
        .expect("admin request")
}

/// [`meshkit_test_support::scrape`] (a strict parse) off the runtime's threads.
pub async fn scrape(addr: SocketAddr) -> meshkit_test_support::openmetrics::Exposition {
    tokio::task::spawn_blocking(move || meshkit_test_support::scrape(addr))
        .await
        .expect("scrape")
}

/// The backend: reads the whole body and answers `got N` with the forwarding headers it saw
/// (`x-seen-xff`, `x-seen-forwarded`). `/big` answers 4 MiB, `/huge` [`HUGE`] bytes.
async fn serve_app(listener: TcpListener) {
    serve_app_with(listener, Arc::new(Semaphore::new(0))).await;
}

/// [`serve_app`], and also: the trace headers it saw (`x-seen-traceparent`,
/// `x-seen-tracestate`); `/slow` answers [`SLOW_FIRST`] at once and [`SLOW_REST`] once
/// `release` gives a permit; `/slow-head` waits for a permit before its head.
async fn serve_app_with(listener: TcpListener, release: Arc<Semaphore>) {
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            return;
        };
        let release = release.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let release = release.clone();
                async move {
                    let traceparent = req.headers().get("traceparent").cloned();
                    let tracestate = req.headers().get("tracestate").cloned();
                    match req.uri().path() {
                        "/slow" => {
                            let body = SlowBody::new(release);
                            let mut resp =
                                hyper::Response::new(http_body_util::Either::Right(body));
                            if let Some(v) = traceparent {
                                resp.headers_mut().insert("x-seen-traceparent", v);
                            }
                            return Ok::<_, hyper::Error>(resp);
                        }
                        "/slow-head" => {
                            if let Ok(permit) = release.acquire().await {
                                permit.forget();
                            }
                        }
                        _ => {}
                    }
                    let xff = req.headers().get("x-forwarded-for").cloned();
                    let forwarded = req.headers().get("forwarded").cloned();
                    let chunks = match req.uri().path() {
                        "/big" => (4 << 20) / CHUNK.len(),
                        "/huge" => HUGE / CHUNK.len(),
                        _ => 0,
                    };
                    if req.uri().path() == "/stall" {
                        // Reads nothing and never answers.
                        std::future::pending::<()>().await;
                    }
                    let body = req.into_body().collect().await?.to_bytes();
                    let answer = if chunks > 0 {
                        AppBody {
                            first: None,
                            chunks_left: chunks,
                        }
                    } else {
                        AppBody {
                            first: Some(Bytes::from(format!("got {}", body.len()))),
                            chunks_left: 0,
                        }
                    };
                    let mut resp = hyper::Response::new(http_body_util::Either::Left(answer));
                    if let Some(v) = xff {
                        resp.headers_mut().insert("x-seen-xff", v);
                    }
                    if let Some(v) = forwarded {
                        resp.headers_mut().insert("x-seen-forwarded", v);
                    }
                    if let Some(v) = traceparent {
                        resp.headers_mut().insert("x-seen-traceparent", v);
                    }
                    if let Some(v) = tracestate {
                        resp.headers_mut().insert("x-seen-tracestate", v);
                    }
                    Ok::<_, hyper::Error>(resp)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(sock), service)
                .await;
        });
    }
}

/// The length of the app's `/huge` answer: far more than the sockets between it and a
/// client hold.
pub const HUGE: usize = 64 << 20;

/// One chunk of the app's big answer, shared by all of them (the app holds no answer in
/// memory, so the memory the hostile tests see is the gateway's).
static CHUNK: [u8; 64 * 1024] = [b'x'; 64 * 1024];

/// The app's answer: a short text, or `chunks_left` times [`CHUNK`], made as it is sent.
struct AppBody {
    first: Option<Bytes>,
    chunks_left: usize,
}

impl hyper::body::Body for AppBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let data = match this.first.take() {
            Some(first) => first,
            None if this.chunks_left > 0 => {
                this.chunks_left -= 1;
                Bytes::from_static(&CHUNK)
            }
            None => return std::task::Poll::Ready(None),
        };
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(data))))
    }
}

/// The first part of the app's `/slow` answer, sent at once.
pub const SLOW_FIRST: &str = "first part;";

/// The rest of the app's `/slow` answer, sent once released.
pub const SLOW_REST: &str = "the rest, after a wait";

/// The app's `/slow` answer: [`SLOW_FIRST`], then [`SLOW_REST`] once its semaphore gives a
/// permit.
struct SlowBody {
    first: bool,
    wait: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>>,
}

impl SlowBody {
    fn new(release: Arc<Semaphore>) -> Self {
        Self {
            first: true,
            wait: Some(Box::pin(async move {
                if let Ok(permit) = release.acquire().await {
                    permit.forget();
                }
            })),
        }
    }
}

impl hyper::body::Body for SlowBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if this.first {
            this.first = false;
            return std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::from_static(
                SLOW_FIRST.as_bytes(),
            )))));
        }
        let Some(wait) = this.wait.as_mut() else {
            return std::task::Poll::Ready(None);
        };
        std::task::ready!(wait.as_mut().poll(cx));
        this.wait = None;
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::from_static(
            SLOW_REST.as_bytes(),
        )))))
    }
}

/// An answer as a client sees it.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: String,
}

/// [`request`], failing when no answer has come within [`PATIENCE`].
pub async fn request_in_time(addr: SocketAddr, req: http::Request<Full<Bytes>>) -> Answer {
    tokio::time::timeout(PATIENCE, request(addr, req))
        .await
        .expect("answered in time")
}

/// Writes `raw` on a new connection to `addr` and reads the answer's status line, failing
/// when none has come within [`PATIENCE`]; for requests a well-behaved client does not send.
pub async fn raw_status_line(addr: SocketAddr, raw: &[u8]) -> String {
    let mut sock = TcpStream::connect(addr).await.expect("connect");
    sock.write_all(raw).await.expect("request");
    let mut buf = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        let mut chunk = [0u8; 1024];
        while !buf.windows(2).any(|w| w == b"\r\n") {
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await
    .expect("a status line or the end in time");
    let text = String::from_utf8_lossy(&buf);
    text.lines().next().unwrap_or_default().to_owned()
}

/// One HTTP/1.1 request on a new connection to `addr`.
pub async fn request(addr: SocketAddr, req: http::Request<Full<Bytes>>) -> Answer {
    let sock = TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(sock))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let resp = send.send_request(req).await.expect("answer");
    into_answer(resp).await
}

async fn into_answer(resp: hyper::Response<Incoming>) -> Answer {
    let (parts, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// `GET /` for [`HOST`] with `headers`.
pub fn get(headers: &[(&str, &str)]) -> http::Request<Full<Bytes>> {
    let mut req = http::Request::get("/").header("host", HOST);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(Full::new(Bytes::new())).expect("request")
}

/// An honest `GET /` through the gateway's plain listener, answered by the backend.
pub async fn honest(addr: SocketAddr) {
    let answer = tokio::time::timeout(Duration::from_secs(10), request(addr, get(&[])))
        .await
        .expect("honest request answered in time");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body, "got 0");
}

/// An honest `GET /` over HTTP/2 with TLS, answered by the backend.
pub async fn honest_tls_h2(h: &Harness) {
    let tls = tls_connect(h, &[b"h2"]).await;
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("h2 handshake");
    tokio::spawn(conn);
    let req = http::Request::get(format!("https://{HOST}/"))
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = tokio::time::timeout(Duration::from_secs(10), send.send_request(req))
        .await
        .expect("in time")
        .expect("answer");
    let answer = into_answer(resp).await;
    assert_eq!(answer.status, 200, "{answer:?}");
}

/// A TLS connection to the HTTPS listener for [`HOST`], offering `alpn`.
pub async fn tls_connect(
    h: &Harness,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    tls_connect_to(h, h.https, alpn).await
}

/// A TLS connection to `addr` for [`HOST`], offering `alpn`, trusting the harness's roots.
pub async fn tls_connect_to(
    h: &Harness,
    addr: SocketAddr,
    alpn: &[&[u8]],
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut config =
        rustls::ClientConfig::builder_with_provider(meshkit_identity::default_provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(h.roots.clone())
            .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let sock = TcpStream::connect(addr).await.expect("connect");
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(HOST.try_into().expect("name"), sock)
        .await
        .expect("tls handshake")
}

/// Whether the gateway closes `io` within `within`, reading (and dropping) what it sends
/// meanwhile; writes `trickle`, one byte every `every`, while it waits.
pub async fn closed_within<IO>(io: IO, trickle: &[u8], every: Duration, within: Duration) -> bool
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let (mut r, mut w) = tokio::io::split(io);
    let deadline = Instant::now() + within;
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    let write = async {
        for b in trickle.iter().cycle() {
            if w.write_all(&[*b]).await.is_err() || w.flush().await.is_err() {
                // Written into a closed connection: wait for the read side to see it.
                return std::future::pending().await;
            }
            tokio::time::sleep(every).await;
        }
        std::future::pending().await
    };
    tokio::select! {
        () = read => true,
        () = write => false,
        () = tokio::time::sleep_until(deadline.into()) => false,
    }
}

/// The resident set of this process, in KiB (`VmRSS` in `/proc/self/status`).
pub fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

// === HTTP/2 frames, written by hand ===

/// The client preface and an empty SETTINGS frame.
pub fn h2_preface() -> Vec<u8> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out
}

/// A frame: type, flags, stream, payload.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("frame length");
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK block for `GET https://HOST/` (static-table indices, literal authority).
pub fn get_block() -> Vec<u8> {
    // :method GET (2), :scheme https (7), :path / (4), :authority literal (name index 1).
    let mut block = vec![
        0x82,
        0x87,
        0x84,
        0x01,
        u8::try_from(HOST.len()).expect("len"),
    ];
    block.extend_from_slice(HOST.as_bytes());
    block
}

/// HPACK literal headers `x-a: aaa...` (126-byte values), about `bytes` of them.
pub fn filler_block(bytes: usize) -> Vec<u8> {
    let mut block = Vec::with_capacity(bytes + 131);
    while block.len() < bytes {
        block.extend_from_slice(&[0x00, 0x03, b'x', b'-', b'a', 0x7e]);
        block.extend_from_slice(&[b'a'; 126]);
    }
    block
}

pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const CONTINUATION: u8 = 0x9;
