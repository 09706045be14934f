//! The demo mesh assembled from meshkit's parts: a control plane, two node proxies and an
//! ingress gateway that get their configuration over xDS and their certificates from the
//! control plane's CA, and echo workloads, all in one process on loopback addresses.
//!
//! The node proxies use Delta ADS, the gateway State-of-the-World ADS, so both variants of the
//! xDS client are exercised by every run.
//!
//! This crate is the demo and nothing depends on it: the parts it assembles are the
//! `meshkit-control-plane`, `meshkit-node-proxy` and `meshkit-gateway` crates, and the echo
//! application ([`serve_echo`]) stands in for the workloads.
//!
//! # Feature flags
//!
//! - `aws-lc-rs`: aws-lc-rs instead of ring as the crypto provider of every part.
//!
//! # Stability
//!
//! Pre-1.0, and a demo: its API follows what `mesh-demo` and the tests need.

// docs.rs builds with `--cfg docsrs`: items behind a feature show it.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod echo;

pub use echo::{EchoReply, serve_echo};

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use meshkit_cli::CliError;
use meshkit_control_plane::ca::TokenGrants;
use meshkit_control_plane::{ControlPlane, ControlPlaneConfig, Source};
use meshkit_gateway::feed::gateway_config_over_xds;
use meshkit_gateway::{Gateway, GatewayConfig, GatewaySettings, TlsCertificate};
use meshkit_identity::istio::IstioCaClient;
use meshkit_identity::{SpiffeId, SvidCache, TrustBundle, TrustBundleSet, TrustDomain};
use meshkit_mesh::MeshConfig;
use meshkit_mesh::feed::mesh_over_xds;
use meshkit_node_proxy::admin::Registry;
use meshkit_node_proxy::{NodeProxy, NodeProxyConfig, OutboundListener, Telemetry};
use meshkit_xds_client::ClientConfig as XdsConfig;
use meshkit_xds_client::envoy::Node;
use meshkit_xds_client::protocol::Mode;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

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
    (
        "gateway-api.yaml",
        include_str!("../manifests/gateway-api.yaml"),
    ),
    (
        "shop-policy.yaml",
        include_str!("../manifests/shop-policy.yaml"),
    ),
];

/// The service that each node proxy has an outbound listener for (on loopback, port chosen at
/// start; [`DemoMesh::outbound_addr`]), so that the demo's workloads can call it through the
/// mesh and the `shop/api-callers` AuthorizationPolicy decides who may.
pub const OUTBOUND_SERVICE: (&str, u16) = ("api.shop.svc.cluster.local", 80);

/// The demo's bootstrap tokens (see `manifests/demo-tokens.txt`: the demo's trust model).
pub const DEMO_TOKENS: &str = include_str!("../manifests/demo-tokens.txt");

/// The nodes of the demo and their bootstrap tokens.
pub const NODES: &[(&str, &str)] = &[
    ("node-a", "demo-node-a-token"),
    ("node-b", "demo-node-b-token"),
];

/// The cluster name the demo's parts send to the control plane in their xDS node.
pub const DEMO_CLUSTER: &str = "meshkit-demo";

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
    /// The address of the gateway's Gateway API listeners, each on its Gateway listener's
    /// port (the sample Gateway's is [`GATEWAY_API_PORT`]). Default `127.0.0.1`.
    pub gateway_api: IpAddr,
}

/// The port of the sample Gateway's HTTP listener (`gateway-api.yaml`).
pub const GATEWAY_API_PORT: u16 = 18090;

/// Where an Envoy fed by the demo's control plane listens (see [`envoy_bootstrap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvoyListeners {
    /// Plain HTTP.
    pub http: SocketAddr,
    /// HTTPS with the certificate chosen by SNI; `None` for no HTTPS listener.
    pub https: Option<SocketAddr>,
    /// The address Envoy's Gateway API listeners bind (each on its Gateway listener's port);
    /// `None` keeps the control plane's default (`0.0.0.0`). It must differ from the
    /// gateway's [`MeshOptions::gateway_api`], whose ports are the same.
    pub gateway_api: Option<IpAddr>,
}

impl Default for MeshOptions {
    fn default() -> Self {
        Self {
            http: SocketAddr::from(([127, 0, 0, 1], 0)),
            https: SocketAddr::from(([127, 0, 0, 1], 0)),
            envoy: None,
            gateway_api: IpAddr::from([127, 0, 0, 1]),
        }
    }
}

