//! The main job, run as a user runs it. The test does not take the program's word for it: it
//! reads what the program saw (who answered each route, with which status, which identities
//! each hop verified) and checks that against its own table of the sample manifests.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

/// Requests per route the test asks for.
const REQUESTS: usize = 6;

/// The sample manifests' routes: host, path, and the workloads that must answer (each of
/// them, between them every request).
const ROUTES: &[(&str, &str, &[&str])] = &[
    ("shop.example.com", "/", &["web-1", "web-2"]),
    ("shop.example.com", "/api/v1/items", &["api-1"]),
    ("shop.example.com", "/apiary", &["web-1", "web-2"]),
    ("shop.example.com", "/healthz", &["api-1"]),
    ("shop.example.com", "/healthz/deep", &["web-1", "web-2"]),
    ("SHOP.example.com:18080", "/api", &["api-1"]),
    ("m.shop.example.com", "/", &["web-1", "web-2"]),
    ("a.b.shop.example.com", "/", &["fallback-1"]),
    ("blog.example.com", "/posts/1", &["blog-1"]),
    ("unknown.example.org", "/", &["fallback-1"]),
];

/// The sample workloads: name, service account, node, and the address its app listens on.
const WORKLOADS: &[(&str, &str, &str, &str)] = &[
    ("web-1", "shop/sa/web", "node-a", "127.0.0.11:8080"),
    ("web-2", "shop/sa/web", "node-b", "127.0.0.12:8080"),
    ("api-1", "shop/sa/api", "node-a", "127.0.0.13:9090"),
    (
        "fallback-1",
        "shop/sa/fallback",
        "node-b",
        "127.0.0.14:8080",
    ),
    ("blog-1", "blog/sa/blog", "node-b", "127.0.0.21:8080"),
];

const GATEWAY: &str = "spiffe://cluster.local/ns/istio-system/sa/ingress-gateway";

/// The Gateway API rows (HTTPRoute `shop/store`): what starts the row, and what it must
/// hold; then the answers by service account they add to hop 1.
const GATEWAY_API_ROWS: &[(&str, &str)] = &[
    ("store.example.com/cart", "x-canary: true     api-1 x4 "),
    (
        "store.example.com/cart",
        "fallback-1 x2, web-1 x3, web-2 x3 ",
    ),
    ("store.example.com/blog/posts/1", "blog-1 x2 "),
    (
        "store.example.com/old",
        "301 http://store.example.com:18090/new ok",
    ),
];
const GATEWAY_API_ANSWERS: &[(&str, usize)] = &[
    ("shop/sa/api", 4),
    ("shop/sa/web", 6),
    ("shop/sa/fallback", 2),
    ("blog/sa/blog", 2),
];

/// The "answered by" column of the row for `host` and `path`: requests per workload, as the
/// program counted the answers' backend headers.
fn answered_by(stdout: &str, host: &str, path: &str) -> BTreeMap<String, usize> {
    let row = stdout
        .lines()
        .find(|line| {
            let mut words = line.split_whitespace();
            words.next() == Some(host) && words.next() == Some(path)
        })
        .unwrap_or_else(|| panic!("no row for {host}{path}:\n{stdout}"));
    // `web-1 x3, web-2 x3` after the host and path: name and count in pairs.
    let words: Vec<&str> = row.split_whitespace().skip(2).collect();
    let mut seen = BTreeMap::new();
    for pair in words.chunks(2) {
        let [name, count] = pair else { break };
        let Some(n) = count.trim_end_matches(',').strip_prefix('x') else {
            break;
        };
        let n = n
            .parse()
            .unwrap_or_else(|_| panic!("{host}{path}: not a count in {row:?}"));
        seen.insert((*name).to_owned(), n);
        if !count.ends_with(',') {
            break;
        }
    }
    seen
}

/// The count on the line that is exactly `line` followed by ` xN`, if there is one.
fn count_of(stdout: &str, line: &str) -> Option<usize> {
    stdout.lines().find_map(|l| {
        let (text, n) = l.trim().rsplit_once(" x")?;
        (text == line).then(|| n.parse().ok())?
    })
}

#[test]
fn mesh_demo_routes_and_identities_are_as_the_manifests_say() {
    let out = meshkit_test_support::output_within(
        Command::new(env!("CARGO_BIN_EXE_mesh-demo")).args(["--requests", &REQUESTS.to_string()]),
        Duration::from_secs(120),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    check_the_run(&stdout);
}

/// The same demo with the sample objects in a real API server and the control plane
/// watching it: the same answers, and the workloads and services it derived, printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mesh_demo_from_a_kubernetes_api_server_routes_the_same() {
    let Some(api) = meshkit_test_support::apiserver::ApiServer::start_or_skip(
        "mesh_demo_from_a_kubernetes_api_server_routes_the_same",
    )
    .await
    else {
        return;
    };
    let kubeconfig = api.kubeconfig().to_owned();
    let out = tokio::task::spawn_blocking(move || {
        meshkit_test_support::output_within(
            Command::new(env!("CARGO_BIN_EXE_mesh-demo"))
                .args(["--requests", &REQUESTS.to_string(), "--kubeconfig"])
                .arg(kubeconfig),
            Duration::from_secs(120),
        )
    })
    .await
    .expect("the demo ran");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("sample objects applied to the API server"),
        "{stdout}"
    );
    for (name, sa, node, addr) in WORKLOADS {
        let (ns, account) = sa.split_once("/sa/").expect("NS/sa/SA");
        let ip = addr.split(':').next().unwrap_or_default();
        let uid = format!("Kubernetes/networking.istio.io/WorkloadEntry/{ns}/{name}");
        let want = format!("workload {uid}: {ip} on {node}, identity {ns}/{account}");
        assert!(
            stdout.lines().any(|l| l.trim() == want),
            "no line {want:?}:\n{stdout}"
        );
    }
    assert!(
        stdout.contains("service  shop/web.shop.svc.cluster.local: ports 80->"),
        "{stdout}"
    );
    check_the_run(&stdout);
}

