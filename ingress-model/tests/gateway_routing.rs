//! Gateway API routing semantics: a table of cases per rule (listeners and attachment,
//! hostnames, matches, precedence, filters, weights, grants, status), each asserting the
//! backend, the status or the rewritten request.

use http::HeaderMap;
use meshkit_ingress_model::gateway::{
    Action, Filter, HttpRequest, HttpRouteTable, PathModifier, Reason, manifest,
};

/// The table over a manifest's Gateways, HTTPRoutes and ReferenceGrants.
fn table(yaml: &str) -> HttpRouteTable {
    let objects = manifest::from_yaml_str(yaml).expect("manifest");
    HttpRouteTable::new(
        &objects.gateways,
        &objects.http_routes,
        &objects.reference_grants,
    )
}

/// A request: `port host path[?query]`, then `method` and `name: value` headers.
struct Req {
    port: u16,
    host: String,
    path: String,
    query: Option<String>,
    method: String,
    headers: HeaderMap,
}

fn req(port: u16, host: &str, target: &str) -> Req {
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p.to_owned(), Some(q.to_owned())),
        None => (target.to_owned(), None),
    };
    Req {
        port,
        host: host.to_owned(),
        path,
        query,
        method: "GET".to_owned(),
        headers: HeaderMap::new(),
    }
}

impl Req {
    fn method(mut self, method: &str) -> Self {
        self.method = method.to_owned();
        self
    }

    fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers
            .append(name, value.parse().expect("header value"));
        self
    }

    fn facts(&self) -> HttpRequest<'_> {
        HttpRequest {
            port: self.port,
            host: &self.host,
            path: &self.path,
            query: self.query.as_deref(),
            method: &self.method,
            headers: &self.headers,
        }
    }
}

/// What the table does with `request` at `roll`: `ns/service:port`, `404`, `500`, or
/// `301 <location>`.
fn outcome(table: &HttpRouteTable, request: &Req, roll: u64) -> String {
    let Some(rule) = table.route(&request.facts()) else {
        return "404".to_owned();
    };
    match rule.action(roll) {
        Action::Forward(backend) => {
            let service = backend.target.as_ref().expect("valid backend");
            format!("{}/{}:{}", service.namespace, service.name, service.port)
        }
        Action::Status(status) => status.to_string(),
        Action::Redirect(redirect) => format!(
            "{} {}",
            redirect.status(),
            redirect.location(
                "http",
                &request.host,
                request.port,
                &request.path,
                request.query.as_deref(),
                rule.matched_path()
            )
        ),
    }
}

fn check(table: &HttpRouteTable, cases: &[(Req, &str)]) {
    for (request, expected) in cases {
        assert_eq!(
            outcome(table, request, 0),
            *expected,
            "{} {}:{}{}",
            request.method,
            request.host,
            request.port,
            request.path
        );
    }
}

const GATEWAY: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: edge}
spec:
  gatewayClassName: meshkit
  listeners:
  - {name: http, port: 80, protocol: HTTP}
"#;

fn with_gateway(routes: &str) -> HttpRouteTable {
    table(&format!("{GATEWAY}\n---\n{routes}"))
}

