//! The gateway serves the Gateway API beside Ingress: a listener per Gateway port, opened and
//! closed with the configuration; routing by HTTPRoute with its filters as layers (request
//! headers and URL rewrite on the way in, response headers on the way out); redirects and
//! 404s; TLS on an HTTPS Gateway listener with its certificate ref, chosen by SNI.

mod support;

use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use meshkit_ingress_model::gateway::manifest;
use meshkit_mesh::{MeshService, ServicePort};
use support::*;
use tokio::net::{TcpListener, TcpStream};

/// An app that answers with what it received: `path host x-added`.
async fn serve_echo(listener: TcpListener) {
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let service = hyper::service::service_fn(|req: hyper::Request<Incoming>| async move {
                let header = |name: &str| {
                    req.headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-")
                        .to_owned()
                };
                let body = format!(
                    "{} {} {}",
                    req.uri().path_and_query().map_or("-", |pq| pq.as_str()),
                    header("host"),
                    header("x-added")
                );
                Ok::<_, hyper::Error>(hyper::Response::new(Full::new(Bytes::from(body))))
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(sock), service)
                .await;
        });
    }
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    meshkit_test_support::free_port()
}

fn objects(http_port: u16, https_port: u16) -> manifest::GatewayApiObjects {
    manifest::from_yaml_str(&format!(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: meshkit}}
spec: {{controllerName: meshkit.dev/gateway}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: public, namespace: shop}}
spec:
  gatewayClassName: meshkit
  listeners:
  - {{name: http, port: {http_port}, protocol: HTTP}}
  - name: https
    port: {https_port}
    protocol: HTTPS
    hostname: {HOST}
    tls: {{certificateRefs: [{{name: shop-tls}}]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: store, namespace: shop}}
spec:
  parentRefs: [{{name: public}}]
  rules:
  - matches: [{{path: {{value: /v1}}}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {{set: [{{name: x-added, value: "yes"}}]}}
    - type: URLRewrite
      urlRewrite: {{hostname: internal.test, path: {{type: ReplacePrefixMatch, replacePrefixMatch: /v2}}}}
    - type: ResponseHeaderModifier
      responseHeaderModifier: {{add: [{{name: x-served, value: gateway-api}}]}}
    backendRefs: [{{name: echo, port: 81}}]
  - matches: [{{path: {{type: Exact, value: /old}}}}]
    filters: [{{type: RequestRedirect, requestRedirect: {{hostname: new.test, statusCode: 301}}}}]
"#
    ))
    .expect("manifest")
}

async fn get_on(port: u16, host: &str, path: &str) -> Answer {
    let req = http::Request::get(path)
        .header(http::header::HOST, host)
        .body(Full::new(Bytes::new()))
        .expect("request");
    request_in_time(SocketAddr::from(([127, 0, 0, 1], port)), req).await
}

/// Waits until `port` on loopback accepts (`open`) or refuses (`!open`) connections.
async fn wait_port(port: u16, open: bool) {
    let deadline = Instant::now() + PATIENCE;
    while TcpStream::connect(("127.0.0.1", port)).await.is_ok() != open {
        assert!(
            Instant::now() < deadline,
            "port {port} never became open={open}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn gateway_api_routes_filters_tls_and_listeners_follow_the_configuration() {
    let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
    let echo_port = echo.local_addr().expect("addr").port();
    tokio::spawn(serve_echo(echo));
    let (http_port, https_port) = (free_port(), free_port());
    let h = start_with(
        |s| s,
        |config| {
            config.gateway_api = objects(http_port, https_port);
            config.mesh.workloads[0]
                .ports
                .get_or_insert_with(Vec::new)
                .push(echo_port);
            config.mesh.services.push(MeshService {
                name: "echo".into(),
                namespace: "shop".into(),
                hostname: "echo.shop.svc.cluster.local".into(),
                vip: None,
                ports: vec![ServicePort {
                    name: Some("http".into()),
                    port: 81,
                    target_port: echo_port,
                }],
                endpoints: vec!["127.0.0.1".parse().expect("ip")],
            });
        },
    )
    .await;
    let serving = tokio::spawn(
        h.gateway
            .clone()
            .serve_gateway_api("127.0.0.1".parse().expect("ip")),
    );
    wait_port(http_port, true).await;
    wait_port(https_port, true).await;

    // The rule's filters: header set and URL rewritten on the way in, header added on the
    // way out.
    let answer = get_on(http_port, "store.test", "/v1/items?page=2").await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body, "/v2/items?page=2 internal.test yes");
    assert_eq!(
        answer.headers.get("x-served").map(|v| v.as_bytes()),
        Some(&b"gateway-api"[..])
    );
    // The redirect keeps the scheme, path and the listener's port.
    let answer = get_on(http_port, "store.test", "/old").await;
    assert_eq!(answer.status, 301);
    assert_eq!(
        answer.headers.get("location").and_then(|v| v.to_str().ok()),
        Some(format!("http://new.test:{http_port}/old").as_str())
    );
    // No rule matches: 404, and the Ingress routes are not consulted on a Gateway port.
    assert_eq!(get_on(http_port, HOST, "/nothing").await.status, 404);
    assert_eq!(get_on(http_port, HOST, "/").await.status, 404);

    // HTTPS on the Gateway's listener: its certificate ref (shop-tls), chosen by SNI.
    let tls = tls_connect_to(
        &h,
        SocketAddr::from(([127, 0, 0, 1], https_port)),
        &[b"http/1.1"],
    )
    .await;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let resp = send
        .send_request(
            http::Request::get("/v1/x")
                .header(http::header::HOST, HOST)
                .body(Full::new(Bytes::new()))
                .expect("request"),
        )
        .await
        .expect("answer");
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"/v2/x internal.test yes");

    // A Gateway listener on the port of the gateway's Ingress listener cannot bind there,
    // and the Ingress listener keeps routing by the Ingresses (not by this Gateway).
    let mut clash = h.prepared.clone();
    clash.gateway_api = objects(h.http.port(), https_port);
    h.config.send_replace(clash);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(get_on(h.http.port(), HOST, "/").await.status, 200);
    assert_eq!(
        get_on(h.http.port(), "store.test", "/v1/items")
            .await
            .status,
        404
    );

    // The Gateway goes: its listeners close.
    let mut without = h.prepared.clone();
    without.gateway_api = manifest::GatewayApiObjects::default();
    h.config.send_replace(without);
    wait_port(http_port, false).await;
    wait_port(https_port, false).await;
    serving.abort();
}
