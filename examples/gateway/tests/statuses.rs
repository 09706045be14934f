//! The statuses the gateway answers itself (docs/gateway.md, "The request path"), each for
//! the reason the docs give, with the body that names it: 400 without a host, 404 without a
//! route or for a `resource` backend, 503 for an unknown service, a port the service does not
//! have, no endpoints or none reachable, 502 when the backend fails the exchange, 504 when it
//! does not answer; and endpoint failover, an unreachable endpoint skipped for the next.

mod support;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use meshkit_gateway::{BACKEND_WORKLOAD, GatewayConfig};
use meshkit_mesh::{MeshService, ServicePort, Workload};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The host of this file's routes.
const STATUSES: &str = "statuses.example.com";

/// One path per case; each names the service its backend is.
const INGRESS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: statuses, namespace: shop}
spec:
  rules:
  - host: statuses.example.com
    http:
      paths:
      - {path: /bucket, pathType: Prefix, backend: {resource: {apiGroup: k8s.example.com, kind: StorageBucket, name: b}}}
      - {path: /unknown, pathType: Prefix, backend: {service: {name: nosuch, port: {number: 80}}}}
      - {path: /port-number, pathType: Prefix, backend: {service: {name: web, port: {number: 81}}}}
      - {path: /port-name, pathType: Prefix, backend: {service: {name: web, port: {name: grpc}}}}
      - {path: /empty, pathType: Prefix, backend: {service: {name: empty, port: {number: 80}}}}
      - {path: /no-workload, pathType: Prefix, backend: {service: {name: orphan, port: {number: 80}}}}
      - {path: /dead, pathType: Prefix, backend: {service: {name: dead, port: {number: 80}}}}
      - {path: /closes, pathType: Prefix, backend: {service: {name: closes, port: {number: 80}}}}
      - {path: /garbage, pathType: Prefix, backend: {service: {name: garbage, port: {number: 80}}}}
      - {path: /failover, pathType: Prefix, backend: {service: {name: pair, port: {number: 80}}}}
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
"#;

/// A backend that reads a request head, writes `answer` (not an HTTP answer, or nothing) and
/// closes the connection: an app that fails the exchange. Its port.
async fn failing_app(answer: &'static [u8]) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = sock.write_all(answer).await;
                // Dropped: closed, with no (complete) answer.
            });
        }
    });
    port
}

fn service(name: &str, target_port: u16, endpoints: &[&str]) -> MeshService {
    MeshService {
        name: name.into(),
        namespace: "shop".into(),
        hostname: format!("{name}.shop.svc.cluster.local"),
        vip: None,
        ports: vec![ServicePort {
            name: Some("http".into()),
            port: 80,
            target_port,
        }],
        endpoints: endpoints.iter().map(|ip| ip.parse().expect("ip")).collect(),
    }
}

/// The harness's gateway with this file's routes and services, and the backend headers on.
async fn gateway(
    tune: impl FnOnce(meshkit_gateway::GatewaySettings) -> meshkit_gateway::GatewaySettings,
) -> Harness {
    let closes = failing_app(b"").await;
    let garbage = failing_app(b"this is not HTTP\r\n\r\n").await;
    start_with(
        |s| tune(s.with_backend_headers(true)),
        move |config: &mut GatewayConfig| {
            config
                .ingresses
                .extend(meshkit_ingress_model::manifest::from_yaml_str(INGRESS).expect("ingress"));
            let web = config.mesh.services[0].clone();
            let app_port = web.ports[0].target_port;
            // web-2 on 127.0.0.2, where no HBONE server listens: unreachable.
            config.mesh.workloads.push(Workload {
                authorization_policies: Vec::new(),
                name: "web-2".into(),
                namespace: "shop".into(),
                service_account: "web".into(),
                ip: "127.0.0.2".parse().expect("ip"),
                node: "node".into(),
                ports: None,
            });
            config.mesh.services.extend([
                service("empty", app_port, &[]),
                // An endpoint address no workload has.
                service("orphan", app_port, &["127.0.0.9"]),
                service("dead", app_port, &["127.0.0.2"]),
                service("closes", closes, &["127.0.0.1"]),
                service("garbage", garbage, &["127.0.0.1"]),
                service("pair", app_port, &["127.0.0.2", "127.0.0.1"]),
            ]);
        },
    )
    .await
}

/// `GET path` for [`STATUSES`].
fn get(path: &str) -> http::Request<Full<Bytes>> {
    http::Request::get(path)
        .header("host", STATUSES)
        .body(Full::new(Bytes::new()))
        .expect("request")
}

/// Asserts that `answer` is the gateway's own `status` with `body`, no backend named.
fn assert_gateway_answer(answer: &Answer, status: u16, body: &str) {
    assert_eq!(
        (answer.status, answer.body.as_str()),
        (status, body),
        "{answer:?}"
    );
}

