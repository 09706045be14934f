//! Tests of the control plane: manifests in, ADS and CA out, over real sockets on loopback.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, route_match};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use meshkit_control_plane::access::XdsRole;
use meshkit_control_plane::ca::TokenGrants;
use meshkit_control_plane::manifests::ManifestSet;
use meshkit_control_plane::translate::{TranslateOptions, build_snapshot};
use meshkit_control_plane::{ControlPlane, ControlPlaneConfig};
use meshkit_identity::istio::IstioCaClient;
use meshkit_identity::{
    Authorize, CaError, PeerRole, SpiffeId, SpiffeVerifier, VerifyError, request_svid,
};
use meshkit_ingress_model::gateway::types::HttpRoute;
use meshkit_mesh::proto::workload::address;
use meshkit_mesh::resources::{
    ADDRESS_TYPE_URL, AddressResource, GatewayApiResource, INGRESS_TYPE_URL, IngressClassResource,
    IngressResource,
};
use meshkit_xds_client::protocol::Mode;
use meshkit_xds_client::{
    CallCredentials, ClientConfig, LISTENER_TYPE_URL, Resource, SECRET_TYPE_URL, WatchEvent,
    XdsClient,
};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const WEB_CLUSTER: &str = "outbound|80||web.shop.svc.cluster.local";
const TOKEN_A: &str = "node-a-token";
/// Bound on every wait for something that must happen: far above what it needs, so that a
/// loaded machine does not fail it. Waits for something that must not happen are short.
const PATIENCE: Duration = Duration::from_secs(10);
/// How long a check that nothing is sent waits.
const NO_ANSWER: Duration = Duration::from_secs(1);

fn bundled() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../demo/manifests")
}

/// A fresh copy of the bundled manifests, with a TLS Secret generated for this test.
fn manifest_copy(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("meshkit-cp-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    for entry in std::fs::read_dir(bundled()).expect("bundled manifests") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            std::fs::copy(&path, dir.join(path.file_name().expect("name"))).expect("copy");
        }
    }
    std::fs::write(dir.join("shop-tls-secret.yaml"), generated_tls_secret()).expect("secret");
    dir
}

fn generated_tls_secret() -> String {
    use base64::Engine as _;
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let params = rcgen::CertificateParams::new(vec![
        "shop.example.com".to_owned(),
        "*.shop.example.com".to_owned(),
    ])
    .expect("params");
    let cert = params.self_signed(&key).expect("self-signed");
    let b64 = |s: String| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: shop-tls, namespace: shop}}\n\
         type: kubernetes.io/tls\ndata:\n  tls.crt: {}\n  tls.key: {}\n",
        b64(cert.pem()),
        b64(key.serialize_pem())
    )
}

async fn start(dir: &Path) -> ControlPlane {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let grants = TokenGrants::new()
        .grant(TOKEN_A, "spiffe://cluster.local/ns/shop/*")
        .expect("grant")
        .grant(TOKEN_A, "spiffe://cluster.local/ns/blog/sa/blog")
        .expect("grant")
        // A gateway role for any node id: these tests look at everything a gateway is sent.
        .with_xds_role(TOKEN_A, XdsRole::Gateway("*".to_owned()));
    let config = ControlPlaneConfig::new(dir)
        .with_ads_addr(any)
        .with_ca_addr(any)
        .with_grants(grants)
        .with_poll_interval(Duration::from_millis(100));
    ControlPlane::start(config)
        .await
        .expect("control plane starts")
}

/// `config` with the control plane's TLS and [`TOKEN_A`].
fn secure(cp: &ControlPlane, config: ClientConfig) -> ClientConfig {
    config
        .with_control_plane_tls(&cp.client_tls().expect("client TLS"))
        .expect("TLS config")
        .bearer_token(TOKEN_A)
        .expect("token")
}

type RawClient = AggregatedDiscoveryServiceClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, CallCredentials>,
>;

/// A raw ADS client over the control plane's TLS, with `token` (or none).
fn raw_client(cp: &ControlPlane, token: Option<&str>) -> RawClient {
    let channel = cp
        .client_tls()
        .expect("client TLS")
        .connect_lazy(&cp.ads_uri())
        .expect("channel");
    let credentials = match token {
        Some(token) => CallCredentials::bearer_token(token).expect("token"),
        None => CallCredentials::from_fn(Ok),
    };
    AggregatedDiscoveryServiceClient::with_interceptor(channel, credentials)
}

fn node(id: &str) -> Node {
    Node {
        id: id.to_owned(),
        ..Default::default()
    }
}

/// Collects `Updated` events of a wildcard watch until `count` names are known.
async fn collect<T: Resource>(
    watch: &mut meshkit_xds_client::Watch<T>,
    count: usize,
) -> std::collections::BTreeMap<String, std::sync::Arc<T>> {
    let mut seen = std::collections::BTreeMap::new();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while seen.len() < count {
        let event = tokio::time::timeout_at(deadline, watch.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{count} resources within {PATIENCE:?}, got {:?}",
                    seen.keys()
                )
            })
            .expect("watch open");
        if let WatchEvent::Updated { name, resource, .. } = event {
            seen.insert(name, resource);
        }
    }
    seen
}

// === manifests and translation ===

