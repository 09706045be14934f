//! `mesh-demo`: meshkit's main job. Starts a control plane, two node proxies, an ingress
//! gateway and echo workloads in one process on loopback addresses, loads the bundled sample
//! manifests, sends traffic through gateway -> HBONE -> node proxy -> app, checks every
//! answer, and prints a summary. Exits 0 only if every check passed.
//!
//! ```text
//! cargo run --release -p meshkit-demo --bin mesh-demo            # run the checks, exit
//! cargo run --release -p meshkit-demo --bin mesh-demo -- --serve # then keep serving
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use meshkit_cli::CliError;
use meshkit_control_plane::Source;
use meshkit_control_plane::kube_source::KubeSourceConfig;
use meshkit_demo::{
    DemoMesh, EchoReply, EnvoyListeners, EnvoyXdsSecurity, GATEWAY_ID, MeshOptions, apply_samples,
    envoy_bootstrap_with, write_samples,
};
use meshkit_gateway::{BACKEND_IDENTITY, BACKEND_WORKLOAD};
use tokio::net::TcpStream;

// mimalloc keeps the HTTP/2 frame buffers glibc would return to the kernel (docs/hbone.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs the demo mesh on loopback and checks it end to end.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Keep serving after the checks, on fixed ports, and print where to point curl.
    #[arg(long)]
    serve: bool,
    /// Gateway HTTP port with --serve.
    #[arg(long, default_value_t = 18080)]
    http_port: u16,
    /// Gateway HTTPS port with --serve.
    #[arg(long, default_value_t = 18443)]
    https_port: u16,
    /// Requests per route.
    #[arg(long, default_value_t = 20)]
    requests: usize,
    /// Worker threads of the runtime that runs the whole mesh (control plane, node proxies,
    /// gateway, applications).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    threads: u16,
    /// Address of the HTTP listener the control plane sends an Envoy gateway in LDS (default
    /// the control plane's, 0.0.0.0:8080).
    #[arg(long)]
    envoy_http: Option<SocketAddr>,
    /// Address of Envoy's HTTPS listener, with --envoy-http (default: none).
    #[arg(long, requires = "envoy_http")]
    envoy_https: Option<SocketAddr>,
    /// Address Envoy's Gateway API listeners bind (each on its Gateway listener's port), with
    /// --envoy-http; not the gateway's own, 127.0.0.1 (default: the control plane's, 0.0.0.0).
    #[arg(long, requires = "envoy_http")]
    envoy_gateway_api: Option<std::net::IpAddr>,
    /// Write an Envoy bootstrap (YAML) that takes everything from the control plane over ADS
    /// to this file, once the mesh is up.
    #[arg(long)]
    envoy_bootstrap_out: Option<std::path::PathBuf>,
    /// The bootstrap speaks Delta ADS instead of State of the World.
    #[arg(long)]
    envoy_delta: bool,
    /// Run the demo against the Kubernetes API server of this kubeconfig: the sample objects
    /// are created there (server-side apply), and the control plane watches the API instead
    /// of a folder. `cargo run -p meshkit-test-support --example apiserver` starts one.
    #[arg(long)]
    kubeconfig: Option<std::path::PathBuf>,
}

/// One route of the sample manifests and the workloads that must answer it.
struct Check {
    host: &'static str,
    path: &'static str,
    expect: &'static [&'static str],
    why: &'static str,
}