/// An Envoy bootstrap (YAML) that takes all of its configuration (LDS, CDS and through them
/// RDS, EDS, SDS) from the ADS server at `ads` (plaintext gRPC, as the demo's control plane
/// serves it), State of the World or, with `delta`, incremental. The admin interface listens
/// on `admin` (port 0: any free port; Envoy writes the bound address to
/// `--admin-address-path` if asked).
pub fn envoy_bootstrap(ads: SocketAddr, node_id: &str, delta: bool, admin: SocketAddr) -> String {
    envoy_bootstrap_with(ads, node_id, delta, admin, &EnvoyXdsSecurity::default())
}

/// The demo's token for Envoy gateways (`gateway=envoy-gateway*` in `demo-tokens.txt`).
pub const ENVOY_TOKEN: &str = "demo-envoy-token";

/// How an Envoy reaches the control plane: the bearer token it sends on the ADS stream, and
/// TLS (the root PEM and the server name to check) when the control plane serves TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvoyXdsSecurity {
    /// Sent as `authorization: Bearer TOKEN`; `None`: no token.
    pub token: Option<String>,
    /// `(root PEM, server name)`; `None`: plaintext.
    pub tls: Option<(String, String)>,
}

impl EnvoyXdsSecurity {
    /// What the demo's Envoy needs for `control_plane`: [`ENVOY_TOKEN`], and its TLS.
    pub fn demo(control_plane: &ControlPlane) -> Self {
        Self {
            token: Some(ENVOY_TOKEN.to_owned()),
            tls: control_plane
                .server_name()
                .map(|name| (control_plane.root_pem().to_owned(), name.to_owned())),
        }
    }
}

/// As [`envoy_bootstrap`], with the token and TLS of `security` for the ADS connection.
pub fn envoy_bootstrap_with(
    ads: SocketAddr,
    node_id: &str,
    delta: bool,
    admin: SocketAddr,
    security: &EnvoyXdsSecurity,
) -> String {
    let api_type = if delta { "DELTA_GRPC" } else { "GRPC" };
    let metadata = match &security.token {
        Some(token) => format!(
            "\n      initial_metadata: [{{ key: authorization, value: \"Bearer {token}\" }}]"
        ),
        None => String::new(),
    };
    let transport = match &security.tls {
        Some((root, name)) => {
            let root = root.replace('\n', "\\n");
            format!(
                r#"
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: {name}
        common_tls_context:
          # The control plane speaks TLS 1.3 only; Envoy's upstream default stops at 1.2.
          tls_params: {{ tls_minimum_protocol_version: TLSv1_3, tls_maximum_protocol_version: TLSv1_3 }}
          alpn_protocols: [h2]
          validation_context:
            trusted_ca: {{ inline_string: "{root}" }}
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: {{ exact: {name} }}"#
            )
        }
        None => String::new(),
    };
    format!(
        r#"node:
  id: {node_id}
  cluster: {DEMO_CLUSTER}
admin:
  address: {{ socket_address: {{ address: {admin_ip}, port_value: {admin_port} }} }}
dynamic_resources:
  ads_config:
    api_type: {api_type}
    transport_api_version: V3
    set_node_on_first_message_only: true
    grpc_services:
    - envoy_grpc: {{ cluster_name: xds }}{metadata}
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
            address: {{ socket_address: {{ address: {ads_ip}, port_value: {ads_port} }} }}{transport}
"#,
        admin_ip = admin.ip(),
        admin_port = admin.port(),
        ads_ip = ads.ip(),
        ads_port = ads.port(),
    )
}

/// A running demo mesh. Dropping it stops every part.
pub struct DemoMesh {
    /// What the control plane reads: the manifest folder (edit it to change the mesh), or
    /// the Kubernetes API server.
    pub source: Source,
    /// The control plane.
    pub control_plane: ControlPlane,
    /// The node proxies, by node name.
    pub node_proxies: BTreeMap<String, NodeProxy>,
    /// Where the gateway serves plain HTTP.
    pub http_addr: SocketAddr,
    /// Where the gateway serves HTTPS.
    pub https_addr: SocketAddr,
    /// The address of the gateway's Gateway API listeners.
    pub gateway_api: IpAddr,
    /// The mesh as the gateway sees it, from xDS.
    pub gateway_config: watch::Receiver<GatewayConfig>,
    /// Each part's admin endpoint (`/healthz/ready`, `/metrics`, `/config_dump`), by part:
    /// `control-plane`, `gateway`, and each node's name.
    pub admin_addrs: BTreeMap<String, SocketAddr>,
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
    /// Its readiness and metrics, kept across restarts like the admin endpoint serving them.
    telemetry: Telemetry,
}

