//! Property test: [`HttpRouteTable::route`] agrees with a straightforward reference that
//! checks every rule of every route against the request and sorts the matches by the
//! specification's precedence, over random routes and requests.

use std::cmp::Reverse;

use http::HeaderMap;
use meshkit_ingress_model::gateway::types::{
    AllowedRoutes, BackendObjectReference, Gateway, GatewaySpec, HttpBackendRef, HttpHeaderMatch,
    HttpPathMatch, HttpQueryParamMatch, HttpRoute, HttpRouteMatch, HttpRouteRule, HttpRouteSpec,
    Listener, ParentReference, RouteNamespaces,
};
use meshkit_ingress_model::gateway::{HttpRequest, HttpRouteTable};
use meshkit_ingress_model::k8s::io::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use proptest::prelude::*;

/// Listeners of the one Gateway: (name, hostname).
const LISTENERS: [(&str, Option<&str>); 3] = [
    ("any", None),
    ("wild", Some("*.a.test")),
    ("exact", Some("x.a.test")),
];
const ROUTE_HOSTS: [&str; 5] = ["x.a.test", "y.a.test", "*.a.test", "b.test", "*.test"];
const PATHS: [&str; 6] = ["/", "/a", "/a/", "/a/b", "/ab", "/a/b/c"];
const REQUEST_HOSTS: [&str; 6] = [
    "x.a.test",
    "y.a.test",
    "z.y.a.test",
    "b.test",
    "c.b.test",
    "other",
];
const REQUEST_PATHS: [&str; 8] = ["/", "/a", "/a/", "/a/b", "/a/b/c", "/ab", "/a/bc", "/b"];
const HEADERS: [(&str, &str); 3] = [("x", "1"), ("w", "1"), ("x", "2")];
const QUERY: [(&str, &str); 2] = [("q", "1"), ("r", "1")];

#[derive(Debug, Clone)]
struct MatchSpec {
    exact: bool,
    path: usize,
    method: Option<bool>,
    headers: Vec<usize>,
    query: Vec<usize>,
}

#[derive(Debug, Clone)]
struct RouteSpec {
    namespace: usize,
    name: usize,
    created: Option<i64>,
    section: Option<usize>,
    hosts: Vec<usize>,
    rules: Vec<Vec<MatchSpec>>,
}

#[derive(Debug, Clone)]
struct RequestSpec {
    host: usize,
    path: usize,
    post: bool,
    headers: Vec<usize>,
    query: Vec<usize>,
}

fn match_spec() -> impl Strategy<Value = MatchSpec> {
    (
        any::<bool>(),
        0..PATHS.len(),
        prop::option::of(any::<bool>()),
        prop::collection::vec(0..HEADERS.len(), 0..3),
        prop::collection::vec(0..QUERY.len(), 0..2),
    )
        .prop_map(|(exact, path, method, headers, query)| MatchSpec {
            exact,
            path,
            method,
            headers,
            query,
        })
}

fn route_spec() -> impl Strategy<Value = RouteSpec> {
    (
        0..2usize,
        0..3usize,
        prop::option::of(0..3i64),
        prop::option::of(0..LISTENERS.len()),
        prop::collection::vec(0..ROUTE_HOSTS.len(), 0..3),
        prop::collection::vec(prop::collection::vec(match_spec(), 0..3), 1..4),
    )
        .prop_map(
            |(namespace, name, created, section, hosts, rules)| RouteSpec {
                namespace,
                name,
                created,
                section,
                hosts,
                rules,
            },
        )
}

fn request_spec() -> impl Strategy<Value = RequestSpec> {
    (
        0..REQUEST_HOSTS.len(),
        0..REQUEST_PATHS.len(),
        any::<bool>(),
        prop::collection::vec(0..HEADERS.len(), 0..3),
        prop::collection::vec(0..QUERY.len(), 0..2),
    )
        .prop_map(|(host, path, post, headers, query)| RequestSpec {
            host,
            path,
            post,
            headers,
            query,
        })
}

fn gateway() -> Gateway {
    Gateway {
        metadata: ObjectMeta {
            name: Some("gw".into()),
            namespace: Some("edge".into()),
            ..Default::default()
        },
        spec: GatewaySpec {
            gateway_class_name: "meshkit".into(),
            listeners: LISTENERS
                .iter()
                .map(|(name, hostname)| Listener {
                    name: (*name).into(),
                    hostname: hostname.map(Into::into),
                    port: 80,
                    protocol: "HTTP".into(),
                    tls: None,
                    allowed_routes: Some(AllowedRoutes {
                        namespaces: Some(RouteNamespaces {
                            from: Some("All".into()),
                            selector: None,
                        }),
                        kinds: Vec::new(),
                    }),
                })
                .collect(),
            addresses: Vec::new(),
        },
    }
}

fn route_name(spec: &RouteSpec, index: usize) -> (String, String) {
    // The index keeps names unique, so the answer is never a tie between two equal names.
    (
        format!("ns{}", spec.namespace),
        format!("r{}-{index}", spec.name),
    )
}