const CHECKS: &[Check] = &[
    Check {
        host: "shop.example.com",
        path: "/",
        expect: &["web-1", "web-2"],
        why: "Prefix /, round-robin over two nodes",
    },
    Check {
        host: "shop.example.com",
        path: "/api/v1/items",
        expect: &["api-1"],
        why: "Prefix /api, longest match",
    },
    Check {
        host: "shop.example.com",
        path: "/apiary",
        expect: &["web-1", "web-2"],
        why: "Prefix matches whole segments only",
    },
    Check {
        host: "shop.example.com",
        path: "/healthz",
        expect: &["api-1"],
        why: "Exact /healthz",
    },
    Check {
        host: "shop.example.com",
        path: "/healthz/deep",
        expect: &["web-1", "web-2"],
        why: "Exact does not match below it",
    },
    Check {
        host: "SHOP.example.com:18080",
        path: "/api",
        expect: &["api-1"],
        why: "host is case-insensitive, port ignored",
    },
    Check {
        host: "m.shop.example.com",
        path: "/",
        expect: &["web-1", "web-2"],
        why: "wildcard *.shop.example.com",
    },
    Check {
        host: "a.b.shop.example.com",
        path: "/",
        expect: &["fallback-1"],
        why: "wildcard covers one label only: default backend",
    },
    Check {
        host: "blog.example.com",
        path: "/posts/1",
        expect: &["blog-1"],
        why: "another namespace's Ingress",
    },
    Check {
        host: "unknown.example.org",
        path: "/",
        expect: &["fallback-1"],
        why: "no rule: default backend",
    },
];

#[derive(Default)]
struct Tally {
    statuses: BTreeMap<u16, usize>,
    latencies: Vec<Duration>,
    identities: BTreeMap<String, usize>,
}

