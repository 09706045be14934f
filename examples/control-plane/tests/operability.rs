//! The control plane as an operator sees it: the admin endpoint's readiness, metrics (after
//! known traffic, exact counters and labels, every scrape parsed strictly), config dump, and
//! the log lines of clients coming, NACKing and going.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{Struct, Value, value};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use meshkit_control_plane::access::XdsRole;
use meshkit_control_plane::ca::TokenGrants;
use meshkit_control_plane::{ControlPlane, ControlPlaneConfig};
use meshkit_identity::istio::IstioCaClient;
use meshkit_identity::{CaError, SpiffeId, request_svid};
use meshkit_test_support::openmetrics::{self, Exposition};
use meshkit_xds_client::{CLUSTER_TYPE_URL, CallCredentials, LISTENER_TYPE_URL, SECRET_TYPE_URL};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const TOKEN: &str = "operability-token-5c1d";
/// Bound on every wait for something that must happen.
const PATIENCE: Duration = Duration::from_secs(10);

fn bundled() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../demo/manifests")
}

/// A fresh copy of the bundled manifests, with a TLS Secret generated for this test; returns
/// the folder and the Secret's `tls.key` as it is in the manifest (base64).
fn manifest_copy(test: &str) -> (PathBuf, String) {
    use base64::Engine as _;
    let dir = std::env::temp_dir().join(format!("meshkit-cp-ops-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    for entry in std::fs::read_dir(bundled()).expect("bundled manifests") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            std::fs::copy(&path, dir.join(path.file_name().expect("name"))).expect("copy");
        }
    }
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let params = rcgen::CertificateParams::new(vec!["shop.example.com".to_owned()]).expect("p");
    let cert = params.self_signed(&key).expect("self-signed");
    let b64 = |s: String| base64::engine::general_purpose::STANDARD.encode(s);
    let key_b64 = b64(key.serialize_pem());
    let secret = format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: shop-tls, namespace: shop}}\n\
         type: kubernetes.io/tls\ndata:\n  tls.crt: {}\n  tls.key: {key_b64}\n",
        b64(cert.pem()),
    );
    std::fs::write(dir.join("shop-tls-secret.yaml"), secret).expect("secret");
    (dir, key_b64)
}

async fn start(dir: &Path) -> ControlPlane {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let grants = TokenGrants::new()
        .grant(TOKEN, "spiffe://cluster.local/ns/shop/*")
        .expect("grant")
        .with_xds_role(TOKEN, XdsRole::Gateway("gw-*".to_owned()));
    let config = ControlPlaneConfig::new(dir)
        .with_ads_addr(any)
        .with_ca_addr(any)
        .with_admin_addr(any)
        .with_grants(grants)
        .with_poll_interval(Duration::from_millis(50));
    ControlPlane::start(config)
        .await
        .expect("control plane starts")
}

fn admin(cp: &ControlPlane) -> SocketAddr {
    cp.admin_addr().expect("an admin address was asked for")
}

/// `GET path` on the admin endpoint, off the runtime's threads.
async fn get(addr: SocketAddr, path: &'static str) -> (u16, String) {
    tokio::task::spawn_blocking(move || meshkit_test_support::http_get(addr, path))
        .await
        .expect("GET task")
}

/// `/metrics`, parsed strictly; `/stats/prometheus` must parse too and hold the same families.
async fn scrape(addr: SocketAddr) -> Exposition {
    let metrics = tokio::task::spawn_blocking(move || meshkit_test_support::scrape(addr))
        .await
        .expect("scrape task");
    let (status, body) = get(addr, "/stats/prometheus").await;
    assert_eq!(status, 200, "{body}");
    let other = openmetrics::parse(&body)
        .unwrap_or_else(|e| panic!("/stats/prometheus does not parse: {e}\n{body}"));
    assert_eq!(metrics.types, other.types);
    metrics
}