fn build_route(spec: &RouteSpec, index: usize) -> HttpRoute {
    let (namespace, name) = route_name(spec, index);
    HttpRoute {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace),
            creation_timestamp: spec.created.map(|s| Time {
                seconds: Some(s),
                nanos: Some(0),
            }),
            ..Default::default()
        },
        spec: HttpRouteSpec {
            parent_refs: vec![ParentReference {
                namespace: Some("edge".into()),
                name: "gw".into(),
                section_name: spec.section.map(|s| LISTENERS[s].0.into()),
                ..Default::default()
            }],
            hostnames: spec.hosts.iter().map(|h| ROUTE_HOSTS[*h].into()).collect(),
            rules: spec
                .rules
                .iter()
                .map(|matches| HttpRouteRule {
                    matches: matches
                        .iter()
                        .map(|m| HttpRouteMatch {
                            path: Some(HttpPathMatch {
                                match_type: Some(
                                    if m.exact { "Exact" } else { "PathPrefix" }.into(),
                                ),
                                value: Some(PATHS[m.path].into()),
                            }),
                            headers: m
                                .headers
                                .iter()
                                .map(|h| HttpHeaderMatch {
                                    match_type: None,
                                    name: HEADERS[*h].0.into(),
                                    value: HEADERS[*h].1.into(),
                                })
                                .collect(),
                            query_params: m
                                .query
                                .iter()
                                .map(|q| HttpQueryParamMatch {
                                    match_type: None,
                                    name: QUERY[*q].0.into(),
                                    value: QUERY[*q].1.into(),
                                })
                                .collect(),
                            method: m
                                .method
                                .map(|post| if post { "POST" } else { "GET" }.into()),
                        })
                        .collect(),
                    backend_refs: vec![HttpBackendRef {
                        backend: BackendObjectReference {
                            name: "svc".into(),
                            port: Some(80),
                            ..Default::default()
                        },
                        weight: None,
                        filters: Vec::new(),
                    }],
                    ..Default::default()
                })
                .collect(),
        },
    }
}

// === the reference ===

/// True when `host` is covered by `pattern` (exact, or `*.` for any names below).
fn covers(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => host.ends_with(&format!(".{suffix}")),
        None => pattern == host,
    }
}

/// Specificity of a hostname, smaller first: exact, then wildcards by suffix length, then
/// none.
fn host_rank(pattern: Option<&str>) -> (u8, Reverse<usize>) {
    match pattern {
        None => (2, Reverse(0)),
        Some(p) => match p.strip_prefix("*.") {
            Some(suffix) => (1, Reverse(suffix.len())),
            None => (0, Reverse(0)),
        },
    }
}

/// The narrower of two intersecting hostnames (both cover the request host).
fn narrower<'a>(listener: Option<&'a str>, route: &'a str) -> &'a str {
    match listener {
        None => route,
        Some(l) if host_rank(Some(l)) <= host_rank(Some(route)) => l,
        Some(_) => route,
    }
}

fn path_matches(exact: bool, value: &str, path: &str) -> bool {
    if exact {
        return value == path;
    }
    let prefix = value.trim_end_matches('/');
    prefix.is_empty() || path == prefix || path.starts_with(&format!("{prefix}/"))
}

fn first_values<'a>(
    pairs: &[(&'a str, &'a str)],
    case_insensitive: bool,
) -> Vec<(&'a str, &'a str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for (name, value) in pairs {
        let seen = out.iter().any(|(n, _)| {
            if case_insensitive {
                n.eq_ignore_ascii_case(name)
            } else {
                n == name
            }
        });
        if !seen {
            out.push((name, value));
        }
    }
    out
}

