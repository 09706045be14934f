//! The demo mesh assembled from meshkit's parts: a control plane, two node proxies and an
//! ingress gateway that get their configuration over xDS and their certificates from the
//! control plane's CA, and echo workloads, all in one process on loopback addresses.
//!
//! The node proxies use Delta ADS, the gateway State-of-the-World ADS, so both variants of the
//! xDS client are exercised by every run.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{Node, data_source};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{Secret, secret};
use meshkit_identity::istio::IstioCaClient;
use meshkit_identity::{SpiffeId, SvidCache, TrustBundle, TrustBundleSet, TrustDomain};
use meshkit_xds_client::protocol::Mode;
use meshkit_xds_client::{ClientConfig as XdsConfig, Resource, WatchEvent, XdsClient};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::CliError;
use crate::control_plane::ca::TokenGrants;
use crate::control_plane::workload::{
    AddressResource, IngressClassResource, IngressResource, address,
};
use crate::control_plane::{ControlPlane, ControlPlaneConfig};
use crate::gateway::{Gateway, GatewayConfig, GatewaySettings, TlsSecret, serve_echo};
use crate::node_proxy::{MeshConfig, NodeProxy, NodeProxyConfig, Service, ServicePort, Workload};

/// The bundled sample manifests, written to a folder the control plane reads.
pub const SAMPLE_MANIFESTS: &[(&str, &str)] = &[
    (
        "ingress-class.yaml",
        include_str!("../manifests/ingress-class.yaml"),
    ),
    ("shop.yaml", include_str!("../manifests/shop.yaml")),
    (
        "shop-ingress.yaml",
        include_str!("../manifests/shop-ingress.yaml"),
    ),
    (
        "shop-tls-secret.yaml",
        include_str!("../manifests/shop-tls-secret.yaml"),
    ),
    ("blog.yaml", include_str!("../manifests/blog.yaml")),
];

/// The demo's bootstrap tokens (see `manifests/demo-tokens.txt`: the demo's trust model).
pub const DEMO_TOKENS: &str = include_str!("../manifests/demo-tokens.txt");

/// The nodes of the demo and their bootstrap tokens.
pub const NODES: &[(&str, &str)] = &[
    ("node-a", "demo-node-a-token"),
    ("node-b", "demo-node-b-token"),
];

/// The gateway's identity and token.
pub const GATEWAY_ID: &str = "spiffe://cluster.local/ns/istio-system/sa/ingress-gateway";
const GATEWAY_TOKEN: &str = "demo-gateway-token";

/// Where the gateway listens.
#[derive(Debug, Clone, Copy)]
pub struct MeshOptions {
    /// Plain HTTP (HTTP/1.1 and HTTP/2 prior knowledge).
    pub http: SocketAddr,
    /// HTTPS with the certificate chosen by SNI.
    pub https: SocketAddr,
    /// The listener addresses the control plane sends an Envoy gateway in LDS. `None` (the
    /// default) keeps the control plane's defaults (`0.0.0.0:8080` and `0.0.0.0:8443`).
    pub envoy: Option<EnvoyListeners>,
}

/// Where an Envoy fed by the demo's control plane listens (see [`envoy_bootstrap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvoyListeners {
    /// Plain HTTP.
    pub http: SocketAddr,
    /// HTTPS with the certificate chosen by SNI; `None` for no HTTPS listener.
    pub https: Option<SocketAddr>,
}

impl Default for MeshOptions {
    fn default() -> Self {
        Self {
            http: SocketAddr::from(([127, 0, 0, 1], 0)),
            https: SocketAddr::from(([127, 0, 0, 1], 0)),
            envoy: None,
        }
    }
}

/// An Envoy bootstrap (YAML) that takes all of its configuration (LDS, CDS and through them
/// RDS, EDS, SDS) from the ADS server at `ads` (plaintext gRPC, as the demo's control plane
/// serves it), State of the World or, with `delta`, incremental. The admin interface listens
/// on `admin` (port 0: any free port; Envoy writes the bound address to
/// `--admin-address-path` if asked).
pub fn envoy_bootstrap(ads: SocketAddr, node_id: &str, delta: bool, admin: SocketAddr) -> String {
    let api_type = if delta { "DELTA_GRPC" } else { "GRPC" };
    format!(
        r#"node:
  id: {node_id}
  cluster: meshkit-demo
admin:
  address: {{ socket_address: {{ address: {admin_ip}, port_value: {admin_port} }} }}
dynamic_resources:
  ads_config:
    api_type: {api_type}
    transport_api_version: V3
    set_node_on_first_message_only: true
    grpc_services:
    - envoy_grpc: {{ cluster_name: xds }}
  lds_config: {{ ads: {{}}, resource_api_version: V3 }}
  cds_config: {{ ads: {{}}, resource_api_version: V3 }}
static_resources:
  clusters:
  - name: xds
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    load_assignment:
      cluster_name: xds
      endpoints:
      - lb_endpoints:
        - endpoint:
            address: {{ socket_address: {{ address: {ads_ip}, port_value: {ads_port} }} }}
"#,
        admin_ip = admin.ip(),
        admin_port = admin.port(),
        ads_ip = ads.ip(),
        ads_port = ads.port(),
    )
}

