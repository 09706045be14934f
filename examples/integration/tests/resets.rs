//! Resets cross the mesh as resets (RFC 9113 section 8.5): through the node proxies both ways
//! (outbound listener → HBONE → inbound forwarder) and through the gateway. An application
//! that resets its socket mid-transfer is seen by the other side as a reset or an incomplete
//! response after a byte-exact prefix, never as a clean, complete end.
//!
//! Each test uses its own `127.78.N.0/24`: `.1` node A, `.2` node B, `.3` the gateway, `.11`
//! the application behind node B, `.21` the client workload on node A.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use meshkit_gateway::{Gateway, GatewayConfig, GatewaySettings};
use meshkit_hbone::Client;
use meshkit_identity::test_util::TestCa;
use meshkit_identity::{RotationConfig, SpiffeId, SvidCache, TrustDomain};
use meshkit_ingress_model::manifest;
use meshkit_mesh::{MeshConfig, MeshService, ServicePort, Workload};
use meshkit_node_proxy::{NodeProxy, NodeProxyConfig, OutboundListener};
use meshkit_test_support::pattern;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::watch;

const APP_PORT: u16 = 8080;
const SENT: usize = 1024 * 1024;
/// Bound on every wait here; far above what any step needs.
const PATIENCE: Duration = Duration::from_secs(20);

const INGRESS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: shop, namespace: shop}
spec:
  rules:
  - host: shop.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
"#;

fn ip(net: u8, host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 78, net, host))
}

fn workload(net: u8, name: &str, host: u8, node: &str) -> Workload {
    Workload {
        authorization_policies: Vec::new(),
        name: name.into(),
        namespace: "shop".into(),
        service_account: name.into(),
        ip: ip(net, host),
        node: node.into(),
        ports: Some(vec![APP_PORT]),
    }
}

fn mesh(net: u8) -> MeshConfig {
    MeshConfig {
        policies: Vec::new(),
        rejected_policies: Vec::new(),
        workloads: vec![
            workload(net, "web", 11, "node-b"),
            workload(net, "client", 21, "node-a"),
        ],
        services: vec![MeshService {
            name: "web".into(),
            namespace: "shop".into(),
            hostname: "web.shop.svc.cluster.local".into(),
            vip: None,
            ports: vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                target_port: APP_PORT,
            }],
            endpoints: vec![ip(net, 11)],
        }],
    }
}

/// Two node proxies over one mesh, the application's listener behind node B, and a gateway
/// in front.
struct Mesh {
    app: TcpListener,
    outbound: SocketAddr,
    gateway: SocketAddr,
    _nodes: (NodeProxy, NodeProxy),
    _mesh: watch::Sender<MeshConfig>,
    _gateway_config: watch::Sender<GatewayConfig>,
}

impl Mesh {
    async fn start(net: u8) -> Self {
        let td = TrustDomain::new("cluster.local").unwrap();
        let ca = Arc::new(TestCa::new(td.clone()));
        let (mesh_tx, _) = watch::channel(mesh(net));
        let app = TcpListener::bind(SocketAddr::new(ip(net, 11), APP_PORT))
            .await
            .unwrap();
        let node = |name: &str, host: u8, outbound: bool| {
            let mut config = NodeProxyConfig::new(name, td.clone());
            if outbound {
                config = config.with_outbound(OutboundListener::new(
                    SocketAddr::new(ip(net, host), 0),
                    "web.shop.svc.cluster.local",
                    80,
                ));
            }
            let certs = SvidCache::new(ca.clone(), RotationConfig::default());
            NodeProxy::start(config, mesh_tx.subscribe(), certs, ca.bundle_set())
        };
        let node_a = node("node-a", 1, true).await.unwrap();
        let node_b = node("node-b", 2, false).await.unwrap();
        let outbound = node_a.outbound_addrs()[0];

        let gw_id = SpiffeId::from_istio(&td, "ingress", "gateway").unwrap();
        let client = Client::new(
            meshkit_cli::hbone_client_config(),
            ca.issue(gw_id.clone()),
            ca.bundle_set(),
        );
        let (gateway_tx, gateway_rx) = watch::channel(GatewayConfig {
            ingresses: manifest::from_yaml_str(INGRESS).unwrap(),
            mesh: mesh(net),
            ..GatewayConfig::default()
        });
        let gateway = Gateway::new(GatewaySettings::new(gw_id), client, gateway_rx);
        let listener = TcpListener::bind(SocketAddr::new(ip(net, 3), 0))
            .await
            .unwrap();
        let gateway_addr = listener.local_addr().unwrap();
        tokio::spawn(gateway.serve_http(listener));
        Self {
            app,
            outbound,
            gateway: gateway_addr,
            _nodes: (node_a, node_b),
            _mesh: mesh_tx,
            _gateway_config: gateway_tx,
        }
    }