/// (namespace, name, rule index) of the rule that should serve the request.
fn reference(routes: &[RouteSpec], request: &RequestSpec) -> Option<(String, String, usize)> {
    let host = REQUEST_HOSTS[request.host];
    let path = REQUEST_PATHS[request.path];
    // The listener: the most specific hostname that covers the host.
    let listener = LISTENERS
        .iter()
        .enumerate()
        .filter(|(_, (_, h))| h.is_none_or(|h| covers(h, host)))
        .min_by_key(|(_, (_, h))| host_rank(*h))?;
    let (listener_index, (_, listener_host)) = listener;
    let request_headers: Vec<(&str, &str)> = request.headers.iter().map(|h| HEADERS[*h]).collect();
    let request_query: Vec<(&str, &str)> = request.query.iter().map(|q| QUERY[*q]).collect();
    let mut best = None;
    for (index, route) in routes.iter().enumerate() {
        if route.section.is_some_and(|s| s != listener_index) {
            continue;
        }
        let hostname_rank = if route.hosts.is_empty() {
            host_rank(*listener_host)
        } else {
            let ranks = route
                .hosts
                .iter()
                .map(|h| ROUTE_HOSTS[*h])
                .filter(|h| covers(h, host))
                .map(|h| host_rank(Some(narrower(*listener_host, h))));
            match ranks.min() {
                Some(rank) => rank,
                None => continue,
            }
        };
        let (namespace, name) = route_name(route, index);
        for (rule_index, matches) in route.rules.iter().enumerate() {
            let default = [MatchSpec {
                exact: false,
                path: 0,
                method: None,
                headers: Vec::new(),
                query: Vec::new(),
            }];
            let matches = if matches.is_empty() {
                &default[..]
            } else {
                &matches[..]
            };
            for (match_index, m) in matches.iter().enumerate() {
                let headers = first_values(
                    &m.headers.iter().map(|h| HEADERS[*h]).collect::<Vec<_>>(),
                    true,
                );
                let query = first_values(
                    &m.query.iter().map(|q| QUERY[*q]).collect::<Vec<_>>(),
                    false,
                );
                let method_ok = m.method.is_none_or(|post| post == request.post);
                let headers_ok = headers.iter().all(|(n, v)| {
                    let values: Vec<&str> = request_headers
                        .iter()
                        .filter(|(rn, _)| rn.eq_ignore_ascii_case(n))
                        .map(|(_, rv)| *rv)
                        .collect();
                    !values.is_empty() && values.join(",") == *v
                });
                let query_ok = query.iter().all(|(n, v)| {
                    request_query
                        .iter()
                        .find(|(rn, _)| rn == n)
                        .is_some_and(|(_, rv)| rv == v)
                });
                if !(path_matches(m.exact, PATHS[m.path], path)
                    && method_ok
                    && headers_ok
                    && query_ok)
                {
                    continue;
                }
                let key = (
                    hostname_rank,
                    !m.exact,
                    Reverse(PATHS[m.path].trim_end_matches('/').len()),
                    // `/a/` before `/a`: the longer value as written.
                    Reverse(PATHS[m.path].len()),
                    m.method.is_none(),
                    Reverse(headers.len()),
                    Reverse(query.len()),
                    (
                        route.created.is_none(),
                        route.created,
                        namespace.clone(),
                        name.clone(),
                    ),
                    rule_index,
                    match_index,
                );
                if best.as_ref().is_none_or(|(k, _)| key < *k) {
                    best = Some((key, (namespace.clone(), name.clone(), rule_index)));
                }
            }
        }
    }
    best.map(|(_, answer)| answer)
}

/// What a proxy that routes by [`HttpRouteTable::domains`] would answer: the most specific
/// domain covering the host (exact, the longest wildcard, `*`), then its first rule whose
/// conditions hold, as Envoy's virtual hosts and routes do.
fn by_domains(
    table: &HttpRouteTable,
    request: &RequestSpec,
    headers: &HeaderMap,
    query: &[(&str, &str)],
) -> Option<(String, String, usize)> {
    let host = REQUEST_HOSTS[request.host];
    let path = REQUEST_PATHS[request.path];
    let domains = table.domains(80);
    let domain = domains
        .iter()
        .filter(|d| d.domain == "*" || covers(&d.domain, host))
        .min_by_key(|d| match d.domain.as_str() {
            "*" => (2, Reverse(0)),
            other => host_rank(Some(other)),
        })?;
    let rule = domain.rules.iter().find(|rule| {
        path_matches(rule.is_exact_path(), rule.matched_path(), path)
            && rule
                .method()
                .is_none_or(|m| m == if request.post { "POST" } else { "GET" })
            && rule.header_matches().all(|(name, value)| {
                let values: Vec<&str> = headers
                    .get_all(name)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .collect();
                !values.is_empty() && values.join(",") == value
            })
            && rule.query_matches().all(|(name, value)| {
                query
                    .iter()
                    .find(|(n, _)| *n == name)
                    .is_some_and(|(_, v)| *v == value)
            })
    })?;
    Some((
        rule.namespace().to_owned(),
        rule.route_name().to_owned(),
        rule.rule_index(),
    ))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn table_agrees_with_the_reference(
        routes in prop::collection::vec(route_spec(), 1..7),
        requests in prop::collection::vec(request_spec(), 1..24),
    ) {
        let built: Vec<HttpRoute> = routes.iter().enumerate().map(|(i, r)| build_route(r, i)).collect();
        let table = HttpRouteTable::new(&[gateway()], &built, &[]);
        for request in &requests {
            let mut headers = HeaderMap::new();
            for h in &request.headers {
                headers.append(HEADERS[*h].0, HEADERS[*h].1.parse().expect("value"));
            }
            let query = request
                .query
                .iter()
                .map(|q| format!("{}={}", QUERY[*q].0, QUERY[*q].1))
                .collect::<Vec<_>>()
                .join("&");
            let facts = HttpRequest {
                port: 80,
                host: REQUEST_HOSTS[request.host],
                path: REQUEST_PATHS[request.path],
                query: (!query.is_empty()).then_some(query.as_str()),
                method: if request.post { "POST" } else { "GET" },
                headers: &headers,
            };
            let got = table
                .route(&facts)
                .map(|m| (m.namespace().to_owned(), m.route_name().to_owned(), m.rule_index()));
            prop_assert_eq!(&got, &reference(&routes, request), "{:?}", request);
            let pairs: Vec<(&str, &str)> = request.query.iter().map(|q| QUERY[*q]).collect();
            prop_assert_eq!(got, by_domains(&table, request, &headers, &pairs), "domains: {:?}", request);
        }
    }
}
