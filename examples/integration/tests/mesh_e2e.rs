//! The demo mesh end to end with curl as the client: Ingress semantics over HTTP/1.1, HTTP/2
//! with prior knowledge and HTTPS with SNI; a manifest edit that changes routing while an
//! open connection keeps working; a node proxy restart; and identities the mesh refuses.
//!
//! One test function: the demo binds fixed loopback workload addresses, so its steps run in
//! sequence.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use meshkit_demo::{DemoMesh, GATEWAY_ID, MeshOptions, write_samples};
use meshkit_gateway::BACKEND_WORKLOAD;
use meshkit_hbone::{Client, ClientConfig, Target};
use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    Authorize, ErrorChain, SpiffeId, SpiffeVerifier, TlsSettings, TrustBundle, TrustBundleSet,
    TrustDomain,
};
use meshkit_node_proxy::InboundPolicy;
use rustls::AlertDescription;
use tokio::io::AsyncReadExt;

/// Bound on every wait for the mesh to reach a state: far above what any step needs, so that
/// a loaded machine does not fail it, and a step that never happens fails with a message.
const PATIENCE: Duration = Duration::from_secs(20);

/// What curl saw.
#[derive(Debug)]
struct Seen {
    status: u16,
    workload: Option<String>,
    http_version: String,
}

/// Runs curl with `args`, returning the status, the answering workload and the HTTP version.
fn curl(args: &[&str]) -> Seen {
    let out = Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-D", "-", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl is installed (CI installs it)");
    let head = String::from_utf8_lossy(&out.stdout);
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default().to_owned();
    let mut parts = status_line.split_whitespace();
    let http_version = parts.next().unwrap_or_default().to_owned();
    let status = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Seen {
        status,
        workload: headers.get(BACKEND_WORKLOAD).cloned(),
        http_version,
    }
}

fn http(addr: SocketAddr, host: &str, path: &str) -> Seen {
    curl(&[
        "-H",
        &format!("Host: {host}"),
        &format!("http://{addr}{path}"),
    ])
}