/// A running demo mesh. Dropping it stops every part.
pub struct DemoMesh {
    /// The manifest folder the control plane watches (edit it to change the mesh).
    pub manifest_dir: PathBuf,
    /// The control plane.
    pub control_plane: ControlPlane,
    /// The node proxies, by node name.
    pub node_proxies: BTreeMap<String, NodeProxy>,
    /// Where the gateway serves plain HTTP.
    pub http_addr: SocketAddr,
    /// Where the gateway serves HTTPS.
    pub https_addr: SocketAddr,
    /// The mesh as the gateway sees it, from xDS.
    pub gateway_config: watch::Receiver<GatewayConfig>,
    /// What each node proxy is started from, to restart it.
    node_parts: BTreeMap<String, NodeParts>,
    trust_domain: TrustDomain,
    bundles: Arc<TrustBundleSet>,
    tasks: Vec<JoinHandle<()>>,
}

/// A node proxy's certificate cache and xDS-fed mesh, which outlive the proxy itself.
struct NodeParts {
    certs: SvidCache,
    mesh: watch::Receiver<MeshConfig>,
}

impl std::fmt::Debug for DemoMesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DemoMesh")
            .field("manifest_dir", &self.manifest_dir)
            .field("http_addr", &self.http_addr)
            .field("https_addr", &self.https_addr)
            .finish_non_exhaustive()
    }
}

impl Drop for DemoMesh {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Writes the sample manifests into `dir` (created if needed).
///
/// # Errors
///
/// When the folder or a file cannot be written.
pub fn write_samples(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, text) in SAMPLE_MANIFESTS {
        std::fs::write(dir.join(name), text)?;
    }
    Ok(())
}