/// What every run of the demo must show, whatever its source.
fn check_the_run(stdout: &str) {
    // Every route answered by exactly its workloads, each of them, every request.
    let mut per_identity: BTreeMap<&str, usize> = BTreeMap::new();
    for (host, path, expect) in ROUTES {
        let seen = answered_by(stdout, host, path);
        let names: Vec<&str> = seen.keys().map(String::as_str).collect();
        assert_eq!(names, *expect, "{host}{path}: answered by {seen:?}");
        assert_eq!(
            seen.values().sum::<usize>(),
            REQUESTS,
            "{host}{path}: {seen:?}"
        );
        for (name, n) in &seen {
            let (_, sa, _, _) = WORKLOADS
                .iter()
                .find(|(w, ..)| w == name)
                .expect("a sample workload");
            *per_identity.entry(sa).or_default() += n;
        }
    }
    // The Gateway API rows: each as the HTTPRoute says, and marked ok.
    for (start, holds) in GATEWAY_API_ROWS {
        let found = stdout.lines().map(str::trim).any(|l| {
            l.starts_with(start) && l.contains(holds) && l.split_whitespace().any(|w| w == "ok")
        });
        assert!(found, "no row {start} with {holds:?}:\n{stdout}");
    }
    let routed_by_gateway_api: usize = GATEWAY_API_ANSWERS.iter().map(|(_, n)| n).sum();
    for (sa, n) in GATEWAY_API_ANSWERS {
        *per_identity.entry(sa).or_default() += n;
    }
    // All of them with 200.
    assert_eq!(
        count_of(stdout, "status counts: 200"),
        Some(ROUTES.len() * REQUESTS + routed_by_gateway_api),
        "{stdout}"
    );
    // Hop 1: the identity the gateway verified for each answer, as many times as that
    // identity's workloads answered.
    for (sa, n) in per_identity {
        let id = format!("spiffe://cluster.local/ns/{sa}");
        assert_eq!(count_of(stdout, &id), Some(n), "{id}:\n{stdout}");
    }
    // Hop 2: each workload's node proxy admitted the gateway's identity to it.
    for (name, _, node, addr) in WORKLOADS {
        let line = format!("{node}: {GATEWAY} -> {addr}");
        assert!(
            count_of(stdout, &line).is_some_and(|n| n >= 1),
            "{name}: no tunnel {line}:\n{stdout}"
        );
    }
    // The gateway's own /metrics count the same answers: every route's requests, the
    // HTTPS one and the Gateway API ones with 200, and the redirect.
    let metrics = stdout
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("gateway: istio_requests_total by response_code: "))
        .unwrap_or_else(|| panic!("no gateway metrics line:\n{stdout}"));
    assert_eq!(
        metrics,
        format!(
            "200 x{}, 301 x1",
            ROUTES.len() * REQUESTS + 1 + routed_by_gateway_api
        ),
        "{stdout}"
    );
    // Each node proxy's own /metrics count the gateway's tunnels to it: as many inbound
    // connections as tunnels it reported accepting.
    for node in ["node-a", "node-b"] {
        let tunnels: usize = stdout
            .lines()
            .filter_map(|l| {
                let rest = l.trim().strip_prefix(&format!("{node}: {GATEWAY} -> "))?;
                rest.rsplit_once(" x")?.1.parse::<usize>().ok()
            })
            .sum();
        let prefix = format!("{node}: from {GATEWAY}: ");
        let scraped = stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(' ').next()?.parse::<usize>().ok())
            .unwrap_or_else(|| panic!("no scraped figure for {node}:\n{stdout}"));
        assert_eq!(scraped, tunnels, "{node}:\n{stdout}");
    }
    // L4 authorization: node-a admitted web's tunnel to the API and refused fallback's, as
    // `shop/api-callers` says, and its own /metrics counted the refusal.
    let line_of = |start: &str| {
        stdout
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no line {start:?}:\n{stdout}"))
            .to_owned()
    };
    assert!(
        line_of("web-2 (shop/sa/web)").contains("allowed, answered by api-1"),
        "{stdout}"
    );
    assert!(
        line_of("fallback-1 (shop/sa/fallback)").contains("denied ("),
        "{stdout}"
    );
    let api = "127.0.0.13:9090";
    assert!(
        count_of(
            stdout,
            &format!("node-a: spiffe://cluster.local/ns/shop/sa/web -> {api}")
        )
        .is_some_and(|n| n >= 1),
        "{stdout}"
    );
    assert_eq!(
        count_of(
            stdout,
            &format!("node-a: spiffe://cluster.local/ns/shop/sa/fallback -> {api}")
        ),
        None,
        "{stdout}"
    );
    assert!(
        line_of("node-a /metrics: meshkit_node_proxy_policy_denials_total")
            .ends_with("{reason=\"authorization_policy\"} 1"),
        "{stdout}"
    );
    // HTTPS with SNI: answered by a web workload.
    let https = stdout
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("https://shop.example.com/ answered by ")
        })
        .unwrap_or_else(|| panic!("no HTTPS answer:\n{stdout}"));
    let workload = https.split(':').next().unwrap_or_default();
    assert!(
        workload == "web-1" || workload == "web-2",
        "https answered by {https:?}"
    );
}