fn main() -> ExitCode {
    meshkit_cli::init_logging_quiet();
    let args = Args::parse();
    let result = meshkit_cli::runtime(usize::from(args.threads))
        .map_err(CliError::from)
        .and_then(|rt| rt.block_on(run(args)));
    match result {
        Ok(true) => {
            println!("\nmesh-demo: all checks passed");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!("\nmesh-demo: some checks FAILED");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("mesh-demo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn step(n: usize, total: usize, text: &str) {
    println!("[{n}/{total}] {text}");
}

async fn run(args: Args) -> Result<bool, CliError> {
    let total = 7;
    let dir = std::env::temp_dir().join(format!("meshkit-demo-{}", std::process::id()));
    let source = match &args.kubeconfig {
        Some(path) => {
            let client = kube_client(path).await?;
            let applied = apply_samples(&client).await?;
            step(
                1,
                total,
                &format!(
                    "{applied} sample objects applied to the API server of {}",
                    path.display()
                ),
            );
            Source::Kubernetes(Box::new(KubeSourceConfig::new(client)))
        }
        None => {
            write_samples(&dir)?;
            step(
                1,
                total,
                &format!("sample manifests written to {}", dir.display()),
            );
            Source::Manifests(dir.clone())
        }
    };
    let envoy = args.envoy_http.map(|http| EnvoyListeners {
        http,
        https: args.envoy_https,
        gateway_api: args.envoy_gateway_api,
    });
    let options = if args.serve {
        MeshOptions {
            http: SocketAddr::from(([127, 0, 0, 1], args.http_port)),
            https: SocketAddr::from(([127, 0, 0, 1], args.https_port)),
            envoy,
            ..MeshOptions::default()
        }
    } else {
        MeshOptions {
            envoy,
            ..MeshOptions::default()
        }
    };
    let started = Instant::now();
    let mesh = DemoMesh::start_from(source, options, |line| println!("      {line}")).await?;
    step(2, total, &format!("mesh up in {:?}", started.elapsed()));
    if args.kubeconfig.is_some() {
        print_derived(&mesh);
    }
    let admins: Vec<String> = mesh
        .admin_addrs
        .iter()
        .map(|(part, addr)| format!("{part} http://{addr}"))
        .collect();
    println!(
        "      admin endpoints (/healthz/ready, /metrics, /config_dump): {}",
        admins.join(", ")
    );
    if let Some(path) = &args.envoy_bootstrap_out {
        let bootstrap = envoy_bootstrap_with(
            mesh.control_plane.ads_addr(),
            "envoy-gateway",
            args.envoy_delta,
            SocketAddr::from(([127, 0, 0, 1], 0)),
            &EnvoyXdsSecurity::demo(&mesh.control_plane),
        );
        std::fs::write(path, bootstrap)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("      Envoy bootstrap written to {}", path.display());
    }

    step(
        3,
        total,
        &format!(
            "{} routes x {} requests over HTTP/1.1 and HTTP/2",
            CHECKS.len(),
            args.requests
        ),
    );
    let mut tally = Tally::default();
    let mut all_ok = true;
    println!(
        "      {:<24} {:<16} {:<22} {:<7} why",
        "host", "path", "answered by", "result"
    );
    for check in CHECKS {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let mut ok = true;
        for i in 0..args.requests {
            let http2 = i % 2 == 1;
            match request(mesh.http_addr, check.host, check.path, http2).await {
                Ok(answer) => {
                    *tally.statuses.entry(answer.status).or_default() += 1;
                    tally.latencies.push(answer.latency);
                    if let Some(id) = answer.identity {
                        *tally.identities.entry(id).or_default() += 1;
                    }
                    let who = answer
                        .workload
                        .unwrap_or_else(|| format!("status {}", answer.status));
                    ok &= answer.status == 200
                        && check.expect.contains(&who.as_str())
                        && answer.echo_path_ok;
                    *seen.entry(who).or_default() += 1;
                }
                Err(e) => {
                    ok = false;
                    *seen.entry(format!("error: {e}")).or_default() += 1;
                }
            }
        }
        // Round-robin routes must spread over every expected workload.
        ok &= check.expect.iter().all(|w| seen.contains_key(*w));
        all_ok &= ok;
        let answered: Vec<String> = seen.iter().map(|(w, n)| format!("{w} x{n}")).collect();
        println!(
            "      {:<24} {:<16} {:<22} {:<7} {}",
            check.host,
            check.path,
            answered.join(", "),
            if ok { "ok" } else { "FAILED" },
            check.why
        );
    }

    step(
        4,
        total,
        "HTTPS with SNI shop.example.com (certificate from the shop-tls Secret)",
    );
    let https_ok = match https_request(mesh.https_addr, &mesh).await {
        Ok(workload) => {
            let ok = workload == "web-1" || workload == "web-2";
            println!(
                "      https://shop.example.com/ answered by {workload}: {}",
                if ok { "ok" } else { "FAILED" }
            );
            ok
        }
        Err(e) => {
            println!("      https://shop.example.com/ FAILED: {e}");
            false
        }
    };
    all_ok &= https_ok;

    step(
        5,
        total,
        "Gateway API: HTTPRoute shop/store on Gateway shop/public (header match, 3:1 split, redirect, another namespace)",
    );
    all_ok &= check_gateway_api(&mesh, &mut tally).await;

    step(
        6,
        total,
        "L4 authorization: AuthorizationPolicy shop/api-callers lets only the gateway and web call api",
    );
    all_ok &= check_policy(&mesh).await;

    step(7, total, "summary");
    let mut lat = tally.latencies.clone();
    lat.sort();
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or_default()
    };
    let statuses: Vec<String> = tally
        .statuses
        .iter()
        .map(|(s, n)| format!("{s} x{n}"))
        .collect();
    println!("      status counts: {}", statuses.join(", "));
    println!(
        "      latency through gateway -> HBONE -> app: p50 {:?}, p99 {:?}",
        pct(0.5),
        pct(0.99)
    );
    println!(
        "      hop 1, gateway -> node proxy: the gateway presented {GATEWAY_ID} and verified each backend:"
    );
    for (id, n) in &tally.identities {
        println!("        {id} x{n}");
    }
    println!("      hop 2, node proxy accepted tunnels (verified peer -> workload):");
    for (node, proxy) in &mesh.node_proxies {
        for ((peer, target), n) in proxy.accepted_tunnels() {
            println!("        {node}: {peer} -> {target} x{n}");
        }
    }
    let gateway_hops: usize = mesh
        .node_proxies
        .values()
        .flat_map(|p| p.accepted_tunnels())
        .filter(|((peer, _), _)| peer.as_str() == GATEWAY_ID)
        .map(|(_, n)| n as usize)
        .sum();
    if gateway_hops == 0 {
        println!("      FAILED: no node proxy saw the gateway's identity");
        all_ok = false;
    }
    all_ok &= print_scraped(&mesh).await;

    if args.serve {
        println!("\nserving; try:");
        for (part, addr) in &mesh.admin_addrs {
            println!("  curl http://{addr}/metrics        # {part}");
        }
        println!(
            "  curl -H 'Host: shop.example.com' http://{}/api/v1",
            mesh.http_addr
        );
        println!(
            "  curl --http2-prior-knowledge -H 'Host: blog.example.com' http://{}/",
            mesh.http_addr
        );
        println!(
            "  curl --resolve shop.example.com:{port}:127.0.0.1 -k https://shop.example.com:{port}/",
            port = mesh.https_addr.port()
        );
        match &mesh.source {
            Source::Manifests(dir) => println!(
                "  edit {} and watch routing change; Ctrl-C to stop",
                dir.display()
            ),
            Source::Kubernetes(_) => {
                println!(
                    "  change the objects in the API server and watch routing change; Ctrl-C to stop"
                );
            }
        }
        meshkit_cli::stop_signal().await;
    }
    drop(mesh);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(all_ok)
}

/// Calls the API through node-b's outbound listener from two workloads of node-b: web-2 is
/// allowed by `shop/api-callers`, fallback-1 is not, so node-a's proxy refuses its tunnel
/// (401) and node-b resets its connection. The refusal is read back from node-a's `/metrics`.
async fn check_policy(mesh: &DemoMesh) -> bool {
    let Some(outbound) = mesh.outbound_addr("node-b") else {
        println!("      FAILED: node-b has no outbound listener for the API");
        return false;
    };
    let mut ok = true;
    for (workload, from, allowed) in [
        ("web-2 (shop/sa/web)", [127, 0, 0, 12], true),
        ("fallback-1 (shop/sa/fallback)", [127, 0, 0, 14], false),
    ] {
        let answer = call_through(std::net::Ipv4Addr::from(from), outbound).await;
        let (seen, right) = match (&answer, allowed) {
            (Ok(name), true) => (format!("allowed, answered by {name}"), name == "api-1"),
            (Ok(name), false) => (format!("answered by {name}"), false),
            (Err(e), true) => (format!("no answer: {e}"), false),
            (Err(e), false) => (format!("denied ({e})"), true),
        };
        ok &= right;
        println!(
            "      {workload:<30} -> api.shop: {seen:<45} {}",
            if right { "ok" } else { "FAILED" }
        );
    }
    let denials = match meshkit_demo::admin_get(mesh.admin_addrs["node-a"], "/metrics").await {
        Ok(text) => meshkit_demo::samples(&text, "meshkit_node_proxy_policy_denials_total")
            .into_iter()
            .filter(|(labels, _)| {
                labels.get("reason").map(String::as_str) == Some("authorization_policy")
            })
            .map(|(_, n)| n)
            .sum::<f64>(),
        Err(e) => {
            println!("      FAILED to scrape node-a: {e}");
            return false;
        }
    };
    println!(
        "      node-a /metrics: meshkit_node_proxy_policy_denials_total{{reason=\"authorization_policy\"}} {denials}"
    );
    ok && denials >= 1.0
}

/// An HTTP/1.1 GET to `to` over a connection from address `from` (a workload's own address,
/// which is how the node proxy knows who is calling): the answering workload's name.
async fn call_through(from: std::net::Ipv4Addr, to: SocketAddr) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::from((from, 0)))?;
        let mut stream = socket.connect(to).await?;
        stream
            .write_all(b"GET /policy HTTP/1.1\r\nHost: api.shop.svc.cluster.local\r\nConnection: close\r\n\r\n")
            .await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = match tokio::time::timeout(Duration::from_secs(10), exchange).await {
        Err(_) => return Err("no answer within 10 s".to_owned()),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {
            return Err("connection reset".to_owned());
        }
        Ok(Err(e)) => return Err(e.to_string()),
        Ok(Ok(answer)) => answer,
    };
    let text = String::from_utf8_lossy(&answer);
    let Some((_, body)) = text.split_once("\r\n\r\n") else {
        return Err(if answer.is_empty() {
            "closed without an answer".to_owned()
        } else {
            "not an HTTP answer".to_owned()
        });
    };
    serde_json::from_str::<EchoReply>(body)
        .map(|reply| reply.name)
        .map_err(|e| format!("not an echo reply: {e}"))
}