#[test]
fn bundled_manifests_load_and_translate() {
    let set =
        ManifestSet::load_dir(&bundled()).unwrap_or_else(|e| panic!("bundled manifests: {e}"));
    assert_eq!(set.ingresses.len(), 2);
    assert_eq!(set.ingress_classes.len(), 1);
    assert_eq!(set.secrets.len(), 1);
    assert_eq!(set.service_entries.len(), 4);
    assert_eq!(set.workload_entries.len(), 5);
    let namespaces: BTreeSet<&str> = set
        .workload_entries
        .iter()
        .map(|w| w.namespace.as_str())
        .collect();
    assert_eq!(namespaces, BTreeSet::from(["blog", "shop"]));

    let snapshot = build_snapshot(&set, &TranslateOptions::default());
    let addresses = snapshot.names(ADDRESS_TYPE_URL);
    assert_eq!(addresses.len(), 9, "{addresses:?}");
    assert!(addresses.contains(&"shop/web.shop.svc.cluster.local".to_owned()));
    let web1 = "Kubernetes/networking.istio.io/WorkloadEntry/shop/web-1";
    let any = &snapshot
        .get(ADDRESS_TYPE_URL, web1)
        .expect("web-1")
        .resource;
    let decoded = AddressResource::decode(&any.value).expect("decodes");
    assert_eq!(decoded.name, web1);
    let Some(address::Type::Workload(w)) = decoded.address.r#type else {
        panic!("web-1 is a workload")
    };
    assert_eq!(w.addresses, vec![vec![127, 0, 0, 11]]);
    assert_eq!(w.service_account, "web");
    // The default trust domain goes empty, as istiod sends it.
    assert_eq!(w.trust_domain, "");
    assert_eq!(w.node, "node-a");
    let ports = &w.services["shop/web.shop.svc.cluster.local"].ports;
    assert_eq!((ports[0].service_port, ports[0].target_port), (80, 8080));

    // A WorkloadEntry port override by port name.
    let blog1 = "Kubernetes/networking.istio.io/WorkloadEntry/blog/blog-1";
    let any = &snapshot
        .get(ADDRESS_TYPE_URL, blog1)
        .expect("blog-1")
        .resource;
    let Some(address::Type::Workload(w)) = AddressResource::decode(&any.value)
        .expect("decodes")
        .address
        .r#type
    else {
        panic!("blog-1 is a workload")
    };
    assert_eq!(
        w.services["blog/blog.blog.svc.cluster.local"].ports[0].target_port,
        8080
    );

    // Envoy: routes in Kubernetes precedence order, then the default backend.
    let any = &snapshot
        .get(meshkit_xds_client::ROUTE_TYPE_URL, "http")
        .expect("RDS http")
        .resource;
    let rc = <RouteConfiguration as Message>::decode(any.value.as_slice()).expect("decodes");
    let vh_names: Vec<&str> = rc.virtual_hosts.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        vh_names,
        [
            "*",
            "*.shop.example.com",
            "blog.example.com",
            "shop.example.com"
        ]
    );
    let shop = &rc.virtual_hosts[3];
    let matches: Vec<route_match::PathSpecifier> = shop
        .routes
        .iter()
        .map(|r| {
            r.r#match
                .clone()
                .and_then(|m| m.path_specifier)
                .expect("path")
        })
        .collect();
    assert_eq!(
        matches,
        [
            route_match::PathSpecifier::Path("/healthz".into()),
            route_match::PathSpecifier::PathSeparatedPrefix("/api".into()),
            route_match::PathSpecifier::Prefix("/".into()),
            route_match::PathSpecifier::Prefix("/".into()),
        ]
    );
    assert_eq!(shop.routes[3].name, "default-backend");

    // EDS from the selected workloads, on the target port.
    let any = &snapshot
        .get(meshkit_xds_client::ENDPOINT_TYPE_URL, WEB_CLUSTER)
        .expect("EDS")
        .resource;
    let cla = <ClusterLoadAssignment as Message>::decode(any.value.as_slice()).expect("decodes");
    assert_eq!(cla.endpoints[0].lb_endpoints.len(), 2);

    // The sample Gateway's HTTP listener on 18090 beside the Ingress listeners.
    assert_eq!(
        snapshot.names(LISTENER_TYPE_URL),
        ["gateway-api-18090", "http", "https"]
    );
    assert_eq!(
        snapshot.names(meshkit_xds_client::SECRET_TYPE_URL),
        ["shop/shop-tls"]
    );
}

#[test]
fn translation_is_deterministic() {
    let set = ManifestSet::load_dir(&bundled()).expect("bundled manifests");
    let a = build_snapshot(&set, &TranslateOptions::default());
    let b = build_snapshot(&set, &TranslateOptions::default());
    assert_eq!(a, b);
    for url in a.type_urls() {
        assert_eq!(a.version(url), b.version(url));
    }
}

// === ADS over the wire ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_and_delta_subscribers_get_the_resources() {
    let dir = manifest_copy("subscribers");
    let cp = start(&dir).await;
    let uri = cp.ads_uri();

    let (sotw, sotw_driver) = XdsClient::new(secure(
        &cp,
        ClientConfig::new(&uri, Mode::StateOfTheWorld, node("envoy~gw")),
    ));
    let sotw_task = tokio::spawn(sotw_driver.run());
    let (delta, delta_driver) = XdsClient::new(secure(
        &cp,
        ClientConfig::new(&uri, Mode::Delta, node("ztunnel~node-a")),
    ));
    let delta_task = tokio::spawn(delta_driver.run());

    // Node proxy: workload API over Delta.
    let mut addresses = delta.watch_all::<AddressResource>();
    let got = collect(&mut addresses, 9).await;
    assert!(got.contains_key("Kubernetes/networking.istio.io/WorkloadEntry/shop/web-2"));
    assert!(got.contains_key("blog/blog.blog.svc.cluster.local"));

    // meshkit's gateway: the Ingresses themselves, both variants.
    let mut ingresses = delta.watch_all::<IngressResource>();
    let got = collect(&mut ingresses, 2).await;
    assert_eq!(got.keys().collect::<Vec<_>>(), ["blog/blog", "shop/shop"]);
    let mut sotw_ingresses = sotw.watch_all::<IngressResource>();
    collect(&mut sotw_ingresses, 2).await;
    let mut classes = delta.watch_all::<IngressClassResource>();
    let got = collect(&mut classes, 1).await;
    assert_eq!(got.keys().collect::<Vec<_>>(), ["meshkit"]);

    // Envoy: LDS, RDS, EDS over SotW.
    // meshkit's gateway: the Gateway API objects, as Kubernetes JSON.
    let mut http_routes = delta.watch_all::<GatewayApiResource<HttpRoute>>();
    let got = collect(&mut http_routes, 1).await;
    assert_eq!(got.keys().collect::<Vec<_>>(), ["shop/store"]);
    assert_eq!(
        got["shop/store"].object.spec.hostnames,
        ["store.example.com"]
    );

    let mut listeners = sotw.watch_all::<Listener>();
    let got = collect(&mut listeners, 3).await;
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        ["gateway-api-18090", "http", "https"]
    );
    let mut routes = sotw.watch::<RouteConfiguration>("http");
    let got = collect(&mut routes, 1).await;
    assert_eq!(got["http"].virtual_hosts.len(), 4);
    let mut eds = sotw.watch::<ClusterLoadAssignment>(WEB_CLUSTER);
    let got = collect(&mut eds, 1).await;
    assert_eq!(got[WEB_CLUSTER].endpoints[0].lb_endpoints.len(), 2);
    // And the same EDS resource over Delta, by name.
    let mut eds_delta = delta.watch::<ClusterLoadAssignment>(WEB_CLUSTER);
    collect(&mut eds_delta, 1).await;

    drop((sotw, delta));
    sotw_task.abort();
    delta_task.abort();
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A raw ADS stream, to see exactly what the server pushes.
struct RawDelta {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    rx: tonic::Streaming<DeltaDiscoveryResponse>,
}

impl RawDelta {
    async fn open(cp: &ControlPlane) -> Self {
        let mut client = raw_client(cp, Some(TOKEN_A));
        let (tx, rx) = mpsc::channel(16);
        let rx = client
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await
            .expect("delta stream")
            .into_inner();
        Self { tx, rx }
    }