fn workload(seen: &Seen) -> &str {
    seen.workload.as_deref().unwrap_or("-")
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

/// Polls `http(addr, host, path)` until `done` holds for what it saw, for at most
/// [`PATIENCE`]; what it saw last. `what` names the awaited state in the failure message.
async fn poll_until(
    addr: SocketAddr,
    (host, path): (&'static str, &'static str),
    what: &str,
    done: impl Fn(&Seen) -> bool,
) -> Seen {
    let started = Instant::now();
    loop {
        let seen = blocking(move || http(addr, host, path)).await;
        if done(&seen) {
            return seen;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "{what}: not after {PATIENCE:?}, last answer {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The TLS alert behind `err`, if a peer's alert is what ended the connection.
fn received_alert(err: &std::io::Error) -> Option<AlertDescription> {
    match err.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::AlertReceived(alert) => Some(*alert),
        _ => None,
    }
}

/// Writes the shop-tls certificate (a self-signed demo CA for shop.example.com) for curl.
fn shop_ca(mesh: &DemoMesh, dir: &Path) -> String {
    let secret = mesh
        .gateway_secret("shop-tls")
        .expect("the gateway received the shop-tls Secret");
    let path = dir.join("shop-ca.pem");
    std::fs::write(&path, secret.cert_pem).unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_mesh_end_to_end_with_curl() {
    let dir = std::env::temp_dir().join(format!("meshkit-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_samples(&dir).unwrap();
    let mut mesh = DemoMesh::start(dir.clone(), MeshOptions::default(), |_| {})
        .await
        .expect("demo mesh starts");
    let (http_addr, https_addr) = (mesh.http_addr, mesh.https_addr);

    // --- Ingress semantics over HTTP/1.1.
    for (host, path, expect) in [
        ("shop.example.com", "/api/orders", "api-1"),
        ("shop.example.com", "/healthz", "api-1"),
        ("shop.example.com", "/apiary", "web"),
        ("m.shop.example.com", "/x", "web"),
        ("a.b.shop.example.com", "/", "fallback-1"),
        ("blog.example.com", "/", "blog-1"),
        ("nobody.example.net", "/", "fallback-1"),
    ] {
        let seen = blocking(move || http(http_addr, host, path)).await;
        assert_eq!(seen.status, 200, "{host}{path}: {seen:?}");
        assert!(
            workload(&seen).starts_with(expect),
            "{host}{path}: {seen:?}"
        );
        assert_eq!(seen.http_version, "HTTP/1.1");
    }

    // --- HTTP/2 with prior knowledge.
    let seen = blocking(move || {
        curl(&[
            "--http2-prior-knowledge",
            "-H",
            "Host: blog.example.com",
            &format!("http://{http_addr}/posts"),
        ])
    })
    .await;
    assert_eq!((seen.status, workload(&seen)), (200, "blog-1"), "{seen:?}");
    assert_eq!(seen.http_version, "HTTP/2");

    // --- HTTPS with SNI: the certificate of the shop-tls Secret, verified by curl.
    let ca = shop_ca(&mesh, &dir);
    let port = https_addr.port();
    let seen = blocking(move || {
        curl(&[
            "--cacert",
            &ca,
            "--resolve",
            &format!("shop.example.com:{port}:127.0.0.1"),
            &format!("https://shop.example.com:{port}/api/cart"),
        ])
    })
    .await;
    assert_eq!((seen.status, workload(&seen)), (200, "api-1"), "{seen:?}");

    // --- A manifest edit changes routing within a second; an open connection keeps working.
    let sock = tokio::net::TcpStream::connect(http_addr).await.unwrap();
    let (mut open, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(sock))
            .await
            .unwrap();
    tokio::spawn(conn);
    let get = |path: &str| {
        hyper::Request::get(path)
            .header("host", "blog.example.com")
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    let resp = tokio::time::timeout(PATIENCE, open.send_request(get("/before")))
        .await
        .expect("answered in time")
        .unwrap();
    assert_eq!(resp.status(), 200);
    tokio::time::timeout(PATIENCE, resp.into_body().collect())
        .await
        .expect("body in time")
        .unwrap();

    let blog = dir.join("blog.yaml");
    let edited = std::fs::read_to_string(&blog)
        .unwrap()
        .replace("host: blog.example.com", "host: news.example.com");
    std::fs::write(&blog, edited).unwrap();
    poll_until(
        http_addr,
        ("news.example.com", "/"),
        "the edit applied",
        |seen| seen.status == 200 && workload(seen) == "blog-1",
    )
    .await;
    // The old host no longer has a rule: the default backend answers it now.
    let seen = blocking(move || http(http_addr, "blog.example.com", "/")).await;
    assert_eq!(workload(&seen), "fallback-1", "{seen:?}");
    // The connection opened before the edit still works.
    tokio::time::timeout(PATIENCE, open.ready())
        .await
        .expect("the open connection is ready in time")
        .expect("the open connection still works");
    let resp = tokio::time::timeout(PATIENCE, open.send_request(get("/after")))
        .await
        .expect("answered in time")
        .unwrap();
    assert_eq!(resp.status(), 200);

    // --- A node proxy restart: its workloads fail while it is down and come back after.
    // The stop takes effect as its tasks end, and a backend connection pooled before it may
    // carry one more request: wait for the answer of a node without its proxy.
    mesh.stop_node("node-b");
    poll_until(
        http_addr,
        ("news.example.com", "/"),
        "node-b down",
        |seen| seen.status == 503,
    )
    .await;
    let seen = blocking(move || http(http_addr, "shop.example.com", "/api")).await;
    assert_eq!(
        (seen.status, workload(&seen)),
        (200, "api-1"),
        "node-a unaffected"
    );
    mesh.start_node("node-b").await.unwrap();
    let seen = poll_until(
        http_addr,
        ("news.example.com", "/"),
        "node-b recovered",
        |seen| seen.status == 200,
    )
    .await;
    assert_eq!(workload(&seen), "blog-1");

    // --- Identities the mesh refuses.
    // A node that stops admitting the gateway: its workloads are not reachable through it.
    let gateway_id = GATEWAY_ID.parse().unwrap();
    mesh.node_proxies["node-a"].set_policy(InboundPolicy::any().deny(gateway_id));
    // The node proxy refuses the gateway's CONNECT; api has no other endpoint: 503. The
    // gateway's pooled tunnel to api-1 is cut by the policy change as the node proxy sees it,
    // so a request racing that may still use it: wait for the refusal.
    poll_until(
        http_addr,
        ("shop.example.com", "/api"),
        "the gateway refused",
        |seen| seen.status == 503,
    )
    .await;
    mesh.node_proxies["node-a"].set_policy(InboundPolicy::any());
    let seen = blocking(move || http(http_addr, "shop.example.com", "/api")).await;
    assert_eq!(seen.status, 200, "{seen:?}");

    // A workload certificate from another CA, even with a name of the mesh's trust domain,
    // is refused in the TLS handshake by the node proxy. The client trusts the mesh's own
    // root, so it accepts the node proxy's certificate and finishes its side of the
    // handshake (TLS 1.3): the refusal it sees is the node proxy's alert, certificate_unknown
    // (what rustls sends when a verifier, here meshkit's, refuses the chain).
    let td = TrustDomain::new("cluster.local").unwrap();
    let mesh_roots: TrustBundleSet =
        TrustBundle::from_pem(td.clone(), mesh.control_plane.root_pem())
            .unwrap()
            .into();
    let impostor_ca = TestCa::new(td);
    let impostor: SpiffeId = "spiffe://cluster.local/ns/shop/sa/web".parse().unwrap();
    let api: SpiffeId = "spiffe://cluster.local/ns/shop/sa/api".parse().unwrap();
    let api_hbone: SocketAddr = "127.0.0.13:15008".parse().unwrap();

    // Over TLS alone, to see the alert itself.
    let tls = TlsSettings::default()
        .client_config(
            impostor_ca.issue(impostor.clone()),
            SpiffeVerifier::new(mesh_roots.clone(), Authorize::Exact(api.clone())),
        )
        .unwrap();
    let sock = tokio::net::TcpStream::connect(api_hbone).await.unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(api_hbone.ip().into());
    let refusal = tokio::time::timeout(PATIENCE, async {
        let mut stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
            .connect(name, sock)
            .await?;
        let mut buf = [0u8; 1024];
        loop {
            if stream.read(&mut buf).await? == 0 {
                return Ok::<_, std::io::Error>(());
            }
        }
    })
    .await
    .expect("the node proxy answered the impostor in time")
    .expect_err("the node proxy admitted a certificate of another CA");
    assert_eq!(
        received_alert(&refusal),
        Some(AlertDescription::CertificateUnknown),
        "not the node proxy's refusal of the client certificate: {refusal}"
    );

    // And through the HBONE client: the same refusal ends the connection before any CONNECT,
    // and the client did not refuse the node proxy itself. It reads the alert, unless its
    // first write after the handshake (TLS 1.3 lets it write before the server has checked
    // its certificate) met the closed socket first, whose reset then discards the alert; the
    // raw client above has shown which alert the node proxy sends.
    let client = Client::new(
        ClientConfig::default(),
        impostor_ca.issue(impostor.clone()),
        mesh_roots,
    );
    let target = Target::new(api_hbone, "127.0.0.13:9090".parse().unwrap(), impostor, api);
    let err = tokio::time::timeout(PATIENCE, client.open(target))
        .await
        .expect("refused in time")
        .expect_err("an impostor got a tunnel");
    let chain = ErrorChain(&err).to_string();
    assert!(
        !err.is_peer_identity() && err.status().is_none(),
        "refused for another reason than the node proxy's alert: {chain}"
    );
    assert!(
        chain.contains("CertificateUnknown")
            || chain.contains("broken pipe")
            || chain.contains("reset"),
        "{chain}"
    );

    drop(mesh);
    let _ = std::fs::remove_dir_all(&dir);
}
