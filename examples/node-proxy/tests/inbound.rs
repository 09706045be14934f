//! Inbound HBONE on loopback: which targets a CONNECT may reach (the ports a workload serves,
//! never the node proxy's own listeners, the plaintext one included), what the plaintext
//! listener does with a connection nothing redirected, and mesh updates that do not wait for
//! the CA.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshkit_hbone::{Client, ClientConfig, Target};
use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    BoxFuture, CaClient, CaError, CertificateRequest, RotationConfig, SpiffeId, SvidCache,
    TrustDomain,
};
use meshkit_mesh::feed::mesh_config;
use meshkit_mesh::proto::workload::{Address, Port, PortList, Service, address};
use meshkit_mesh::resources::AddressResource;
use meshkit_mesh::{MeshConfig, Workload};
use meshkit_node_proxy::{NodeProxy, NodeProxyConfig, OutboundListener};
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The HBONE port of these tests (each test has loopback addresses of its own).
const HBONE: u16 = 25008;
const NODE: &str = "node-a";
/// Bound on every wait for something that must happen: far above what it needs, so that a
/// loaded machine does not fail it.
const PATIENCE: Duration = Duration::from_secs(10);

fn td() -> TrustDomain {
    TrustDomain::new("cluster.local").unwrap()
}

fn ip(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 79, 8, last))
}

fn id(sa: &str) -> SpiffeId {
    SpiffeId::from_istio(&td(), "shop", sa).unwrap()
}