    async fn send(&self, req: DeltaDiscoveryRequest) {
        self.tx.send(req).await.expect("send");
    }

    async fn recv(&mut self, within: Duration) -> Option<DeltaDiscoveryResponse> {
        match tokio::time::timeout(within, self.rx.message()).await {
            Ok(Ok(Some(r))) => Some(r),
            Ok(other) => panic!("stream ended: {other:?}"),
            Err(_) => None,
        }
    }

    async fn ack(&self, r: &DeltaDiscoveryResponse) {
        self.send(DeltaDiscoveryRequest {
            type_url: r.type_url.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        })
        .await;
    }
}

struct RawSotw {
    tx: mpsc::Sender<DiscoveryRequest>,
    rx: tonic::Streaming<DiscoveryResponse>,
}

impl RawSotw {
    async fn open(cp: &ControlPlane) -> Self {
        let mut client = raw_client(cp, Some(TOKEN_A));
        let (tx, rx) = mpsc::channel(16);
        let rx = client
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await
            .expect("sotw stream")
            .into_inner();
        Self { tx, rx }
    }

    async fn send(&self, req: DiscoveryRequest) {
        self.tx.send(req).await.expect("send");
    }

    async fn recv(&mut self, within: Duration) -> Option<DiscoveryResponse> {
        match tokio::time::timeout(within, self.rx.message()).await {
            Ok(Ok(Some(r))) => Some(r),
            Ok(other) => panic!("stream ended: {other:?}"),
            Err(_) => None,
        }
    }
}