/// The summary's figures as Prometheus would scrape them from each part's `/metrics`: the
/// gateway's requests by code, each node proxy's inbound connections and bytes by peer
/// identity. False if a part could not be scraped.
async fn print_scraped(mesh: &meshkit_demo::DemoMesh) -> bool {
    println!("      from the parts' own /metrics:");
    let mut ok = true;
    for (part, addr) in &mesh.admin_addrs {
        let text = match meshkit_demo::admin_get(*addr, "/metrics").await {
            Ok(text) => text,
            Err(e) => {
                println!("        {part}: FAILED to scrape: {e}");
                ok = false;
                continue;
            }
        };
        if part == "gateway" {
            let mut codes: BTreeMap<String, f64> = BTreeMap::new();
            for (labels, value) in meshkit_demo::samples(&text, "istio_requests_total") {
                let code = labels.get("response_code").cloned().unwrap_or_default();
                *codes.entry(code).or_default() += value;
            }
            let codes: Vec<String> = codes.iter().map(|(c, n)| format!("{c} x{n}")).collect();
            println!(
                "        gateway: istio_requests_total by response_code: {}",
                codes.join(", ")
            );
        } else if part != "control-plane" {
            // Inbound (reporter=destination): who connected, and the bytes each way.
            let mut peers: BTreeMap<String, [f64; 4]> = BTreeMap::new();
            for (i, name) in [
                "istio_tcp_connections_opened_total",
                "istio_tcp_connections_closed_total",
                "istio_tcp_received_bytes_total",
                "istio_tcp_sent_bytes_total",
            ]
            .iter()
            .enumerate()
            {
                for (labels, value) in meshkit_demo::samples(&text, name) {
                    if labels.get("reporter").map(String::as_str) != Some("destination") {
                        continue;
                    }
                    let peer = labels.get("source_principal").cloned().unwrap_or_default();
                    peers.entry(peer).or_default()[i] += value;
                }
            }
            // Bytes are counted when a connection closes; the gateway's pooled tunnels are
            // still open here.
            for (peer, [opened, closed, received, sent]) in &peers {
                println!(
                    "        {part}: from {peer}: {opened} connections opened, {closed} closed ({received} bytes in, {sent} bytes out)"
                );
            }
        }
    }
    ok
}