#[tokio::test]
async fn a_request_without_a_host_is_400() {
    let h = gateway(|s| s).await;
    // HTTP/1.1 and HTTP/1.0, origin-form, no Host.
    let no_host = http::Request::get("/")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let answer = request_in_time(h.http, no_host).await;
    assert_gateway_answer(&answer, 400, "no host in the request");
    let line = raw_status_line(h.http, b"GET / HTTP/1.0\r\n\r\n").await;
    assert!(
        line.starts_with("HTTP/1.0 400") || line.starts_with("HTTP/1.1 400"),
        "{line}"
    );
    // A host that is not text.
    let line = raw_status_line(h.http, b"GET / HTTP/1.1\r\nHost: \xff\xfe\r\n\r\n").await;
    assert!(line.starts_with("HTTP/1.1 400"), "{line}");
    // An empty Host names no host either.
    let line = raw_status_line(h.http, b"GET / HTTP/1.1\r\nHost:\r\n\r\n").await;
    assert!(line.starts_with("HTTP/1.1 400"), "{line}");
    // Two Host lines (RFC 9112, 3.2): which one is meant is not for the gateway to guess.
    let line = raw_status_line(
        h.http,
        b"GET / HTTP/1.1\r\nHost: statuses.example.com\r\nHost: other.example.com\r\n\r\n",
    )
    .await;
    assert!(line.starts_with("HTTP/1.1 400"), "{line}");
    // An absolute-form target names the host; Host is then not consulted (RFC 9112, 3.2.2).
    let line = raw_status_line(
        h.http,
        b"GET http://shop.example.com/ HTTP/1.1\r\nHost: other.example.com\r\n\r\n",
    )
    .await;
    assert_eq!(line, "HTTP/1.1 200 OK");
    // Answered by the backend once the host is there.
    honest(h.http).await;
}

#[tokio::test]
async fn no_route_or_a_resource_backend_is_404() {
    let h = gateway(|s| s).await;
    let other = http::Request::get("/")
        .header("host", "other.example.com")
        .body(Full::new(Bytes::new()))
        .expect("request");
    assert_gateway_answer(&request_in_time(h.http, other).await, 404, "no route");
    assert_gateway_answer(
        &request_in_time(h.http, get("/bucket")).await,
        404,
        "route has no service backend",
    );
}

#[tokio::test]
async fn an_unknown_service_a_missing_port_or_no_endpoints_is_503() {
    let h = gateway(|s| s).await;
    for (path, body) in [
        ("/unknown", "backend service unknown"),
        ("/port-number", "backend service has no such port"),
        ("/port-name", "backend service has no such port"),
        ("/empty", "no endpoints"),
        ("/no-workload", "no endpoints"),
        ("/dead", "no endpoint reachable"),
    ] {
        let answer = request_in_time(h.http, get(path)).await;
        assert_gateway_answer(&answer, 503, body);
        assert!(
            !answer.headers.contains_key(BACKEND_WORKLOAD),
            "{path}: {answer:?}"
        );
    }
}

#[tokio::test]
async fn a_backend_that_fails_the_exchange_is_502() {
    let h = gateway(|s| s).await;
    for path in ["/closes", "/garbage"] {
        let answer = request_in_time(h.http, get(path)).await;
        assert_gateway_answer(&answer, 502, "backend request failed");
        // The endpoint that failed is named: the request reached it.
        assert_eq!(
            answer.headers[BACKEND_WORKLOAD], "web-1",
            "{path}: {answer:?}"
        );
    }
}

#[tokio::test]
async fn a_backend_that_does_not_answer_is_504() {
    // The app's /stall reads nothing and never answers; the GET has no body, so the
    // response timeout runs from the request's end.
    let h = gateway(|s| s.with_response_timeout(Duration::from_millis(500))).await;
    let answer = request_in_time(h.http, get("/stall")).await;
    assert_gateway_answer(&answer, 504, "backend timed out");
    assert_eq!(answer.headers[BACKEND_WORKLOAD], "web-1", "{answer:?}");
}

#[tokio::test]
async fn an_unreachable_endpoint_is_skipped_for_the_next() {
    let h = gateway(|s| s).await;
    // The round robin starts every other request at web-2 (unreachable): each is answered by
    // web-1 all the same.
    for i in 0..4 {
        let answer = request_in_time(h.http, get("/failover")).await;
        assert_eq!(
            (answer.status, answer.body.as_str()),
            (200, "got 0"),
            "{i}: {answer:?}"
        );
        assert_eq!(answer.headers[BACKEND_WORKLOAD], "web-1", "{i}: {answer:?}");
    }
}
