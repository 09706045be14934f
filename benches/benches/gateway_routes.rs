//! meshkit-ingress-model: `HttpRouteTable::route` (Gateway API) with 10, 1,000 and 100,000
//! rules, beside a linear scan over the same rules in the same run.
//!
//! `cargo bench -p meshkit-benches --bench gateway_routes`

use std::cmp::Reverse;
use std::hint::black_box;

use criterion::{Criterion, criterion_group};
use http::HeaderMap;
use meshkit_benches::{Ratio, Run};
use meshkit_ingress_model::gateway::types::{
    BackendObjectReference, Gateway, GatewaySpec, HttpBackendRef, HttpHeaderMatch, HttpPathMatch,
    HttpRoute, HttpRouteMatch, HttpRouteRule, HttpRouteSpec, Listener, ParentReference,
};
use meshkit_ingress_model::gateway::{Action, HttpRequest, HttpRouteTable};
use meshkit_ingress_model::k8s::io::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const SIZES: [usize; 3] = [10, 1_000, 100_000];
const RULES_PER_ROUTE: usize = 10;
const REQUESTS: usize = 1024;

fn meta(name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some("bench".to_owned()),
        ..Default::default()
    }
}

fn gateway() -> Gateway {
    Gateway {
        metadata: meta("gw".to_owned()),
        spec: GatewaySpec {
            gateway_class_name: "meshkit".to_owned(),
            listeners: vec![Listener {
                name: "http".to_owned(),
                port: 80,
                protocol: "HTTP".to_owned(),
                ..Default::default()
            }],
            addresses: Vec::new(),
        },
    }
}

/// One rule of the bench: its path, whether Exact, and whether it needs a header or a method.
struct RuleShape {
    path: String,
    exact: bool,
    header: bool,
    post: bool,
}

fn rule_shape(r: usize) -> RuleShape {
    RuleShape {
        path: if r.is_multiple_of(2) {
            format!("/svc{r}/api")
        } else {
            format!("/svc{r}/api/v{r}")
        },
        exact: r.is_multiple_of(3),
        header: r % 4 == 1,
        post: r % 5 == 2,
    }
}

fn host_of(h: usize) -> String {
    if h % 10 == 9 {
        format!("*.w{h}.example.com")
    } else {
        format!("h{h}.example.com")
    }
}

/// `rules` rules in routes of one hostname each, `RULES_PER_ROUTE` rules per route.
fn routes(rules: usize) -> Vec<HttpRoute> {
    let routes = rules.div_ceil(RULES_PER_ROUTE);
    (0..routes)
        .map(|h| HttpRoute {
            metadata: meta(format!("route{h}")),
            spec: HttpRouteSpec {
                parent_refs: vec![ParentReference {
                    name: "gw".to_owned(),
                    ..Default::default()
                }],
                hostnames: vec![host_of(h)],
                rules: (0..RULES_PER_ROUTE.min(rules - h * RULES_PER_ROUTE))
                    .map(|r| {
                        let shape = rule_shape(r);
                        HttpRouteRule {
                            matches: vec![HttpRouteMatch {
                                path: Some(HttpPathMatch {
                                    match_type: Some(
                                        if shape.exact { "Exact" } else { "PathPrefix" }.to_owned(),
                                    ),
                                    value: Some(shape.path),
                                }),
                                headers: if shape.header {
                                    vec![HttpHeaderMatch {
                                        match_type: None,
                                        name: "x-canary".to_owned(),
                                        value: "on".to_owned(),
                                    }]
                                } else {
                                    Vec::new()
                                },
                                query_params: Vec::new(),
                                method: shape.post.then(|| "POST".to_owned()),
                            }],
                            backend_refs: vec![HttpBackendRef {
                                backend: BackendObjectReference {
                                    name: format!("s{h}-{r}"),
                                    port: Some(80),
                                    ..Default::default()
                                },
                                weight: None,
                                filters: Vec::new(),
                            }],
                            ..Default::default()
                        }
                    })
                    .collect(),
            },
        })
        .collect()
}

/// A request of the bench: host, path, whether it carries the header, whether it is a POST.
type Request = (String, String, bool, bool);

/// Deterministic requests: hits below a rule path, exact hits, near misses and misses, with
/// and without the header and the method.
fn requests(rules: usize) -> Vec<Request> {
    let routes = rules.div_ceil(RULES_PER_ROUTE);
    let mut next = meshkit_benches::deterministic_numbers(0x2545_f491);
    (0..REQUESTS)
        .map(|i| {
            let h = next() % routes;
            let r = next() % RULES_PER_ROUTE;
            let host = if h % 10 == 9 {
                format!("tenant.w{h}.example.com:80")
            } else {
                format!("H{h}.example.com")
            };
            let path = match i % 4 {
                0 => format!("/svc{r}/api"),
                1 => format!("/svc{r}/api/v{r}/items/42"),
                2 => format!("/svc{r}/apix"),
                _ => "/unknown".to_owned(),
            };
            (
                host,
                path,
                next().is_multiple_of(2),
                next().is_multiple_of(3),
            )
        })
        .collect()
}

