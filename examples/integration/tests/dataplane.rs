//! The data plane end to end on loopback: echo apps behind two node proxies, the gateway in
//! front, curl (or a hyper client) as the user.
//!
//! Each test uses its own `127.77.N.0/24` so tests can run in parallel: `.1` node A, `.2` node
//! B, `.3` the gateway, `.1x` workloads.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use meshkit_demo::{EchoReply, serve_echo};
use meshkit_gateway::{Gateway, GatewayConfig, GatewaySettings, TlsCertificate};
use meshkit_hbone::{Client, ClientConfig, Target};
use meshkit_identity::test_util::TestCa;
use meshkit_identity::{RotationConfig, SpiffeId, SvidCache, TrustDomain};
use meshkit_ingress_model::{Ingress, manifest};
use meshkit_mesh::{MeshConfig, MeshService, ServicePort, Workload};
use meshkit_node_proxy::{InboundPolicy, NodeProxy, NodeProxyConfig, OutboundListener};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const APP_PORT: u16 = 8080;
/// Bound on every wait for something that must happen: far above what it needs, so that a
/// loaded machine does not fail it.
const PATIENCE: Duration = Duration::from_secs(20);

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
      - {path: /api, pathType: Prefix, backend: {service: {name: api, port: {name: http}}}}
      - {path: /exact, pathType: Exact, backend: {service: {name: api, port: {number: 80}}}}
  - host: "*.apps.example.com"
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: api, port: {number: 80}}}}
"#;

const DEFAULT_BACKEND: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: fallback, namespace: shop}
spec:
  defaultBackend: {service: {name: fallback, port: {number: 80}}}
"#;

/// Everything of one test's mesh.
struct Mesh {
    net: u8,
    td: TrustDomain,
    ca: Arc<TestCa>,
    mesh_tx: watch::Sender<MeshConfig>,
    gateway_tx: watch::Sender<GatewayConfig>,
    node_a: Option<NodeProxy>,
    node_b: Option<NodeProxy>,
    gateway_http: SocketAddr,
    gateway_https: SocketAddr,
    tls_cert_pem: String,
    _apps: Vec<JoinHandle<()>>,
    _gateway: Vec<JoinHandle<std::io::Result<()>>>,
}

/// The gateway's idle timeout for pooled backend connections in these tests.
const BACKEND_IDLE: Duration = Duration::from_secs(2);

fn ip(net: u8, host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 77, net, host))
}

fn workload(net: u8, name: &str, sa: &str, host: u8, node: &str) -> Workload {
    Workload {
        authorization_policies: Vec::new(),
        name: name.into(),
        namespace: "shop".into(),
        service_account: sa.into(),
        ip: ip(net, host),
        node: node.into(),
        ports: Some(vec![APP_PORT]),
    }
}

fn service(name: &str, endpoints: Vec<IpAddr>) -> MeshService {
    MeshService {
        name: name.into(),
        namespace: "shop".into(),
        hostname: format!("{name}.shop.svc.cluster.local"),
        vip: None,
        ports: vec![ServicePort {
            name: Some("http".into()),
            port: 80,
            target_port: APP_PORT,
        }],
        endpoints,
    }
}

fn mesh_config(net: u8) -> MeshConfig {
    MeshConfig {
        policies: Vec::new(),
        rejected_policies: Vec::new(),
        workloads: vec![
            workload(net, "web-1", "web", 11, "node-b"),
            workload(net, "web-2", "web", 12, "node-b"),
            workload(net, "api-1", "api", 13, "node-a"),
            workload(net, "fallback-1", "fallback", 14, "node-a"),
            workload(net, "client", "client", 21, "node-a"),
            workload(net, "intruder", "intruder", 22, "node-a"),
        ],
        services: vec![
            service("web", vec![ip(net, 11), ip(net, 12)]),
            service("api", vec![ip(net, 13)]),
            service("fallback", vec![ip(net, 14)]),
        ],
    }
}

fn ingresses(with_default: bool) -> Vec<Ingress> {
    let mut all = manifest::from_yaml_str(INGRESS).expect("ingress yaml");
    if with_default {
        all.extend(manifest::from_yaml_str(DEFAULT_BACKEND).expect("default backend yaml"));
    }
    all
}

fn id(td: &TrustDomain, ns: &str, sa: &str) -> SpiffeId {
    SpiffeId::from_istio(td, ns, sa).expect("istio id")
}