struct Answer {
    status: u16,
    workload: Option<String>,
    identity: Option<String>,
    echo_path_ok: bool,
    latency: Duration,
}

/// One Gateway API case: the request (path and headers) and what must answer it.
struct RouteCase {
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    /// The workloads that must answer, each the number of times, over `requests` requests.
    expect: &'static [(&'static str, usize)],
    requests: usize,
    why: &'static str,
}

const ROUTE_CASES: &[RouteCase] = &[
    RouteCase {
        path: "/cart",
        headers: &[("x-canary", "true")],
        expect: &[("api-1", 4)],
        requests: 4,
        why: "header match x-canary: true",
    },
    RouteCase {
        path: "/cart",
        headers: &[],
        // web 3 : fallback 1, and web's share round-robin over its two workloads.
        expect: &[("fallback-1", 2), ("web-1", 3), ("web-2", 3)],
        requests: 8,
        why: "weights 3:1, x-route set on the answer",
    },
    RouteCase {
        path: "/blog/posts/1",
        headers: &[],
        expect: &[("blog-1", 2)],
        requests: 2,
        why: "backend in namespace blog (ReferenceGrant)",
    },
];

/// The Gateway API cases through the gateway's listener for the sample Gateway, and its
/// redirect; each is printed with what answered.
async fn check_gateway_api(mesh: &DemoMesh, tally: &mut Tally) -> bool {
    let addr = SocketAddr::new(mesh.gateway_api, meshkit_demo::GATEWAY_API_PORT);
    let host = "store.example.com";
    let mut all_ok = true;
    for case in ROUTE_CASES {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let mut marked = true;
        for _ in 0..case.requests {
            match route_request(addr, host, case.path, case.headers).await {
                Ok(answer) => {
                    *tally.statuses.entry(answer.status).or_default() += 1;
                    if let Some(id) = answer.identity {
                        *tally.identities.entry(id).or_default() += 1;
                    }
                    // The split's rule marks its answers; the others do not.
                    marked &= answer.x_route.as_deref()
                        == (case.why.contains("x-route")).then_some("shop/store");
                    let who = answer
                        .workload
                        .unwrap_or_else(|| format!("status {}", answer.status));
                    *seen.entry(who).or_default() += 1;
                }
                Err(e) => *seen.entry(format!("error: {e}")).or_default() += 1,
            }
        }
        let expected: BTreeMap<String, usize> = case
            .expect
            .iter()
            .map(|(w, n)| ((*w).to_owned(), *n))
            .collect();
        let ok = seen == expected && marked;
        all_ok &= ok;
        let answered: Vec<String> = seen.iter().map(|(w, n)| format!("{w} x{n}")).collect();
        let headers: Vec<String> = case
            .headers
            .iter()
            .map(|(n, v)| format!("{n}: {v}"))
            .collect();
        println!(
            "      {host}{:<14} {:<18} {:<34} {:<7} {}",
            case.path,
            headers.join(", "),
            answered.join(", "),
            if ok { "ok" } else { "FAILED" },
            case.why
        );
    }
    let expected_location = format!("http://{host}:{}/new", meshkit_demo::GATEWAY_API_PORT);
    let redirect = route_request(addr, host, "/old", &[]).await;
    let ok = matches!(&redirect, Ok(a) if a.status == 301 && a.location.as_deref() == Some(expected_location.as_str()));
    all_ok &= ok;
    let shown = match &redirect {
        Ok(a) => format!(
            "{} {}",
            a.status,
            a.location.as_deref().unwrap_or("(no Location)")
        ),
        Err(e) => format!("error: {e}"),
    };
    println!(
        "      {host}{:<14} {:<18} {:<34} {:<7} RequestRedirect ReplaceFullPath /new",
        "/old",
        "",
        shown,
        if ok { "ok" } else { "FAILED" },
    );
    all_ok
}