impl std::fmt::Debug for DemoMesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DemoMesh")
            .field("source", &self.source)
            .field("http_addr", &self.http_addr)
            .field("https_addr", &self.https_addr)
            .field("gateway_api", &self.gateway_api)
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

/// The namespaces of the sample manifests' objects (a test holds this to the manifests).
pub const SAMPLE_NAMESPACES: &[&str] = &["blog", "shop"];

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

/// Creates (or updates, by server-side apply as field manager `meshkit-demo`) the objects of
/// the sample manifests in the Kubernetes API server of `client`, with the namespaces they
/// are in; returns how many objects were applied.
///
/// # Errors
///
/// When the API server refuses an object (its CRD is not installed, say).
pub async fn apply_samples(client: &kube::Client) -> Result<usize, CliError> {
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    use meshkit_control_plane::kube_source::resource_of;
    let params = PatchParams::apply("meshkit-demo").force();
    let mut objects = Vec::new();
    for (file, text) in SAMPLE_MANIFESTS {
        let documents: Vec<serde_json::Value> = serde_saphyr::from_multiple(text)
            .map_err(|e| format!("sample manifest {file}: {e}"))?;
        objects.extend(documents.into_iter().filter(|d| d.is_object()));
    }
    let mut namespaces: Vec<String> = objects
        .iter()
        .filter_map(|o| o["metadata"]["namespace"].as_str().map(str::to_owned))
        .collect();
    namespaces.sort();
    namespaces.dedup();
    let (namespace_resource, _) =
        resource_of("v1", "Namespace").ok_or("Namespaces are not watched")?;
    let namespace_api: Api<DynamicObject> = Api::all_with(client.clone(), &namespace_resource);
    for ns in &namespaces {
        let object = serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}
        });
        namespace_api
            .patch(ns, &params, &Patch::Apply(&object))
            .await
            .map_err(|e| format!("namespace {ns}: {e}"))?;
    }
    for object in &objects {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let Some((resource, namespaced)) = resource_of(api_version, kind) else {
            return Err(format!(
                "{api_version} {kind} {name} is not a kind the control plane reads"
            )
            .into());
        };
        let api: Api<DynamicObject> = if namespaced {
            let ns = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default");
            Api::namespaced_with(client.clone(), ns, &resource)
        } else {
            Api::all_with(client.clone(), &resource)
        };
        api.patch(name, &params, &Patch::Apply(object))
            .await
            .map_err(|e| format!("{kind} {name}: {e}"))?;
    }
    Ok(namespaces.len() + objects.len())
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
        Self::start_from(Source::Manifests(manifest_dir), options, progress).await
    }

    /// [`DemoMesh::start`] with the control plane reading `source`: the manifests folder,
    /// or a Kubernetes API server holding the sample objects ([`apply_samples`]).
    ///
    /// # Errors
    ///
    /// As [`DemoMesh::start`].
    pub async fn start_from(
        source: Source,
        options: MeshOptions,
        progress: impl Fn(&str),
    ) -> Result<Self, CliError> {
        let td = TrustDomain::new("cluster.local")?;
        let mut cp_config = match &source {
            Source::Manifests(dir) => ControlPlaneConfig::new(dir),
            Source::Kubernetes(kube) => ControlPlaneConfig::kubernetes((**kube).clone()),
        };
        cp_config = cp_config
            .with_ads_addr(SocketAddr::from(([127, 0, 0, 1], 0)))
            .with_ca_addr(SocketAddr::from(([127, 0, 0, 1], 0)))
            .with_grants(TokenGrants::parse(DEMO_TOKENS)?)
            .with_admin_addr(SocketAddr::from(([127, 0, 0, 1], 0)));
        if let Some(envoy) = options.envoy {
            cp_config.translate.http_listener = envoy.http;
            cp_config.translate.https_listener = envoy.https;
            if let Some(address) = envoy.gateway_api {
                cp_config.translate.gateway_api_address = address;
            }
        }
        let control_plane = ControlPlane::start(cp_config).await?;
        progress(&format!(
            "control plane: ADS on {}, CA on {}",
            control_plane.ads_uri(),
            control_plane.ca_addr()
        ));
        let bundles: Arc<TrustBundleSet> =
            Arc::new(TrustBundle::from_pem(td.clone(), control_plane.root_pem())?.into());
        // The CA and ADS speak TLS with a certificate from the control plane's own CA.
        let ca_channel = control_plane.ca_channel()?;
        let mut tasks = Vec::new();
        let mut admin_addrs = BTreeMap::new();
        if let Some(addr) = control_plane.admin_addr() {
            admin_addrs.insert("control-plane".to_owned(), addr);
        }

        // Node proxies: certificates from the CA, workloads over Delta ADS.
        let mut node_proxies = BTreeMap::new();
        let mut node_parts = BTreeMap::new();
        for (node, token) in NODES {
            let ca = IstioCaClient::new(ca_channel.clone())
                .with_impersonated_identity(true)
                .with_bearer_token(token)?;
            let certs = SvidCache::new(ca, meshkit_cli::rotation_config());
            let (rx, feed) = mesh_over_xds(xds_config(&control_plane, Mode::Delta, node, token)?);
            tasks.extend(feed);
            let telemetry = Telemetry::new();
            let proxy = NodeProxy::start(
                node_proxy_config(node, &td, &telemetry),
                rx.clone(),
                certs.clone(),
                bundles.clone(),
            )
            .await?;
            let admin = telemetry.admin(Registry::default());
            let (addr, serving) = serve_admin(admin).await?;
            admin_addrs.insert((*node).to_owned(), addr);
            tasks.push(serving);
            node_proxies.insert((*node).to_owned(), proxy);
            node_parts.insert(
                (*node).to_owned(),
                NodeParts {
                    certs,
                    mesh: rx,
                    telemetry,
                },
            );
        }
        progress("node proxies: node-a and node-b, workloads over Delta xDS");

        // The gateway: Ingresses, classes, secrets and workloads over State-of-the-World ADS.
        let gateway_id: SpiffeId = GATEWAY_ID.parse()?;
        let ca = IstioCaClient::new(ca_channel).with_bearer_token(GATEWAY_TOKEN)?;
        let certs = SvidCache::new(ca, meshkit_cli::rotation_config());
        certs.get(&gateway_id).await?;
        let (gateway_config, feed) = gateway_config_over_xds(xds_config(
            &control_plane,
            Mode::StateOfTheWorld,
            "gateway",
            GATEWAY_TOKEN,
        )?);
        tasks.extend(feed);
        let hbone =
            meshkit_hbone::Client::new(meshkit_cli::hbone_client_config(), certs, bundles.clone());
        let gateway = Gateway::new(
            // The demo shows who answered: the backend headers are its point.
            GatewaySettings::new(gateway_id)
                .with_provider(meshkit_cli::crypto_provider())
                .with_backend_headers(true),
            hbone,
            gateway_config.clone(),
        );
        let (addr, serving) = serve_admin(gateway.admin(Registry::default())).await?;
        admin_addrs.insert("gateway".to_owned(), addr);
        tasks.push(serving);
        let http = TcpListener::bind(options.http).await?;
        let https = TcpListener::bind(options.https).await?;
        let (http_addr, https_addr) = (http.local_addr()?, https.local_addr()?);
        let serve_http = gateway.clone().serve_http(http);
        tasks.push(tokio::spawn(async move {
            let _ = serve_http.await;
        }));
        let serve_https = gateway.clone().serve_https(https);
        tasks.push(tokio::spawn(async move {
            let _ = serve_https.await;
        }));
        tasks.push(tokio::spawn(gateway.serve_gateway_api(options.gateway_api)));

        // Wait for the configuration: resources arrive one event at a time, so wait until
        // routes and endpoints are there and nothing has changed for a moment. Only the
        // samples' services count: an API server has Services of its own (`kubernetes`)
        // with no workload in this mesh.
        let mut config = gateway_config.clone();
        let ready = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                let complete = {
                    let c = config.borrow_and_update();
                    !c.ingresses.is_empty()
                        && !c.gateway_api.http_routes.is_empty()
                        && !c.secrets.is_empty()
                        && !c.mesh.workloads.is_empty()
                        && c.mesh
                            .services
                            .iter()
                            .filter(|s| SAMPLE_NAMESPACES.contains(&s.namespace.as_str()))
                            .all(|s| !s.endpoints.is_empty())
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
            source,
            control_plane,
            node_proxies,
            node_parts,
            trust_domain: td,
            bundles,
            http_addr,
            https_addr,
            gateway_api: options.gateway_api,
            gateway_config,
            admin_addrs,
            tasks,
        })
    }
}