impl DemoMesh {
    /// Starts the mesh from the manifests in `manifest_dir`, reporting each step to
    /// `progress`, and returns once the gateway has routes and endpoints to serve.
    ///
    /// # Errors
    ///
    /// When a part cannot start (an address in use, the CA refusing a token, no configuration
    /// arriving within 20 s).
    pub async fn start(
        manifest_dir: PathBuf,
        options: MeshOptions,
        progress: impl Fn(&str),
    ) -> Result<Self, CliError> {
        let td = TrustDomain::new("cluster.local")?;
        let mut cp_config = ControlPlaneConfig::new(&manifest_dir)
            .with_ads_addr(SocketAddr::from(([127, 0, 0, 1], 0)))
            .with_ca_addr(SocketAddr::from(([127, 0, 0, 1], 0)))
            .with_grants(TokenGrants::parse(DEMO_TOKENS)?);
        if let Some(envoy) = options.envoy {
            cp_config.translate.http_listener = envoy.http;
            cp_config.translate.https_listener = envoy.https;
        }
        let control_plane = ControlPlane::start(cp_config).await?;
        progress(&format!(
            "control plane: ADS on {}, CA on {}",
            control_plane.ads_uri(),
            control_plane.ca_addr()
        ));
        let bundles: Arc<TrustBundleSet> =
            Arc::new(TrustBundle::from_pem(td.clone(), control_plane.root_pem())?.into());
        let ca_channel =
            tonic::transport::Endpoint::from_shared(format!("http://{}", control_plane.ca_addr()))?
                .connect_lazy();
        let mut tasks = Vec::new();

        // Node proxies: certificates from the CA, workloads over Delta ADS.
        let mut node_proxies = BTreeMap::new();
        let mut node_parts = BTreeMap::new();
        for (node, token) in NODES {
            let ca = IstioCaClient::new(ca_channel.clone()).with_bearer_token(token)?;
            let certs = SvidCache::new(ca, crate::rotation_config());
            let (rx, feed) = mesh_over_xds(&control_plane.ads_uri(), node);
            tasks.extend(feed);
            let proxy = NodeProxy::start(
                NodeProxyConfig::new(*node, td.clone()),
                rx.clone(),
                certs.clone(),
                bundles.clone(),
            )
            .await?;
            node_proxies.insert((*node).to_owned(), proxy);
            node_parts.insert((*node).to_owned(), NodeParts { certs, mesh: rx });
        }
        progress("node proxies: node-a and node-b, workloads over Delta xDS");

        // The gateway: Ingresses, classes, secrets and workloads over State-of-the-World ADS.
        let gateway_id: SpiffeId = GATEWAY_ID.parse()?;
        let ca = IstioCaClient::new(ca_channel).with_bearer_token(GATEWAY_TOKEN)?;
        let certs = SvidCache::new(ca, crate::rotation_config());
        certs.get(&gateway_id).await?;
        let (gateway_config, feed) = gateway_config_over_xds(&control_plane.ads_uri(), "gateway");
        tasks.extend(feed);
        let hbone =
            meshkit_hbone::Client::new(crate::hbone_client_config(), certs, bundles.clone());
        let gateway = Gateway::new(
            GatewaySettings::new(gateway_id),
            hbone,
            gateway_config.clone(),
        );
        let http = TcpListener::bind(options.http).await?;
        let https = TcpListener::bind(options.https).await?;
        let (http_addr, https_addr) = (http.local_addr()?, https.local_addr()?);
        let serve_http = gateway.clone().serve_http(http);
        tasks.push(tokio::spawn(async move {
            let _ = serve_http.await;
        }));
        let serve_https = gateway.serve_https(https);
        tasks.push(tokio::spawn(async move {
            let _ = serve_https.await;
        }));

        // Wait for the configuration: resources arrive one event at a time, so wait until
        // routes and endpoints are there and nothing has changed for a moment.
        let mut config = gateway_config.clone();
        let ready = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let complete = {
                    let c = config.borrow_and_update();
                    !c.ingresses.is_empty()
                        && !c.secrets.is_empty()
                        && !c.mesh.workloads.is_empty()
                        && c.mesh.services.iter().all(|s| !s.endpoints.is_empty())
                };
                match tokio::time::timeout(Duration::from_millis(300), config.changed()).await {
                    Err(_) if complete => break,
                    Err(_) | Ok(Ok(())) => {}
                    Ok(Err(_)) => break,
                }
            }
        })
        .await;
        if ready.is_err() {
            return Err("no complete configuration reached the gateway within 20 s".into());
        }
        let mesh = config.borrow().mesh.clone();
        for (addr, name) in app_listeners(&mesh) {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot start workload {name} on {addr}: {e}"))?;
            tasks.push(tokio::spawn(serve_echo(listener, name)));
        }
        progress(&format!(
            "workloads: {} echo applications behind their node proxies",
            mesh.workloads.len()
        ));
        // Each node proxy serves inbound HBONE for its own workloads once it has their
        // certificates: wait for every one of them.
        for (node, proxy) in &node_proxies {
            let expected = mesh.workloads.iter().filter(|w| &w.node == node).count();
            let mut inbound = proxy.watch_inbound();
            let serving = tokio::time::timeout(Duration::from_secs(20), async {
                while inbound.borrow_and_update().len() < expected {
                    if inbound.changed().await.is_err() {
                        break;
                    }
                }
            })
            .await;
            if serving.is_err() {
                return Err(format!(
                    "{node} did not serve inbound HBONE for its {expected} workloads within 20 s"
                )
                .into());
            }
        }
        progress(&format!(
            "gateway: HTTP on {http_addr}, HTTPS on {https_addr}, as {GATEWAY_ID}"
        ));
        Ok(Self {
            manifest_dir,
            control_plane,
            node_proxies,
            node_parts,
            trust_domain: td,
            bundles,
            http_addr,
            https_addr,
            gateway_config,
            tasks,
        })
    }
}

impl DemoMesh {
    /// The TLS Secret `name` as the gateway last received it over xDS.
    pub fn gateway_secret(&self, name: &str) -> Option<TlsSecret> {
        self.gateway_config
            .borrow()
            .secrets
            .iter()
            .find(|s| s.name == name)
            .cloned()
    }

    /// Stops the node proxy of `node` (its workloads become unreachable through the mesh).
    pub fn stop_node(&mut self, node: &str) {
        if let Some(proxy) = self.node_proxies.remove(node) {
            proxy.shutdown();
        }
    }

