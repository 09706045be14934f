//! Routing semantics: a table of host and path cases, and a property test comparing
//! [`RouteTable`] with a straightforward reference implementation.

mod support;

use meshkit_ingress_model::k8s::io::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use meshkit_ingress_model::route::DEFAULT_CLASS_ANNOTATION;
use meshkit_ingress_model::{
    HostMatch, Ingress, IngressClass, IngressClassSpec, MatchSource, PathType, RouteTable,
};
use proptest::prelude::*;
use support::*;

const E: Option<&str> = Some("Exact");
const P: Option<&str> = Some("Prefix");
const I: Option<&str> = Some("ImplementationSpecific");

/// `(host, path, expected)`; `expected` is `Some((service, port))` or `None` for no match.
type Case<'a> = (&'a str, &'a str, Option<(&'a str, i32)>);

/// Asserts each case.
fn check(table: &RouteTable, cases: &[Case<'_>]) {
    for (host, path, expected) in cases {
        let got = table.route(host, path).map(|m| service_of(m.backend()));
        let expected = expected.map(|(s, p)| (s.to_owned(), p));
        assert_eq!(got, expected, "route({host:?}, {path:?})");
    }
}

#[test]
fn exact_is_case_sensitive_equality() {
    let table = RouteTable::new(&[ingress(
        "ns",
        "a",
        None,
        vec![rule(None, vec![path("/foo", E, "exact", 80)])],
    )]);
    check(
        &table,
        &[
            ("h", "/foo", Some(("exact", 80))),
            ("h", "/foo/", None),
            ("h", "/Foo", None),
            ("h", "/foo/bar", None),
            ("h", "/fo", None),
        ],
    );
}

#[test]
fn prefix_is_element_wise_and_ignores_trailing_slash() {
    let table = RouteTable::new(&[ingress(
        "ns",
        "a",
        None,
        vec![rule(
            None,
            vec![
                path("/foo", P, "foo", 80),
                path("/bar/", P, "bar", 81),
                path("/aaa/bbb", P, "ab", 82),
            ],
        )],
    )]);
    check(
        &table,
        &[
            ("h", "/foo", Some(("foo", 80))),
            ("h", "/foo/", Some(("foo", 80))),
            ("h", "/foo/bar", Some(("foo", 80))),
            ("h", "/foobar", None),
            ("h", "/FOO", None),
            ("h", "/bar", Some(("bar", 81))),
            ("h", "/bar/", Some(("bar", 81))),
            ("h", "/bar/x", Some(("bar", 81))),
            ("h", "/aaa/bbb", Some(("ab", 82))),
            ("h", "/aaa/bbb/", Some(("ab", 82))),
            ("h", "/aaa/bbb/ccc", Some(("ab", 82))),
            ("h", "/aaa/bbbxyz", None),
            ("h", "/aaa", None),
        ],
    );
}

#[test]
fn root_prefix_matches_everything() {
    let table = RouteTable::new(&[ingress(
        "ns",
        "a",
        None,
        vec![rule(None, vec![path("/", P, "root", 80)])],
    )]);
    check(
        &table,
        &[
            ("h", "/", Some(("root", 80))),
            ("h", "/anything/at/all", Some(("root", 80))),
            ("h", "", Some(("root", 80))),
        ],
    );
}

#[test]
fn longest_path_wins_and_exact_beats_prefix_at_equal_length() {
    let table = RouteTable::new(&[ingress(
        "ns",
        "a",
        None,
        vec![
            rule(
                None,
                vec![path("/", P, "root", 80), path("/foo", P, "foo", 80)],
            ),
            rule(
                None,
                vec![
                    path("/foo/bar", P, "foobar", 80),
                    path("/foo", E, "foo-exact", 80),
                    path("/foo/bar/baz", I, "impl", 80),
                ],
            ),
        ],
    )]);
    check(
        &table,
        &[
            ("h", "/foo", Some(("foo-exact", 80))),
            ("h", "/foo/", Some(("foo", 80))),
            ("h", "/foo/x", Some(("foo", 80))),
            ("h", "/foo/bar", Some(("foobar", 80))),
            ("h", "/foo/bar/x", Some(("foobar", 80))),
            ("h", "/foo/bar/baz/q", Some(("impl", 80))),
            ("h", "/other", Some(("root", 80))),
        ],
    );
}

#[test]
fn implementation_specific_and_missing_path_type_act_as_prefix() {
    let table = RouteTable::new(&[ingress(
        "ns",
        "a",
        None,
        vec![rule(
            None,
            vec![
                path("/impl", I, "impl", 80),
                path("/none", None, "none", 80),
            ],
        )],
    )]);
    check(
        &table,
        &[
            ("h", "/impl/x", Some(("impl", 80))),
            ("h", "/implx", None),
            ("h", "/none/", Some(("none", 80))),
        ],
    );
    let m = table.route("h", "/impl").expect("match");
    assert_eq!(m.path_type(), Some(PathType::ImplementationSpecific));
}

#[test]
fn hosts_are_case_insensitive_and_ignore_port() {
    let table = RouteTable::new(&[ingress(
        "ns",
        "a",
        None,
        vec![rule(Some("Foo.Example.com"), vec![path("/", P, "foo", 80)])],
    )]);
    check(
        &table,
        &[
            ("foo.example.com", "/", Some(("foo", 80))),
            ("FOO.EXAMPLE.COM", "/x", Some(("foo", 80))),
            ("foo.example.com:8443", "/", Some(("foo", 80))),
            ("foo.example.com.", "/", Some(("foo", 80))),
            ("bar.example.com", "/", None),
            ("example.com", "/", None),
        ],
    );
}

#[test]
fn wildcard_matches_one_label_and_loses_to_exact_host() {
    let table = RouteTable::new(&[ingress(
        "ns",
        "a",
        None,
        vec![
            rule(Some("*.foo.com"), vec![path("/", P, "wild", 80)]),
            rule(Some("exact.foo.com"), vec![path("/", P, "exact", 80)]),
        ],
    )]);
    check(
        &table,
        &[
            ("a.foo.com", "/", Some(("wild", 80))),
            ("A.FOO.COM:80", "/", Some(("wild", 80))),
            ("exact.foo.com", "/", Some(("exact", 80))),
            ("foo.com", "/", None),
            ("a.b.foo.com", "/", None),
            (".foo.com", "/", None),
            ("afoo.com", "/", None),
        ],
    );
    let m = table.route("x.foo.com", "/").expect("match");
    assert!(matches!(
        m.source(),
        MatchSource::Rule {
            host: HostMatch::Wildcard,
            ..
        }
    ));
}

#[test]
fn host_kind_beats_path_length_and_falls_through_when_no_path_matches() {
    let table = RouteTable::new(&[ingress(
        "ns",
        "a",
        None,
        vec![
            rule(Some("foo.com"), vec![path("/app", P, "exact-host", 80)]),
            rule(Some("*.foo.com"), vec![path("/app", P, "wild", 80)]),
            rule(
                None,
                vec![
                    path("/app/long/path", P, "any-long", 80),
                    path("/", P, "any-root", 80),
                ],
            ),
        ],
    )]);
    check(
        &table,
        &[
            // The exact host rule wins over a longer host-less path.
            ("foo.com", "/app/long/path", Some(("exact-host", 80))),
            // No path of the exact host matches: the host-less rules apply.
            ("foo.com", "/other", Some(("any-root", 80))),
            ("x.foo.com", "/app/long/path", Some(("wild", 80))),
            ("x.foo.com", "/other", Some(("any-root", 80))),
            ("bar.com", "/app/long/path/x", Some(("any-long", 80))),
        ],
    );
}

#[test]
fn default_backend_catches_unmatched_requests() {
    let table = RouteTable::new(&[
        with_default(
            ingress(
                "ns",
                "newer",
                Some(200),
                vec![rule(Some("foo.com"), vec![path("/api", P, "api", 80)])],
            ),
            "fallback-newer",
            8080,
        ),
        with_default(
            ingress("ns", "older", Some(100), vec![]),
            "fallback-older",
            8080,
        ),
    ]);
    check(
        &table,
        &[
            ("foo.com", "/api", Some(("api", 80))),
            ("foo.com", "/web", Some(("fallback-older", 8080))),
            ("bar.com", "/", Some(("fallback-older", 8080))),
        ],
    );
    let m = table.route("bar.com", "/").expect("match");
    assert_eq!(m.source(), MatchSource::DefaultBackend);
    assert_eq!(m.ingress_name(), "older");
    assert_eq!(m.path(), None);
}

#[test]
fn conflicts_go_to_oldest_then_namespace_then_name() {
    let same = |ns: &str, name: &str, created: Option<i64>, svc: &str| {
        ingress(
            ns,
            name,
            created,
            vec![rule(Some("foo.com"), vec![path("/x", P, svc, 80)])],
        )
    };
    // Oldest creationTimestamp wins regardless of input order and names.
    let table = RouteTable::new(&[
        same("a", "a", Some(300), "newest"),
        same("z", "z", Some(100), "oldest"),
        same("b", "b", None, "no-timestamp"),
    ]);
    check(&table, &[("foo.com", "/x", Some(("oldest", 80)))]);
    // Equal timestamps: namespace, then name.
    let table = RouteTable::new(&[
        same("b", "a", Some(100), "ns-b"),
        same("a", "z", Some(100), "ns-a-z"),
        same("a", "m", Some(100), "ns-a-m"),
    ]);
    check(&table, &[("foo.com", "/x", Some(("ns-a-m", 80)))]);
    let m = table.route("foo.com", "/x").expect("match");
    assert_eq!((m.namespace(), m.ingress_name()), ("a", "m"));
    // Without timestamps, an Ingress with one is older.
    let table = RouteTable::new(&[
        same("a", "a", None, "none"),
        same("z", "z", Some(5), "some"),
    ]);
    check(&table, &[("foo.com", "/x", Some(("some", 80)))]);
}

#[test]
fn match_reports_rule_and_path_indices() {
    let table = RouteTable::new(&[ingress(
        "team",
        "web",
        None,
        vec![
            rule(Some("a.com"), vec![path("/", P, "a", 80)]),
            rule(
                Some("b.com"),
                vec![path("/x", E, "bx", 80), path("/y", E, "by", 80)],
            ),
        ],
    )]);
    let m = table.route("b.com", "/y").expect("match");
    assert_eq!(
        m.source(),
        MatchSource::Rule {
            rule: 1,
            path: 1,
            host: HostMatch::Exact
        }
    );
    assert_eq!(m.namespace(), "team");
    assert_eq!(m.ingress_name(), "web");
    assert_eq!(m.path(), Some("/y"));
    assert_eq!(m.path_type(), Some(PathType::Exact));
    assert_eq!(m.service_name(), Some("by"));
}

#[test]
fn tls_secret_lookup() {
    let table = RouteTable::new(&[
        with_tls(
            ingress("ns1", "newer", Some(200), vec![]),
            vec![
                tls(&["foo.com"], "foo-newer"),
                tls(&["*.bar.com"], "bar-wild"),
            ],
        ),
        with_tls(
            ingress("ns2", "older", Some(100), vec![]),
            vec![
                tls(&["foo.com", "www.bar.com"], "shared"),
                tls(&[], "catch-all"),
            ],
        ),
    ]);
    let secret = |host: &str| {
        table
            .tls_secret_for(host)
            .map(|s| (s.namespace, s.secret_name))
    };
    assert_eq!(secret("foo.com"), Some(("ns2", "shared")));
    assert_eq!(secret("FOO.com"), Some(("ns2", "shared")));
    assert_eq!(secret("www.bar.com"), Some(("ns2", "shared")));
    assert_eq!(secret("api.bar.com"), Some(("ns1", "bar-wild")));
    assert_eq!(secret("a.api.bar.com"), Some(("ns2", "catch-all")));
    assert_eq!(secret("other.org"), Some(("ns2", "catch-all")));
    let empty = RouteTable::new(&[]);
    assert_eq!(empty.tls_secret_for("foo.com"), None);
}

fn class(name: &str, controller: &str, default: bool) -> IngressClass {
    let mut meta = ObjectMeta {
        name: Some(name.to_owned()),
        ..Default::default()
    };
    if default {
        meta.annotations
            .insert(DEFAULT_CLASS_ANNOTATION.to_owned(), "true".to_owned());
    }
    IngressClass {
        metadata: Some(meta),
        spec: Some(IngressClassSpec {
            controller: Some(controller.to_owned()),
            parameters: None,
        }),
    }
}

#[test]
fn ingress_class_filtering() {
    let one = |name: &str, svc: &str| {
        ingress(
            "ns",
            name,
            None,
            vec![rule(
                Some(&format!("{name}.com")),
                vec![path("/", P, svc, 80)],
            )],
        )
    };
    let mut legacy = one("legacy", "legacy");
    if let Some(meta) = legacy.metadata.as_mut() {
        meta.annotations
            .insert("kubernetes.io/ingress.class".to_owned(), "mesh".to_owned());
    }
    let ingresses = vec![
        with_class(one("mine", "mine"), "mesh"),
        with_class(one("theirs", "theirs"), "nginx"),
        one("classless", "classless"),
        legacy,
    ];
    // No filter: everything.
    let all = RouteTable::new(&ingresses);
    assert_eq!(all.ingress_count(), 4);

    // Explicit class, no default class known: class-less Ingresses are out.
    let table = RouteTable::builder()
        .ingress_class("mesh")
        .build(&ingresses);
    check(
        &table,
        &[
            ("mine.com", "/", Some(("mine", 80))),
            ("legacy.com", "/", Some(("legacy", 80))),
            ("theirs.com", "/", None),
            ("classless.com", "/", None),
        ],
    );

    // The default class takes class-less Ingresses.
    let classes = [
        class("mesh", "meshkit.dev/ingress", true),
        class("nginx", "k8s.io/nginx", false),
    ];
    let table = RouteTable::builder()
        .ingress_class("mesh")
        .ingress_classes(&classes)
        .build(&ingresses);
    check(
        &table,
        &[
            ("classless.com", "/", Some(("classless", 80))),
            ("theirs.com", "/", None),
        ],
    );

    // By controller.
    let table = RouteTable::builder()
        .controller("k8s.io/nginx")
        .ingress_classes(&classes)
        .build(&ingresses);
    check(
        &table,
        &[
            ("theirs.com", "/", Some(("theirs", 80))),
            ("mine.com", "/", None),
            ("classless.com", "/", None),
        ],
    );

    // Two default classes: no default at all.
    let two_defaults = [class("mesh", "x", true), class("other", "y", true)];
    let table = RouteTable::builder()
        .ingress_class("mesh")
        .ingress_classes(&two_defaults)
        .build(&ingresses);
    check(&table, &[("classless.com", "/", None)]);
}

// ---------------------------------------------------------------------------------------
// Reference implementation: a linear scan that follows the documented rules literally.
// ---------------------------------------------------------------------------------------

fn reference_normalize_host(host: &str) -> String {
    let host = if host.starts_with('[') {
        match host.find(']') {
            Some(end) => &host[..=end],
            None => host,
        }
    } else if host.matches(':').count() == 1 {
        host.split(':').next().unwrap_or(host)
    } else {
        host
    };
    host.strip_suffix('.').unwrap_or(host).to_lowercase()
}

/// 0 = exact host, 1 = wildcard, 2 = any host; `None` when the rule host does not match.
fn reference_host_tier(rule_host: Option<&str>, request_host: &str) -> Option<u8> {
    let rule_host = rule_host.unwrap_or("").to_lowercase();
    if rule_host.is_empty() {
        return Some(2);
    }
    if let Some(suffix) = rule_host.strip_prefix("*.") {
        let (label, rest) = request_host.split_once('.')?;
        return (!label.is_empty() && rest == suffix).then_some(1);
    }
    (rule_host == request_host).then_some(0)
}

/// Matched length when `path_type`/`rule_path` matches `request`.
fn reference_path_len(path_type: Option<&str>, rule_path: &str, request: &str) -> Option<usize> {
    if path_type == Some("Exact") {
        return (rule_path == request).then_some(rule_path.len());
    }
    let p = rule_path.trim_end_matches('/');
    let matches = p.is_empty() || request == p || request.starts_with(&format!("{p}/"));
    matches.then_some(p.len())
}

fn reference_order(ingresses: &[Ingress]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..ingresses.len()).collect();
    order.sort_by_key(|&i| {
        let meta = ingresses[i].metadata.clone().unwrap_or_default();
        let ts = meta
            .creation_timestamp
            .map(|t| (t.seconds.unwrap_or(0), t.nanos.unwrap_or(0)));
        // `None` sorts after every timestamp.
        (
            ts.is_none(),
            ts,
            meta.namespace.unwrap_or_default(),
            meta.name.unwrap_or_default(),
            i,
        )
    });
    order
}

