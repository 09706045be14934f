//! The node proxy as an operator sees it: exact Istio TCP metrics after known traffic,
//! readiness through start-up and drain, a drain that lets a tunnel finish (and resets one that
//! does not), the access log with the trace carried across, and the config dump.
//!
//! One node proxy carries both ends: workload `client-1` (`.11`) reaches service `web` through
//! the outbound listener (`.1`), whose endpoint `web-1` (`.12`) is local too, so each
//! connection is reported once as `source` (outbound) and once as `destination` (inbound).
//! Each test has its own `127.79.N.0/24`.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    BoxFuture, CaClient, CaError, CertificateRequest, RotationConfig, SpiffeId, SvidCache,
    TrustDomain,
};
use meshkit_mesh::{MeshConfig, MeshService, ServicePort, Workload};
use meshkit_node_proxy::admin::{AccessLog, Registry};
use meshkit_node_proxy::{InboundPolicy, NodeProxy, NodeProxyConfig, OutboundListener, Telemetry};
use meshkit_test_support::openmetrics::{Exposition, Sample};
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

const HBONE: u16 = 25008;
const NODE: &str = "node-a";
const HOST: &str = "web.shop.svc.cluster.local";
/// Bound on every wait for something that must happen.
const PATIENCE: Duration = Duration::from_secs(10);

fn td() -> TrustDomain {
    TrustDomain::new("cluster.local").unwrap()
}

fn ip(net: u8, last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 79, net, last))
}

fn id(sa: &str) -> SpiffeId {
    SpiffeId::from_istio(&td(), "shop", sa).unwrap()
}

/// An application that answers each byte `b` it reads with `b, !b` ([`answer`]) and ends its
/// answer when the request ends: the response is twice the request, so the two byte counters
/// differ, and it does not depend on how the bytes were chunked.
async fn doubling_app(ip: IpAddr) -> u16 {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0; 16 * 1024];
                loop {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if sock.write_all(&answer(&buf[..n])).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = sock.shutdown().await;
            });
        }
    });
    port
}

/// What [`doubling_app`] answers to `data`.
fn answer(data: &[u8]) -> Vec<u8> {
    data.iter().flat_map(|b| [*b, !*b]).collect()
}

fn workload(name: &str, sa: &str, addr: IpAddr) -> Workload {
    serde_json::from_value(serde_json::json!({
        "name": name, "namespace": "shop", "service_account": sa,
        "ip": addr.to_string(), "node": NODE,
    }))
    .unwrap()
}

fn mesh(net: u8, app: u16) -> MeshConfig {
    MeshConfig {
        policies: Vec::new(),
        rejected_policies: Vec::new(),
        workloads: vec![
            workload("client-1", "client", ip(net, 11)),
            workload("web-1", "web", ip(net, 12)),
        ],
        services: vec![MeshService {
            name: "web".into(),
            namespace: "shop".into(),
            hostname: HOST.into(),
            vip: None,
            ports: vec![ServicePort {
                name: None,
                port: 80,
                target_port: app,
            }],
            endpoints: vec![ip(net, 12)],
        }],
    }
}

/// One test's mesh: the node proxy, its admin endpoint, the app.
struct Mesh {
    net: u8,
    app: u16,
    proxy: Option<NodeProxy>,
    admin: SocketAddr,
    outbound: SocketAddr,
    certs: SvidCache,
    _mesh: watch::Sender<MeshConfig>,
}

impl Mesh {
    async fn start(net: u8, telemetry: Telemetry) -> Self {
        let app = doubling_app(ip(net, 12)).await;
        let ca = Arc::new(TestCa::new(td()));
        let admin = serve_admin(&telemetry).await;
        let config = NodeProxyConfig::new(NODE, td())
            .with_hbone_port(HBONE)
            .with_telemetry(telemetry)
            .with_outbound(OutboundListener::new(
                SocketAddr::new(ip(net, 1), 0),
                HOST,
                80,
            ));
        let (tx, rx) = watch::channel(mesh(net, app));
        let certs = SvidCache::new(ca.clone(), RotationConfig::default());
        let proxy = NodeProxy::start(config, rx, certs.clone(), ca.bundle_set())
            .await
            .unwrap();
        let outbound = proxy.outbound_addrs()[0];
        Self {
            net,
            app,
            proxy: Some(proxy),
            admin,
            outbound,
            certs,
            _mesh: tx,
        }
    }