    /// Starts the node proxy of `node` again, with the certificates and mesh it had.
    ///
    /// # Errors
    ///
    /// When `node` is not a node of the demo, or the proxy cannot start.
    pub async fn start_node(&mut self, node: &str) -> Result<(), CliError> {
        self.stop_node(node);
        let parts = self
            .node_parts
            .get(node)
            .ok_or_else(|| format!("no node {node} in the demo"))?;
        let proxy = NodeProxy::start(
            NodeProxyConfig::new(node, self.trust_domain.clone()),
            parts.mesh.clone(),
            parts.certs.clone(),
            self.bundles.clone(),
        )
        .await?;
        self.node_proxies.insert(node.to_owned(), proxy);
        Ok(())
    }
}

/// One listener per (workload address, target port) of the services' endpoints.
fn app_listeners(mesh: &MeshConfig) -> BTreeMap<SocketAddr, String> {
    let names: BTreeMap<IpAddr, &str> = mesh
        .workloads
        .iter()
        .map(|w| (w.ip, w.name.as_str()))
        .collect();
    let mut out = BTreeMap::new();
    for service in &mesh.services {
        for ip in &service.endpoints {
            for port in &service.ports {
                let name = names.get(ip).copied().unwrap_or("unknown");
                out.insert(SocketAddr::new(*ip, port.target_port), name.to_owned());
            }
        }
    }
    out
}

/// Follows the workload API Addresses of the control plane at `ads_uri` over Delta ADS, as a
/// node proxy's view of the mesh. The returned tasks (the xDS driver and the feed) stop the
/// subscription when aborted.
pub fn mesh_over_xds(
    ads_uri: &str,
    node: &str,
) -> (watch::Receiver<MeshConfig>, Vec<JoinHandle<()>>) {
    let (client, driver) = xds_client(ads_uri, Mode::Delta, node);
    let (tx, rx) = watch::channel(MeshConfig::default());
    (rx, vec![driver, tokio::spawn(feed_mesh(client, tx))])
}

/// Follows the Ingresses, IngressClasses, TLS Secrets and workload Addresses of the control
/// plane at `ads_uri` over State-of-the-World ADS, as a gateway's configuration. The returned
/// tasks stop the subscription when aborted.
pub fn gateway_config_over_xds(
    ads_uri: &str,
    node: &str,
) -> (watch::Receiver<GatewayConfig>, Vec<JoinHandle<()>>) {
    let (client, driver) = xds_client(ads_uri, Mode::StateOfTheWorld, node);
    let (tx, rx) = watch::channel(GatewayConfig::default());
    (rx, vec![driver, tokio::spawn(feed_gateway(client, tx))])
}

/// An xDS client for `node`, and the spawned task that drives it.
fn xds_client(uri: &str, mode: Mode, node: &str) -> (XdsClient, JoinHandle<()>) {
    let node = Node {
        id: node.to_owned(),
        cluster: "meshkit-demo".to_owned(),
        ..Default::default()
    };
    let (client, driver) = XdsClient::new(XdsConfig::new(uri.to_owned(), mode, node));
    let driver = tokio::spawn(async move {
        if let Err(e) = driver.run().await {
            tracing::warn!(error = %e, "xDS client stopped");
        }
    });
    (client, driver)
}

/// Keeps `tx` at the mesh described by the Address resources `client` receives.
async fn feed_mesh(client: XdsClient, tx: watch::Sender<MeshConfig>) {
    let mut addresses = client.watch_all::<AddressResource>();
    let mut current: BTreeMap<String, AddressResource> = BTreeMap::new();
    while let Some(event) = addresses.next().await {
        if apply(&mut current, event) {
            tx.send_replace(mesh_config(current.values()));
        }
    }
}