/// Precedence key of a candidate; smallest wins: host tier, longer path, Exact first,
/// Ingress rank, rule index, path index.
type RefKey = (u8, std::cmp::Reverse<usize>, u8, usize, usize, usize);

/// The service name the reference picks.
fn reference_route(ingresses: &[Ingress], host: &str, path: &str) -> Option<String> {
    let host = reference_normalize_host(host);
    let order = reference_order(ingresses);
    let mut best: Option<(RefKey, String)> = None;
    for (rank, &i) in order.iter().enumerate() {
        let spec = ingresses[i].spec.clone().unwrap_or_default();
        for (ri, rule) in spec.rules.iter().enumerate() {
            let Some(tier) = reference_host_tier(rule.host.as_deref(), &host) else {
                continue;
            };
            let Some(http) = rule
                .ingress_rule_value
                .as_ref()
                .and_then(|v| v.http.as_ref())
            else {
                continue;
            };
            for (pi, p) in http.paths.iter().enumerate() {
                let Some(backend) = p.backend.as_ref() else {
                    continue;
                };
                let Some(len) = reference_path_len(
                    p.path_type.as_deref(),
                    p.path.as_deref().unwrap_or(""),
                    path,
                ) else {
                    continue;
                };
                let exactness = if p.path_type.as_deref() == Some("Exact") {
                    0
                } else {
                    1
                };
                let key = (tier, std::cmp::Reverse(len), exactness, rank, ri, pi);
                if best.as_ref().is_none_or(|(k, _)| key < *k) {
                    best = Some((key, service_of(backend).0));
                }
            }
        }
    }
    if let Some((_, svc)) = best {
        return Some(svc);
    }
    order.iter().find_map(|&i| {
        let spec = ingresses[i].spec.as_ref()?;
        spec.default_backend.as_ref().map(|b| service_of(b).0)
    })
}