#[test]
fn listeners_take_requests_by_port_and_most_specific_hostname() {
    let table = table(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: edge}
spec:
  gatewayClassName: meshkit
  listeners:
  - {name: exact, port: 80, protocol: HTTP, hostname: a.example.com}
  - {name: wild, port: 80, protocol: HTTP, hostname: "*.example.com"}
  - {name: any, port: 80, protocol: HTTP}
  - {name: other-port, port: 8080, protocol: HTTP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: on-exact, namespace: edge}
spec:
  parentRefs: [{name: gw, sectionName: exact}]
  rules: [{backendRefs: [{name: exact, port: 1}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: on-wild, namespace: edge}
spec:
  parentRefs: [{name: gw, sectionName: wild}]
  rules: [{matches: [{path: {value: /only-wild}}], backendRefs: [{name: wild, port: 1}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: on-any, namespace: edge}
spec:
  parentRefs: [{name: gw, sectionName: any}]
  rules: [{backendRefs: [{name: any, port: 1}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: on-port, namespace: edge}
spec:
  parentRefs: [{name: gw, port: 8080}]
  rules: [{backendRefs: [{name: port8080, port: 1}]}]
"#,
    );
    check(
        &table,
        &[
            (req(80, "a.example.com", "/"), "edge/exact:1"),
            (req(80, "A.Example.COM:80", "/x"), "edge/exact:1"),
            // The exact listener takes a.example.com: the wildcard listener's routes never
            // see it, even for a path only they serve.
            (req(80, "a.example.com", "/only-wild"), "edge/exact:1"),
            (req(80, "b.example.com", "/only-wild"), "edge/wild:1"),
            (req(80, "b.c.example.com", "/only-wild"), "edge/wild:1"),
            (req(80, "b.example.com", "/"), "404"),
            (req(80, "example.com", "/"), "edge/any:1"),
            (req(80, "other.test", "/"), "edge/any:1"),
            (req(8080, "a.example.com", "/"), "edge/port8080:1"),
            (req(9090, "a.example.com", "/"), "404"),
        ],
    );
}

#[test]
fn attachment_follows_parent_refs_and_allowed_routes() {
    let table = table(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: edge}
spec:
  gatewayClassName: meshkit
  listeners:
  - {name: same, port: 80, protocol: HTTP, hostname: same.test}
  - name: all
    port: 80
    protocol: HTTP
    hostname: all.test
    allowedRoutes: {namespaces: {from: All}}
  - name: no-http-routes
    port: 80
    protocol: HTTP
    hostname: grpc.test
    allowedRoutes: {kinds: [{kind: GRPCRoute}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: shop}
spec:
  parentRefs: [{name: gw, namespace: edge}]
  rules: [{backendRefs: [{name: shop, port: 1}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: edge}
spec:
  parentRefs: [{name: gw}]
  hostnames: [same.test, grpc.test]
  rules: [{backendRefs: [{name: local, port: 1}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: missing, namespace: edge}
spec:
  parentRefs: [{name: gw, sectionName: nope}, {name: absent}]
  rules: [{backendRefs: [{name: x, port: 1}]}]
"#,
    );
    check(
        &table,
        &[
            // `shop` routes may attach only where `from: All`.
            (req(80, "all.test", "/"), "shop/shop:1"),
            (req(80, "same.test", "/"), "edge/local:1"),
            // A listener that admits only GRPCRoutes takes no HTTPRoute.
            (req(80, "grpc.test", "/"), "404"),
        ],
    );
    let status = |ns: &str, name: &str, parent: usize| {
        table
            .route_status()
            .iter()
            .filter(|s| s.namespace == ns && s.name == name)
            .nth(parent)
            .map(|s| (s.accepted.status, s.accepted.reason))
    };
    assert_eq!(status("shop", "r", 0), Some((true, Reason::Accepted)));
    assert_eq!(status("edge", "r", 0), Some((true, Reason::Accepted)));
    assert_eq!(
        status("edge", "missing", 0),
        Some((false, Reason::NoMatchingParent))
    );
    assert_eq!(
        status("edge", "missing", 1),
        Some((false, Reason::NoMatchingParent))
    );
    let attached: Vec<(&str, u32)> = table
        .listener_status()
        .iter()
        .map(|l| (l.listener.as_str(), l.attached_routes))
        .collect();
    // edge/r is admitted by `all` but shares no hostname with it: not Accepted there, so
    // not counted.
    assert_eq!(attached, [("same", 1), ("all", 1), ("no-http-routes", 0)]);
}

#[test]
fn a_route_no_listener_admits_is_not_allowed_by_listeners() {
    let table = table(&format!(
        "{GATEWAY}\n---\n{}",
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: foreign, namespace: shop}
spec:
  parentRefs: [{name: gw, namespace: edge}]
  rules: [{backendRefs: [{name: shop, port: 1}]}]
"#
    ));
    let status = &table.route_status()[0];
    assert_eq!(
        (status.accepted.status, status.accepted.reason),
        (false, Reason::NotAllowedByListeners)
    );
    assert_eq!(outcome(&table, &req(80, "any.test", "/"), 0), "404");
}

#[test]
fn hostnames_intersect_with_the_listener() {
    let table = table(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: edge}
spec:
  gatewayClassName: meshkit
  listeners:
  - {name: wild, port: 80, protocol: HTTP, hostname: "*.example.com"}
  - {name: exact, port: 81, protocol: HTTP, hostname: very.specific.com}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: mixed, namespace: edge}
spec:
  parentRefs: [{name: gw, sectionName: wild}]
  hostnames: [a.example.com, "*.b.example.com", example.com, other.net]
  rules: [{backendRefs: [{name: mixed, port: 1}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: wider, namespace: edge}
spec:
  parentRefs: [{name: gw, sectionName: exact}]
  hostnames: ["*.specific.com"]
  rules: [{backendRefs: [{name: wider, port: 1}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: disjoint, namespace: edge}
spec:
  parentRefs: [{name: gw}]
  hostnames: [elsewhere.org]
  rules: [{backendRefs: [{name: disjoint, port: 1}]}]
"#,
    );
    check(
        &table,
        &[
            (req(80, "a.example.com", "/"), "edge/mixed:1"),
            (req(80, "x.b.example.com", "/"), "edge/mixed:1"),
            (req(80, "x.y.b.example.com", "/"), "edge/mixed:1"),
            (req(80, "b.example.com", "/"), "404"),
            // Inside the route's hostnames but outside the listener's: ignored.
            (req(80, "example.com", "/"), "404"),
            (req(80, "other.net", "/"), "404"),
            // A wildcard route on an exact listener serves the listener's name only.
            (req(81, "very.specific.com", "/"), "edge/wider:1"),
            (req(81, "other.specific.com", "/"), "404"),
        ],
    );
    let disjoint = table
        .route_status()
        .iter()
        .find(|s| s.name == "disjoint")
        .expect("status");
    assert_eq!(
        (disjoint.accepted.status, disjoint.accepted.reason),
        (false, Reason::NoMatchingListenerHostname)
    );
}

#[test]
fn path_header_query_and_method_matches() {
    let table = with_gateway(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: edge}
spec:
  parentRefs: [{name: gw}]
  rules:
  - matches: [{path: {type: Exact, value: /exact}}]
    backendRefs: [{name: exact, port: 1}]
  - matches: [{path: {type: PathPrefix, value: /abc/}}]
    backendRefs: [{name: prefix, port: 1}]
  - matches:
    - path: {value: /h}
      headers: [{name: X-Env, value: canary}, {name: x-env, value: ignored-second}]
    backendRefs: [{name: header, port: 1}]
  - matches: [{path: {value: /q}, queryParams: [{name: v, value: "a b"}]}]
    backendRefs: [{name: query, port: 1}]
  - matches: [{path: {value: /m}, method: POST}]
    backendRefs: [{name: method, port: 1}]
  - matches: [{path: {value: /either}, method: PUT}, {path: {type: Exact, value: /or}}]
    backendRefs: [{name: either, port: 1}]
"#,
    );
    check(
        &table,
        &[
            (req(80, "h", "/exact"), "edge/exact:1"),
            (req(80, "h", "/exact/"), "404"),
            (req(80, "h", "/Exact"), "404"),
            (req(80, "h", "/abc"), "edge/prefix:1"),
            (req(80, "h", "/abc/"), "edge/prefix:1"),
            (req(80, "h", "/abc/def"), "edge/prefix:1"),
            (req(80, "h", "/abcd"), "404"),
            (
                req(80, "h", "/h").header("x-env", "canary"),
                "edge/header:1",
            ),
            (
                req(80, "h", "/h").header("X-ENV", "canary"),
                "edge/header:1",
            ),
            (req(80, "h", "/h").header("x-env", "Canary"), "404"),
            (req(80, "h", "/h"), "404"),
            // Repeated request headers are compared joined by commas.
            (
                req(80, "h", "/h")
                    .header("x-env", "canary")
                    .header("x-env", "b"),
                "404",
            ),
            (req(80, "h", "/q?v=a%20b"), "edge/query:1"),
            (req(80, "h", "/q?x=1&v=a%20b&v=c"), "edge/query:1"),
            (req(80, "h", "/q?v=c&v=a%20b"), "404"),
            (req(80, "h", "/q?V=a%20b"), "404"),
            (req(80, "h", "/m").method("POST"), "edge/method:1"),
            (req(80, "h", "/m"), "404"),
            (req(80, "h", "/either/x").method("PUT"), "edge/either:1"),
            (req(80, "h", "/or"), "edge/either:1"),
            (req(80, "h", "/either"), "404"),
        ],
    );
}

#[test]
fn precedence_follows_the_specification() {
    let table = table(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: edge}
spec:
  gatewayClassName: meshkit
  listeners:
  - name: http
    port: 80
    protocol: HTTP
    allowedRoutes: {namespaces: {from: All}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: newer, namespace: a, creationTimestamp: "2026-02-01T00:00:00Z"}
spec:
  parentRefs: [{name: gw, namespace: edge}]
  hostnames: [p.test]
  rules:
  - matches: [{path: {value: /tie}}]
    backendRefs: [{name: newer, port: 1}]
  - matches: [{path: {value: /ns-tie}}]
    backendRefs: [{name: newer, port: 1}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: older, namespace: z, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  parentRefs: [{name: gw, namespace: edge}]
  hostnames: [p.test]
  rules:
  - matches: [{path: {value: /tie}}]
    backendRefs: [{name: older, port: 1}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: b, namespace: m, creationTimestamp: "2026-02-01T00:00:00Z"}
spec:
  parentRefs: [{name: gw, namespace: edge}]
  hostnames: [p.test]
  rules:
  - matches: [{path: {value: /ns-tie}}]
    backendRefs: [{name: m-b, port: 1}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: edge}
spec:
  parentRefs: [{name: gw}]
  hostnames: [p.test]
  rules:
  - matches: [{path: {value: /a}}]
    backendRefs: [{name: short-prefix, port: 1}]
  - matches: [{path: {value: /a/b}}]
    backendRefs: [{name: long-prefix, port: 1}]
  - matches: [{path: {type: Exact, value: /a/b/c}}]
    backendRefs: [{name: exact, port: 1}]
  - matches: [{path: {value: /a/b/c}, method: GET, headers: [{name: x, value: "1"}, {name: w, value: "1"}]}]
    backendRefs: [{name: long-with-all, port: 1}]
  - matches: [{path: {value: /m}, headers: [{name: x, value: "1"}, {name: w, value: "1"}]}]
    backendRefs: [{name: two-headers, port: 1}]
  - matches: [{path: {value: /m}, method: GET}]
    backendRefs: [{name: method, port: 1}]
  - matches: [{path: {value: /h}, headers: [{name: x, value: "1"}]}]
    backendRefs: [{name: one-header, port: 1}]
  - matches: [{path: {value: /h}, headers: [{name: x, value: "1"}, {name: w, value: "1"}]}]
    backendRefs: [{name: two-headers, port: 1}]
  - matches: [{path: {value: /hq}, headers: [{name: x, value: "1"}]}]
    backendRefs: [{name: header, port: 1}]
  - matches: [{path: {value: /hq}, queryParams: [{name: q, value: "1"}, {name: r, value: "1"}]}]
    backendRefs: [{name: queries, port: 1}]
  - matches: [{path: {value: /first}}]
    backendRefs: [{name: first-rule, port: 1}]
  - matches: [{path: {value: /first}}]
    backendRefs: [{name: second-rule, port: 1}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: wild, namespace: edge}
spec:
  parentRefs: [{name: gw}]
  hostnames: ["*.test"]
  rules:
  - matches: [{path: {type: Exact, value: /a/b/c}}]
    backendRefs: [{name: wildcard-exact, port: 1}]
  - matches: [{path: {value: /only-wild}}]
    backendRefs: [{name: wildcard, port: 1}]
"#,
    );
    check(
        &table,
        &[
            // 1. Exact over any prefix, even a longer one with more conditions.
            (req(80, "p.test", "/a/b/c"), "edge/exact:1"),
            // 2. The longest prefix.
            (
                req(80, "p.test", "/a/b/c/d")
                    .header("x", "1")
                    .header("w", "1"),
                "edge/long-with-all:1",
            ),
            (
                req(80, "p.test", "/a/b/c/d")
                    .method("POST")
                    .header("x", "1")
                    .header("w", "1"),
                "edge/long-prefix:1",
            ),
            (req(80, "p.test", "/a/b/c/d"), "edge/long-prefix:1"),
            (req(80, "p.test", "/a/b"), "edge/long-prefix:1"),
            (req(80, "p.test", "/a/x"), "edge/short-prefix:1"),
            // 3. A method over header matches.
            (
                req(80, "p.test", "/m").header("x", "1").header("w", "1"),
                "edge/method:1",
            ),
            (
                req(80, "p.test", "/m")
                    .method("PUT")
                    .header("x", "1")
                    .header("w", "1"),
                "edge/two-headers:1",
            ),
            // 4. The most header matches.
            (
                req(80, "p.test", "/h").header("x", "1").header("w", "1"),
                "edge/two-headers:1",
            ),
            (
                req(80, "p.test", "/h").header("x", "1"),
                "edge/one-header:1",
            ),
            // 5. The count of header matches decides before the count of query matches.
            (
                req(80, "p.test", "/hq?q=1&r=1").header("x", "1"),
                "edge/header:1",
            ),
            (req(80, "p.test", "/hq?q=1&r=1"), "edge/queries:1"),
            // 6. The oldest route.
            (req(80, "p.test", "/tie"), "z/older:1"),
            // 7. Equal age: the first by namespace/name (a/newer before m/b).
            (req(80, "p.test", "/ns-tie"), "a/newer:1"),
            // 8. Within a route, the first rule.
            (req(80, "p.test", "/first"), "edge/first-rule:1"),
            // The exact route hostname outranks the wildcard one, whose rules still serve
            // what the exact one does not match.
            (req(80, "p.test", "/only-wild"), "edge/wildcard:1"),
            (req(80, "q.test", "/a/b/c"), "edge/wildcard-exact:1"),
            (req(80, "q.test", "/a"), "404"),
        ],
    );
}

#[test]
fn weights_split_and_invalid_shares_answer_500() {
    let table = table(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: edge}
spec:
  gatewayClassName: meshkit
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: edge}
spec:
  parentRefs: [{name: gw}]
  rules:
  - matches: [{path: {value: /split}}]
    backendRefs: [{name: a, port: 1, weight: 3}, {name: zero, port: 1, weight: 0}, {name: b, port: 1}]
  - matches: [{path: {value: /half-invalid}}]
    backendRefs: [{name: ok, port: 1}, {name: far, namespace: other, port: 1}]
  - matches: [{path: {value: /all-zero}}]
    backendRefs: [{name: a, port: 1, weight: 0}]
  - matches: [{path: {value: /none}}]
  - matches: [{path: {value: /kind}}]
    backendRefs: [{name: bucket, kind: Bucket, group: storage.example.com}]
"#,
    );
    let rolls = |path: &str| -> Vec<String> {
        (0..4)
            .map(|roll| outcome(&table, &req(80, "h", path), roll))
            .collect()
    };
    assert_eq!(
        rolls("/split"),
        ["edge/a:1", "edge/a:1", "edge/a:1", "edge/b:1"]
    );
    assert_eq!(
        rolls("/half-invalid"),
        ["edge/ok:1", "500", "edge/ok:1", "500"]
    );
    assert_eq!(rolls("/all-zero"), ["500"; 4]);
    assert_eq!(rolls("/none"), ["500"; 4]);
    assert_eq!(rolls("/kind"), ["500"; 4]);
    let status = &table.route_status()[0];
    assert!(status.accepted.status, "{status:?}");
    assert_eq!(
        (status.resolved_refs.status, status.resolved_refs.reason),
        (false, Reason::RefNotPermitted)
    );
}

#[test]
fn reference_grants_permit_cross_namespace_backends_and_certificates() {
    let objects = manifest::from_yaml_str(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: edge}
spec:
  gatewayClassName: meshkit
  listeners:
  - name: https
    port: 443
    protocol: HTTPS
    hostname: "*.example.com"
    tls: {certificateRefs: [{name: wildcard, namespace: certs}, {name: local}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: edge}
spec:
  parentRefs: [{name: gw}]
  rules:
  - matches: [{path: {value: /granted}}]
    backendRefs: [{name: api, namespace: backends, port: 8080}]
  - matches: [{path: {value: /named}}]
    backendRefs: [{name: other, namespace: backends, port: 8080}]
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: routes-to-api, namespace: backends}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: edge}]
  to: [{group: "", kind: Service, name: api}]
"#,
    )
    .expect("manifest");
    let build = |grants: &[_]| HttpRouteTable::new(&objects.gateways, &objects.http_routes, grants);
    let granted = build(&objects.reference_grants);
    check(
        &granted,
        &[
            (req(443, "a.example.com", "/granted"), "backends/api:8080"),
            // The grant names `api` only.
            (req(443, "a.example.com", "/named"), "500"),
        ],
    );
    // Without the grant, both answer 500.
    let refused = build(&[]);
    check(&refused, &[(req(443, "a.example.com", "/granted"), "500")]);
    // The certificate in `certs` has no grant for Gateways: only the local one is served,
    // and the listener says why.
    let certs: Vec<String> = granted
        .certificates_for(443, "a.example.com")
        .expect("an HTTPS listener")
        .iter()
        .map(|c| format!("{}/{}", c.namespace, c.name))
        .collect();
    assert_eq!(certs, ["edge/local"]);
    let listener = &granted.listener_status()[0];
    assert_eq!(
        (listener.resolved_refs.status, listener.resolved_refs.reason),
        (false, Reason::RefNotPermitted)
    );
    assert!(granted.certificates_for(443, "example.org").is_none());
    assert_eq!(granted.ports(), [(443, true)]);
}

#[test]
fn filters_compile_and_rewrite_the_request() {
    let table = with_gateway(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: edge}
spec:
  parentRefs: [{name: gw}]
  rules:
  - matches: [{path: {value: /headers}}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{name: x-set, value: new}]
        add: [{name: x-add, value: two}]
        remove: [x-remove]
    - type: ResponseHeaderModifier
      responseHeaderModifier: {add: [{name: x-served-by, value: meshkit}]}
    backendRefs: [{name: svc, port: 1}]
  - matches: [{path: {value: /prefix}}]
    filters:
    - type: URLRewrite
      urlRewrite: {hostname: internal.test, path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}}
    backendRefs: [{name: svc, port: 1}]
  - matches: [{path: {value: /to-https}}]
    filters: [{type: RequestRedirect, requestRedirect: {scheme: https}}]
  - matches: [{path: {value: /moved}}]
    filters:
    - type: RequestRedirect
      requestRedirect: {hostname: new.test, port: 8443, statusCode: 301, path: {type: ReplacePrefixMatch, replacePrefixMatch: /}}
  - matches: [{path: {value: /full}}]
    filters: [{type: RequestRedirect, requestRedirect: {path: {type: ReplaceFullPath, replaceFullPath: /elsewhere}}}]
"#,
    );
    check(
        &table,
        &[
            (
                req(80, "h.test", "/to-https/x?a=1"),
                "302 https://h.test/to-https/x?a=1",
            ),
            (
                req(80, "h.test:80", "/moved/page"),
                "301 http://new.test:8443/page",
            ),
            (req(80, "h.test", "/moved"), "301 http://new.test:8443/"),
            (req(80, "h.test", "/full/x"), "302 http://h.test/elsewhere"),
        ],
    );
    let headers = req(80, "h.test", "/headers");
    let rule = table.route(&headers.facts()).expect("rule");
    let mut request_headers = HeaderMap::new();
    request_headers.insert("x-set", "old".parse().expect("value"));
    request_headers.insert("x-add", "one".parse().expect("value"));
    request_headers.insert("x-remove", "gone".parse().expect("value"));
    let Filter::RequestHeaders(modifier) = &rule.filters()[0] else {
        panic!("{:?}", rule.filters());
    };
    modifier.apply(&mut request_headers);
    assert_eq!(
        request_headers.get("x-set").map(|v| v.as_bytes()),
        Some(&b"new"[..])
    );
    let added: Vec<&[u8]> = request_headers
        .get_all("x-add")
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    assert_eq!(added, [&b"one"[..], b"two"]);
    assert!(request_headers.get("x-remove").is_none());
    assert!(matches!(rule.filters()[1], Filter::ResponseHeaders(_)));

    let prefix = req(80, "h.test", "/prefix/items/1");
    let rule = table.route(&prefix.facts()).expect("rule");
    let Filter::Rewrite(rewrite) = &rule.filters()[0] else {
        panic!("{:?}", rule.filters());
    };
    assert_eq!(rewrite.hostname(), Some("internal.test"));
    assert_eq!(
        rewrite.path(&prefix.path, rule.matched_path()).as_deref(),
        Some("/v2/items/1")
    );
    assert_eq!(outcome(&table, &prefix, 0), "edge/svc:1");
}

#[test]
fn replace_prefix_match_follows_the_documented_cases() {
    // (request path, matched prefix, replacement, result)
    let cases = [
        ("/foo/bar", "/foo", "/xyz", "/xyz/bar"),
        ("/foo/bar", "/foo/", "/xyz", "/xyz/bar"),
        ("/foo/bar", "/foo", "/xyz/", "/xyz/bar"),
        ("/foo", "/foo", "/xyz", "/xyz"),
        ("/foo/", "/foo", "/xyz", "/xyz/"),
        ("/foo/bar", "/foo", "", "/bar"),
        ("/foo/", "/foo", "", "/"),
        ("/foo", "/foo", "", "/"),
        ("/foo/", "/foo", "/", "/"),
        ("/foo", "/foo", "/", "/"),
    ];
    for (path, prefix, replacement, expected) in cases {
        let modifier = PathModifier::ReplacePrefixMatch(replacement.to_owned());
        assert_eq!(
            modifier.apply(path, prefix),
            expected,
            "{path} with {prefix} -> {replacement:?}"
        );
    }
}

#[test]
fn unsupported_values_are_not_accepted_and_route_nothing() {
    let table = with_gateway(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: regex, namespace: edge}
spec:
  parentRefs: [{name: gw}]
  rules:
  - matches: [{path: {type: RegularExpression, value: "/r.*"}}]
    backendRefs: [{name: svc, port: 1}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: mirror, namespace: edge}
spec:
  parentRefs: [{name: gw}]
  rules:
  - filters: [{type: RequestMirror, requestMirror: {backendRef: {name: copy, port: 1}}}]
    backendRefs: [{name: svc, port: 1}]
"#,
    );
    for status in table.route_status() {
        assert_eq!(
            (status.accepted.status, status.accepted.reason),
            (false, Reason::UnsupportedValue),
            "{status:?}"
        );
    }
    assert_eq!(outcome(&table, &req(80, "h", "/r1"), 0), "404");
    assert_eq!(table.rule_count(), 0);
}

#[test]
fn a_route_without_rules_answers_500_everywhere() {
    let table = with_gateway(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: empty, namespace: edge}
spec:
  parentRefs: [{name: gw}]
"#,
    );
    assert_eq!(outcome(&table, &req(80, "h", "/anything"), 0), "500");
}