fn replace_in(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).expect("read manifest");
    assert!(text.contains(from), "{} has no {from:?}", path.display());
    std::fs::write(path, text.replace(from, to)).expect("write manifest");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_edit_pushes_only_what_changed() {
    let dir = manifest_copy("edit");
    let cp = start(&dir).await;

    let mut delta = RawDelta::open(&cp).await;
    delta
        .send(DeltaDiscoveryRequest {
            node: Some(node("ztunnel~node-a")),
            type_url: ADDRESS_TYPE_URL.to_owned(),
            resource_names_subscribe: vec!["*".to_owned()],
            ..Default::default()
        })
        .await;
    let first = delta.recv(PATIENCE).await.expect("initial response");
    assert_eq!(first.resources.len(), 9);
    delta.ack(&first).await;

    let mut sotw = RawSotw::open(&cp).await;
    for type_url in [LISTENER_TYPE_URL, ADDRESS_TYPE_URL] {
        sotw.send(DiscoveryRequest {
            node: Some(node("envoy~gw")),
            type_url: type_url.to_owned(),
            ..Default::default()
        })
        .await;
    }
    let mut initial = BTreeSet::new();
    for _ in 0..2 {
        let r = sotw.recv(PATIENCE).await.expect("initial SotW response");
        sotw.send(DiscoveryRequest {
            type_url: r.type_url.clone(),
            version_info: r.version_info.clone(),
            response_nonce: r.nonce.clone(),
            ..Default::default()
        })
        .await;
        initial.insert(r.type_url);
    }
    assert_eq!(initial.len(), 2);
    // An ACK alone is never answered.
    assert!(delta.recv(Duration::from_millis(300)).await.is_none());
    assert!(sotw.recv(Duration::from_millis(50)).await.is_none());

    // Move web-2 to another address: one workload changes, nothing else.
    replace_in(&dir.join("shop.yaml"), "127.0.0.12", "127.0.0.15");
    let update = delta.recv(PATIENCE).await.expect("pushed");
    let names: Vec<&str> = update.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        ["Kubernetes/networking.istio.io/WorkloadEntry/shop/web-2"]
    );
    assert!(update.removed_resources.is_empty());
    delta.ack(&update).await;

    // SotW: only the Address type is re-sent; listeners did not change.
    let r = sotw.recv(PATIENCE).await.expect("SotW push");
    assert_eq!(r.type_url, ADDRESS_TYPE_URL);
    assert_eq!(r.resources.len(), 9, "SotW responses carry the full set");
    assert!(
        sotw.recv(Duration::from_millis(300)).await.is_none(),
        "nothing else pushed"
    );

    // Removing a workload is pushed as a removal.
    let text = std::fs::read_to_string(dir.join("blog.yaml")).expect("read");
    let kept: Vec<&str> = text
        .split("\n---\n")
        .filter(|doc| !doc.contains("name: blog-1"))
        .collect();
    std::fs::write(dir.join("blog.yaml"), kept.join("\n---\n")).expect("write");
    let update = delta.recv(PATIENCE).await.expect("removal pushed");
    assert_eq!(
        update.removed_resources,
        ["Kubernetes/networking.istio.io/WorkloadEntry/blog/blog-1"]
    );
    assert!(update.resources.is_empty());

    // Shutting down ends open streams instead of waiting for clients to hang up.
    tokio::time::timeout(PATIENCE, cp.shutdown())
        .await
        .expect("shutdown does not wait for the open streams' clients");
    let end = tokio::time::timeout(PATIENCE, delta.rx.message())
        .await
        .expect("stream ends on shutdown");
    assert!(!matches!(end, Ok(Some(_))), "no more responses");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_manifest_keeps_the_last_good_snapshot() {
    let dir = manifest_copy("broken");
    let cp = start(&dir).await;
    let mut status = cp.status();
    tokio::time::timeout(PATIENCE, status.wait_for(|s| s.applied == 1))
        .await
        .expect("first load applied in time")
        .expect("status");
    let good = cp.cache().current();
    assert!(!good.names(ADDRESS_TYPE_URL).is_empty());

    let mut delta = RawDelta::open(&cp).await;
    delta
        .send(DeltaDiscoveryRequest {
            node: Some(node("ztunnel~node-a")),
            type_url: ADDRESS_TYPE_URL.to_owned(),
            ..Default::default()
        })
        .await;
    let first = delta.recv(PATIENCE).await.expect("initial");
    delta.ack(&first).await;

    // Document 5 of shop.yaml (web-2) gets an address that is not an IP.
    replace_in(
        &dir.join("shop.yaml"),
        "address: 127.0.0.12",
        "address: not-an-ip",
    );
    let s = tokio::time::timeout(PATIENCE, status.wait_for(|s| !s.errors.is_empty()))
        .await
        .expect("error reported in time")
        .expect("status")
        .clone();
    let error = &s.errors[0];
    assert_eq!(error.file, dir.join("shop.yaml"));
    assert_eq!(error.document, Some(4));
    assert_eq!(error.field.as_deref(), Some("spec.address"));
    assert!(
        error
            .to_string()
            .contains("shop.yaml: document 4: spec.address:"),
        "{error}"
    );
    assert_eq!(
        *cp.cache().current(),
        *good,
        "still serving the last good snapshot"
    );
    assert!(
        delta.recv(Duration::from_millis(400)).await.is_none(),
        "nothing pushed"
    );

    // A bad Ingress is reported with its field path, from the Ingress validation rules.
    replace_in(
        &dir.join("shop.yaml"),
        "address: not-an-ip",
        "address: 127.0.0.12",
    );
    replace_in(&dir.join("shop-ingress.yaml"), "path: /api,", "path: api,");
    let s = tokio::time::timeout(
        PATIENCE,
        status.wait_for(|s| {
            s.errors
                .iter()
                .any(|e| e.file.ends_with("shop-ingress.yaml"))
        }),
    )
    .await
    .expect("error reported")
    .expect("status")
    .clone();
    let error = &s.errors[0];
    assert_eq!(error.document, Some(0));
    assert!(
        error
            .field
            .as_deref()
            .is_some_and(|f| f.starts_with("spec.rules[0].http.paths[1]")),
        "{error}"
    );
    assert_eq!(*cp.cache().current(), *good);

    // Fixed: served again, and nothing changed for the client.
    replace_in(&dir.join("shop-ingress.yaml"), "path: api,", "path: /api,");
    tokio::time::timeout(
        PATIENCE,
        status.wait_for(|s| s.applied == 2 && s.errors.is_empty()),
    )
    .await
    .expect("applied again")
    .expect("status");
    assert_eq!(*cp.cache().current(), *good);
    assert!(delta.recv(Duration::from_millis(300)).await.is_none());

    // Invalid YAML is reported against the file.
    std::fs::write(dir.join("zz-broken.yaml"), "kind: [unclosed\n").expect("write");
    let s = tokio::time::timeout(
        PATIENCE,
        status.wait_for(|s| s.errors.iter().any(|e| e.file.ends_with("zz-broken.yaml"))),
    )
    .await
    .expect("error reported")
    .expect("status")
    .clone();
    assert!(
        s.errors[0].message.contains("invalid YAML"),
        "{}",
        s.errors[0]
    );
    assert_eq!(*cp.cache().current(), *good);

    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

// === CA ===

async fn ca_client(cp: &ControlPlane, token: Option<&str>) -> IstioCaClient {
    let channel = cp.ca_channel().expect("CA channel");
    let client = IstioCaClient::new(channel);
    match token {
        Some(token) => client.with_bearer_token(token).expect("token"),
        None => client,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ca_issues_only_identities_allowed_for_the_token() {
    let dir = manifest_copy("ca");
    let cp = start(&dir).await;
    let hour = Duration::from_secs(3600);
    let web: SpiffeId = "spiffe://cluster.local/ns/shop/sa/web".parse().expect("id");
    let blog: SpiffeId = "spiffe://cluster.local/ns/blog/sa/blog"
        .parse()
        .expect("id");
    let other: SpiffeId = "spiffe://cluster.local/ns/blog/sa/admin"
        .parse()
        .expect("id");
    let foreign: SpiffeId = "spiffe://evil.example/ns/shop/sa/web".parse().expect("id");

    let client = ca_client(&cp, Some(TOKEN_A)).await;
    let svid = request_svid(&client, &web, hour)
        .await
        .expect("web allowed by ns/shop/*");
    assert_eq!(svid.spiffe_id(), &web);
    // The chain verifies against the root the control plane publishes, and only against it.
    let td: meshkit_identity::TrustDomain = "cluster.local".parse().expect("td");
    let published: meshkit_identity::TrustBundleSet =
        meshkit_identity::TrustBundle::from_pem(td.clone(), cp.root_pem())
            .expect("root bundle")
            .into();
    let verify = |bundles: meshkit_identity::TrustBundleSet| {
        SpiffeVerifier::new(bundles, Authorize::Exact(web.clone())).verify(
            svid.chain(),
            PeerRole::Client,
            rustls_pki_types::UnixTime::now(),
        )
    };
    assert_eq!(
        verify(published),
        Ok(web.clone()),
        "the SVID does not chain to the published root"
    );
    let other_root = meshkit_identity::test_util::TestCa::new(td).bundle_set();
    assert_eq!(
        verify(other_root),
        Err(VerifyError::UnknownIssuer(
            "cluster.local".parse().expect("td")
        )),
        "a root the control plane does not use accepted its SVID"
    );
    request_svid(&client, &blog, hour)
        .await
        .expect("blog allowed exactly");

    let refused = request_svid(&client, &other, hour)
        .await
        .expect_err("not granted");
    assert!(
        matches!(refused, CaError::Rejected(ref m) if m.contains("PermissionDenied")),
        "{refused}"
    );
    let refused = request_svid(&client, &foreign, hour)
        .await
        .expect_err("other trust domain");
    assert!(matches!(refused, CaError::Rejected(_)), "{refused}");

    let unknown = ca_client(&cp, Some("guessed-token")).await;
    let refused = request_svid(&unknown, &web, hour)
        .await
        .expect_err("unknown token");
    assert!(
        matches!(refused, CaError::Rejected(ref m) if m.contains("Unauthenticated")),
        "{refused}"
    );
    let anonymous = ca_client(&cp, None).await;
    let refused = request_svid(&anonymous, &web, hour)
        .await
        .expect_err("no token");
    assert!(
        matches!(refused, CaError::Rejected(ref m) if m.contains("Unauthenticated")),
        "{refused}"
    );

    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The token file is followed: a line removed revokes its token for the CA and for ADS
/// without a restart, a line added takes effect, and a version that does not parse leaves
/// the last good grants in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_file_is_followed_and_a_removed_token_is_revoked() {
    let dir = manifest_copy("token-file");
    let tokens = dir.join("tokens.txt");
    let line = |token: &str| format!("{token} gateway=gateway spiffe://cluster.local/ns/shop/*\n");
    std::fs::write(&tokens, line("first-token")).expect("tokens");
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let cp = ControlPlane::start(
        ControlPlaneConfig::new(&dir)
            .with_ads_addr(any)
            .with_ca_addr(any)
            .with_tokens_file(&tokens),
    )
    .await
    .expect("control plane starts");
    let web: SpiffeId = "spiffe://cluster.local/ns/shop/sa/web".parse().expect("id");
    let hour = Duration::from_secs(3600);
    let signs = |token: &'static str| {
        let cp = &cp;
        let web = web.clone();
        async move { request_svid(&ca_client(cp, Some(token)).await, &web, hour).await }
    };
    let ads = |token: &'static str| {
        let cp = &cp;
        async move { delta_first(cp, Some(token), "gateway", ADDRESS_TYPE_URL, PATIENCE).await }
    };
    signs("first-token").await.expect("the first token signs");
    assert!(matches!(ads("first-token").await, Ok(Some(_))));

    // The line is replaced: the old token is revoked, the new one works, with no restart.
    std::fs::write(&tokens, line("second-token")).expect("tokens");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while signs("first-token").await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the removed token still signs"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let refused = signs("first-token").await.expect_err("revoked");
    assert!(
        matches!(refused, CaError::Rejected(ref m) if m.contains("Unauthenticated")),
        "{refused}"
    );
    assert_eq!(
        ads("first-token").await.expect_err("revoked").code(),
        tonic::Code::Unauthenticated
    );
    signs("second-token").await.expect("the new token signs");
    assert!(matches!(ads("second-token").await, Ok(Some(_))));

    // A version that does not parse is refused whole; the last good grants stay.
    std::fs::write(
        &tokens,
        "second-token spiffe://not an id\nthird-token gateway=gateway\n",
    )
    .expect("tokens");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while cp.metrics().ca().token_file_reloads("refused") == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the bad version was not read"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    signs("second-token")
        .await
        .expect("the last good grants stay");
    assert!(signs("third-token").await.is_err());
    assert_eq!(cp.metrics().ca().token_file_reloads("applied"), 1);

    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn token_file_format() {
    let grants = TokenGrants::parse(
        "# demo tokens\n\
         node-a  spiffe://cluster.local/ns/shop/*  spiffe://cluster.local/ns/blog/sa/blog\n\
         \n\
         gateway spiffe://cluster.local/ns/infra/sa/gateway # the ingress gateway\n",
    )
    .expect("parses");
    assert_eq!(grants.len(), 2);
    let id = |s: &str| s.parse::<SpiffeId>().expect("id");
    assert!(grants.allows("node-a", &id("spiffe://cluster.local/ns/shop/sa/web")));
    assert!(!grants.allows("node-a", &id("spiffe://cluster.local/ns/shopping/sa/web")));
    assert!(!grants.allows("gateway", &id("spiffe://cluster.local/ns/shop/sa/web")));
    assert!(!grants.allows("node-b", &id("spiffe://cluster.local/ns/shop/sa/web")));
    let error = TokenGrants::parse("lonely-token\n").expect_err("no identities");
    assert!(error.to_string().contains("line 1"), "{error}");
    let error = TokenGrants::parse("t spiffe://UPPER/x\n").expect_err("bad id");
    assert!(error.to_string().contains("line 1"), "{error}");
}

#[test]
fn every_problem_is_reported_with_file_document_and_field() {
    let text = r#"
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: a, namespace: shop}
spec: {address: 127.0.0.31, serviceAccount: a}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: a, namespace: shop}
spec: {address: 127.0.0.32}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: s, namespace: shop}
spec:
  hosts: [s.shop.svc.cluster.local]
  ports: [{number: 70000, name: http}]
