//! meshkit-ingress-model: `RouteTable::route` with 10, 1,000 and 100,000 rule paths, beside a
//! naive linear scan over the same paths in the same run.
//!
//! `cargo bench -p meshkit-benches --bench ingress`

use std::hint::black_box;

use criterion::{Criterion, criterion_group};
use meshkit_benches::{Ratio, Run};
use meshkit_ingress_model::k8s::io::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use meshkit_ingress_model::{
    HttpIngressPath, HttpIngressRuleValue, Ingress, IngressBackend, IngressRule, IngressRuleValue,
    IngressServiceBackend, IngressSpec, RouteTable, ServiceBackendPort,
};

const SIZES: [usize; 3] = [10, 1_000, 100_000];
const PATHS_PER_HOST: usize = 10;
const REQUESTS: usize = 1024;

fn backend(name: String) -> IngressBackend {
    IngressBackend {
        service: Some(IngressServiceBackend {
            name: Some(name),
            port: Some(ServiceBackendPort {
                name: None,
                number: Some(80),
            }),
        }),
        resource: None,
    }
}

/// `rules` paths in Ingresses of one host each: `PATHS_PER_HOST` paths per host, a mix of
/// Prefix and Exact, two and three elements deep; every tenth host is a wildcard.
fn ingresses(rules: usize) -> Vec<Ingress> {
    let hosts = rules.div_ceil(PATHS_PER_HOST);
    (0..hosts)
        .map(|h| {
            let host = if h % 10 == 9 {
                format!("*.w{h}.example.com")
            } else {
                format!("h{h}.example.com")
            };
            let paths = (0..PATHS_PER_HOST.min(rules - h * PATHS_PER_HOST))
                .map(|p| HttpIngressPath {
                    path: Some(if p % 2 == 0 {
                        format!("/svc{p}/api")
                    } else {
                        format!("/svc{p}/api/v{p}")
                    }),
                    path_type: Some(if p % 3 == 0 { "Exact" } else { "Prefix" }.to_owned()),
                    backend: Some(backend(format!("s{h}-{p}"))),
                })
                .collect();
            Ingress {
                metadata: Some(ObjectMeta {
                    name: Some(format!("ing{h}")),
                    namespace: Some("bench".to_owned()),
                    ..Default::default()
                }),
                spec: Some(IngressSpec {
                    rules: vec![IngressRule {
                        host: Some(host),
                        ingress_rule_value: Some(IngressRuleValue {
                            http: Some(HttpIngressRuleValue { paths }),
                        }),
                    }],
                    ..Default::default()
                }),
                status: None,
            }
        })
        .collect()
}

/// Deterministic requests: mostly hits below a rule path, some exact hits, some misses.
fn requests(rules: usize) -> Vec<(String, String)> {
    let hosts = rules.div_ceil(PATHS_PER_HOST);
    let mut next = meshkit_benches::deterministic_numbers(0x2545_f491);
    (0..REQUESTS)
        .map(|i| {
            let h = next() % hosts;
            let p = next() % PATHS_PER_HOST;
            let host = if h % 10 == 9 {
                format!("tenant.w{h}.example.com:443")
            } else {
                format!("H{h}.example.com")
            };
            let path = match i % 4 {
                0 => format!("/svc{p}/api"),
                1 => format!("/svc{p}/api/v{p}/items/42"),
                2 => format!("/svc{p}/apix"),
                _ => "/unknown".to_owned(),
            };
            (host, path)
        })
        .collect()
}

/// The naive baseline: every path of every rule is checked for each request.
struct LinearScan {
    entries: Vec<(String, String, bool, IngressBackend)>,
}

impl LinearScan {
    fn new(ingresses: &[Ingress]) -> Self {
        let mut entries = Vec::new();
        for ing in ingresses {
            for rule in ing.spec.iter().flat_map(|s| &s.rules) {
                let host = rule.host.clone().unwrap_or_default().to_ascii_lowercase();
                for p in rule
                    .ingress_rule_value
                    .iter()
                    .flat_map(|v| &v.http)
                    .flat_map(|h| &h.paths)
                {
                    entries.push((
                        host.clone(),
                        p.path.clone().unwrap_or_default(),
                        p.path_type.as_deref() == Some("Exact"),
                        p.backend.clone().unwrap_or_default(),
                    ));
                }
            }
        }
        LinearScan { entries }
    }

    fn route(&self, host: &str, path: &str) -> Option<&IngressBackend> {
        let host = host.split(':').next().unwrap_or(host).to_ascii_lowercase();
        let mut best: Option<(u8, usize, bool, &IngressBackend)> = None;
        for (rule_host, rule_path, exact, backend) in &self.entries {
            let tier = if rule_host.is_empty() {
                2
            } else if let Some(suffix) = rule_host.strip_prefix("*.") {
                match host.split_once('.') {
                    Some((label, rest)) if !label.is_empty() && rest == suffix => 1,
                    _ => continue,
                }
            } else if *rule_host == host {
                0
            } else {
                continue;
            };
            let len = if *exact {
                if rule_path != path {
                    continue;
                }
                rule_path.len()
            } else {
                let p = rule_path.trim_end_matches('/');
                let hit = p.is_empty()
                    || path == p
                    || (path.starts_with(p) && path.as_bytes().get(p.len()) == Some(&b'/'));
                if !hit {
                    continue;
                }
                p.len()
            };
            let better = match best {
                None => true,
                Some((t, l, e, _)) => {
                    (tier, std::cmp::Reverse(len), !exact) < (t, std::cmp::Reverse(l), !e)
                }
            };
            if better {
                best = Some((tier, len, *exact, backend));
            }
        }
        best.map(|(_, _, _, b)| b)
    }
}

fn route_lookup(c: &mut Criterion) {
    for rules in SIZES {
        let ingresses = ingresses(rules);
        let table = RouteTable::new(&ingresses);
        let scan = LinearScan::new(&ingresses);
        let requests = requests(rules);
        // Both must agree before their speed is compared.
        for (host, path) in &requests {
            assert_eq!(
                table.route(host, path).map(|m| m.backend()),
                scan.route(host, path),
                "{host} {path}"
            );
        }
        let mut group = c.benchmark_group(format!("ingress_route_{rules}"));
        group.bench_function("route_table", |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % REQUESTS;
                let (host, path) = &requests[i];
                black_box(table.route(black_box(host), black_box(path)).is_some())
            })
        });
        group.bench_function("linear_scan", |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % REQUESTS;
                let (host, path) = &requests[i];
                black_box(scan.route(black_box(host), black_box(path)).is_some())
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
    let groups: Vec<String> = SIZES.iter().map(|n| format!("ingress_route_{n}")).collect();
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