/// Keeps `tx` at the gateway configuration `client` receives.
async fn feed_gateway(client: XdsClient, tx: watch::Sender<GatewayConfig>) {
    let mut addresses = client.watch_all::<AddressResource>();
    let mut ingresses = client.watch_all::<IngressResource>();
    let mut classes = client.watch_all::<IngressClassResource>();
    let mut secrets = client.watch_all::<Secret>();
    let (mut a, mut i, mut c, mut s) = (
        BTreeMap::new(),
        BTreeMap::new(),
        BTreeMap::new(),
        BTreeMap::new(),
    );
    loop {
        let changed = tokio::select! {
            Some(e) = addresses.next() => apply(&mut a, e),
            Some(e) = ingresses.next() => apply(&mut i, e),
            Some(e) = classes.next() => apply(&mut c, e),
            Some(e) = secrets.next() => apply(&mut s, e),
            else => return,
        };
        if changed {
            tx.send_replace(GatewayConfig {
                ingresses: i
                    .values()
                    .map(|r: &IngressResource| r.ingress.clone())
                    .collect(),
                ingress_classes: c
                    .values()
                    .map(|r: &IngressClassResource| r.class.clone())
                    .collect(),
                secrets: s.values().filter_map(tls_secret).collect(),
                mesh: mesh_config(a.values()),
            });
        }
    }
}

/// Applies one watch event to a name-keyed view; whether the view changed.
fn apply<T: Resource + Clone>(view: &mut BTreeMap<String, T>, event: WatchEvent<T>) -> bool {
    match event {
        WatchEvent::Updated { name, resource, .. } => {
            view.insert(name, T::clone(&resource));
            true
        }
        WatchEvent::Removed { name, .. } => view.remove(&name).is_some(),
        WatchEvent::Error { name, error } => {
            tracing::warn!(?name, %error, "rejected xDS resource");
            false
        }
        _ => false,
    }
}

/// The node proxy's view of the mesh from workload API Address resources.
pub fn mesh_config<'a>(addresses: impl Iterator<Item = &'a AddressResource>) -> MeshConfig {
    let mut workloads = Vec::new();
    let mut services = Vec::new();
    let mut members: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
    // Target ports as the workloads declare them (a WorkloadEntry may map a service port to
    // a port of its own), by service key and service port.
    let mut targets: BTreeMap<(String, u32), u32> = BTreeMap::new();
    for resource in addresses {
        match &resource.address.r#type {
            Some(address::Type::Workload(w)) => {
                let Some(ip) = w.addresses.first().and_then(|b| ip_from_bytes(b)) else {
                    continue;
                };
                for (key, ports) in &w.services {
                    members.entry(key.clone()).or_default().insert(ip);
                    for p in &ports.ports {
                        targets
                            .entry((key.clone(), p.service_port))
                            .or_insert(p.target_port);
                    }
                }
                workloads.push(Workload {
                    name: w.name.clone(),
                    namespace: w.namespace.clone(),
                    service_account: w.service_account.clone(),
                    ip,
                    node: w.node.clone(),
                    ports: Vec::new(),
                });
            }
            Some(address::Type::Service(s)) => {
                services.push(Service {
                    name: s.name.clone(),
                    namespace: s.namespace.clone(),
                    hostname: s.hostname.clone(),
                    vip: s.addresses.first().and_then(|a| ip_from_bytes(&a.address)),
                    ports: s
                        .ports
                        .iter()
                        .filter_map(|p| {
                            Some(ServicePort {
                                name: None,
                                port: u16::try_from(p.service_port).ok()?,
                                target_port: u16::try_from(p.target_port).ok()?,
                            })
                        })
                        .collect(),
                    endpoints: Vec::new(),
                });
            }
            None => {}
        }
    }
    for service in &mut services {
        let key = format!("{}/{}", service.namespace, service.hostname);
        service.endpoints = members.get(&key).into_iter().flatten().copied().collect();
        for port in &mut service.ports {
            if let Some(target) = targets
                .get(&(key.clone(), u32::from(port.port)))
                .and_then(|t| u16::try_from(*t).ok())
                .filter(|t| *t != 0)
            {
                port.target_port = target;
            }
        }
    }
    MeshConfig {
        workloads,
        services,
    }
}

fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

/// A TLS Secret from an SDS `Secret` named `namespace/name` with inline PEM.
fn tls_secret(s: &Secret) -> Option<TlsSecret> {
    let (namespace, name) = s.name.split_once('/')?;
    let Some(secret::Type::TlsCertificate(cert)) = &s.r#type else {
        return None;
    };
    let inline = |d: &Option<envoy_types::pb::envoy::config::core::v3::DataSource>| match d
        .as_ref()?
        .specifier
        .as_ref()?
    {
        data_source::Specifier::InlineBytes(b) => String::from_utf8(b.clone()).ok(),
        data_source::Specifier::InlineString(s) => Some(s.clone()),
        _ => None,
    };
    Some(TlsSecret {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        cert_pem: inline(&cert.certificate_chain)?,
        key_pem: inline(&cert.private_key)?,
    })
}