fn arb_path() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(prop::sample::select(vec!["a", "b", "ab", "A", ""]), 0..3),
        any::<bool>(),
    )
        .prop_map(|(segments, trailing)| {
            let mut p = String::from("/");
            p.push_str(&segments.join("/"));
            if trailing && !p.ends_with('/') {
                p.push('/');
            }
            p
        })
}

fn arb_rule_host() -> impl Strategy<Value = Option<String>> {
    prop::sample::select(vec![
        None,
        Some("foo.com"),
        Some("FOO.com"),
        Some("*.foo.com"),
        Some("a.foo.com"),
        Some("bar.com"),
        Some("*.bar.com"),
        Some("*.a.foo.com"),
    ])
    .prop_map(|h| h.map(str::to_owned))
}

fn arb_request_host() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "foo.com",
        "FOO.COM:8080",
        "a.foo.com",
        "b.foo.com",
        "x.a.foo.com",
        "bar.com.",
        "q.bar.com",
        "other.org",
        "[::1]:80",
    ])
    .prop_map(str::to_owned)
}

fn arb_ingresses() -> impl Strategy<Value = Vec<Ingress>> {
    let path_type = prop::sample::select(vec![E, P, I, None]);
    let http_path = (arb_path(), path_type);
    let rule_strategy = (arb_rule_host(), prop::collection::vec(http_path, 0..4));
    let one = (
        prop::sample::select(vec!["a", "b"]),
        prop::sample::select(vec!["x", "y"]),
        prop::option::of(0i64..3),
        prop::collection::vec(rule_strategy, 0..4),
        any::<bool>(),
    );
    prop::collection::vec(one, 0..5).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(ii, (ns, name, created, rules, has_default))| {
                let rules = rules
                    .into_iter()
                    .enumerate()
                    .map(|(ri, (host, paths))| {
                        let paths = paths
                            .into_iter()
                            .enumerate()
                            .map(|(pi, (p, t))| path(&p, t, &format!("s{ii}-{ri}-{pi}"), 80))
                            .collect();
                        rule(host.as_deref(), paths)
                    })
                    .collect();
                let ing = ingress(ns, name, created, rules);
                if has_default {
                    with_default(ing, &format!("default{ii}"), 80)
                } else {
                    ing
                }
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn table_agrees_with_reference(
        ingresses in arb_ingresses(),
        requests in prop::collection::vec((arb_request_host(), arb_path()), 1..16),
    ) {
        let table = RouteTable::new(&ingresses);
        // Also ask for every rule path itself and one element below it, where ties between
        // path types and Ingresses happen.
        let mut requests = requests;
        for ing in &ingresses {
            for rule in ing.spec.iter().flat_map(|s| &s.rules) {
                for p in rule.ingress_rule_value.iter().flat_map(|v| &v.http).flat_map(|h| &h.paths) {
                    let p = p.path.clone().unwrap_or_default();
                    for host in ["foo.com", "a.foo.com", "x.a.foo.com", "other.org"] {
                        requests.push((host.to_owned(), p.clone()));
                        requests.push((host.to_owned(), format!("{p}/a")));
                    }
                }
            }
        }
        for (host, path) in &requests {
            let fast = table.route(host, path).and_then(|m| m.service_name().map(str::to_owned));
            let slow = reference_route(&ingresses, host, path);
            prop_assert_eq!(fast, slow, "route({:?}, {:?})", host, path);
        }
    }
}

#[test]
fn public_types_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<RouteTable>();
    assert_send_sync::<meshkit_ingress_model::RouteTableBuilder>();
    assert_send_sync::<meshkit_ingress_model::RouteMatch<'static>>();
    assert_send_sync::<meshkit_ingress_model::manifest::ManifestError>();
    assert_send_sync::<meshkit_ingress_model::envelope::EnvelopeError>();
    assert_send_sync::<meshkit_ingress_model::validation::ValidationErrors>();
}