---
apiVersion: v1
kind: Secret
metadata: {name: t, namespace: shop}
type: kubernetes.io/tls
data: {tls.crt: "!!!", tls.key: "!!!"}
---
apiVersion: v1
kind: Secret
metadata: {name: opaque}
type: Opaque
data: {password: "!!!"}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: b, namespace: shop}
spec: {address: 127.0.0.31, ports: {http: "eighty"}}
"#;
    let mut set = ManifestSet::default();
    let file = Path::new("objects.yaml");
    let errors = set.add_str(file, text);
    let found: Vec<(Option<usize>, Option<&str>)> = errors
        .iter()
        .map(|e| (e.document, e.field.as_deref()))
        .collect();
    assert_eq!(
        found,
        [
            (Some(1), Some("metadata.name")),
            (Some(2), Some("spec.ports[0].number")),
            (Some(3), Some("data.tls.crt")),
            (Some(5), Some("spec.ports.http")),
        ],
        "{errors:#?}"
    );
    assert!(errors.iter().all(|e| e.file == file));
    // The valid objects are kept; the Opaque Secret is not a TLS Secret and is skipped.
    assert_eq!(set.workload_entries.len(), 1);
    assert!(set.secrets.is_empty());
}

#[test]
fn the_bundled_token_file_parses() {
    let grants = TokenGrants::load(&bundled().join("demo-tokens.txt")).expect("parses");
    assert_eq!(grants.len(), 4);
}

#[test]
fn hostile_manifests_are_errors_not_panics() {
    let deep = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
    let inputs = [
        "- just\n- a list\n",
        "42\n",
        "kind: List\nitems: [1, \"two\", null]\n",
        "kind: WorkloadEntry\napiVersion: networking.istio.io/v1\nmetadata: []\n",
        "kind: WorkloadEntry\napiVersion: networking.istio.io/v1\nmetadata: {name: x}\nspec: {address: 1.2.3.4, ports: {a: -1}}\n",
        "kind: ServiceEntry\napiVersion: networking.istio.io/v1\nmetadata: {name: x}\nspec: {hosts: [], ports: [{number: 0}], addresses: [\"::1\", nope]}\n",
        "kind: Secret\napiVersion: v1\ntype: kubernetes.io/tls\nmetadata: {name: x}\nstringData: {tls.crt: x}\n",
        "kind: Ingress\napiVersion: extensions/v1beta1\nmetadata: {name: x}\n",
        "kind: Ingress\napiVersion: networking.k8s.io/v1\nmetadata: {name: x}\nspec: {rules: [{host: \"*\"}]}\n",
        "kind: ServiceEntry\napiVersion: networking.istio.io/v2\nmetadata: {name: x}\n",
        &deep,
    ];
    for input in inputs {
        let mut set = ManifestSet::default();
        let errors = set.add_str(Path::new("hostile.yaml"), input);
        assert!(!errors.is_empty(), "{input:.60} should be rejected");
        let _ = build_snapshot(&set, &TranslateOptions::default());
    }
    // Control characters: whatever the YAML parser makes of them, no panic.
    let mut set = ManifestSet::default();
    let _ = set.add_str(Path::new("hostile.yaml"), "\u{0}\u{1}: [");
}

// === TLS, authentication and scoping (issue 12, item 10) ===

const NODE_A_TOKEN: &str = "scoped-node-a";
const NODE_B_TOKEN: &str = "scoped-node-b";
const GATEWAY_TOKEN: &str = "scoped-gateway";
const CA_ONLY_TOKEN: &str = "scoped-ca-only";