#[test]
fn gateways_of_other_controllers_are_not_served() {
    let objects = manifest::from_yaml_str(&format!(
        "{GATEWAY}\n---\n{}",
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: meshkit}
spec: {controllerName: example.com/other}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: edge}
spec:
  parentRefs: [{name: gw}]
  rules: [{backendRefs: [{name: svc, port: 1}]}]
"#
    ))
    .expect("manifest");
    let build = |controller: &str| {
        HttpRouteTable::builder()
            .controller(controller)
            .gateway_classes(&objects.gateway_classes)
            .build(&objects.gateways, &objects.http_routes, &[])
    };
    assert_eq!(
        outcome(&build("meshkit.dev/gateway"), &req(80, "h", "/"), 0),
        "404"
    );
    assert_eq!(
        outcome(&build("example.com/other"), &req(80, "h", "/"), 0),
        "edge/svc:1"
    );
}

#[test]
fn known_services_decide_backend_not_found() {
    let objects = manifest::from_yaml_str(&format!(
        "{GATEWAY}\n---\n{}",
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: edge}
spec:
  parentRefs: [{name: gw}]
  rules: [{backendRefs: [{name: present, port: 1}, {name: absent, port: 1}]}]
"#
    ))
    .expect("manifest");
    let table = HttpRouteTable::builder()
        .services([("edge", "present")])
        .build(&objects.gateways, &objects.http_routes, &[]);
    assert_eq!(outcome(&table, &req(80, "h", "/"), 0), "edge/present:1");
    assert_eq!(outcome(&table, &req(80, "h", "/"), 1), "500");
    let status = &table.route_status()[0];
    assert_eq!(status.resolved_refs.reason, Reason::BackendNotFound);
}