    fn proxy(&self) -> &NodeProxy {
        self.proxy.as_ref().unwrap()
    }

    /// A connection to the outbound listener from the workload at `.last`.
    async fn connect_from(&self, last: u8) -> TcpStream {
        let sock = TcpSocket::new_v4().unwrap();
        sock.bind(SocketAddr::new(ip(self.net, last), 0)).unwrap();
        tokio::time::timeout(PATIENCE, sock.connect(self.outbound))
            .await
            .expect("connected in time")
            .unwrap()
    }

    /// Connects from the workload at `.last`, sends a few bytes and expects a reset (which may
    /// come before the connect completes).
    async fn expect_reset(&self, last: u8) {
        let sock = TcpSocket::new_v4().unwrap();
        sock.bind(SocketAddr::new(ip(self.net, last), 0)).unwrap();
        let connected = tokio::time::timeout(PATIENCE, sock.connect(self.outbound))
            .await
            .expect("connected in time");
        let mut sock = match connected {
            Ok(sock) => sock,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("connect: {e}"),
        };
        let _ = sock.write_all(b"hello").await;
        let mut buf = [0; 16];
        let end = tokio::time::timeout(PATIENCE, sock.read(&mut buf))
            .await
            .expect("refused in time");
        assert!(end.is_err(), "a refused connection is reset: {end:?}");
    }

    /// Sends `data` from `client-1`, ends the request, and returns the whole answer.
    async fn exchange(&self, data: &[u8]) -> Vec<u8> {
        let mut sock = self.connect_from(11).await;
        sock.write_all(data).await.unwrap();
        sock.shutdown().await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(PATIENCE, sock.read_to_end(&mut answer))
            .await
            .expect("answered in time")
            .unwrap();
        answer
    }
}

async fn serve_admin(telemetry: &Telemetry) -> SocketAddr {
    let admin = telemetry.admin(Registry::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(admin.serve(listener, std::future::pending()));
    addr
}

async fn get(addr: SocketAddr, path: &'static str) -> (u16, String) {
    tokio::task::spawn_blocking(move || meshkit_test_support::http_get(addr, path))
        .await
        .unwrap()
}

/// Scrapes `/metrics`; the strict parser must accept it.
async fn scrape(addr: SocketAddr) -> Exposition {
    tokio::task::spawn_blocking(move || meshkit_test_support::scrape(addr))
        .await
        .unwrap()
}

/// Polls `check` until it holds, failing with `what` after [`PATIENCE`].
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn samples<'a>(x: &'a Exposition, name: &str, labels: &[(&str, &str)]) -> Vec<&'a Sample> {
    x.samples
        .iter()
        .filter(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect()
}