/// An echo application on `ip`, on a free port.
async fn echo_app(ip: IpAddr) -> u16 {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0; 1024];
                while let Ok(n) = sock.read(&mut buf).await {
                    if n == 0 || sock.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// The mesh as the xDS feed builds it: service `web` (port 80 to `target`) and workload
/// `web-1` at `addr` backing it.
fn xds_mesh(addr: IpAddr, target: u16) -> MeshConfig {
    let host = "web.shop.svc.cluster.local";
    let service = Service {
        name: "web".into(),
        namespace: "shop".into(),
        hostname: host.into(),
        ports: vec![Port {
            service_port: 80,
            target_port: u32::from(target),
            ..Default::default()
        }],
        ..Default::default()
    };
    let IpAddr::V4(v4) = addr else { unreachable!() };
    let workload = meshkit_mesh::proto::workload::Workload {
        uid: "Kubernetes/networking.istio.io/WorkloadEntry/shop/web-1".into(),
        name: "web-1".into(),
        namespace: "shop".into(),
        addresses: vec![v4.octets().to_vec()],
        service_account: "web".into(),
        node: NODE.into(),
        services: BTreeMap::from([(
            format!("shop/{host}"),
            PortList {
                ports: vec![Port {
                    service_port: 80,
                    target_port: u32::from(target),
                    ..Default::default()
                }],
            },
        )]),
        ..Default::default()
    };
    let resources = [
        AddressResource {
            name: format!("shop/{host}"),
            address: Address {
                r#type: Some(address::Type::Service(service)),
            },
        },
        AddressResource {
            name: workload.uid.clone(),
            address: Address {
                r#type: Some(address::Type::Workload(workload)),
            },
        },
    ];
    mesh_config(resources.iter())
}

/// A workload as a mesh file gives it, with no `ports`: any port.
fn file_workload(name: &str, sa: &str, addr: IpAddr) -> Workload {
    serde_json::from_value(serde_json::json!({
        "name": name, "namespace": "shop", "service_account": sa,
        "ip": addr.to_string(), "node": NODE,
    }))
    .unwrap()
}

fn client(ca: &TestCa) -> (Client, SpiffeId) {
    let me = id("client");
    let client = Client::new(
        ClientConfig::default(),
        ca.issue(me.clone()),
        ca.bundle_set(),
    );
    (client, me)
}

/// The status of a CONNECT to `destination` through the node proxy's HBONE port on its IP.
async fn connect_status(client: &Client, me: &SpiffeId, destination: SocketAddr) -> u16 {
    let target = Target::new(
        SocketAddr::new(destination.ip(), HBONE),
        destination,
        me.clone(),
        id("web"),
    );
    match tokio::time::timeout(PATIENCE, client.open(target))
        .await
        .expect("CONNECT answered in time")
    {
        Ok(_) => 200,
        Err(e) => e
            .status()
            .map(|s| s.as_u16())
            .unwrap_or_else(|| panic!("{e}")),
    }
}

async fn start(
    config: NodeProxyConfig,
    mesh: MeshConfig,
    ca: Arc<impl CaClient + 'static>,
    bundles: meshkit_identity::TrustBundleSet,
) -> (NodeProxy, watch::Sender<MeshConfig>) {
    let (tx, rx) = watch::channel(mesh);
    let certs = SvidCache::new(ca, RotationConfig::default());
    let proxy = NodeProxy::start(config, rx, certs, bundles).await.unwrap();
    (proxy, tx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xds_workload_is_reached_only_on_its_services_target_ports() {
    let addr = ip(11);
    let app = echo_app(addr).await;
    let other = echo_app(addr).await;
    let ca = Arc::new(TestCa::new(td()));
    let config = NodeProxyConfig::new(NODE, td()).with_hbone_port(HBONE);
    let (proxy, _mesh) = start(config, xds_mesh(addr, app), ca.clone(), ca.bundle_set()).await;
    assert!(
        proxy
            .inbound_addrs()
            .contains(&SocketAddr::new(addr, HBONE))
    );
    let (client, me) = client(&ca);

    let mut tunnel = tokio::time::timeout(
        PATIENCE,
        client.open(Target::new(
            SocketAddr::new(addr, HBONE),
            SocketAddr::new(addr, app),
            me.clone(),
            id("web"),
        )),
    )
    .await
    .expect("CONNECT answered in time")
    .expect("the service's target port is reachable");
    tunnel.write_all(b"ping").await.unwrap();
    let mut buf = [0; 4];
    tokio::time::timeout(PATIENCE, tunnel.read_exact(&mut buf))
        .await
        .expect("echoed in time")
        .unwrap();
    assert_eq!(&buf, b"ping");

    // Another application listening on the workload's address is not the mesh's to reach.
    assert_eq!(
        connect_status(&client, &me, SocketAddr::new(addr, other)).await,
        403
    );
    // Nor is the service port itself, nor the node proxy's HBONE port.
    assert_eq!(
        connect_status(&client, &me, SocketAddr::new(addr, 80)).await,
        403
    );
    assert_eq!(
        connect_status(&client, &me, SocketAddr::new(addr, HBONE)).await,
        403
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_proxys_own_listeners_are_refused_even_where_any_port_is_allowed() {
    let addr = ip(21);
    let app = echo_app(addr).await;
    let ca = Arc::new(TestCa::new(td()));
    let config = NodeProxyConfig::new(NODE, td())
        .with_hbone_port(HBONE)
        .with_outbound(OutboundListener::new(
            SocketAddr::new(addr, 0),
            "web.shop.svc.cluster.local",
            80,
        ));
    let mesh = MeshConfig {
        policies: Vec::new(),
        rejected_policies: Vec::new(),
        workloads: vec![file_workload("web-1", "web", addr)],
        services: Vec::new(),
    };
    let (proxy, _mesh) = start(config, mesh, ca.clone(), ca.bundle_set()).await;
    let outbound = proxy.outbound_addrs()[0];
    let (client, me) = client(&ca);

    // The file lists no ports: the application is reachable on any of its ports...
    assert_eq!(
        connect_status(&client, &me, SocketAddr::new(addr, app)).await,
        200
    );
    // ...but never the node proxy itself: its HBONE listener, its outbound listener.
    assert_eq!(
        connect_status(&client, &me, SocketAddr::new(addr, HBONE)).await,
        403
    );
    assert_eq!(connect_status(&client, &me, outbound).await, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plaintext_listener_is_never_a_target_and_refuses_what_was_not_redirected() {
    let addr = ip(22);
    let app = echo_app(addr).await;
    let ca = Arc::new(TestCa::new(td()));
    // A port of the workload's address: the listener takes redirected connections for any
    // local workload, and is itself never one of their targets.
    let plaintext = {
        let probe = std::net::TcpListener::bind(SocketAddr::new(addr, 0)).unwrap();
        probe.local_addr().unwrap()
    };
    let config = NodeProxyConfig::new(NODE, td())
        .with_hbone_port(HBONE)
        .with_inbound_plaintext(plaintext);
    let mesh = MeshConfig {
        policies: Vec::new(),
        rejected_policies: Vec::new(),
        workloads: vec![file_workload("web-1", "web", addr)],
        services: Vec::new(),
    };
    let (_proxy, _mesh) = start(config, mesh, ca.clone(), ca.bundle_set()).await;
    let (client, me) = client(&ca);
    assert_eq!(
        connect_status(&client, &me, SocketAddr::new(addr, app)).await,
        200
    );
    assert_eq!(connect_status(&client, &me, plaintext).await, 403);

    // Straight to the listener, nothing redirected it: no workload to take it to. The
    // connection is reset without a byte (never a clean end). The reset may already be
    // there when the connect completes.
    let read = match tokio::net::TcpStream::connect(plaintext).await {
        Err(e) => Err(e),
        Ok(mut sock) => {
            let mut buf = [0; 16];
            tokio::time::timeout(PATIENCE, sock.read(&mut buf))
                .await
                .expect("the listener closes the connection")
        }
    };
    assert!(
        matches!(&read, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "{read:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserved_wildcard_address_is_refused_on_every_workload_address() {
    let addr = ip(25);
    let app = echo_app(addr).await;
    let ca = Arc::new(TestCa::new(td()));
    let config = NodeProxyConfig::new(NODE, td())
        .with_hbone_port(HBONE)
        .with_reserved(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), app));
    let mesh = MeshConfig {
        policies: Vec::new(),
        rejected_policies: Vec::new(),
        workloads: vec![file_workload("web-1", "web", addr)],
        services: Vec::new(),
    };
    let (_proxy, _mesh) = start(config, mesh, ca.clone(), ca.bundle_set()).await;
    let (client, me) = client(&ca);
    assert_eq!(
        connect_status(&client, &me, SocketAddr::new(addr, app)).await,
        403
    );
}

/// A CA that never answers for the identities in `silent`, and signs the others; `asked`
/// says when a silent identity has been asked for.
struct SilentCa {
    inner: TestCa,
    silent: Mutex<BTreeSet<SpiffeId>>,
    asked: watch::Sender<bool>,
}

impl SilentCa {
    fn new(silent: SpiffeId) -> Self {
        Self {
            inner: TestCa::new(td()),
            silent: Mutex::new(BTreeSet::from([silent])),
            asked: watch::Sender::new(false),
        }
    }
}

impl CaClient for SilentCa {
    fn sign<'a>(
        &'a self,
        request: &'a CertificateRequest,
    ) -> BoxFuture<'a, Result<Vec<CertificateDer<'static>>, CaError>> {
        if self.silent.lock().unwrap().contains(&request.id) {
            self.asked.send_replace(true);
            return Box::pin(std::future::pending());
        }
        self.inner.sign(request)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_ca_does_not_hold_up_mesh_updates() {
    let (web, slow, web2) = (ip(31), ip(32), ip(33));
    let ca = Arc::new(SilentCa::new(id("slow")));
    let bundles = ca.inner.bundle_set();
    let config = NodeProxyConfig::new(NODE, td()).with_hbone_port(HBONE);
    let mesh = |workloads: Vec<Workload>| MeshConfig {
        policies: Vec::new(),
        rejected_policies: Vec::new(),
        workloads,
        services: Vec::new(),
    };
    let (proxy, tx) = start(
        config,
        mesh(vec![file_workload("web-1", "web", web)]),
        ca.clone(),
        bundles,
    )
    .await;
    let hbone = |ip| SocketAddr::new(ip, HBONE);
    assert_eq!(proxy.inbound_addrs(), BTreeSet::from([hbone(web)]));

    // A workload whose certificate the CA never delivers joins...
    tx.send_replace(mesh(vec![
        file_workload("web-1", "web", web),
        file_workload("slow-1", "slow", slow),
    ]));
    // (the node proxy asks the CA for it, and gets no answer)...
    tokio::time::timeout(PATIENCE, ca.asked.subscribe().wait_for(|asked| *asked))
        .await
        .expect("the node proxy asked for slow's certificate in time")
        .expect("the CA is alive");
    // ...then web-1 leaves and web-2 joins: both apply while the CA stays silent.
    tx.send_replace(mesh(vec![
        file_workload("slow-1", "slow", slow),
        file_workload("web-2", "web2", web2),
    ]));
    let mut inbound = proxy.watch_inbound();
    tokio::time::timeout(
        PATIENCE,
        inbound.wait_for(|addrs| *addrs == BTreeSet::from([hbone(web2)])),
    )
    .await
    .expect("mesh update applied while the CA is silent")
    .expect("node proxy running");
    // The removed listener's task closes its socket once it has stopped.
    tokio::time::timeout(PATIENCE, async {
        while tokio::net::TcpStream::connect(hbone(web)).await.is_ok() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the removed listener refuses connections in time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_returns_when_the_ca_stays_silent() {
    let slow = ip(41);
    let ca = Arc::new(SilentCa::new(id("slow")));
    let bundles = ca.inner.bundle_set();
    let mut config = NodeProxyConfig::new(NODE, td()).with_hbone_port(HBONE);
    config.startup_timeout = Duration::from_millis(500);
    let mesh = MeshConfig {
        policies: Vec::new(),
        rejected_policies: Vec::new(),
        workloads: vec![file_workload("slow-1", "slow", slow)],
        services: Vec::new(),
    };
    let (proxy, _tx) = tokio::time::timeout(PATIENCE, start(config, mesh, ca.clone(), bundles))
        .await
        .expect("start returns");
    assert!(proxy.inbound_addrs().is_empty());
}