/// What a Gateway API request got.
struct RouteAnswer {
    status: u16,
    workload: Option<String>,
    identity: Option<String>,
    location: Option<String>,
    x_route: Option<String>,
}

/// One HTTP/1.1 request with extra headers, over a new connection.
async fn route_request(
    addr: SocketAddr,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<RouteAnswer, CliError> {
    let sock = TcpStream::connect(addr).await?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(sock)).await?;
    tokio::spawn(conn);
    let mut req = hyper::Request::get(path).header(hyper::header::HOST, host);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = send.send_request(req.body(Empty::<Bytes>::new())?).await?;
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let answer = RouteAnswer {
        status: resp.status().as_u16(),
        workload: header(BACKEND_WORKLOAD),
        identity: header(BACKEND_IDENTITY),
        location: header("location"),
        x_route: header("x-route"),
    };
    let _ = resp.into_body().collect().await?;
    Ok(answer)
}

/// One request to the gateway over a new connection, HTTP/1.1 or HTTP/2 prior knowledge.
async fn request(
    gateway: SocketAddr,
    host: &str,
    path: &str,
    http2: bool,
) -> Result<Answer, CliError> {
    let started = Instant::now();
    let sock = TcpStream::connect(gateway).await?;
    let io = hyper_util::rt::TokioIo::new(sock);
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .body(Empty::<Bytes>::new())?;
    let resp = if http2 {
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io).await?;
        tokio::spawn(conn);
        let mut req = req;
        *req.uri_mut() = format!("http://{host}{path}").parse()?;
        req.headers_mut().remove(hyper::header::HOST);
        send.send_request(req).await?
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(conn);
        send.send_request(req).await?
    };
    let status = resp.status().as_u16();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (workload, identity) = (header(BACKEND_WORKLOAD), header(BACKEND_IDENTITY));
    let body = resp.into_body().collect().await?.to_bytes();
    let echo_path_ok = serde_json::from_slice::<EchoReply>(&body)
        .map(|reply| reply.path == path && reply.headers.contains_key("x-forwarded-for"))
        .unwrap_or(status != 200);
    Ok(Answer {
        status,
        workload,
        identity,
        echo_path_ok,
        latency: started.elapsed(),
    })
}