impl DemoMesh {
    /// The TLS Secret `name` as the gateway last received it over xDS.
    pub fn gateway_secret(&self, name: &str) -> Option<TlsCertificate> {
        self.gateway_config
            .borrow()
            .secrets
            .iter()
            .find(|s| s.name == name)
            .cloned()
    }

    /// Where the node proxy of `node` listens for connections to [`OUTBOUND_SERVICE`]: a
    /// workload of that node connects there from its own address.
    pub fn outbound_addr(&self, node: &str) -> Option<SocketAddr> {
        self.node_proxies
            .get(node)?
            .outbound_addrs()
            .first()
            .copied()
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
            node_proxy_config(node, &self.trust_domain, &parts.telemetry),
            parts.mesh.clone(),
            parts.certs.clone(),
            self.bundles.clone(),
        )
        .await?;
        self.node_proxies.insert(node.to_owned(), proxy);
        Ok(())
    }
}

/// The demo's xDS client configuration for `node` of the demo cluster, with the control
/// plane's TLS (when it serves TLS) and the node's token.
fn xds_config(
    control_plane: &ControlPlane,
    mode: Mode,
    node: &str,
    token: &str,
) -> Result<XdsConfig, CliError> {
    let node = Node {
        id: node.to_owned(),
        cluster: DEMO_CLUSTER.to_owned(),
        ..Default::default()
    };
    let mut config = XdsConfig::new(control_plane.ads_uri(), mode, node).bearer_token(token)?;
    if control_plane.server_name().is_some() {
        config = config.with_control_plane_tls(&control_plane.client_tls()?)?;
    }
    Ok(config)
}