    /// A connection from the client workload to the outbound listener, and the application's
    /// side of the tunnel it opens.
    async fn connect(&self, net: u8) -> (TcpStream, TcpStream) {
        let sock = TcpSocket::new_v4().unwrap();
        sock.bind(SocketAddr::new(ip(net, 21), 0)).unwrap();
        let client = sock.connect(self.outbound).await.unwrap();
        let (app, _) = tokio::time::timeout(PATIENCE, self.app.accept())
            .await
            .expect("the tunnel reached the application")
            .unwrap();
        (client, app)
    }
}

fn reset(sock: TcpStream) {
    sock.set_zero_linger().unwrap();
    drop(sock);
}

async fn read_all(sock: &mut TcpStream) -> (Vec<u8>, std::io::Result<usize>) {
    let mut got = Vec::new();
    let end = tokio::time::timeout(PATIENCE, sock.read_to_end(&mut got))
        .await
        .expect("the reader saw neither an end nor an error");
    (got, end)
}

/// Reads the whole 1 MiB a peer sent before it resets, checked byte for byte.
async fn read_exactly(sock: &mut TcpStream) {
    let mut got = vec![0u8; SENT];
    tokio::time::timeout(PATIENCE, sock.read_exact(&mut got))
        .await
        .expect("the bytes sent before the reset arrive")
        .unwrap();
    assert!(
        got == pattern(SENT),
        "the bytes that arrived are not what was sent"
    );
}

/// After the whole 1 MiB arrived: nothing more, and a reset rather than an end.
fn assert_reset_after_prefix(got: &[u8], end: &std::io::Result<usize>) {
    let err = end
        .as_ref()
        .expect_err("a reset must not read as a clean end");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    assert!(
        got.is_empty(),
        "{} bytes arrived after the reset",
        got.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_reset_crosses_both_node_proxies_as_a_reset() {
    let mesh = Mesh::start(1).await;
    let (mut client, mut app) = mesh.connect(1).await;
    app.write_all(&pattern(SENT)).await.unwrap();
    read_exactly(&mut client).await;
    reset(app);
    let (got, end) = read_all(&mut client).await;
    assert_reset_after_prefix(&got, &end);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_reset_crosses_both_node_proxies_as_a_reset() {
    let mesh = Mesh::start(2).await;
    let (mut client, mut app) = mesh.connect(2).await;
    client.write_all(&pattern(SENT)).await.unwrap();
    read_exactly(&mut app).await;
    reset(client);
    let (got, end) = read_all(&mut app).await;
    assert_reset_after_prefix(&got, &end);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_reset_mid_response_never_reaches_a_client_of_the_gateway_as_complete() {
    let mesh = Mesh::start(3).await;
    // Over HTTP/1.1 and HTTP/2 (prior knowledge) to the gateway: a response whose length is
    // its connection's end (the hardest case: a FIN would complete it) is cut by a reset.
    for http2 in [false, true] {
        let sock = TcpStream::connect(mesh.gateway).await.unwrap();
        let io = hyper_util::rt::TokioIo::new(sock);
        let request = hyper::Request::get("/big")
            .header("host", "shop.example.com")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let response = if http2 {
            let (mut send, conn) =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                    .await
                    .unwrap();
            tokio::spawn(conn);
            tokio::spawn(async move { send.send_request(request).await })
        } else {
            let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            tokio::spawn(async move { send.send_request(request).await })
        };
        let (mut app, _) = tokio::time::timeout(PATIENCE, mesh.app.accept())
            .await
            .expect("the request reached the application")
            .unwrap();
        let mut head = Vec::new();
        tokio::time::timeout(PATIENCE, async {
            while !head.ends_with(b"\r\n\r\n") {
                let mut byte = [0u8; 1];
                app.read_exact(&mut byte).await.unwrap();
                head.push(byte[0]);
            }
        })
        .await
        .expect("the request head reached the application");
        app.write_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        app.write_all(&pattern(SENT)).await.unwrap();
        reset(app);
        let response = tokio::time::timeout(PATIENCE, response)
            .await
            .unwrap()
            .unwrap()
            .expect("the head of the response arrived before the reset");
        assert_eq!(response.status(), 200);
        let body = tokio::time::timeout(PATIENCE, response.into_body().collect())
            .await
            .expect("the body ended one way or another");
        assert!(
            body.is_err(),
            "http2 {http2}: a cut response was delivered as complete ({} bytes)",
            body.map(|b| b.to_bytes().len()).unwrap_or_default()
        );
    }
}