#[test]
fn one_protocol_per_port_and_conflicting_listeners_are_not_served() {
    let table = table(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: older, namespace: edge, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  gatewayClassName: meshkit
  listeners: [{name: http, port: 8000, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: newer, namespace: edge, creationTimestamp: "2026-02-01T00:00:00Z"}
spec:
  gatewayClassName: meshkit
  listeners:
  - {name: https, port: 8000, protocol: HTTPS, hostname: b.example.com, tls: {certificateRefs: [{name: b}]}}
"#,
    );
    assert_eq!(table.ports(), [(8000, false)]);
    let newer = table
        .listener_status()
        .iter()
        .find(|l| l.gateway == "newer")
        .expect("status");
    assert_eq!(
        (newer.accepted.status, newer.accepted.reason),
        (false, Reason::ProtocolConflict)
    );
    assert!(table.certificates_for(8000, "b.example.com").is_none());
}

#[test]
fn a_selector_admits_only_namespaces_whose_labels_are_known_and_match() {
    let yaml = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: edge}
spec:
  gatewayClassName: meshkit
  listeners:
  - name: http
    port: 80
    protocol: HTTP
    allowedRoutes:
      namespaces:
        from: Selector
        selector: {matchExpressions: [{key: untrusted, operator: DoesNotExist}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r, namespace: team}
spec:
  parentRefs: [{name: gw, namespace: edge}]
  rules: [{backendRefs: [{name: svc, port: 1}]}]
"#;
    let objects = manifest::from_yaml_str(yaml).expect("manifest");
    let build = |labels: Option<&[(&str, &str)]>| {
        let mut builder = HttpRouteTable::builder();
        if let Some(labels) = labels {
            builder = builder.namespace_labels(
                "team",
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            );
        }
        builder.build(&objects.gateways, &objects.http_routes, &[])
    };
    // Unknown labels: not admitted, whatever the selector says of missing labels.
    assert_eq!(outcome(&build(None), &req(80, "h", "/"), 0), "404");
    assert_eq!(
        outcome(&build(Some(&[("untrusted", "yes")])), &req(80, "h", "/"), 0),
        "404"
    );
    assert_eq!(
        outcome(&build(Some(&[("tier", "web")])), &req(80, "h", "/"), 0),
        "team/svc:1"
    );
}

#[test]
fn values_meshkit_does_not_serve_make_the_route_unsupported() {
    for (what, rule) in [
        (
            "Host set by a header filter",
            "{filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: Host, value: x}]}}], backendRefs: [{name: svc, port: 1}]}",
        ),
        (
            "Host removed by a header filter",
            "{filters: [{type: RequestHeaderModifier, requestHeaderModifier: {remove: [host]}}], backendRefs: [{name: svc, port: 1}]}",
        ),
        (
            "timeouts",
            "{timeouts: {request: 1s}, backendRefs: [{name: svc, port: 1}]}",
        ),
        (
            "a rewrite on a backend",
            "{backendRefs: [{name: svc, port: 1, filters: [{type: URLRewrite, urlRewrite: {hostname: a.test}}]}]}",
        ),
    ] {
        let table = with_gateway(&format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r, namespace: edge}}\nspec:\n  parentRefs: [{{name: gw}}]\n  rules: [{rule}]\n"
        ));
        let status = &table.route_status()[0];
        assert_eq!(
            (status.accepted.status, status.accepted.reason),
            (false, Reason::UnsupportedValue),
            "{what}: {status:?}"
        );
    }
    // A header filter on a backend is served.
    let table = with_gateway(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: edge}\nspec:\n  parentRefs: [{name: gw}]\n  rules: [{backendRefs: [{name: svc, port: 1, filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-b, value: \"1\"}]}}]}]}]\n",
    );
    assert_eq!(outcome(&table, &req(80, "h", "/"), 0), "edge/svc:1");
}