/// The bundled manifests plus a Secret no Ingress names and a workload on node-b that no
/// Service selects; tokens for two node proxies, a gateway and a CA-only client.
async fn start_scoped(test: &str) -> (ControlPlane, PathBuf) {
    let dir = manifest_copy(test);
    let unused = generated_tls_secret().replace("name: shop-tls", "name: unused-tls");
    std::fs::write(dir.join("unused-secret.yaml"), unused).expect("secret");
    std::fs::write(
        dir.join("lonely.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata:\n  name: lonely\n  \
         namespace: shop\nspec:\n  address: 127.0.0.99\n  serviceAccount: lonely\n  \
         labels: {app: lonely, meshkit.io/node: node-b}\n",
    )
    .expect("workload");
    let grants = TokenGrants::parse(&format!(
        "{NODE_A_TOKEN} node=node-a spiffe://cluster.local/ns/shop/*\n\
         {NODE_B_TOKEN} node=node-b spiffe://cluster.local/ns/shop/*\n\
         {GATEWAY_TOKEN} gateway=gateway\n\
         {CA_ONLY_TOKEN} spiffe://cluster.local/ns/shop/sa/web\n"
    ))
    .expect("tokens");
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let cp = ControlPlane::start(
        ControlPlaneConfig::new(&dir)
            .with_ads_addr(any)
            .with_ca_addr(any)
            .with_grants(grants),
    )
    .await
    .expect("control plane starts");
    (cp, dir)
}

/// Opens a Delta stream with `token` and sends one wildcard request for `type_url` as
/// `node_id`; the first response, or the status the stream ended with. `Ok(None)`: no answer
/// within `within` ([`PATIENCE`] where an answer or a refusal must come; a second where
/// none must).
async fn delta_first(
    cp: &ControlPlane,
    token: Option<&str>,
    node_id: &str,
    type_url: &str,
    within: Duration,
) -> Result<Option<DeltaDiscoveryResponse>, tonic::Status> {
    let mut client = raw_client(cp, token);
    let (tx, rx) = mpsc::channel(4);
    tx.send(DeltaDiscoveryRequest {
        node: Some(node(node_id)),
        type_url: type_url.to_owned(),
        resource_names_subscribe: vec!["*".to_owned()],
        ..Default::default()
    })
    .await
    .expect("queue");
    let mut stream = client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await?
        .into_inner();
    let got = tokio::time::timeout(within, stream.message()).await;
    drop(tx);
    match got {
        Err(_) => Ok(None),
        Ok(Ok(Some(r))) => Ok(Some(r)),
        Ok(Ok(None)) => Err(tonic::Status::unknown("stream ended")),
        Ok(Err(status)) => Err(status),
    }
}

fn names(r: &DeltaDiscoveryResponse) -> BTreeSet<String> {
    r.resources.iter().map(|r| r.name.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_ads_and_ca_are_refused_by_a_tls_control_plane() {
    let (cp, dir) = start_scoped("plaintext-refused").await;
    assert!(cp.ads_uri().starts_with("https://"), "{}", cp.ads_uri());
    for addr in [cp.ads_addr(), cp.ca_addr()] {
        let result = tokio::time::timeout(Duration::from_secs(5), async {
            let mut client =
                AggregatedDiscoveryServiceClient::connect(format!("http://{addr}")).await?;
            let (_tx, rx) = mpsc::channel::<DeltaDiscoveryRequest>(1);
            client
                .delta_aggregated_resources(ReceiverStream::new(rx))
                .await
                .map(|_| ())
                .map_err(Box::<dyn std::error::Error + Send + Sync>::from)
        })
        .await
        .expect("refused in time");
        assert!(result.is_err(), "plaintext to {addr} must fail");
    }
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ads_clients_without_a_valid_token_or_with_another_node_id_are_refused() {
    let (cp, dir) = start_scoped("auth").await;
    let code = |r: Result<Option<DeltaDiscoveryResponse>, tonic::Status>| match r {
        Err(status) => status.code(),
        Ok(r) => panic!("expected a refusal, got {r:?}"),
    };
    let none = delta_first(&cp, None, "node-a", ADDRESS_TYPE_URL, PATIENCE).await;
    assert_eq!(code(none), tonic::Code::Unauthenticated);
    let wrong = delta_first(&cp, Some("guessed"), "node-a", ADDRESS_TYPE_URL, PATIENCE).await;
    assert_eq!(code(wrong), tonic::Code::Unauthenticated);
    let ca_only = delta_first(
        &cp,
        Some(CA_ONLY_TOKEN),
        "node-a",
        ADDRESS_TYPE_URL,
        PATIENCE,
    )
    .await;
    assert_eq!(code(ca_only), tonic::Code::PermissionDenied);
    let other_node = delta_first(
        &cp,
        Some(NODE_A_TOKEN),
        "node-b",
        ADDRESS_TYPE_URL,
        PATIENCE,
    )
    .await;
    assert_eq!(code(other_node), tonic::Code::PermissionDenied);
    // ztunnel's form of node id is accepted when its NODE_NAME is the token's node.
    let ztunnel = |node_name: &str| {
        use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
        let mut n = node("ztunnel~127.0.0.1~ztunnel-x.istio-system~istio-system.svc.cluster.local");
        n.metadata = Some(Struct {
            fields: [(
                "NODE_NAME".to_owned(),
                Value {
                    kind: Some(Kind::StringValue(node_name.to_owned())),
                },
            )]
            .into(),
        });
        n
    };
    for (name, expect) in [("node-a", true), ("node-b", false)] {
        let mut client = raw_client(&cp, Some(NODE_A_TOKEN));
        let (tx, rx) = mpsc::channel(1);
        tx.send(DeltaDiscoveryRequest {
            node: Some(ztunnel(name)),
            type_url: ADDRESS_TYPE_URL.to_owned(),
            resource_names_subscribe: vec!["*".to_owned()],
            ..Default::default()
        })
        .await
        .expect("queue");
        let mut stream = client
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await
            .expect("opened")
            .into_inner();
        let first = tokio::time::timeout(PATIENCE, stream.message())
            .await
            .expect("in time");
        match first {
            Ok(Some(r)) => assert!(expect && !r.resources.is_empty(), "{name}"),
            Err(status) => {
                assert!(!expect, "{name}: {status}");
                assert_eq!(status.code(), tonic::Code::PermissionDenied);
            }
            Ok(None) => panic!("{name}: stream ended"),
        }
    }
    // The right token and node id are served.
    let ok = delta_first(
        &cp,
        Some(NODE_A_TOKEN),
        "node-a",
        ADDRESS_TYPE_URL,
        PATIENCE,
    )
    .await
    .expect("served")
    .expect("answered");
    assert!(!ok.resources.is_empty());
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_gateway_gets_secrets_and_only_those_its_routes_use() {
    let (cp, dir) = start_scoped("secrets").await;
    assert!(
        cp.cache()
            .current()
            .names(SECRET_TYPE_URL)
            .contains(&"shop/unused-tls".to_owned())
    );
    let gateway = delta_first(
        &cp,
        Some(GATEWAY_TOKEN),
        "gateway",
        SECRET_TYPE_URL,
        PATIENCE,
    )
    .await
    .expect("served")
    .expect("answered");
    assert_eq!(
        names(&gateway),
        BTreeSet::from(["shop/shop-tls".to_owned()])
    );
    // A node proxy is not served Secrets at all.
    let node = delta_first(
        &cp,
        Some(NODE_A_TOKEN),
        "node-a",
        SECRET_TYPE_URL,
        NO_ANSWER,
    )
    .await
    .expect("not refused");
    assert!(
        node.as_ref().is_none_or(|r| r.resources.is_empty()),
        "{node:?}"
    );
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_proxy_gets_its_workloads_and_those_services_reach() {
    let (cp, dir) = start_scoped("scoped-workloads").await;
    let lonely = "Kubernetes/networking.istio.io/WorkloadEntry/shop/lonely";
    let all = cp.cache().current().names(ADDRESS_TYPE_URL);
    assert!(all.contains(&lonely.to_owned()));
    let a = delta_first(
        &cp,
        Some(NODE_A_TOKEN),
        "node-a",
        ADDRESS_TYPE_URL,
        PATIENCE,
    )
    .await
    .expect("served")
    .expect("answered");
    let a = names(&a);
    assert!(
        !a.contains(lonely),
        "node-a must not see node-b's lone workload"
    );
    // Every Service, and the workloads behind them (web-2 is on node-b).
    assert!(a.contains("shop/web.shop.svc.cluster.local"), "{a:?}");
    assert!(a.contains("Kubernetes/networking.istio.io/WorkloadEntry/shop/web-2"));
    assert_eq!(a.len(), all.len() - 1, "{a:?}");
    let b = delta_first(
        &cp,
        Some(NODE_B_TOKEN),
        "node-b",
        ADDRESS_TYPE_URL,
        PATIENCE,
    )
    .await
    .expect("served")
    .expect("answered");
    assert!(names(&b).contains(lonely));
    // The node proxy is sent no gateway resources.
    let ingress = delta_first(
        &cp,
        Some(NODE_A_TOKEN),
        "node-a",
        INGRESS_TYPE_URL,
        NO_ANSWER,
    )
    .await
    .expect("not refused");
    assert!(ingress.is_none_or(|r| r.resources.is_empty()));
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// ztunnel with `XDS_ON_DEMAND=true`: its first Address request subscribes to `*` and
/// unsubscribes from it at once, then it asks for addresses by `network/IP`, workloads by
/// uid and services by host name as it needs them, and expects its own node's workloads
/// without asking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_demand_node_proxy_gets_its_node_and_what_it_asks_for_by_address_or_host() {
    let (cp, dir) = start_scoped("on-demand").await;
    let uid = |name: &str| format!("Kubernetes/networking.istio.io/WorkloadEntry/shop/{name}");
    let mut client = raw_client(&cp, Some(NODE_B_TOKEN));
    let (tx, rx) = mpsc::channel(4);
    let mut stream = client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .expect("served")
        .into_inner();
    let mut next = async || {
        tokio::time::timeout(PATIENCE, stream.message())
            .await
            .expect("answered in time")
            .expect("no error")
            .expect("stream open")
    };
    tx.send(DeltaDiscoveryRequest {
        node: Some(node("node-b")),
        type_url: ADDRESS_TYPE_URL.to_owned(),
        resource_names_subscribe: vec!["*".to_owned()],
        resource_names_unsubscribe: vec!["*".to_owned()],
        ..Default::default()
    })
    .await
    .expect("queue");
    let first = next().await;
    let expected: BTreeSet<String> = [
        uid("web-2"),
        uid("fallback-1"),
        uid("lonely"),
        "Kubernetes/networking.istio.io/WorkloadEntry/blog/blog-1".to_owned(),
    ]
    .into();
    assert_eq!(
        names(&first),
        expected,
        "node-b's own workloads, and nothing else"
    );

    // web-1 (node-a) by its address, the web service by its host name, an unknown address.
    tx.send(DeltaDiscoveryRequest {
        type_url: ADDRESS_TYPE_URL.to_owned(),
        response_nonce: first.nonce.clone(),
        resource_names_subscribe: vec![
            "/127.0.0.11".to_owned(),
            "web.shop.svc.cluster.local".to_owned(),
            "/10.9.9.9".to_owned(),
        ],
        ..Default::default()
    })
    .await
    .expect("queue");
    let demanded = next().await;
    let got: BTreeMap<&str, &[String]> = demanded
        .resources
        .iter()
        .map(|r| (r.name.as_str(), r.aliases.as_slice()))
        .collect();
    assert_eq!(got["/127.0.0.11"], [uid("web-1")], "{got:?}");
    assert_eq!(
        got["web.shop.svc.cluster.local"],
        ["shop/web.shop.svc.cluster.local".to_owned()]
    );
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(demanded.removed_resources, ["/10.9.9.9"]);
    let web1 = demanded
        .resources
        .iter()
        .find(|r| r.name == "/127.0.0.11")
        .and_then(|r| r.resource.as_ref())
        .map(|any| meshkit_mesh::proto::workload::Address::decode(any.value.as_slice()));
    assert!(
        matches!(
            web1,
            Some(Ok(meshkit_mesh::proto::workload::Address {
                r#type: Some(meshkit_mesh::proto::workload::address::Type::Workload(ref w)),
            })) if w.name == "web-1"
        ),
        "{web1:?}"
    );
    drop(tx);
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_is_refused_on_a_non_loopback_address() {
    let dir = manifest_copy("plaintext-wildcard");
    let result = ControlPlane::start(
        ControlPlaneConfig::new(&dir)
            .with_ads_addr(SocketAddr::from(([0, 0, 0, 0], 0)))
            .with_ca_addr(SocketAddr::from(([127, 0, 0, 1], 0)))
            .with_plaintext(),
    )
    .await;
    assert!(
        matches!(
            result,
            Err(meshkit_control_plane::StartError::PlaintextNotLoopback { what: "ADS", .. })
        ),
        "{result:?}"
    );
    // Plaintext on loopback is allowed, and still needs a token.
    let cp = ControlPlane::start(
        ControlPlaneConfig::new(&dir)
            .with_ads_addr(SocketAddr::from(([127, 0, 0, 1], 0)))
            .with_ca_addr(SocketAddr::from(([127, 0, 0, 1], 0)))
            .with_plaintext(),
    )
    .await
    .expect("loopback plaintext");
    assert!(cp.ads_uri().starts_with("http://"));
    assert!(cp.server_name().is_none());
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A TCP connection to `to` from 127.0.0.`host`.
async fn connect_from(host: u8, to: SocketAddr) -> tokio::net::TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::from(([127, 0, 0, host], 0))).unwrap();
    sock.connect(to).await.unwrap()
}

/// The places of TLS handshakes in progress are shared fairly among sources: one host that
/// fills them with handshakes it never finishes keeps another out only until it asks. The
/// other source's handshake is answered, in the place of the filler's least recently active
/// one, which is closed; the refusals are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_source_filling_the_handshakes_gives_a_place_to_another() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = manifest_copy("fair-handshakes");
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let tls = meshkit_control_plane::tls::ServingTls {
        max_handshakes: 3,
        ..Default::default()
    };
    let cp = ControlPlane::start(
        ControlPlaneConfig::new(&dir)
            .with_ads_addr(any)
            .with_ca_addr(any)
            .with_tls(tls),
    )
    .await
    .expect("control plane starts");
    const HELLO_START: &[u8] = b"\x16\x03\x01\x00\x04\x01\x00\x00\x00";
    for (listener, addr) in [("ads", cp.ads_addr()), ("ca", cp.ca_addr())] {
        let mut filler = Vec::new();
        for _ in 0..3 {
            filler.push(connect_from(9, addr).await);
        }
        // Another source's handshake runs: a TLS alert comes back, not a bare close.
        let mut other = connect_from(10, addr).await;
        other.write_all(HELLO_START).await.unwrap();
        let mut buf = [0u8; 16];
        let answered = tokio::time::timeout(PATIENCE, other.read(&mut buf)).await;
        assert!(
            matches!(answered, Ok(Ok(n)) if n > 0),
            "{listener}: another source's handshake was not served: {answered:?}"
        );
        let mut closed = 0;
        for sock in &mut filler {
            let read = tokio::time::timeout(Duration::from_millis(300), sock.read(&mut buf)).await;
            if matches!(read, Ok(Ok(0) | Err(_))) {
                closed += 1;
            }
        }
        assert_eq!(
            closed, 1,
            "{listener}: one of the filler's handshakes gives its place"
        );
        assert_eq!(cp.metrics().connections_refused(listener, "tls_evicted"), 1);
    }
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// One host cannot take every connection slot: past `max_connections_per_source` from one
/// address, ADS and CA connections are closed at accept, before TLS; another source is still
/// served, and the slots come back when the connections close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_source_are_limited_on_ads_and_the_ca() {
    use tokio::io::AsyncReadExt;
    let dir = manifest_copy("per-source");
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let cp = ControlPlane::start(
        ControlPlaneConfig::new(&dir)
            .with_ads_addr(any)
            .with_ca_addr(any)
            .with_max_connections_per_source(4),
    )
    .await
    .expect("control plane starts");
    for addr in [cp.ads_addr(), cp.ca_addr()] {
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(connect_from(7, addr).await);
        }
        // The fifth from the same source is closed at once, without a byte.
        let mut fifth = connect_from(7, addr).await;
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(PATIENCE, fifth.read(&mut buf))
            .await
            .expect("the connection past the limit is closed");
        assert!(
            matches!(read, Ok(0) | Err(_)),
            "past the limit, yet answered: {read:?}"
        );
        // Another source is served: its TLS handshake gets an answer.
        let mut other = connect_from(8, addr).await;
        tokio::io::AsyncWriteExt::write_all(&mut other, b"\x16\x03\x01\x00\x04\x01\x00\x00\x00")
            .await
            .unwrap();
        // A TLS alert back (bytes, not a bare close): the handshake ran.
        let answered = tokio::time::timeout(PATIENCE, other.read(&mut buf)).await;
        assert!(
            matches!(answered, Ok(Ok(n)) if n > 0),
            "a connection from another source was not served: {answered:?}"
        );
        // Closing the held connections gives the places back, once the control plane has
        // seen them close: until then a new connection may still be closed at accept.
        drop(held);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let mut again = connect_from(7, addr).await;
            tokio::io::AsyncWriteExt::write_all(
                &mut again,
                b"\x16\x03\x01\x00\x04\x01\x00\x00\x00",
            )
            .await
            .unwrap();
            let answered = tokio::time::timeout(PATIENCE, again.read(&mut buf)).await;
            if matches!(answered, Ok(Ok(n)) if n > 0) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the source's places did not come back: {answered:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_credential_obtains_certificates_only_for_the_workloads_on_its_node() {
    let (cp, dir) = start_scoped("impersonation").await;
    let hour = Duration::from_secs(3600);
    let id = |s: &str| -> SpiffeId { format!("spiffe://cluster.local/{s}").parse().expect("id") };
    let impersonating = |token: &str| {
        IstioCaClient::new(cp.ca_channel().expect("CA channel"))
            .with_impersonated_identity(true)
            .with_bearer_token(token)
            .expect("token")
    };
    let node_a = impersonating(NODE_A_TOKEN);
    // web-1 and api-1 run on node-a.
    for on_node in ["ns/shop/sa/web", "ns/shop/sa/api"] {
        let svid = request_svid(&node_a, &id(on_node), hour)
            .await
            .unwrap_or_else(|e| panic!("{on_node}: {e}"));
        assert_eq!(svid.spiffe_id(), &id(on_node));
    }
    // `lonely` runs on node-b: the token's own grant (ns/shop/*) does not count when the
    // request impersonates.
    let refused = request_svid(&node_a, &id("ns/shop/sa/lonely"), hour)
        .await
        .expect_err("another node's workload");
    assert!(
        matches!(refused, CaError::Rejected(ref m)
            if m.contains("PermissionDenied") && m.contains("no workload on node node-a")),
        "{refused}"
    );
    // node-b's credential obtains it.
    request_svid(&impersonating(NODE_B_TOKEN), &id("ns/shop/sa/lonely"), hour)
        .await
        .expect("lonely is on node-b");
    // Leaving `ImpersonatedIdentity` out changes nothing for a node's credential.
    let node_a_plain = IstioCaClient::new(cp.ca_channel().expect("CA channel"))
        .with_bearer_token(NODE_A_TOKEN)
        .expect("token");
    let refused = request_svid(&node_a_plain, &id("ns/shop/sa/lonely"), hour)
        .await
        .expect_err("another node's workload, not named");
    assert!(
        matches!(refused, CaError::Rejected(ref m) if m.contains("no workload on node node-a")),
        "{refused}"
    );
    request_svid(&node_a_plain, &id("ns/shop/sa/web"), hour)
        .await
        .expect("web-1 is on node-a");
    // A credential that is not a node proxy's may not impersonate at all.
    for token in [GATEWAY_TOKEN, CA_ONLY_TOKEN] {
        let refused = request_svid(&impersonating(token), &id("ns/shop/sa/web"), hour)
            .await
            .expect_err("not a node proxy");
        assert!(
            matches!(refused, CaError::Rejected(ref m) if m.contains("only a node proxy's credential")),
            "{token}: {refused}"
        );
    }
    // Without impersonation, the token's grant decides, as before.
    let plain = IstioCaClient::new(cp.ca_channel().expect("CA channel"))
        .with_bearer_token(CA_ONLY_TOKEN)
        .expect("token");
    request_svid(&plain, &id("ns/shop/sa/web"), hour)
        .await
        .expect("granted exactly");
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
