//! The mesh as separate processes, as people run it: `control-plane`, two `node-proxy --xds`
//! and an `ingress-gateway --xds`, with echo applications on the sample workload addresses.
//! A request through the gateway reaches the right workload over HBONE.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use meshkit_demo::{serve_echo, write_samples};
use meshkit_test_support::{KillOnDrop as Proc, free_port};
use tokio::net::TcpListener;

fn spawn(bin: PathBuf, args: &[&str], log: PathBuf) -> Proc {
    Proc(
        Command::new(bin)
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// `curl` through the gateway; the answering workload (the echo reply's `name`), if the
/// answer was a 200.
fn through_gateway(gateway: u16, host: &str, path: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "5"])
        .args(["-H", &format!("Host: {host}")])
        .arg(format!("http://127.0.0.1:{gateway}{path}"))
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let reply: meshkit_demo::EchoReply = serde_json::from_slice(&out.stdout).ok()?;
    Some(reply.name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_node_proxies_and_gateway_as_processes() {
    let dir = std::env::temp_dir().join(format!("meshkit-procs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_samples(&dir.join("manifests")).unwrap();
    std::fs::write(dir.join("tokens.txt"), meshkit_demo::DEMO_TOKENS).unwrap();
    let path = |f: &str| dir.join(f).display().to_string();

    // The applications, on the sample workload addresses.
    for (addr, name) in [
        ("127.0.0.13:9090", "api-1"),
        ("127.0.0.21:8080", "blog-1"),
        ("127.0.0.14:8080", "fallback-1"),
    ] {
        let listener = TcpListener::bind(addr.parse::<SocketAddr>().unwrap())
            .await
            .unwrap();
        tokio::spawn(serve_echo(listener, name.to_owned()));
    }

    let (ads, ca, gateway) = (free_port(), free_port(), free_port());
    // ADS and the CA over TLS (the control plane's default), each client with its token.
    let ads_url = format!("https://127.0.0.1:{ads}");
    let ca_url = format!("https://127.0.0.1:{ca}");
    for (file, token) in [
        ("node-a.token", "demo-node-a-token"),
        ("node-b.token", "demo-node-b-token"),
        ("gateway.token", "demo-gateway-token"),
    ] {
        std::fs::write(dir.join(file), format!("{token}\n")).unwrap();
    }
    let _cp = spawn(
        meshkit_test_support::workspace_bin("control-plane"),
        &[
            "--manifests",
            &path("manifests"),
            "--tokens",
            &path("tokens.txt"),
            "--admin-addr",
            "127.0.0.1:0",
            "--ads-listen",
            &format!("127.0.0.1:{ads}"),
            "--ca-listen",
            &format!("127.0.0.1:{ca}"),
            "--root-out",
            &path("root.pem"),
        ],
        dir.join("control-plane.log"),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !dir.join("root.pem").exists() {
        assert!(Instant::now() < deadline, "control plane did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut procs = Vec::new();
    for node in ["node-a", "node-b"] {
        // Each node proxy's admin endpoint on a port of its own (the default, 15020, is one).
        let admin = format!("127.0.0.1:{}", free_port());
        procs.push(spawn(
            meshkit_test_support::workspace_bin("node-proxy"),
            &[
                "--node",
                node,
                "--admin-addr",
                &admin,
                "--xds",
                &ads_url,
                "--ca",
                &ca_url,
                "--ca-root",
                &path("root.pem"),
                "--xds-ca",
                &path("root.pem"),
                "--xds-server-name",
                "istiod.istio-system.svc",
                "--xds-token-file",
                &path(&format!("{node}.token")),
            ],
            dir.join(format!("{node}.log")),
        ));
    }
    procs.push(spawn(
        meshkit_test_support::workspace_bin("ingress-gateway"),
        &[
            "--admin-addr",
            "127.0.0.1:0",
            "--listen",
            &format!("127.0.0.1:{gateway}"),
            // The test reads which workload answered from the backend headers.
            "--debug-backend-headers",
            "--xds",
            &ads_url,
            "--ca",
            &ca_url,
            "--ca-root",
            &path("root.pem"),
            "--xds-ca",
            &path("root.pem"),
            "--xds-server-name",
            "istiod.istio-system.svc",
            "--xds-token-file",
            &path("gateway.token"),
            "--node-id",
            "gateway",
        ],
        dir.join("gateway.log"),
    ));

    // Configuration and certificates take a moment to arrive; then every route answers.
    for (host, route, expect) in [
        ("shop.example.com", "/api/v1", "api-1"),
        ("blog.example.com", "/", "blog-1"),
        ("nobody.example.net", "/", "fallback-1"),
    ] {
        let deadline = Instant::now() + Duration::from_secs(20);
        let answered = loop {
            let got = tokio::task::spawn_blocking(move || through_gateway(gateway, host, route))
                .await
                .unwrap();
            if let Some(workload) = got {
                break workload;
            }
            if Instant::now() > deadline {
                let logs = [
                    "gateway.log",
                    "node-a.log",
                    "node-b.log",
                    "control-plane.log",
                ]
                .map(|f| std::fs::read_to_string(dir.join(f)).unwrap_or_default());
                panic!(
                    "{host}{route} never answered; logs:\n{}",
                    logs.join("\n---\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(answered, expect, "{host}{route}");
    }
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}