/// A request over TLS with SNI shop.example.com, accepting only the certificate of the
/// shop-tls Secret the gateway received over xDS.
async fn https_request(gateway: SocketAddr, mesh: &DemoMesh) -> Result<String, CliError> {
    let secret = mesh
        .gateway_secret("shop-tls")
        .ok_or("the gateway has no shop-tls Secret")?;
    let expected = meshkit_identity::certs_from_pem(&secret.cert_pem)?;
    let config = rustls::ClientConfig::builder_with_provider(meshkit_cli::crypto_provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned(expected[0].clone().into_owned())))
        .with_no_client_auth();
    let sock = TcpStream::connect(gateway).await?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            rustls::pki_types::ServerName::try_from("shop.example.com")?,
            sock,
        )
        .await?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    let req = hyper::Request::get("/")
        .header(hyper::header::HOST, "shop.example.com")
        .body(Empty::<Bytes>::new())?;
    let resp = send.send_request(req).await?;
    if resp.status() != 200 {
        return Err(format!("status {}", resp.status()).into());
    }
    resp.headers()
        .get(BACKEND_WORKLOAD)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| "no backend header".into())
}

/// Accepts exactly one certificate: the demo pins the Secret it served (its key is public).
#[derive(Debug)]
struct Pinned(rustls::pki_types::CertificateDer<'static>);

impl rustls::client::danger::ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.0.as_ref() {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &meshkit_cli::crypto_provider().signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &meshkit_cli::crypto_provider().signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        meshkit_cli::crypto_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A client for the API server of the kubeconfig at `path`.
async fn kube_client(path: &std::path::Path) -> Result<kube::Client, CliError> {
    let file = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?;
    Ok(meshkit_control_plane::kube_source::client(
        &config,
        meshkit_cli::crypto_provider(),
    )?)
}

/// Prints the workloads and services the control plane derived from the API's objects: what
/// it serves as Address resources.
fn print_derived(mesh: &DemoMesh) {
    use meshkit_mesh::proto::workload::{Address, address};
    use prost::Message as _;
    let snapshot = mesh.control_plane.cache().current();
    let Some(addresses) = snapshot.get_type(meshkit_mesh::resources::ADDRESS_TYPE_URL) else {
        return;
    };
    println!("      derived from the API's objects:");
    for (name, resource) in addresses.resources() {
        match Address::decode(resource.resource.value.as_slice()).map(|a| a.r#type) {
            Ok(Some(address::Type::Workload(w))) => println!(
                "        workload {name}: {} on {}, identity {}/{}",
                w.addresses
                    .iter()
                    .map(|a| meshkit_mesh::feed::ip_from_bytes(a)
                        .map_or("?".into(), |ip| ip.to_string()))
                    .collect::<Vec<_>>()
                    .join(","),
                if w.node.is_empty() {
                    "no node"
                } else {
                    &w.node
                },
                w.namespace,
                w.service_account,
            ),
            Ok(Some(address::Type::Service(svc))) => println!(
                "        service  {name}: ports {}",
                svc.ports
                    .iter()
                    .map(|p| format!("{}->{}", p.service_port, p.target_port))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            _ => {}
        }
    }
}