/// The precedence key of the baseline: host kind and suffix length, exact path, path
/// length, method, header count; smaller first.
type Precedence = (
    u8,
    Reverse<usize>,
    bool,
    Reverse<usize>,
    bool,
    Reverse<usize>,
);

/// The baseline: every rule is checked for each request, the best kept by precedence.
struct LinearScan {
    /// (hostname, exact, path, header, post, backend)
    entries: Vec<(String, bool, String, bool, bool, String)>,
}

impl LinearScan {
    fn new(routes: &[HttpRoute]) -> Self {
        let mut entries = Vec::new();
        for (h, route) in routes.iter().enumerate() {
            for (r, rule) in route.spec.rules.iter().enumerate() {
                let shape = rule_shape(r);
                let backend = rule.backend_refs[0].backend.name.clone();
                entries.push((
                    host_of(h),
                    shape.exact,
                    shape.path,
                    shape.header,
                    shape.post,
                    backend,
                ));
            }
        }
        LinearScan { entries }
    }

    fn route(&self, request: &Request) -> Option<&str> {
        let (host, path, header, post) = request;
        let host = host.split(':').next().unwrap_or(host).to_ascii_lowercase();
        let mut best: Option<(Precedence, &str)> = None;
        for (hostname, exact, value, needs_header, needs_post, backend) in &self.entries {
            let host_rank = match hostname.strip_prefix("*.") {
                Some(suffix) if host.ends_with(&format!(".{suffix}")) => (1, Reverse(suffix.len())),
                Some(_) => continue,
                None if *hostname == host => (0, Reverse(0)),
                None => continue,
            };
            let path_ok = if *exact {
                value == path
            } else {
                path == value || path.starts_with(&format!("{value}/"))
            };
            if !path_ok || (*needs_header && !header) || (*needs_post && !post) {
                continue;
            }
            let key = (
                host_rank.0,
                host_rank.1,
                !exact,
                Reverse(value.len()),
                !needs_post,
                Reverse(usize::from(*needs_header)),
            );
            if best.as_ref().is_none_or(|(k, _)| key < *k) {
                best = Some((key, backend));
            }
        }
        best.map(|(_, backend)| backend)
    }
}

/// The HTTP form of a bench request.
fn headers_for(request: &Request) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if request.2 {
        headers.insert("x-canary", http::HeaderValue::from_static("on"));
    }
    headers
}

fn lookup<'t>(
    table: &'t HttpRouteTable,
    request: &Request,
    headers: &HeaderMap,
) -> Option<&'t str> {
    let facts = HttpRequest {
        port: 80,
        host: &request.0,
        path: &request.1,
        query: None,
        method: if request.3 { "POST" } else { "GET" },
        headers,
    };
    match table.route(&facts)?.action(0) {
        Action::Forward(backend) => backend.target.as_ref().ok().map(|s| s.name.as_str()),
        _ => None,
    }
}

fn route_lookup(c: &mut Criterion) {
    for rules in SIZES {
        let routes = routes(rules);
        let table = HttpRouteTable::new(&[gateway()], &routes, &[]);
        let scan = LinearScan::new(&routes);
        let requests = requests(rules);
        let headers: Vec<HeaderMap> = requests.iter().map(headers_for).collect();
        // Both must agree before their speed is compared.
        let mut hits = 0;
        for (request, headers) in requests.iter().zip(&headers) {
            let got = lookup(&table, request, headers);
            assert_eq!(got, scan.route(request), "{request:?}");
            hits += usize::from(got.is_some());
        }
        assert!(hits > REQUESTS / 8, "only {hits} hits");
        let mut group = c.benchmark_group(format!("gateway_route_{rules}"));
        group.bench_function("route_table", |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % REQUESTS;
                black_box(lookup(&table, black_box(&requests[i]), &headers[i]).is_some())
            })
        });
        group.bench_function("linear_scan", |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % REQUESTS;
                black_box(scan.route(black_box(&requests[i])).is_some())
            })
        });
        group.finish();
    }
}

criterion_group!(benches, route_lookup);

fn main() {
    let run = Run::start();
    benches();
    Criterion::default().configure_from_args().final_summary();
    let groups: Vec<String> = SIZES.iter().map(|n| format!("gateway_route_{n}")).collect();
    let ratios: Vec<Ratio<'_>> = groups
        .iter()
        .map(|group| Ratio {
            group,
            subject: "route_table",
            baseline: "linear_scan",
        })
        .collect();
    run.report_ratios(&ratios);
}