/// Istio's labels of a connection from `client-1` to `web-1` through service `web`.
fn tcp_labels(reporter: &str, flags: &str) -> BTreeMap<String, String> {
    [
        ("reporter", reporter),
        ("source_workload", "client-1"),
        ("source_canonical_service", "client-1"),
        ("source_canonical_revision", "latest"),
        ("source_workload_namespace", "shop"),
        (
            "source_principal",
            "spiffe://cluster.local/ns/shop/sa/client",
        ),
        ("destination_service", HOST),
        ("destination_service_namespace", "shop"),
        ("destination_service_name", "web"),
        ("destination_workload", "web-1"),
        ("destination_canonical_service", "web-1"),
        ("destination_canonical_revision", "latest"),
        ("destination_workload_namespace", "shop"),
        (
            "destination_principal",
            "spiffe://cluster.local/ns/shop/sa/web",
        ),
        ("request_protocol", "tcp"),
        ("response_flags", flags),
        ("connection_security_policy", "mutual_tls"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// The one sample of `name` for `reporter`, whose labels must be exactly `labels`.
fn only(x: &Exposition, name: &str, reporter: &str, labels: &BTreeMap<String, String>) -> f64 {
    let found = samples(x, name, &[("reporter", reporter)]);
    assert_eq!(found.len(), 1, "{name} {reporter}: {found:?}");
    assert_eq!(&found[0].labels, labels, "{name} {reporter}");
    found[0].value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_after_two_connections_counts_them_exactly() {
    let m = Mesh::start(20, Telemetry::new()).await;
    let request = meshkit_test_support::pattern(1000);
    for _ in 0..2 {
        assert_eq!(m.exchange(&request).await, answer(&request));
    }
    let admin = m.admin;
    eventually(
        "both connections closed in both directions",
        || async move {
            scrape(admin)
                .await
                .sum("istio_tcp_connections_closed_total", &[])
                == 4.0
        },
    )
    .await;
    let x = scrape(m.admin).await;
    for reporter in ["source", "destination"] {
        let labels = tcp_labels(reporter, "-");
        for (name, value) in [
            ("istio_tcp_connections_opened_total", 2.0),
            ("istio_tcp_connections_closed_total", 2.0),
            ("istio_tcp_received_bytes_total", 2000.0),
            ("istio_tcp_sent_bytes_total", 4000.0),
        ] {
            assert_eq!(
                only(&x, name, reporter, &labels),
                value,
                "{name} {reporter}"
            );
        }
    }
    for family in [
        "istio_tcp_connections_opened",
        "istio_tcp_connections_closed",
        "istio_tcp_received_bytes",
        "istio_tcp_sent_bytes",
        "meshkit_node_proxy_hbone_connections_opened",
    ] {
        assert_eq!(
            x.types.get(family).map(String::as_str),
            Some("counter"),
            "{family}"
        );
    }
    for direction in ["inbound", "outbound"] {
        assert_eq!(
            x.value(
                "meshkit_node_proxy_tunnels_open",
                &[("direction", direction)]
            ),
            Some(0.0),
            "{direction}"
        );
    }
    // Both tunnels rode one pooled HBONE connection, which this node proxy also served.
    assert_eq!(
        x.value("meshkit_node_proxy_hbone_connections_opened_total", &[]),
        Some(1.0)
    );
    assert_eq!(
        x.value("meshkit_node_proxy_hbone_pooled_connections", &[]),
        Some(1.0)
    );
    assert_eq!(
        x.value("meshkit_node_proxy_inbound_hbone_connections", &[]),
        Some(1.0)
    );
    assert!(samples(&x, "meshkit_node_proxy_policy_denials_total", &[]).is_empty());
    for sa in ["client", "web"] {
        let svid = m.certs.current(&id(sa)).expect("certificate held");
        let expiry = svid
            .not_after()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as f64;
        assert_eq!(
            x.value(
                "meshkit_node_proxy_certificate_expiry_timestamp_seconds",
                &[("identity", id(sa).as_str())]
            ),
            Some(expiry),
            "{sa}"
        );
    }
    assert_eq!(
        x.value("meshkit_build", &[("component", "node-proxy")]),
        Some(1.0)
    );
    // The same text at Istio's other path.
    let (status, body) = get(m.admin, "/stats/prometheus").await;
    assert_eq!(status, 200);
    meshkit_test_support::openmetrics::parse(&body).expect("strict parse");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_counted_with_their_reason_and_flag() {
    let m = Mesh::start(21, Telemetry::new()).await;
    m.proxy()
        .set_policy(InboundPolicy::any().deny(id("client")));
    m.expect_reset(11).await;
    // Only identities on the allow list, which the client is not on.
    m.proxy()
        .set_policy(InboundPolicy::any().allow(id("gateway")));
    m.expect_reset(11).await;
    // A source that is no workload of the mesh has no route at all.
    m.expect_reset(13).await;

    let admin = m.admin;
    eventually("every refusal recorded", || async move {
        scrape(admin)
            .await
            .sum("istio_tcp_connections_closed_total", &[])
            == 5.0
    })
    .await;
    let x = scrape(m.admin).await;
    assert_eq!(
        x.value(
            "meshkit_node_proxy_policy_denials_total",
            &[("reason", "denied_identity")]
        ),
        Some(1.0)
    );
    assert_eq!(
        x.value(
            "meshkit_node_proxy_policy_denials_total",
            &[("reason", "not_allowed_identity")]
        ),
        Some(1.0)
    );
    assert_eq!(
        samples(&x, "meshkit_node_proxy_policy_denials_total", &[]).len(),
        2
    );
    // The destination refused with 403 (DENY); the source found no endpoint that would take
    // the tunnel (CONNECT). Both counted the connection as opened with no flag.
    let deny = tcp_labels("destination", "DENY");
    assert_eq!(
        only(
            &x,
            "istio_tcp_connections_closed_total",
            "destination",
            &deny
        ),
        2.0
    );
    let connect = tcp_labels("source", "CONNECT");
    let closed = samples(
        &x,
        "istio_tcp_connections_closed_total",
        &[("reporter", "source"), ("response_flags", "CONNECT")],
    );
    assert_eq!(closed.len(), 1);
    assert_eq!(closed[0].labels, connect);
    assert_eq!(closed[0].value, 2.0);
    let no_route = samples(
        &x,
        "istio_tcp_connections_closed_total",
        &[("reporter", "source"), ("response_flags", "NR")],
    );
    assert_eq!(no_route.len(), 1);
    assert_eq!(no_route[0].labels["source_principal"], "unknown");
    assert_eq!(no_route[0].labels["source_workload"], "unknown");
    assert_eq!(no_route[0].labels["destination_principal"], "unknown");
    assert_eq!(no_route[0].labels["destination_service"], HOST);
    assert_eq!(
        x.sum(
            "istio_tcp_connections_opened_total",
            &[("response_flags", "-")]
        ),
        5.0
    );
    // No byte moved.
    assert!(samples(&x, "istio_tcp_received_bytes_total", &[]).is_empty());
    assert!(samples(&x, "istio_tcp_sent_bytes_total", &[]).is_empty());
}

/// A CA that signs only once `open` is true, and says on `asked` when it was first asked.
struct GatedCa {
    inner: TestCa,
    open: watch::Sender<bool>,
    asked: watch::Sender<bool>,
}

impl CaClient for GatedCa {
    fn sign<'a>(
        &'a self,
        request: &'a CertificateRequest,
    ) -> BoxFuture<'a, Result<Vec<CertificateDer<'static>>, CaError>> {
        Box::pin(async move {
            self.asked.send_replace(true);
            let mut open = self.open.subscribe();
            let _ = open.wait_for(|open| *open).await;
            self.inner.sign(request).await
        })
    }
}

async fn readiness(admin: SocketAddr) -> (u16, String) {
    let answer = get(admin, "/healthz/ready").await;
    // Every scrape parses, whatever the state.
    scrape(admin).await;
    answer
}

async fn wait_readiness(admin: SocketAddr, status: u16, body: &'static str) {
    eventually(&format!("readiness {status} {body:?}"), || async move {
        readiness(admin).await == (status, body.to_owned())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_goes_503_then_200_then_503_through_start_up_and_drain() {
    let net = 22;
    let app = doubling_app(ip(net, 12)).await;
    let ca = Arc::new(GatedCa {
        inner: TestCa::new(td()),
        open: watch::Sender::new(false),
        asked: watch::Sender::new(false),
    });
    let telemetry = Telemetry::new();
    let admin = serve_admin(&telemetry).await;
    assert_eq!(
        readiness(admin).await,
        (
            503,
            "not ready: waiting for certificates; waiting for the first xDS state; waiting for listeners\n"
                .to_owned()
        )
    );

    // As over xDS: the channel starts empty, and the first state comes later.
    let config = NodeProxyConfig::new(NODE, td())
        .with_hbone_port(HBONE)
        .with_telemetry(telemetry)
        .waiting_for_first_mesh();
    let (tx, rx) = watch::channel(MeshConfig::default());
    let certs = SvidCache::new(ca.clone(), RotationConfig::default());
    let proxy = tokio::time::timeout(
        PATIENCE,
        NodeProxy::start(config, rx, certs, ca.inner.bundle_set()),
    )
    .await
    .expect("started in time")
    .unwrap();
    assert_eq!(
        readiness(admin).await,
        (
            503,
            "not ready: waiting for the first xDS state\n".to_owned()
        )
    );

    tx.send_replace(mesh(net, app));
    tokio::time::timeout(PATIENCE, ca.asked.subscribe().wait_for(|asked| *asked))
        .await
        .expect("the CA was asked in time")
        .unwrap();
    wait_readiness(
        admin,
        503,
        "not ready: waiting for certificates; waiting for listeners\n",
    )
    .await;

    ca.open.send_replace(true);
    wait_readiness(admin, 200, "ready\n").await;
    assert_eq!(proxy.inbound_addrs().len(), 2);

    let drain = tokio::spawn(proxy.drain(PATIENCE));
    wait_readiness(admin, 503, "not ready: draining\n").await;
    let drained = tokio::time::timeout(PATIENCE, drain)
        .await
        .expect("drained in time")
        .unwrap();
    assert_eq!(drained.reset, 0);
    assert_eq!(
        readiness(admin).await,
        (503, "not ready: draining\n".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_in_flight_at_the_drain_completes_byte_exact() {
    let mut m = Mesh::start(23, Telemetry::new()).await;
    let data = meshkit_test_support::pattern(256 * 1024);
    let (first, rest) = data.split_at(100 * 1024);
    let mut sock = m.connect_from(11).await;
    sock.write_all(first).await.unwrap();
    let mut got = vec![0; 2 * first.len()];
    tokio::time::timeout(PATIENCE, sock.read_exact(&mut got))
        .await
        .expect("first half answered in time")
        .unwrap();

    let proxy = m.proxy.take().unwrap();
    let drain = tokio::spawn(proxy.drain(PATIENCE));
    wait_readiness(m.admin, 503, "not ready: draining\n").await;
    // No new connections, outbound or inbound...
    let (outbound, hbone) = (m.outbound, SocketAddr::new(ip(m.net, 12), HBONE));
    eventually("the listeners closed", || async move {
        TcpStream::connect(outbound).await.is_err() && TcpStream::connect(hbone).await.is_err()
    })
    .await;
    // ...while the open one carries the rest of its bytes.
    sock.write_all(rest).await.unwrap();
    sock.shutdown().await.unwrap();
    tokio::time::timeout(PATIENCE, sock.read_to_end(&mut got))
        .await
        .expect("the rest answered in time")
        .expect("the tunnel ended cleanly");
    assert_eq!(got.len(), 2 * data.len());
    assert!(
        got == answer(&data),
        "the answer differs from what was sent"
    );

    let drained = tokio::time::timeout(PATIENCE, drain)
        .await
        .expect("drained in time")
        .unwrap();
    assert_eq!(drained.reset, 0, "the tunnel finished before the deadline");
    let admin = m.admin;
    eventually("the tunnel recorded in both directions", || async move {
        scrape(admin).await.sum(
            "istio_tcp_connections_closed_total",
            &[("response_flags", "-")],
        ) == 2.0
    })
    .await;
    let x = scrape(m.admin).await;
    for reporter in ["source", "destination"] {
        let labels = tcp_labels(reporter, "-");
        assert_eq!(
            only(&x, "istio_tcp_received_bytes_total", reporter, &labels),
            data.len() as f64
        );
        assert_eq!(
            only(&x, "istio_tcp_sent_bytes_total", reporter, &labels),
            2.0 * data.len() as f64
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_still_open_at_the_drain_deadline_is_reset() {
    let mut m = Mesh::start(24, Telemetry::new()).await;
    let mut sock = m.connect_from(11).await;
    sock.write_all(b"ping").await.unwrap();
    let mut got = [0; 8];
    tokio::time::timeout(PATIENCE, sock.read_exact(&mut got))
        .await
        .expect("answered in time")
        .unwrap();
    assert_eq!(got.as_slice(), answer(b"ping"));

    // The client keeps the tunnel open past the deadline.
    let drained = tokio::time::timeout(
        PATIENCE,
        m.proxy.take().unwrap().drain(Duration::from_millis(300)),
    )
    .await
    .expect("drain returns after its deadline");
    assert_eq!(drained.reset, 2, "one outbound and one inbound tunnel");
    let mut buf = [0; 8];
    let end = tokio::time::timeout(PATIENCE, sock.read(&mut buf))
        .await
        .expect("reset in time");
    assert!(end.is_err(), "the client sees a reset, not an end: {end:?}");
    let admin = m.admin;
    eventually(
        "both ends recorded as reset by the node proxy",
        || async move {
            let x = scrape(admin).await;
            x.sum(
                "istio_tcp_connections_closed_total",
                &[("response_flags", "LR")],
            ) == 2.0
        },
    )
    .await;
    let x = scrape(m.admin).await;
    for reporter in ["source", "destination"] {
        assert_eq!(
            only(
                &x,
                "istio_tcp_connections_closed_total",
                reporter,
                &tcp_labels(reporter, "LR")
            ),
            1.0
        );
        let opened = samples(
            &x,
            "istio_tcp_connections_opened_total",
            &[("reporter", reporter)],
        );
        assert_eq!(opened.len(), 1);
        assert_eq!(opened[0].labels, tcp_labels(reporter, "-"));
    }
    for direction in ["inbound", "outbound"] {
        assert_eq!(
            x.value(
                "meshkit_node_proxy_tunnels_open",
                &[("direction", direction)]
            ),
            Some(0.0)
        );
    }
}

/// Collects what a `tracing` subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }

    /// The access-log lines so far: (the line as written, its JSON object).
    fn access_lines(&self) -> Vec<(String, serde_json::Value)> {
        self.text()
            .lines()
            .filter_map(|line| {
                let (_, json) = line.split_once(" meshkit::access: ")?;
                Some((
                    line.to_owned(),
                    serde_json::from_str(json).expect("a JSON line"),
                ))
            })
            .collect()
    }
}

// The current-thread runtime runs every task on this thread, which the subscriber set here
// therefore sees.
#[tokio::test]
async fn each_connection_is_access_logged_once_each_way_with_its_trace() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let m = Mesh::start(25, Telemetry::new().with_access_log(AccessLog::json())).await;
    let mut sock = m.connect_from(11).await;
    let client = sock.local_addr().unwrap();
    let request = meshkit_test_support::pattern(1000);
    sock.write_all(&request).await.unwrap();
    sock.shutdown().await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(PATIENCE, sock.read_to_end(&mut got))
        .await
        .expect("answered in time")
        .unwrap();
    assert_eq!(got, answer(&request));
    let lines = captured.clone();
    eventually("two access-log lines", || {
        let n = lines.access_lines().len();
        async move { n >= 2 }
    })
    .await;
    let lines = captured.access_lines();
    assert_eq!(lines.len(), 2, "one line per direction: {lines:?}");
    let by_direction = |d: &str| {
        lines
            .iter()
            .find(|(_, v)| v["direction"] == d)
            .unwrap_or_else(|| panic!("no {d} line: {lines:?}"))
            .clone()
    };
    let (_, outbound) = by_direction("outbound");
    let (inbound_line, inbound) = by_direction("inbound");
    let trace_id = outbound["trace_id"].as_str().unwrap().to_owned();
    assert_eq!(trace_id.len(), 32, "{trace_id}");
    assert!(trace_id.bytes().all(|b| b.is_ascii_hexdigit()));
    for line in [&outbound, &inbound] {
        assert_eq!(line["src"], client.to_string(), "{line}");
        assert_eq!(
            line["src_identity"],
            "spiffe://cluster.local/ns/shop/sa/client"
        );
        assert_eq!(line["src_workload"], "client-1");
        assert_eq!(line["src_namespace"], "shop");
        assert_eq!(line["dst"], SocketAddr::new(ip(25, 12), m.app).to_string());
        assert_eq!(
            line["dst_identity"],
            "spiffe://cluster.local/ns/shop/sa/web"
        );
        assert_eq!(line["dst_workload"], "web-1");
        assert_eq!(line["dst_namespace"], "shop");
        assert_eq!(line["dst_service"], HOST);
        assert_eq!(line["bytes_received"], 1000, "{line}");
        assert_eq!(line["bytes_sent"], 2000, "{line}");
        assert_eq!(line["flags"], "-");
        // The inbound side read the trace from the CONNECT's traceparent.
        assert_eq!(line["trace_id"], trace_id.as_str(), "{line}");
        assert!(line["duration_ms"].is_u64());
    }
    // The inbound span holds the traceparent it received.
    assert!(
        inbound_line.contains(&format!("traceparent=00-{trace_id}-")),
        "{inbound_line}"
    );

    // A refused connection gets its line too, with the flag.
    m.expect_reset(13).await;
    let lines = captured.clone();
    eventually("the refusal's line", || {
        let n = lines.access_lines().len();
        async move { n >= 3 }
    })
    .await;
    let (_, refused) = captured.access_lines().pop().unwrap();
    assert_eq!(refused["direction"], "outbound");
    assert_eq!(refused["flags"], "NR");
    assert_eq!(refused["src_identity"], "unknown");
    assert_eq!(refused["dst"], "-");
    assert_eq!(refused["bytes_sent"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_dump_shows_the_mesh_listeners_and_certificates_never_keys() {
    let m = Mesh::start(26, Telemetry::new()).await;
    let (status, body) = get(m.admin, "/config_dump").await;
    assert_eq!(status, 200);
    assert!(
        !body.contains("PRIVATE") && !body.contains("BEGIN"),
        "{body}"
    );
    let dump: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(dump["running"], true);
    assert_eq!(dump["node"], NODE);
    assert_eq!(dump["trust_domain"], "cluster.local");
    assert_eq!(dump["readiness"]["ready"], true);
    assert_eq!(dump["draining"], false);
    let workloads = dump["workloads"].as_array().unwrap();
    assert_eq!(workloads.len(), 2);
    assert!(workloads.iter().all(|w| w["local"] == true));
    assert_eq!(dump["services"][0]["hostname"], HOST);
    assert_eq!(
        dump["listeners"]["outbound"][0]["bound"],
        m.outbound.to_string()
    );
    assert_eq!(dump["listeners"]["outbound"][0]["service"], HOST);
    assert_eq!(dump["listeners"]["outbound"][0]["port"], 80);
    let mut inbound: Vec<String> = dump["listeners"]["inbound"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    inbound.sort();
    assert_eq!(
        inbound,
        [
            SocketAddr::new(ip(26, 11), HBONE).to_string(),
            SocketAddr::new(ip(26, 12), HBONE).to_string()
        ]
    );
    assert_eq!(dump["policy"]["allow"], serde_json::Value::Null);
    assert_eq!(dump["policy"]["deny"], serde_json::json!([]));
    let certificates = dump["certificates"].as_array().unwrap();
    assert_eq!(certificates.len(), 2);
    for (cert, sa) in certificates.iter().zip(["client", "web"]) {
        assert_eq!(cert["identity"], id(sa).as_str());
        let svid = m.certs.current(&id(sa)).unwrap();
        let not_after = svid
            .not_after()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert_eq!(cert["not_after"], not_after);
        assert!(cert["expires_in_seconds"].as_u64().unwrap() > 0);
    }
    m.proxy()
        .set_policy(InboundPolicy::any().deny(id("intruder")));
    let dump = m.proxy().telemetry().config_dump();
    assert_eq!(
        dump["policy"]["deny"],
        serde_json::json!(["spiffe://cluster.local/ns/shop/sa/intruder"])
    );
}