impl Mesh {
    async fn start(net: u8) -> Mesh {
        let td = TrustDomain::new("cluster.local").expect("trust domain");
        let ca = Arc::new(TestCa::new(td.clone()));
        let mesh = mesh_config(net);
        let (mesh_tx, _) = watch::channel(mesh.clone());

        let mut apps = Vec::new();
        for w in &mesh.workloads {
            let listener = TcpListener::bind(SocketAddr::new(w.ip, APP_PORT))
                .await
                .expect("bind app");
            apps.push(tokio::spawn(serve_echo(listener, w.name.clone())));
        }

        let node_a = start_node(&td, &ca, net, "node-a", mesh_tx.subscribe()).await;
        let node_b = start_node(&td, &ca, net, "node-b", mesh_tx.subscribe()).await;

        let tls = rcgen::generate_simple_self_signed(vec!["shop.example.com".to_owned()])
            .expect("tls cert");
        let tls_cert_pem = tls.cert.pem();
        let gateway_config = GatewayConfig {
            ingresses: ingresses(false),
            secrets: vec![TlsCertificate {
                namespace: "shop".into(),
                name: "shop-tls".into(),
                cert_pem: tls_cert_pem.clone(),
                key_pem: tls.signing_key.serialize_pem(),
            }],
            mesh,
            ..GatewayConfig::default()
        };
        let (gateway_tx, gateway_rx) = watch::channel(gateway_config);
        let gw_id = id(&td, "ingress", "gateway");
        let client = Client::new(
            meshkit_cli::hbone_client_config(),
            ca.issue(gw_id.clone()),
            ca.bundle_set(),
        );
        // A short idle timeout for pooled backend connections, so that a test can see it.
        let settings = GatewaySettings::new(gw_id).with_backend_idle_timeout(BACKEND_IDLE);
        let gateway = Gateway::new(settings, client, gateway_rx);
        let http = TcpListener::bind(SocketAddr::new(ip(net, 3), 0))
            .await
            .expect("bind gateway");
        let https = TcpListener::bind(SocketAddr::new(ip(net, 3), 0))
            .await
            .expect("bind gateway tls");
        let gateway_http = http.local_addr().expect("addr");
        let gateway_https = https.local_addr().expect("addr");
        let gw = vec![
            tokio::spawn(gateway.clone().serve_http(http)),
            tokio::spawn(gateway.serve_https(https)),
        ];
        Mesh {
            net,
            td,
            ca,
            mesh_tx,
            gateway_tx,
            node_a: Some(node_a),
            node_b: Some(node_b),
            gateway_http,
            gateway_https,
            tls_cert_pem,
            _apps: apps,
            _gateway: gw,
        }
    }

    fn url(&self, host: &str, path: &str) -> String {
        format!("http://{host}:{}{path}", self.gateway_http.port())
    }

    /// curl through the gateway's plain listener: (status, body).
    async fn get(&self, host: &str, path: &str, extra: &[&str]) -> (u16, String) {
        let resolve = format!("{host}:{}:{}", self.gateway_http.port(), ip(self.net, 3));
        let mut args = vec!["--resolve".to_owned(), resolve, self.url(host, path)];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        curl(args).await
    }
}

async fn start_node(
    td: &TrustDomain,
    ca: &Arc<TestCa>,
    net: u8,
    node: &str,
    mesh: watch::Receiver<MeshConfig>,
) -> NodeProxy {
    let certs = SvidCache::new(ca.clone(), RotationConfig::default());
    let node_ip = ip(net, if node == "node-a" { 1 } else { 2 });
    let intruder = id(td, "shop", "intruder");
    let config = NodeProxyConfig::new(node, td.clone())
        .with_outbound(OutboundListener::new(
            SocketAddr::new(node_ip, 0),
            "web.shop.svc.cluster.local",
            80,
        ))
        .with_policy(InboundPolicy::any().deny(intruder));
    NodeProxy::start(config, mesh, certs, ca.bundle_set())
        .await
        .expect("node proxy starts")
}