/// Scrapes until `done` holds, for at most [`PATIENCE`].
async fn scrape_until(addr: SocketAddr, what: &str, done: impl Fn(&Exposition) -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let m = scrape(addr).await;
        if done(&m) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {PATIENCE:?}; last scrape: {:?}",
            m.samples
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct Sotw {
    tx: mpsc::Sender<DiscoveryRequest>,
    rx: tonic::Streaming<DiscoveryResponse>,
}

impl Sotw {
    async fn open(cp: &ControlPlane) -> Self {
        let channel = cp
            .client_tls()
            .expect("client TLS")
            .connect_lazy(&cp.ads_uri())
            .expect("channel");
        let credentials = CallCredentials::bearer_token(TOKEN).expect("token");
        let mut client = AggregatedDiscoveryServiceClient::with_interceptor(channel, credentials);
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

    async fn recv(&mut self) -> DiscoveryResponse {
        match tokio::time::timeout(PATIENCE, self.rx.message()).await {
            Ok(Ok(Some(r))) => r,
            other => panic!("a response within {PATIENCE:?}: {other:?}"),
        }
    }
}

fn node(id: &str, istio_version: Option<&str>) -> Node {
    let metadata = istio_version.map(|v| Struct {
        fields: [(
            "ISTIO_VERSION".to_owned(),
            Value {
                kind: Some(value::Kind::StringValue(v.to_owned())),
            },
        )]
        .into_iter()
        .collect(),
    });
    Node {
        id: id.to_owned(),
        metadata,
        ..Default::default()
    }
}

/// Log lines of this test binary (info and above), for the checks on what is logged.
fn logs() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = Arc::new(Mutex::new(Vec::new()));
        let writer = Arc::clone(&buffer);
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || Capture(Arc::clone(&writer)))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        buffer
    })
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Waits until a log line contains every one of `parts`.
async fn logged(parts: &[&str]) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let text = String::from_utf8_lossy(&logs().lock().unwrap()).into_owned();
        if text.lines().any(|l| parts.iter().all(|p| l.contains(p))) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no log line with {parts:?} within {PATIENCE:?}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_clients_pushes_nacks_and_ca_decisions_exactly() {
    logs();
    let (dir, _) = manifest_copy("metrics");
    let cp = start(&dir).await;
    let addr = admin(&cp);

    // One client subscribes to listeners and ACKs them.
    let mut acking = Sotw::open(&cp).await;
    acking
        .send(DiscoveryRequest {
            node: Some(node("gw-ack", Some("1.24.0"))),
            type_url: LISTENER_TYPE_URL.into(),
            ..Default::default()
        })
        .await;
    let listeners = acking.recv().await;
    assert_eq!(listeners.type_url, LISTENER_TYPE_URL);
    acking
        .send(DiscoveryRequest {
            type_url: LISTENER_TYPE_URL.into(),
            version_info: listeners.version_info.clone(),
            response_nonce: listeners.nonce.clone(),
            ..Default::default()
        })
        .await;
    // Another subscribes to clusters and NACKs them.
    let mut nacking = Sotw::open(&cp).await;
    nacking
        .send(DiscoveryRequest {
            node: Some(node("gw-nack", None)),
            type_url: CLUSTER_TYPE_URL.into(),
            ..Default::default()
        })
        .await;
    let clusters = nacking.recv().await;
    nacking
        .send(DiscoveryRequest {
            type_url: CLUSTER_TYPE_URL.into(),
            response_nonce: clusters.nonce.clone(),
            error_detail: Some(RpcStatus {
                code: 3,
                message: "cluster rejected by the test".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await;

    // Two CA requests: one granted, one for an identity the token does not hold.
    let ca = IstioCaClient::new(cp.ca_channel().expect("CA channel"))
        .with_bearer_token(TOKEN)
        .expect("token");
    let web: SpiffeId = "spiffe://cluster.local/ns/shop/sa/web".parse().expect("id");
    let admin_id: SpiffeId = "spiffe://cluster.local/ns/blog/sa/admin"
        .parse()
        .expect("id");
    request_svid(&ca, &web, Duration::from_secs(3600))
        .await
        .expect("web is granted");
    let refused = request_svid(&ca, &admin_id, Duration::from_secs(3600))
        .await
        .expect_err("not granted");
    assert!(matches!(refused, CaError::Rejected(_)), "{refused}");

    scrape_until(addr, "the NACK counted", |m| {
        m.sum("pilot_total_xds_rejects_total", &[]) > 0.0
    })
    .await;
    let m = scrape(addr).await;
    let types = |name: &str| m.types.get(name).map(String::as_str);
    assert_eq!(types("pilot_xds"), Some("gauge"));
    assert_eq!(types("pilot_xds_pushes"), Some("counter"));
    assert_eq!(types("pilot_total_xds_rejects"), Some("counter"));
    assert_eq!(types("citadel_server_csr_count"), Some("counter"));
    // Connected clients by version: metadata ISTIO_VERSION, else `unknown`.
    assert_eq!(m.value("pilot_xds", &[("version", "1.24.0")]), Some(1.0));
    assert_eq!(m.value("pilot_xds", &[("version", "unknown")]), Some(1.0));
    assert_eq!(m.sum("pilot_xds", &[]), 2.0);
    // One push of each type, nothing for the ACK or the NACK.
    assert_eq!(
        m.value("pilot_xds_pushes_total", &[("type", "lds")]),
        Some(1.0)
    );
    assert_eq!(
        m.value("pilot_xds_pushes_total", &[("type", "cds")]),
        Some(1.0)
    );
    assert_eq!(m.sum("pilot_xds_pushes_total", &[]), 2.0);
    assert_eq!(
        m.value("pilot_total_xds_rejects_total", &[("type", "cds")]),
        Some(1.0)
    );
    assert_eq!(m.sum("pilot_total_xds_rejects_total", &[]), 1.0);
    // The CA: two CSRs decided, one issued, one refused for permission.
    assert_eq!(m.value("citadel_server_csr_count_total", &[]), Some(2.0));
    assert_eq!(
        m.value("citadel_server_success_cert_issuance_count_total", &[]),
        Some(1.0)
    );
    assert_eq!(
        m.value(
            "meshkit_ca_requests_refused_total",
            &[("reason", "permission_denied")]
        ),
        Some(1.0)
    );
    assert_eq!(m.sum("meshkit_ca_requests_refused_total", &[]), 1.0);
    assert_eq!(
        m.value("citadel_server_authentication_failure_count_total", &[]),
        Some(0.0)
    );
    assert_eq!(
        m.value("citadel_server_csr_parsing_err_count_total", &[]),
        Some(0.0)
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    let expiry = m
        .value("citadel_server_root_cert_expiry_timestamp", &[])
        .expect("root expiry");
    assert!(expiry > now + 86_400.0, "root expires at {expiry}");
    // One load, applied.
    assert_eq!(
        m.value("meshkit_manifest_loads_total", &[("result", "applied")]),
        Some(1.0)
    );
    assert_eq!(m.sum("meshkit_manifest_loads_total", &[]), 1.0);
    assert_eq!(m.value("meshkit_manifest_errors", &[]), Some(0.0));
    // Build info and process metrics, from meshkit-admin.
    assert_eq!(
        m.value("meshkit_build", &[("component", "control-plane")]),
        Some(1.0)
    );
    assert!(m.types.contains_key("process_resident_memory_bytes"));

    // What was logged at info and above, with the node ids.
    logged(&["INFO", "SotW ADS stream opened", "node=gw-nack"]).await;
    logged(&[
        "WARN",
        "NACK",
        "node=gw-nack",
        "cluster rejected by the test",
    ])
    .await;

    // The NACKing client goes away: no longer counted, and its going is logged.
    drop(nacking);
    scrape_until(addr, "the client's disconnect counted", |m| {
        m.value("pilot_xds", &[("version", "unknown")]) == Some(0.0)
    })
    .await;
    let m = scrape(addr).await;
    assert_eq!(m.value("pilot_xds", &[("version", "1.24.0")]), Some(1.0));
    logged(&["INFO", "SotW ADS stream closed", "node=gw-nack"]).await;

    drop(acking);
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_is_503_until_the_manifests_load_and_again_from_shutdown() {
    let (dir, _) = manifest_copy("ready");
    let broken = dir.join("zz-broken.yaml");
    std::fs::write(
        &broken,
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: bad, namespace: shop}\n\
         spec: {rules: [{http: {paths: [{path: nope, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}}]}\n",
    )
    .expect("broken manifest");
    let cp = start(&dir).await;
    let addr = admin(&cp);

    let (status, body) = get(addr, "/healthz/ready").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body, "not ready: waiting for the manifests' first load\n");
    let m = scrape(addr).await;
    assert_eq!(
        m.value("meshkit_manifest_loads_total", &[("result", "rejected")]),
        Some(1.0)
    );
    assert_eq!(
        m.value("meshkit_manifest_loads_total", &[("result", "applied")]),
        None,
        "no load applied"
    );
    assert!(m.value("meshkit_manifest_errors", &[]).unwrap_or(0.0) >= 1.0);
    let (_, dump) = get(addr, "/config_dump").await;
    let dump: serde_json::Value = serde_json::from_str(&dump).expect("JSON");
    assert_eq!(dump["manifests"]["applied"], 0);
    let errors = dump["manifests"]["errors"].as_array().expect("errors");
    assert!(
        errors
            .iter()
            .any(|e| e.as_str().is_some_and(|e| e.contains("zz-broken.yaml"))),
        "{errors:?}"
    );

    std::fs::remove_file(&broken).expect("fix the folder");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (status, body) = get(addr, "/healthz/ready").await;
        if status == 200 {
            assert_eq!(body, "ready\n");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "ready within {PATIENCE:?} of the fix: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let m = scrape(addr).await;
    assert_eq!(
        m.value("meshkit_manifest_loads_total", &[("result", "applied")]),
        Some(1.0)
    );
    assert_eq!(m.value("meshkit_manifest_errors", &[]), Some(0.0));

    let mounted = cp.admin().clone();
    cp.shutdown().await;
    let response = mounted.handle(
        &tonic::codegen::http::Request::get("/healthz/ready")
            .body(())
            .expect("req"),
    );
    assert_eq!(response.status(), 503, "unready once shutting down");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_dump_names_what_is_served_and_holds_no_key_or_token() {
    let (dir, key_b64) = manifest_copy("dump");
    let cp = start(&dir).await;
    let (status, body) = get(admin(&cp), "/config_dump").await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("PRIVATE KEY"), "{body}");
    assert!(!body.contains(&key_b64), "the Secret's key is in the dump");
    assert!(!body.contains(TOKEN), "a token is in the dump");

    let dump: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let snapshot = &dump["snapshot"];
    let names = |url: &str| -> Vec<String> {
        snapshot[url]["resources"]
            .as_object()
            .unwrap_or_else(|| panic!("{url} in the dump: {snapshot}"))
            .keys()
            .cloned()
            .collect()
    };
    assert_eq!(
        names(LISTENER_TYPE_URL),
        ["gateway-api-18090", "http", "https"]
    );
    assert_eq!(names(SECRET_TYPE_URL), ["shop/shop-tls"]);
    assert_eq!(snapshot[LISTENER_TYPE_URL]["label"], "lds");
    let served = cp.cache().current();
    assert_eq!(
        snapshot[CLUSTER_TYPE_URL]["version"],
        served.version(CLUSTER_TYPE_URL).expect("clusters served")
    );
    let web = "outbound|80||web.shop.svc.cluster.local";
    assert_eq!(
        snapshot[CLUSTER_TYPE_URL]["resources"][web],
        served
            .get(CLUSTER_TYPE_URL, web)
            .expect("web cluster")
            .version
            .as_str()
    );

    assert_eq!(dump["manifests"]["applied"], 1);
    assert_eq!(dump["manifests"]["errors"], serde_json::json!([]));
    assert_eq!(dump["ca"]["trust_domain"], "cluster.local");
    let root = &dump["ca"]["root"];
    assert!(
        root["subject"]
            .as_str()
            .is_some_and(|s| s.contains("cluster.local")),
        "{root}"
    );
    assert!(root["not_after_unix"].as_i64().is_some(), "{root}");
    let serving = &dump["serving_certificate"]["subject_alt_names"];
    assert!(
        serving
            .as_array()
            .is_some_and(|names| names.iter().any(|n| n == "DNS:istiod.istio-system.svc")),
        "{serving}"
    );
    assert_eq!(
        dump["tokens"],
        serde_json::json!([{
            "xds_role": "gateway=gw-*",
            "identities": ["spiffe://cluster.local/ns/shop/*"],
        }])
    );
    assert_eq!(dump["listeners"]["ads"], cp.ads_addr().to_string());
    assert_eq!(dump["listeners"]["tls"], true);

    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_refusals_are_counted_by_reason() {
    use meshkit_identity::{CaClient, CertificateRequest};
    let (dir, _) = manifest_copy("refusals");
    let cp = start(&dir).await;
    let web: SpiffeId = "spiffe://cluster.local/ns/shop/sa/web".parse().expect("id");
    let sign = |token: &'static str, csr_pem: String| {
        let client = IstioCaClient::new(cp.ca_channel().expect("CA channel"))
            .with_bearer_token(token)
            .expect("token");
        let request = CertificateRequest {
            id: web.clone(),
            csr_pem,
            validity: Duration::from_secs(3600),
        };
        async move { client.sign(&request).await.expect_err("refused") }
    };
    let (good_csr, _) = meshkit_identity::generate_csr(&web).expect("CSR");
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let dns_only = rcgen::CertificateParams::new(vec!["web.example.com".to_owned()])
        .expect("params")
        .serialize_request(&key)
        .expect("CSR")
        .pem()
        .expect("PEM");

    sign("guessed-token", good_csr).await;
    sign(TOKEN, "not a CSR".to_owned()).await;
    sign(TOKEN, dns_only).await;
    sign(TOKEN, "x".repeat(20 * 1024)).await;

    let m = scrape(admin(&cp)).await;
    let refused =
        |reason: &str| m.value("meshkit_ca_requests_refused_total", &[("reason", reason)]);
    assert_eq!(refused("unauthenticated"), Some(1.0));
    assert_eq!(refused("invalid_csr"), Some(2.0));
    assert_eq!(refused("limit"), Some(1.0));
    assert_eq!(m.sum("meshkit_ca_requests_refused_total", &[]), 4.0);
    assert_eq!(m.value("citadel_server_csr_count_total", &[]), Some(4.0));
    assert_eq!(
        m.value("citadel_server_success_cert_issuance_count_total", &[]),
        Some(0.0)
    );
    assert_eq!(
        m.value("citadel_server_authentication_failure_count_total", &[]),
        Some(1.0)
    );
    assert_eq!(
        m.value("citadel_server_csr_parsing_err_count_total", &[]),
        Some(1.0)
    );
    assert_eq!(
        m.value("citadel_server_id_extraction_err_count_total", &[]),
        Some(1.0)
    );
    cp.shutdown().await;

    // Past the limit of calls in progress (none allowed here): refused before the CSR is read.
    let mut limits = meshkit_control_plane::ca::CaLimits::default();
    limits.max_concurrent_requests = 0;
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let grants = TokenGrants::new()
        .grant(TOKEN, "spiffe://cluster.local/ns/shop/*")
        .expect("grant");
    let cp = ControlPlane::start(
        ControlPlaneConfig::new(&dir)
            .with_ads_addr(any)
            .with_ca_addr(any)
            .with_admin_addr(any)
            .with_grants(grants)
            .with_ca_limits(limits),
    )
    .await
    .expect("control plane starts");
    let client = IstioCaClient::new(cp.ca_channel().expect("CA channel"))
        .with_bearer_token(TOKEN)
        .expect("token");
    request_svid(&client, &web, Duration::from_secs(3600))
        .await
        .expect_err("no call may be in progress");
    let m = scrape(admin(&cp)).await;
    assert_eq!(
        m.value("meshkit_ca_requests_refused_total", &[("reason", "limit")]),
        Some(1.0)
    );
    assert_eq!(m.value("citadel_server_csr_count_total", &[]), Some(0.0));
    cp.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
