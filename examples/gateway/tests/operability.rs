//! What an operator sees of the gateway (docs/gateway.md, "Operating it"): exact request
//! metrics with Istio's names and labels after known traffic, the upstream connection gauges,
//! readiness through start-up and drain, the drain itself (requests in flight finish, HTTP/1.1
//! answers say `connection: close`, HTTP/2 gets a GOAWAY, new connections are refused, the
//! deadline cuts what is left), W3C `traceparent` taken and carried into the HBONE CONNECT and
//! to the backend, the config dump, the access log, and the binary doing all of it on SIGTERM.
//! Every scrape goes through test-support's strict OpenMetrics parser.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use meshkit_gateway::DURATION_BUCKETS_MS;
use meshkit_test_support::openmetrics::Exposition;
use support::*;
use tokio::net::TcpStream;

const GATEWAY_ID: &str = "spiffe://cluster.local/ns/istio-system/sa/ingress-gateway";
const WEB_ID: &str = "spiffe://cluster.local/ns/shop/sa/web";

/// A second Ingress whose one path names a service the mesh does not have.
const EXTRA: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: extra, namespace: shop}
spec:
  rules:
  - host: extra.example.com
    http:
      paths:
      - {path: /x, pathType: Prefix, backend: {service: {name: nosuch, port: {number: 80}}}}
"#;

/// The labels of a request answered by `web-1` on the route `shop/shop:/`.
fn served_by_web(code: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("reporter", "source"),
        ("source_workload", "ingress-gateway"),
        ("source_canonical_service", "ingress-gateway"),
        ("source_canonical_revision", "latest"),
        ("source_workload_namespace", "istio-system"),
        ("source_principal", GATEWAY_ID),
        ("destination_workload", "web-1"),
        ("destination_canonical_service", "web-1"),
        ("destination_canonical_revision", "latest"),
        ("destination_workload_namespace", "shop"),
        ("destination_principal", WEB_ID),
        ("destination_service", "web.shop.svc.cluster.local"),
        ("destination_service_name", "web"),
        ("destination_service_namespace", "shop"),
        ("route", "shop/shop:/"),
        ("request_protocol", "http"),
        ("response_code", code),
        ("response_flags", "-"),
        ("connection_security_policy", "mutual_tls"),
    ]
}

/// `GET path` for `host`, with `headers`.
fn get_from(host: &str, path: &str, headers: &[(&str, &str)]) -> http::Request<Full<Bytes>> {
    let mut req = http::Request::get(path).header("host", host);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.body(Full::new(Bytes::new())).expect("request")
}