/// Runs curl with `-sS` and a timeout, returning the status and the body.
async fn curl(args: Vec<String>) -> (u16, String) {
    let output = tokio::task::spawn_blocking(move || {
        Command::new("curl")
            .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"])
            .args(&args)
            .output()
    })
    .await
    .expect("curl task")
    .expect("curl runs (is it installed?)");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, status) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
    let status = status.trim().parse().unwrap_or(0);
    if status == 0 {
        eprintln!("curl failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    (status, body.to_owned())
}

/// One GET on a new HTTP/1.1 connection to `addr` from this process (no curl: the idle
/// timer tests below want requests that take milliseconds): (status, body).
async fn hyper_get(addr: SocketAddr, host: &str, path: &str) -> (u16, String) {
    use http_body_util::BodyExt;
    tokio::time::timeout(PATIENCE, async {
        let sock = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connect gateway");
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(sock))
                .await
                .expect("handshake");
        tokio::spawn(conn);
        let req = hyper::Request::get(path)
            .header("host", host)
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .expect("request");
        let resp = send.send_request(req).await.expect("answer");
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    })
    .await
    .expect("answered in time")
}

/// `client.open(target)` within [`PATIENCE`].
async fn open_in_time(
    client: &Client,
    target: Target,
) -> Result<meshkit_hbone::Tunnel, meshkit_hbone::Error> {
    tokio::time::timeout(PATIENCE, client.open(target))
        .await
        .expect("the tunnel opened or was refused in time")
}

/// Reads `io` to its end within [`PATIENCE`]: what arrived, and how it ended.
async fn read_to_end_in_time(
    io: &mut (impl tokio::io::AsyncRead + Unpin),
) -> (Vec<u8>, std::io::Result<usize>) {
    let mut got = Vec::new();
    let end = tokio::time::timeout(PATIENCE, io.read_to_end(&mut got))
        .await
        .expect("the stream ended (EOF or an error) in time");
    (got, end)
}