/// The secret the reference picks for `server_name`: exact host entries, then wildcard
/// entries, then entries without hosts, each in conflict order then entry order.
fn reference_tls(ingresses: &[Ingress], server_name: &str) -> Option<String> {
    let host = reference_normalize_host(server_name);
    let order = reference_order(ingresses);
    let mut best: Option<((u8, usize, usize), String)> = None;
    for (rank, &i) in order.iter().enumerate() {
        let spec = ingresses[i].spec.clone().unwrap_or_default();
        for (ti, tls) in spec.tls.iter().enumerate() {
            let Some(secret) = tls.secret_name.clone() else {
                continue;
            };
            let tier = if tls.hosts.is_empty() {
                Some(2)
            } else {
                tls.hosts
                    .iter()
                    .filter_map(|h| match reference_host_tier(Some(h), &host) {
                        Some(2) | None => None,
                        tier => tier,
                    })
                    .min()
            };
            if let Some(tier) = tier {
                let key = (tier, rank, ti);
                if best.as_ref().is_none_or(|(k, _)| key < *k) {
                    best = Some((key, secret));
                }
            }
        }
    }
    best.map(|(_, secret)| secret)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn tls_lookup_agrees_with_reference(
        specs in prop::collection::vec(
            (
                prop::option::of(0i64..3),
                prop::sample::select(vec!["a", "b"]),
                prop::collection::vec(
                    (
                        prop::collection::vec(
                            prop::sample::select(vec!["foo.com", "*.foo.com", "a.foo.com", "BAR.com", "*.a.foo.com"]),
                            0..3,
                        ),
                        any::<bool>(),
                    ),
                    0..3,
                ),
            ),
            0..4,
        ),
        requests in prop::collection::vec(arb_request_host(), 1..8),
    ) {
        let ingresses: Vec<Ingress> = specs
            .into_iter()
            .enumerate()
            .map(|(ii, (created, ns, entries))| {
                let entries = entries
                    .into_iter()
                    .enumerate()
                    .map(|(ti, (hosts, has_secret))| {
                        let mut entry = tls(&hosts, &format!("secret{ii}-{ti}"));
                        if !has_secret {
                            entry.secret_name = None;
                        }
                        entry
                    })
                    .collect();
                with_tls(ingress(ns, &format!("i{ii}"), created, vec![]), entries)
            })
            .collect();
        let table = RouteTable::new(&ingresses);
        for host in &requests {
            let fast = table.tls_secret_for(host).map(|s| s.secret_name.to_owned());
            prop_assert_eq!(fast, reference_tls(&ingresses, host), "tls_secret_for({:?})", host);
        }
    }
}