/// Scrapes until `done` holds for the exposition, failing with `what` after [`PATIENCE`]
/// (the request metrics are counted when an answer's end has been sent, which a client may
/// see a moment before).
async fn scrape_until(
    addr: SocketAddr,
    what: &str,
    done: impl Fn(&Exposition) -> bool,
) -> Exposition {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let scraped = scrape(addr).await;
        if done(&scraped) {
            return scraped;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not seen within {PATIENCE:?}; last scrape: {:#?}",
            scraped
                .samples
                .iter()
                .filter(|s| s.name.starts_with("istio_requests"))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `/healthz/ready` until it answers `status`; the body of that answer.
async fn ready_becomes(admin: SocketAddr, status: u16) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (got, body) = admin_get(admin, "/healthz/ready").await;
        if got == status {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "readiness not {status} within {PATIENCE:?}: {got} {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until connecting to `addr` is refused.
async fn refused(addr: SocketAddr) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match TcpStream::connect(addr).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return,
            _ => {}
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{addr} still accepts connections after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An HTTP/1.1 client connection to `addr`: its sender and its driver task.
async fn http1(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let sock = TcpStream::connect(addr).await.expect("connect");
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(sock))
        .await
        .expect("handshake");
    (
        send,
        tokio::spawn(async move {
            let _ = conn.await;
        }),
    )
}

/// The next data of `body`, within [`PATIENCE`]; `None` at its end, `Err` if it failed.
async fn next_data(body: &mut Incoming) -> Result<Option<Bytes>, String> {
    loop {
        let frame = tokio::time::timeout(PATIENCE, body.frame())
            .await
            .map_err(|_| "no frame in time".to_owned())?;
        match frame {
            None => return Ok(None),
            Some(Err(e)) => return Err(e.to_string()),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    return Ok(Some(data));
                }
            }
        }
    }
}

/// The rest of `body`, as text; `Err` if it failed before its end.
async fn rest(body: &mut Incoming) -> Result<String, String> {
    let mut out = Vec::new();
    while let Some(data) = next_data(body).await? {
        out.extend_from_slice(&data);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

async fn within<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {PATIENCE:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_after_known_traffic_has_exact_counts_and_istio_labels() {
    let mut h = start_with(
        |s| s.with_workload_name("ingress-gateway"),
        |c| {
            c.ingresses
                .extend(meshkit_ingress_model::manifest::from_yaml_str(EXTRA).expect("ingress"));
        },
    )
    .await;
    let admin = admin(&mut h).await;
    for _ in 0..3 {
        honest(h.http).await;
    }
    let answer = request_in_time(h.http, get_from("nowhere.example.com", "/", &[])).await;
    assert_eq!(answer.status, 404, "{answer:?}");
    let answer = request_in_time(h.http, get_from("extra.example.com", "/x", &[])).await;
    assert_eq!(answer.status, 503, "{answer:?}");

    let m = scrape_until(admin, "five requests counted", |m| {
        m.sum("istio_requests_total", &[]) == 5.0
    })
    .await;
    assert_eq!(
        m.types.get("istio_requests").map(String::as_str),
        Some("counter")
    );
    assert_eq!(
        m.types
            .get("istio_request_duration_milliseconds")
            .map(String::as_str),
        Some("histogram")
    );
    let ok = served_by_web("200");
    assert_eq!(m.value("istio_requests_total", &ok), Some(3.0));
    assert_eq!(
        m.value(
            "istio_requests_total",
            &[
                ("reporter", "source"),
                ("source_principal", GATEWAY_ID),
                ("destination_workload", "unknown"),
                ("destination_principal", "unknown"),
                ("destination_service", "unknown"),
                ("destination_service_name", "unknown"),
                ("route", "unknown"),
                ("request_protocol", "http"),
                ("response_code", "404"),
                ("response_flags", "NR"),
                ("connection_security_policy", "unknown"),
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        m.value(
            "istio_requests_total",
            &[
                ("destination_workload", "unknown"),
                ("destination_service", "unknown"),
                ("destination_service_name", "nosuch"),
                ("destination_service_namespace", "shop"),
                ("route", "shop/extra:/x"),
                ("response_code", "503"),
                ("response_flags", "NC"),
            ]
        ),
        Some(1.0)
    );
    // Three label sets, no other.
    let series = m
        .samples
        .iter()
        .filter(|s| s.name == "istio_requests_total")
        .count();
    assert_eq!(series, 3);

    // The histogram: the same labels, Envoy's buckets, three observations.
    assert_eq!(
        m.value("istio_request_duration_milliseconds_count", &ok),
        Some(3.0)
    );
    let mut with_inf = ok.clone();
    with_inf.push(("le", "+Inf"));
    assert_eq!(
        m.value("istio_request_duration_milliseconds_bucket", &with_inf),
        Some(3.0)
    );
    let bounds: Vec<f64> = m
        .samples
        .iter()
        .filter(|s| {
            s.name == "istio_request_duration_milliseconds_bucket"
                && ok
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .filter_map(|s| s.labels.get("le")?.parse::<f64>().ok())
        .collect();
    let mut envoy = DURATION_BUCKETS_MS.to_vec();
    envoy.push(f64::INFINITY);
    assert_eq!(bounds, envoy);
    assert!(
        m.value("istio_request_duration_milliseconds_sum", &ok)
            .is_some()
    );

    // Upstream: the three requests went over one HBONE connection; tunnels (backend
    // connections) stay open in the pool.
    assert_eq!(
        m.value("meshkit_gateway_upstream_connections", &[]),
        Some(1.0)
    );
    assert_eq!(
        m.value("meshkit_gateway_upstream_connections_opened_total", &[]),
        Some(1.0)
    );
    let opened = m
        .value("meshkit_gateway_upstream_tunnels_opened_total", &[])
        .expect("tunnels opened");
    assert!((1.0..=3.0).contains(&opened), "{opened}");
    assert!(
        m.value("meshkit_gateway_upstream_tunnels", &[])
            .expect("tunnels")
            >= 1.0
    );
    assert!(
        m.value("meshkit_gateway_upstream_tunnels_idle", &[])
            .is_some()
    );
    assert!(
        m.value("meshkit_gateway_downstream_connections", &[])
            .is_some()
    );
    assert_eq!(m.value("meshkit_gateway_routes", &[]), Some(2.0));
    let expiry = m
        .value(
            "meshkit_gateway_tls_certificate_expiry_timestamp_seconds",
            &[("namespace", "shop"), ("name", "shop-tls")],
        )
        .expect("certificate expiry");
    assert!(expiry > 1.6e9, "{expiry}");
    assert!(
        m.value("meshkit_build", &[("component", "ingress-gateway")])
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_goes_503_200_503_through_start_up_and_drain() {
    let mut h = start_without_config(|s| s, |_| {}).await;
    let admin = admin(&mut h).await;
    let (status, body) = admin_get(admin, "/healthz/ready").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("first configuration"), "{body}");

    h.config.send_replace(h.prepared.clone());
    assert_eq!(ready_becomes(admin, 200).await, "ready\n");
    honest(h.http).await;

    let gateway = h.gateway.clone();
    let drain = tokio::spawn(async move { gateway.drain(PATIENCE).await });
    let body = ready_becomes(admin, 503).await;
    assert!(body.contains("draining"), "{body}");
    within("the drain of an idle gateway", drain)
        .await
        .expect("drain task");
    let (status, _) = admin_get(admin, "/healthz/ready").await;
    assert_eq!(status, 503);
    refused(h.http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_at_the_drain_finish_and_new_connections_are_refused() {
    let mut h = start(|s| s).await;
    let admin = admin(&mut h).await;

    // A: an HTTP/1.1 answer under way (head and first part sent).
    let (mut a, _a_conn) = http1(h.http).await;
    let resp = within("/slow head", a.send_request(get_from(HOST, "/slow", &[])))
        .await
        .expect("answer");
    assert_eq!(resp.status(), 200);
    let mut a_body = resp.into_body();
    let first = next_data(&mut a_body).await.expect("first part");
    assert_eq!(first.as_deref(), Some(SLOW_FIRST.as_bytes()));

    // B: an idle keep-alive connection.
    let (mut b, b_conn) = http1(h.http).await;
    let resp = within("B's request", b.send_request(get_from(HOST, "/", &[])))
        .await
        .expect("answer");
    let mut b_body = resp.into_body();
    assert_eq!(rest(&mut b_body).await.expect("body"), "got 0");

    // C: a request whose answer has not started yet.
    let (mut c, _c_conn) = http1(h.http).await;
    let c_answer = tokio::spawn(c.send_request(get_from(HOST, "/slow-head", &[])));

    // D: an HTTP/2 answer under way.
    let sock = TcpStream::connect(h.http).await.expect("connect");
    let (mut d, d_conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(sock))
            .await
            .expect("h2 handshake");
    let d_conn = tokio::spawn(d_conn);
    let req = http::Request::get(format!("http://{HOST}/slow"))
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = within("D's head", d.send_request(req))
        .await
        .expect("answer");
    let mut d_body = resp.into_body();
    assert_eq!(
        next_data(&mut d_body).await.expect("first part").as_deref(),
        Some(SLOW_FIRST.as_bytes())
    );
    // Both slow answers have started: the app waits on its semaphore.
    tokio::time::sleep(Duration::from_millis(50)).await;

    let gateway = h.gateway.clone();
    let drain = tokio::spawn(async move { gateway.drain(PATIENCE).await });
    ready_becomes(admin, 503).await;
    refused(h.http).await;
    // The idle connection is closed, the others are not: their answers are in flight.
    within("the idle connection's close", b_conn)
        .await
        .expect("B's driver");
    assert!(
        !drain.is_finished(),
        "the drain ended with requests in flight"
    );

    h.release.add_permits(3);
    let a_rest = rest(&mut a_body).await.expect("A's answer to its end");
    assert_eq!(a_rest, SLOW_REST);
    let c_resp = within("C's answer", c_answer)
        .await
        .expect("task")
        .expect("C answered");
    assert_eq!(c_resp.status(), 200);
    assert_eq!(
        c_resp.headers().get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..]),
        "{:?}",
        c_resp.headers()
    );
    let mut c_body = c_resp.into_body();
    assert_eq!(rest(&mut c_body).await.expect("C's body"), "got 0");
    let d_rest = rest(&mut d_body).await.expect("D's answer to its end");
    assert_eq!(d_rest, SLOW_REST);
    // HTTP/2: GOAWAY, then the connection ends once its stream is done.
    within("the HTTP/2 connection's end", d_conn)
        .await
        .expect("D's driver")
        .expect("a graceful end");
    within("the drain", drain).await.expect("drain task");

    // All four requests were counted as whole answers.
    let m = scrape(admin).await;
    assert_eq!(
        m.value("istio_requests_total", &served_by_web_default("200")),
        Some(4.0)
    );
}

/// [`served_by_web`] for a gateway without a workload name.
fn served_by_web_default(code: &'static str) -> Vec<(&'static str, &'static str)> {
    let mut labels = served_by_web(code);
    for (k, v) in &mut labels {
        if matches!(
            *k,
            "source_workload" | "source_canonical_service" | "source_canonical_revision"
        ) {
            *v = "unknown";
        }
    }
    labels
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_deadline_cuts_what_is_left() {
    let mut h = start(|s| s).await;
    let admin = admin(&mut h).await;
    let (mut a, _a_conn) = http1(h.http).await;
    let resp = within("/slow head", a.send_request(get_from(HOST, "/slow", &[])))
        .await
        .expect("answer");
    let mut body = resp.into_body();
    assert_eq!(
        next_data(&mut body).await.expect("first part").as_deref(),
        Some(SLOW_FIRST.as_bytes())
    );
    // Never released: the answer cannot finish.
    within("the drain", h.gateway.drain(Duration::from_millis(300))).await;
    assert!(
        rest(&mut body).await.is_err(),
        "a cut answer read as complete"
    );
    let mut cut = served_by_web_default("200");
    for (k, v) in &mut cut {
        if *k == "response_flags" {
            *v = "DC";
        }
    }
    scrape_until(admin, "the cut answer counted with DC", |m| {
        m.value("istio_requests_total", &cut) == Some(1.0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traceparent_is_taken_and_carried_into_the_connect_and_to_the_backend() {
    let h = start(|s| s).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_tp = format!("00-{trace}-00f067aa0ba902b7-01");
    let answer = request_in_time(
        h.http,
        get_from(
            HOST,
            "/",
            &[("traceparent", &client_tp), ("tracestate", "vendor=1")],
        ),
    )
    .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let seen = answer.headers["x-seen-traceparent"]
        .to_str()
        .expect("text")
        .to_owned();
    let parts: Vec<&str> = seen.split('-').collect();
    assert_eq!(parts.len(), 4, "{seen}");
    assert_eq!(
        (parts[0], parts[1], parts[3]),
        ("00", trace, "01"),
        "{seen}"
    );
    assert_eq!(parts[2].len(), 16);
    assert_ne!(
        parts[2], "00f067aa0ba902b7",
        "the gateway's span is the parent"
    );
    assert_eq!(answer.headers["x-seen-tracestate"], "vendor=1");
    // The tunnel was opened for this request: its CONNECT carries the same context.
    let connects = h.connects.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(connects.len(), 1);
    assert_eq!(
        connects[0]
            .get("traceparent")
            .map(|v| v.to_str().expect("text")),
        Some(seen.as_str())
    );

    // An invalid one is replaced by a new trace, and its tracestate dropped.
    let answer = request_in_time(
        h.http,
        get_from(
            HOST,
            "/",
            &[
                ("traceparent", &format!("00-{trace}-00f067aa0ba902b7")),
                ("tracestate", "vendor=1"),
            ],
        ),
    )
    .await;
    let seen = answer.headers["x-seen-traceparent"].to_str().expect("text");
    assert_eq!(seen.len(), 55, "{seen}");
    assert!(seen.starts_with("00-") && !seen.contains(trace), "{seen}");
    assert!(!answer.headers.contains_key("x-seen-tracestate"));

    // None: one is started.
    let answer = request_in_time(h.http, get_from(HOST, "/", &[])).await;
    let seen = answer.headers["x-seen-traceparent"].to_str().expect("text");
    assert_eq!(seen.len(), 55, "{seen}");
    assert!(seen.starts_with("00-") && seen.ends_with("-00"), "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_dump_names_routes_backends_and_certificates_never_keys() {
    let mut h = start(|s| s).await;
    let admin = admin(&mut h).await;
    let key_pem = h.prepared.secrets[0].key_pem.clone();
    let (status, body) = admin_get(admin, "/config_dump").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        !body.contains("PRIVATE KEY") && !body.contains(key_pem.trim()),
        "{body}"
    );
    let dump: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(dump["identity"], GATEWAY_ID);
    assert_eq!(dump["draining"], false);
    let routes = dump["routes"].as_array().expect("routes");
    assert_eq!(routes.len(), 1);
    assert_eq!(routes[0]["route"], "shop/shop:/");
    assert_eq!(routes[0]["host"], HOST);
    assert_eq!(routes[0]["backend"]["service"], "web");
    let web = &dump["backends"][0];
    assert_eq!(web["service"], "web.shop.svc.cluster.local");
    assert_eq!(web["endpoints"][0]["workload"], "web-1");
    assert_eq!(web["endpoints"][0]["identity"], WEB_ID);
    let cert = &dump["tls_certificates"][0];
    assert_eq!(cert["name"], "shop-tls");
    assert_eq!(cert["dns_names"], serde_json::json!([HOST]));
    assert_eq!(cert["loaded"], true);
    assert!(
        cert["not_after"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{cert}"
    );
}

/// Where the access-log lines of this test binary go.
static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_access_log_line_per_request_at_info() {
    // The other tests of this binary log here too; this one looks for its own paths.
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(|| LogWriter)
        .try_init();
    let h = start(|s| s).await;
    let answer = request_in_time(h.http, get_from(HOST, "/access-log-check", &[])).await;
    assert_eq!(answer.status, 200);
    let answer = request_in_time(
        h.http,
        get_from("nowhere.example.com", "/access-log-404", &[]),
    )
    .await;
    assert_eq!(answer.status, 404);
    let lines = || -> Vec<String> {
        String::from_utf8_lossy(&LOG.lock().unwrap_or_else(|e| e.into_inner()))
            .lines()
            .filter(|l| l.contains("meshkit::access") && l.contains("/access-log-"))
            .map(str::to_owned)
            .collect()
    };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while lines().len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "{:?}", lines());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lines = lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    let ok = lines
        .iter()
        .find(|l| l.contains("/access-log-check"))
        .expect("200 line");
    for field in [
        " INFO ",
        "request{",
        "method=GET",
        &format!("host={HOST}"),
        "path=/access-log-check",
        "protocol=HTTP/1.1",
        "status=200",
        "flags=-",
        "route=shop/shop:/",
        "destination_service=web.shop.svc.cluster.local",
        "destination_workload=web-1",
        &format!("destination_identity={WEB_ID}"),
        "bytes_received=0",
        "bytes_sent=5",
        "duration_ms=",
        "trace_id=",
        "client=127.0.0.1:",
    ] {
        assert!(ok.contains(field), "{field:?} not in {ok}");
    }
    let refused = lines
        .iter()
        .find(|l| l.contains("/access-log-404"))
        .expect("404 line");
    for field in [
        "status=404",
        "flags=NR",
        "route=unknown",
        "destination_identity=unknown",
    ] {
        assert!(refused.contains(field), "{field:?} not in {refused}");
    }
}

// === the binary ===

/// Signs any CSR for the identity it asks for: the test's CA.
struct AnySigner(Arc<meshkit_identity::test_util::TestCa>);

impl meshkit_identity::istio::CertificateSigner for AnySigner {
    fn create_certificate(
        &self,
        request: tonic::Request<meshkit_identity::istio::IstioCertificateRequest>,
    ) -> meshkit_identity::BoxFuture<
        '_,
        Result<meshkit_identity::istio::IstioCertificateResponse, tonic::Status>,
    > {
        let id: meshkit_identity::SpiffeId = GATEWAY_ID.parse().expect("id");
        let result = self
            .0
            .sign_csr(&request.get_ref().csr, &id, Duration::from_secs(3600))
            .map(|chain| meshkit_identity::istio::IstioCertificateResponse {
                cert_chain: vec![meshkit_identity::certs_to_pem(&chain), self.0.root_pem()],
            })
            .map_err(|e| tonic::Status::permission_denied(e.to_string()));
        Box::pin(std::future::ready(result))
    }
}

/// The binary on SIGTERM: ready while serving, 503 while it drains, new connections
/// refused, the answer in flight finished, then exit 0; its scrape parses and counts, its
/// access log is JSON with `--access-log-json`, `/logging` sets the filter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_drains_on_sigterm() {
    use meshkit_identity::{Authorize, SingleIdentity, SpiffeVerifier, TlsSettings, TrustDomain};
    // The backend on an address of its own, whose port 15008 is the HBONE server's.
    const BACKEND_IP: &str = "127.0.0.187";
    let ca = Arc::new(meshkit_identity::test_util::TestCa::new(
        TrustDomain::new("cluster.local").expect("td"),
    ));
    let ca_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind ca");
    let ca_addr = ca_listener.local_addr().expect("addr");
    let signer = AnySigner(ca.clone());
    let _ca_task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(meshkit_identity::istio::IstioCaServer::new(signer))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(ca_listener))
            .await;
    });
    let (app_port, release, _app) = app_on(BACKEND_IP).await;
    let tls = TlsSettings::default()
        .server_config(
            ca.issue(WEB_ID.parse().expect("id")),
            SpiffeVerifier::new(ca.bundle_set(), Authorize::AnyTrusted),
        )
        .expect("hbone tls");
    let hbone = tokio::net::TcpListener::bind((BACKEND_IP, 15008))
        .await
        .expect("bind HBONE on the backend's port 15008");
    let server = meshkit_hbone::Server::new(
        meshkit_hbone::ServerConfig::default(),
        SingleIdentity::new(tls),
        meshkit_hbone::Forward::new(),
    );
    let _hbone = tokio::spawn(async move {
        let _ = server.serve(hbone).await;
    });

    let dir = std::env::temp_dir().join(format!("meshkit-gw-{}-sigterm", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("root.pem"), ca.root_pem()).expect("root");
    std::fs::write(
        dir.join("ingress.yaml"),
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: shop, namespace: shop}\nspec:\n  rules:\n  - host: shop.example.com\n    http:\n      paths:\n      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}\n",
    )
    .expect("ingress");
    let mesh = serde_json::json!({
        "workloads": [{"name": "web-1", "namespace": "shop", "service_account": "web",
                       "ip": BACKEND_IP, "node": "node", "ports": [app_port]}],
        "services": [{"name": "web", "namespace": "shop", "hostname": "web.shop.svc.cluster.local",
                      "ports": [{"name": "http", "port": 80, "target_port": app_port}],
                      "endpoints": [BACKEND_IP]}],
    });
    std::fs::write(dir.join("mesh.json"), mesh.to_string()).expect("mesh");
    let (http_port, admin_port) = (
        meshkit_test_support::free_port(),
        meshkit_test_support::free_port(),
    );
    let http: SocketAddr = format!("127.0.0.1:{http_port}").parse().expect("addr");
    let admin: SocketAddr = format!("127.0.0.1:{admin_port}").parse().expect("addr");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_ingress-gateway"))
        .args([
            "--listen",
            &http.to_string(),
            "--admin-addr",
            &admin.to_string(),
        ])
        .args([
            "--ca",
            &format!("http://{ca_addr}"),
            "--drain-seconds",
            "20",
        ])
        .arg("--access-log-json")
        .arg("--ca-root")
        .arg(dir.join("root.pem"))
        .arg("--ingress")
        .arg(dir.join("ingress.yaml"))
        .arg("--mesh")
        .arg(dir.join("mesh.json"))
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start ingress-gateway");
    let mut child = meshkit_test_support::KillOnDrop(child);
    let stderr = child.0.stderr.take().expect("stderr");
    let log = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(&mut { stderr }, &mut out);
        out
    });
    tokio::task::spawn_blocking(move || meshkit_test_support::wait_port(admin_port, PATIENCE))
        .await
        .expect("admin port");
    ready_becomes(admin, 200).await;
    let (status, body) = tokio::task::spawn_blocking(move || {
        meshkit_test_support::http_request(admin, "PUT", "/logging?level=info")
    })
    .await
    .expect("admin request");
    assert_eq!(status, 200, "{body}");

    honest(http).await;
    let m = scrape_until(admin, "one request counted", |m| {
        m.sum("istio_requests_total", &[("response_code", "200")]) == 1.0
    })
    .await;
    assert_eq!(
        m.value("istio_requests_total", &[("destination_workload", "web-1")]),
        Some(1.0)
    );
    let (_, dump) = admin_get(admin, "/config_dump").await;
    let dump: serde_json::Value = serde_json::from_str(&dump).expect("dump");
    assert_eq!(dump["certificate"]["identity"], GATEWAY_ID);

    let (mut a, _a_conn) = http1(http).await;
    let resp = within("/slow head", a.send_request(get_from(HOST, "/slow", &[])))
        .await
        .expect("answer");
    let mut body = resp.into_body();
    assert_eq!(
        next_data(&mut body).await.expect("first part").as_deref(),
        Some(SLOW_FIRST.as_bytes())
    );
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(kill.success());
    let draining = ready_becomes(admin, 503).await;
    assert!(draining.contains("draining"), "{draining}");
    refused(http).await;
    assert!(
        child.0.try_wait().expect("wait").is_none(),
        "exited with an answer in flight"
    );
    release.add_permits(1);
    assert_eq!(
        rest(&mut body).await.expect("the answer to its end"),
        SLOW_REST
    );
    let status = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            if let Some(status) = child.0.try_wait().expect("wait") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no exit after the drain"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .expect("exit");
    let log = log.join().expect("stderr");
    assert!(status.success(), "{status}: {log}");
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| l.contains("meshkit::access"))
        .filter_map(|l| serde_json::from_str(&l[l.find("{\"client\"")?..]).ok())
        .collect();
    assert_eq!(lines.len(), 2, "{log}");
    let slow = lines
        .iter()
        .find(|l| l["path"] == "/slow")
        .expect("the /slow line");
    assert_eq!(slow["status"], 200);
    assert_eq!(slow["flags"], "-");
    assert_eq!(slow["destination_identity"], WEB_ID);
    assert_eq!(
        slow["bytes_sent"],
        (SLOW_FIRST.len() + SLOW_REST.len()) as u64
    );
    let _ = std::fs::remove_dir_all(&dir);
}