fn reply(body: &str) -> EchoReply {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not an echo reply ({e}): {body:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_semantics_through_gateway_and_hbone() {
    let mesh = Mesh::start(1).await;

    // Prefix `/` on the exact host: web, round-robin over both endpoints.
    let mut names = std::collections::BTreeSet::new();
    for _ in 0..4 {
        let (status, body) = mesh.get("shop.example.com", "/cart", &[]).await;
        assert_eq!(status, 200, "{body}");
        let r = reply(&body);
        assert_eq!(r.path, "/cart");
        names.insert(r.name);
    }
    assert_eq!(names, ["web-1", "web-2"].map(String::from).into());

    // Prefix `/api` (port by name), element-wise: `/api/v1` yes, `/apiary` no.
    let (status, body) = mesh.get("shop.example.com", "/api/v1?x=1", &[]).await;
    assert_eq!(status, 200);
    let r = reply(&body);
    assert_eq!((r.name.as_str(), r.path.as_str()), ("api-1", "/api/v1?x=1"));
    let (_, body) = mesh.get("shop.example.com", "/apiary", &[]).await;
    assert!(reply(&body).name.starts_with("web-"));

    // Exact.
    let (_, body) = mesh.get("shop.example.com", "/exact", &[]).await;
    assert_eq!(reply(&body).name, "api-1");
    let (_, body) = mesh.get("shop.example.com", "/exact/more", &[]).await;
    assert!(reply(&body).name.starts_with("web-"));

    // Wildcard host: one label only.
    let (status, body) = mesh.get("eu.apps.example.com", "/", &[]).await;
    assert_eq!(status, 200);
    assert_eq!(reply(&body).name, "api-1");
    let (status, _) = mesh.get("a.b.apps.example.com", "/", &[]).await;
    assert_eq!(status, 404);

    // Nothing matches: 404.
    let (status, _) = mesh.get("other.example.com", "/", &[]).await;
    assert_eq!(status, 404);

    // Forwarding headers name the client.
    let (_, body) = mesh.get("shop.example.com", "/h", &[]).await;
    let r = reply(&body);
    let client_ip = "127.0.0.1";
    assert_eq!(
        r.headers.get("x-forwarded-for").map(String::as_str),
        Some(client_ip)
    );
    let forwarded = r.headers.get("forwarded").cloned().unwrap_or_default();
    assert!(forwarded.contains("for=127.0.0.1"), "{forwarded}");
    assert!(forwarded.contains("proto=http"), "{forwarded}");
    assert_eq!(
        r.headers.get("host").map(String::as_str),
        Some(&*format!("shop.example.com:{}", mesh.gateway_http.port()))
    );
    assert_eq!(r.version, "HTTP/1.1");

    // Default backend, added by a configuration update.
    let mut config = mesh.gateway_tx.borrow().clone();
    config.ingresses = ingresses(true);
    mesh.gateway_tx.send_replace(config);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, body) = mesh.get("other.example.com", "/", &[]).await;
        if status == 200 {
            assert_eq!(reply(&body).name, "fallback-1");
            break;
        }
        assert_eq!(status, 404, "before the update applies: {body}");
        assert!(
            Instant::now() < deadline,
            "default backend not applied after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Rules still win over the default backend.
    let (_, body) = mesh.get("shop.example.com", "/api", &[]).await;
    assert_eq!(reply(&body).name, "api-1");

    // Backend connections are reused: more requests to api-1, through new client
    // connections, open at most one more tunnel to it.
    let gateway = id(&mesh.td, "ingress", "gateway");
    let api1 = (gateway.clone(), SocketAddr::new(ip(mesh.net, 13), APP_PORT));
    let node_a = mesh.node_a.as_ref().expect("node a");
    let tunnels_to_api1 = || node_a.accepted_tunnels().get(&api1).copied().unwrap_or(0);
    let before = tunnels_to_api1();
    for _ in 0..5 {
        let (status, body) = hyper_get(mesh.gateway_http, "shop.example.com", "/api").await;
        assert_eq!((status, reply(&body).name.as_str()), (200, "api-1"));
    }
    let after = tunnels_to_api1();
    assert!(
        after - before <= 1,
        "{} tunnels for 5 requests",
        after - before
    );
    // Left idle past the timeout, the pooled connections are closed: the next request needs
    // a tunnel of its own. A loaded machine may run the idle timer late, and a request that
    // finds the connection still pooled uses it (and starts its idle time over), so wait
    // again, a few times at most.
    let mut later = after;
    for _ in 0..5 {
        tokio::time::sleep(BACKEND_IDLE + Duration::from_secs(1)).await;
        let (status, body) = hyper_get(mesh.gateway_http, "shop.example.com", "/api").await;
        assert_eq!((status, reply(&body).name.as_str()), (200, "api-1"));
        later = tunnels_to_api1();
        if later > after {
            break;
        }
    }
    assert_eq!(
        later - after,
        1,
        "a pooled connection outlived its idle timeout five times over"
    );
    // Idle spells much shorter than the timeout, over more than one timeout in all, keep
    // that one connection: the timer of an earlier spell does not close it.
    for _ in 0..5 {
        tokio::time::sleep(BACKEND_IDLE / 4).await;
        let (status, body) = hyper_get(mesh.gateway_http, "shop.example.com", "/api").await;
        assert_eq!((status, reply(&body).name.as_str()), (200, "api-1"));
    }
    let last = tunnels_to_api1();
    assert_eq!(
        last, later,
        "a connection in use was closed by an idle timer"
    );

    // Node B admitted the gateway's verified identity to both web workloads.
    let accepted = mesh.node_b.as_ref().expect("node b").accepted_tunnels();
    for host in [11, 12] {
        let key = (
            gateway.clone(),
            SocketAddr::new(ip(mesh.net, host), APP_PORT),
        );
        assert!(accepted.get(&key).is_some_and(|n| *n >= 1), "{accepted:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_prior_knowledge_and_https_with_sni() {
    let mesh = Mesh::start(2).await;

    let (status, body) = mesh
        .get("shop.example.com", "/api/h2", &["--http2-prior-knowledge"])
        .await;
    assert_eq!(status, 200, "{body}");
    let r = reply(&body);
    assert_eq!(r.name, "api-1");
    // Inside the tunnel the gateway speaks HTTP/1.1.
    assert_eq!(r.version, "HTTP/1.1");

    // A request body crosses HTTP/2 -> HBONE -> HTTP/1.1.
    let (status, body) = mesh
        .get(
            "shop.example.com",
            "/api/post",
            &["--http2-prior-knowledge", "--data-binary", "hello over h2"],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let r = reply(&body);
    assert_eq!(
        (r.method.as_str(), r.body.as_str()),
        ("POST", "hello over h2")
    );

    let dir = std::env::temp_dir().join(format!("meshkit-dataplane-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let ca_file = dir.join("shop-tls.pem");
    std::fs::write(&ca_file, &mesh.tls_cert_pem).expect("write cert");
    let port = mesh.gateway_https.port();
    let resolve = |host: &str| format!("{host}:{port}:{}", ip(mesh.net, 3));
    for version in ["--http1.1", "--http2"] {
        let (status, body) = curl(vec![
            "--cacert".into(),
            ca_file.display().to_string(),
            "--resolve".into(),
            resolve("shop.example.com"),
            version.into(),
            format!("https://shop.example.com:{port}/api/tls"),
        ])
        .await;
        assert_eq!(status, 200, "{version}: {body}");
        let r = reply(&body);
        assert_eq!(r.name, "api-1");
        let forwarded = r.headers.get("forwarded").cloned().unwrap_or_default();
        assert!(forwarded.contains("proto=https"), "{forwarded}");
    }
    // A name without a TLS secret gets no certificate: the gateway ends the handshake with
    // access_denied (rustls's alert when no certificate resolves) before it sends one.
    let mut roots = rustls::RootCertStore::empty();
    for cert in meshkit_identity::certs_from_pem(&mesh.tls_cert_pem).expect("cert") {
        roots.add(cert).expect("root");
    }
    let config = rustls::ClientConfig::builder_with_provider(meshkit_identity::default_provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let sock = tokio::net::TcpStream::connect(mesh.gateway_https)
        .await
        .expect("connect");
    let refused = tokio::time::timeout(
        PATIENCE,
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect("eu.apps.example.com".try_into().expect("name"), sock),
    )
    .await
    .expect("the handshake ended in time")
    .expect_err("a handshake for a name without a Secret succeeded");
    let alert = refused
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
        .cloned();
    assert_eq!(
        alert,
        Some(rustls::Error::AlertReceived(
            rustls::AlertDescription::AccessDenied
        )),
        "the gateway did not refuse the name with its alert: {refused}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A hyper HTTP/1.1 client on one keep-alive connection to the gateway.
async fn keepalive_client(
    addr: SocketAddr,
) -> hyper::client::conn::http1::SendRequest<http_body_util::Empty<bytes::Bytes>> {
    let sock = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect gateway");
    let (sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(sock))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    sender
}

async fn send(
    sender: &mut hyper::client::conn::http1::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    host: &str,
    path: &str,
) -> (u16, String) {
    use http_body_util::BodyExt;
    let req = hyper::Request::get(path)
        .header("host", host)
        .body(http_body_util::Empty::new())
        .expect("request");
    tokio::time::timeout(PATIENCE, async {
        // The previous exchange may still be finishing on the connection.
        sender
            .ready()
            .await
            .expect("the open connection stays usable");
        let resp = sender
            .send_request(req)
            .await
            .expect("response on the open connection");
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    })
    .await
    .expect("answered in time on the open connection")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_update_applies_to_an_open_connection() {
    let mesh = Mesh::start(3).await;
    let mut conn = keepalive_client(mesh.gateway_http).await;
    let (status, body) = send(&mut conn, "shop.example.com", "/cart").await;
    assert_eq!(status, 200);
    assert!(reply(&body).name.starts_with("web-"));

    // Route everything of shop.example.com to api.
    let yaml = INGRESS.replace(
        "{path: /, pathType: Prefix, backend: {service: {name: web",
        "{path: /, pathType: Prefix, backend: {service: {name: api",
    );
    let mut config = mesh.gateway_tx.borrow().clone();
    config.ingresses = manifest::from_yaml_str(&yaml).expect("yaml");
    let changed_at = Instant::now();
    mesh.gateway_tx.send_replace(config);
    loop {
        let (status, body) = send(&mut conn, "shop.example.com", "/cart").await;
        assert_eq!(status, 200);
        if reply(&body).name == "api-1" {
            break;
        }
        assert!(
            changed_at.elapsed() < PATIENCE,
            "update not applied after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The same connection keeps working.
    for _ in 0..3 {
        let (status, body) = send(&mut conn, "shop.example.com", "/still").await;
        assert_eq!(status, 200);
        assert_eq!(reply(&body).name, "api-1");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_proxy_restart_recovers() {
    let mut mesh = Mesh::start(4).await;
    let (status, _) = mesh.get("shop.example.com", "/", &[]).await;
    assert_eq!(status, 200);

    // Node B carries both web endpoints: without it, none is reachable. Its tasks end
    // asynchronously, and a backend connection pooled before may take one more request:
    // wait for the answer of a mesh without node B.
    drop(mesh.node_b.take());
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, body) = mesh.get("shop.example.com", "/", &[]).await;
        if status == 503 {
            assert_eq!(body, "no endpoint reachable");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {status} after {PATIENCE:?} without node B: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Node A still serves its workloads.
    let (status, _) = mesh.get("shop.example.com", "/api", &[]).await;
    assert_eq!(status, 200);

    mesh.node_b = Some(
        start_node(
            &mesh.td,
            &mesh.ca,
            mesh.net,
            "node-b",
            mesh.mesh_tx.subscribe(),
        )
        .await,
    );
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (status, body) = mesh.get("shop.example.com", "/", &[]).await;
        if status == 200 {
            assert!(reply(&body).name.starts_with("web-"));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no recovery after restart: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthorized_identities_are_refused() {
    let mesh = Mesh::start(5).await;
    let web1 = SocketAddr::new(ip(mesh.net, 11), APP_PORT);
    let hbone = SocketAddr::new(ip(mesh.net, 11), meshkit_hbone::HBONE_PORT);
    let web_id = id(&mesh.td, "shop", "web");

    // An identity of the mesh admitted by policy gets through.
    let client_id = id(&mesh.td, "shop", "client");
    let client = Client::new(
        ClientConfig::default(),
        mesh.ca.issue(client_id.clone()),
        mesh.ca.bundle_set(),
    );
    let mut tunnel = open_in_time(
        &client,
        Target::new(hbone, web1, client_id.clone(), web_id.clone()),
    )
    .await
    .expect("client admitted");
    tunnel
        .write_all(b"GET /direct HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("write");
    let (response, end) = read_to_end_in_time(&mut tunnel).await;
    end.expect("the answer ends cleanly");
    assert!(String::from_utf8_lossy(&response).contains("\"name\":\"web-1\""));

    // An open tunnel of that identity ends when the policy stops admitting it; new ones get
    // 403; restoring the policy admits it again.
    let node_b = mesh.node_b.as_ref().expect("node b");
    let policy = InboundPolicy::any().deny(id(&mesh.td, "shop", "intruder"));
    let mut open = open_in_time(
        &client,
        Target::new(hbone, web1, client_id.clone(), web_id.clone()),
    )
    .await
    .expect("client admitted");
    node_b.set_policy(policy.clone().deny(client_id.clone()));
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(PATIENCE, open.read_to_end(&mut rest))
        .await
        .expect("the tunnel outlived the policy that admitted it");
    // Reset with CONNECT_ERROR: the client reads an error, not a clean end of the data.
    let err = ended.expect_err("a tunnel cut by the policy must not read as EOF");
    let connect_error = meshkit_hbone::Reason::CONNECT_ERROR.to_string();
    assert!(err.to_string().contains(&connect_error), "{err}");
    let err = open_in_time(
        &client,
        Target::new(hbone, web1, client_id.clone(), web_id.clone()),
    )
    .await
    .expect_err("denied now");
    assert_eq!(err.status().map(|s| s.as_u16()), Some(403), "{err}");
    node_b.set_policy(policy);
    open_in_time(
        &client,
        Target::new(hbone, web1, client_id.clone(), web_id.clone()),
    )
    .await
    .expect("admitted again");

    // A CONNECT whose `:authority` is not the address the connection arrived on: 400, as
    // ztunnel answers.
    let api1 = SocketAddr::new(ip(mesh.net, 13), APP_PORT);
    let err = open_in_time(
        &client,
        Target::new(hbone, api1, client_id.clone(), web_id.clone()),
    )
    .await
    .expect_err("not the local workload");
    assert_eq!(err.status().map(|s| s.as_u16()), Some(400), "{err}");

    // The denied identity: 403.
    let intruder = id(&mesh.td, "shop", "intruder");
    let client = Client::new(
        ClientConfig::default(),
        mesh.ca.issue(intruder.clone()),
        mesh.ca.bundle_set(),
    );
    let err = open_in_time(&client, Target::new(hbone, web1, intruder, web_id.clone()))
        .await
        .expect_err("intruder refused");
    assert_eq!(err.status().map(|s| s.as_u16()), Some(403), "{err}");

    // Another trust domain (and its own CA): refused in the TLS handshake by the node proxy,
    // whose alert the client reads (it trusts the node proxy, so it did not refuse first).
    let other_td = TrustDomain::new("evil.example").expect("td");
    let other_ca = TestCa::new(other_td.clone());
    let stranger = id(&other_td, "shop", "client");
    let mut bundles = mesh.ca.bundle_set();
    bundles.insert(other_ca.bundle()).expect("bundle");
    let client = Client::new(
        ClientConfig::default(),
        other_ca.issue(stranger.clone()),
        bundles,
    );
    let failures = || {
        node_b
            .inbound_handshake_failures(hbone.ip())
            .expect("node B serves web-1")
    };
    let before = failures();
    let err = open_in_time(&client, Target::new(hbone, web1, stranger, web_id))
        .await
        .expect_err("stranger refused");
    let chain = meshkit_identity::ErrorChain(&err).to_string();
    assert!(
        err.status().is_none() && !err.is_peer_identity(),
        "refused for another reason than the node proxy's refusal: {chain}"
    );
    // The refusal is the node proxy's: its listener counts the failed handshake. The client
    // reads the alert, unless its first write after the handshake (TLS 1.3 lets it write
    // before the server has checked its certificate) met the closed socket first, whose
    // reset then discards the alert.
    tokio::time::timeout(PATIENCE, async {
        while failures() != before + 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("node B counts the refused handshake");
    assert!(
        chain.contains("CertificateUnknown")
            || chain.contains("broken pipe")
            || chain.contains("reset"),
        "{chain}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbound_listener_tunnels_to_service_endpoints() {
    let mesh = Mesh::start(6).await;
    let node_a = mesh.node_a.as_ref().expect("node a");
    let listen = node_a.outbound_addrs()[0];

    let request = |source: IpAddr| async move {
        let sock = TcpSocket::new_v4().expect("socket");
        sock.bind(SocketAddr::new(source, 0)).expect("bind source");
        // A connection the node proxy refuses is reset as soon as it is accepted: the reset
        // may already meet the connect or the write, which then fail with it.
        let mut stream = match sock.connect(listen).await {
            Ok(stream) => stream,
            Err(e) => return (String::new(), Err(e)),
        };
        if let Err(e) = stream
            .write_all(b"GET /out HTTP/1.1\r\nhost: web\r\nconnection: close\r\n\r\n")
            .await
        {
            return (String::new(), Err(e));
        }
        let (response, end) = read_to_end_in_time(&mut stream).await;
        (String::from_utf8_lossy(&response).into_owned(), end)
    };
    // From the local workload `client`: round-robin over web-1 and web-2.
    let mut names = std::collections::BTreeSet::new();
    for _ in 0..2 {
        let (response, end) = request(ip(mesh.net, 21)).await;
        end.expect("the answer ends cleanly");
        let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
        let r = reply(body);
        assert_eq!(r.path, "/out");
        names.insert(r.name);
    }
    assert_eq!(names, ["web-1", "web-2"].map(String::from).into());

    // From an address that is no workload of this node: refused, reset without a byte (not
    // a FIN: an empty answer is not a complete one).
    let (response, end) = request(ip(mesh.net, 99)).await;
    assert_eq!(response, "");
    assert_reset(&end);
    // The denied workload's identity is refused by node B: no endpoint reachable, so the
    // connection is reset (not a FIN: an empty answer is not a complete one).
    let (response, end) = request(ip(mesh.net, 22)).await;
    assert_eq!(response, "");
    assert_reset(&end);
}

/// The connection ended in a reset: read as `ConnectionReset`, or, when the reset came
/// before the request was written, `BrokenPipe` from the write. Never a clean end.
fn assert_reset(end: &std::io::Result<usize>) {
    let kind = end.as_ref().map_err(std::io::Error::kind).err();
    assert!(
        matches!(
            kind,
            Some(std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe)
        ),
        "not a reset: {end:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbound_listeners_follow_the_mesh() {
    let mesh = Mesh::start(7).await;
    let node_b = mesh.node_b.as_ref().expect("node b");
    let web2 = SocketAddr::new(ip(mesh.net, 12), meshkit_hbone::HBONE_PORT);
    assert!(node_b.inbound_addrs().contains(&web2));

    // web-2 leaves the mesh: its listener goes, the port is free again.
    let mut config = mesh_config(mesh.net);
    config.workloads.retain(|w| w.name != "web-2");
    mesh.mesh_tx.send_replace(config);
    let mut inbound = node_b.watch_inbound();
    tokio::time::timeout(PATIENCE, inbound.wait_for(|addrs| !addrs.contains(&web2)))
        .await
        .expect("listener removed in time")
        .expect("node proxy running");
    // The listener task closes its socket once it has stopped: the port refuses
    // connections soon after the address leaves the set.
    tokio::time::timeout(PATIENCE, async {
        while tokio::net::TcpStream::connect(web2).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the port refuses connections in time");

    // It comes back, on the other node this time: node A serves it, node B does not.
    let mut config = mesh_config(mesh.net);
    for w in &mut config.workloads {
        if w.name == "web-2" {
            w.node = "node-a".into();
        }
    }
    mesh.mesh_tx.send_replace(config);
    let node_a = mesh.node_a.as_ref().expect("node a");
    let mut inbound = node_a.watch_inbound();
    tokio::time::timeout(PATIENCE, inbound.wait_for(|addrs| addrs.contains(&web2)))
        .await
        .expect("listener added in time")
        .expect("node proxy running");
    assert!(!node_b.inbound_addrs().contains(&web2));

    // A tunnel to it now goes through node A, with web's identity.
    let client_id = id(&mesh.td, "shop", "client");
    let client = Client::new(
        ClientConfig::default(),
        mesh.ca.issue(client_id.clone()),
        mesh.ca.bundle_set(),
    );
    let mut tunnel = open_in_time(
        &client,
        Target::new(
            web2,
            SocketAddr::new(ip(mesh.net, 12), APP_PORT),
            client_id,
            id(&mesh.td, "shop", "web"),
        ),
    )
    .await
    .expect("tunnel via node a");
    tunnel
        .write_all(b"GET /moved HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("write");
    let (response, end) = read_to_end_in_time(&mut tunnel).await;
    end.expect("the answer ends cleanly");
    assert!(String::from_utf8_lossy(&response).contains("\"name\":\"web-2\""));
}

/// Opens a tunnel to web-1 as the client, applies `change` to web-1 in the mesh, and returns
/// how the open tunnel ended; the mesh is restored after.
async fn tunnel_end_after(mesh: &Mesh, change: impl Fn(&mut Workload)) -> std::io::Result<usize> {
    let web1 = SocketAddr::new(ip(mesh.net, 11), APP_PORT);
    let hbone = SocketAddr::new(ip(mesh.net, 11), meshkit_hbone::HBONE_PORT);
    let client_id = id(&mesh.td, "shop", "client");
    let client = Client::new(
        ClientConfig::default(),
        mesh.ca.issue(client_id.clone()),
        mesh.ca.bundle_set(),
    );
    let mut open = open_in_time(
        &client,
        Target::new(hbone, web1, client_id, id(&mesh.td, "shop", "web")),
    )
    .await
    .expect("client admitted");
    let mut config = mesh_config(mesh.net);
    for w in &mut config.workloads {
        if w.name == "web-1" {
            change(w);
        }
    }
    mesh.mesh_tx.send_replace(config);
    let (_, end) = read_to_end_in_time(&mut open).await;
    mesh.mesh_tx.send_replace(mesh_config(mesh.net));
    end
}

/// An open tunnel is re-checked against everything that admitted it when the mesh changes:
/// its workload no longer serving the port, or moving to another node, resets it with
/// CONNECT_ERROR, as a policy that stops admitting it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_tunnel_ends_when_its_port_is_no_longer_served_or_its_workload_moves() {
    let mesh = Mesh::start(8).await;
    let connect_error = meshkit_hbone::Reason::CONNECT_ERROR.to_string();
    let end = tunnel_end_after(&mesh, |w| w.ports = Some(vec![APP_PORT + 1])).await;
    let err = end.expect_err("a tunnel to a port no longer served must not read as EOF");
    assert!(err.to_string().contains(&connect_error), "{err}");
    let end = tunnel_end_after(&mesh, |w| w.node = "node-a".into()).await;
    let err = end.expect_err("a tunnel to a workload that moved must not read as EOF");
    assert!(err.to_string().contains(&connect_error), "{err}");
}