/// A node proxy of the demo, with the programs' crypto provider.
fn node_proxy_config(
    node: &str,
    trust_domain: &TrustDomain,
    telemetry: &Telemetry,
) -> NodeProxyConfig {
    let (service, port) = OUTBOUND_SERVICE;
    NodeProxyConfig::new(node, trust_domain.clone())
        .with_outbound(OutboundListener::new(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            service,
            port,
        ))
        .with_client(meshkit_cli::hbone_client_config())
        .with_telemetry(telemetry.clone())
        .waiting_for_first_mesh()
}

/// Serves `admin` on a free loopback port: its address and the serving task.
async fn serve_admin(
    admin: meshkit_node_proxy::admin::Admin,
) -> Result<(SocketAddr, JoinHandle<()>), CliError> {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = admin.serve(listener, std::future::pending()).await;
    });
    Ok((addr, task))
}

/// `GET path` on a part's admin endpoint at `addr`: the body of a 200 answer.
///
/// # Errors
///
/// When the endpoint cannot be reached within 10 s or does not answer 200.
pub async fn admin_get(addr: SocketAddr, path: &str) -> Result<String, CliError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut sock = tokio::net::TcpStream::connect(addr).await?;
        sock.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut raw = Vec::new();
        sock.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), fetch)
        .await
        .map_err(|_| format!("{addr}{path}: no answer within 10 s"))??;
    let raw = String::from_utf8_lossy(&raw);
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr}{path}: not an HTTP answer"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("{addr}{path}: {}", head.lines().next().unwrap_or("")).into());
    }
    Ok(body.to_owned())
}

/// The samples named `name` in a metrics text (what `/metrics` answers): each one's labels
/// and value. Lines that are not samples of `name` are skipped; this reads figures for a
/// summary and checks nothing of the format.
pub fn samples(text: &str, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (labels, value) = match rest.strip_prefix('{') {
            Some(rest) => match rest.rsplit_once("} ") {
                Some((labels, value)) => (labels, value),
                None => continue,
            },
            None => match rest.strip_prefix(' ') {
                Some(value) => ("", value),
                None => continue,
            },
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let mut map = BTreeMap::new();
        // Label values here never hold `",` (names, identities, numbers).
        for pair in labels.split("\",").filter(|p| !p.is_empty()) {
            if let Some((k, v)) = pair.split_once("=\"") {
                map.insert(k.to_owned(), v.trim_end_matches('"').to_owned());
            }
        }
        out.push((map, value));
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_namespaces_are_those_the_manifests_name() {
        let mut named: Vec<String> = SAMPLE_MANIFESTS
            .iter()
            .flat_map(|(_, text)| {
                serde_saphyr::from_multiple::<serde_json::Value>(text).expect("sample YAML")
            })
            .filter_map(|doc| doc["metadata"]["namespace"].as_str().map(str::to_owned))
            .collect();
        named.sort();
        named.dedup();
        assert_eq!(named, SAMPLE_NAMESPACES);
    }
}
