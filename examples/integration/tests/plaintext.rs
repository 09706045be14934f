//! Inbound plaintext through meshkit's node proxy, as ztunnel takes it on port 15006: in two
//! network namespaces the test creates (see `netns/mod.rs`), netfilter redirects TCP for
//! workload `mk/mk-app` (10.250.0.2, in `M`) to the node proxy's plaintext listener, and a
//! client in `Z` (10.250.0.1, no mesh identity) connects to the workload's address.
//!
//! - Allowed, the bytes and the half-close cross intact, and the metrics say
//!   `connection_security_policy="none"`.
//! - The mesh's policies decide by the client's address (a DENY by `ipBlocks` on one port).
//! - A connection straight to the listener, not redirected, names no workload: refused.
//! - A STRICT PeerAuthentication, added to the manifests, refuses the plaintext client within
//!   a second or so.
//!
//! Needs root, `ip`, `iptables` and `python3`; without them it says why and returns.

mod netns;

use std::path::Path;
use std::time::{Duration, Instant};

use netns::{CLIENT, ECHO, Netns, exchange, until};

const MANIFESTS: &str = r#"
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: mk-app, namespace: mk}
spec: {address: 10.250.0.2, serviceAccount: mkapp, labels: {app: mkapp, meshkit.io/node: node-m}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: mk-echo, namespace: mk}
spec:
  hosts: [mk-echo.mk.svc.cluster.local]
  ports:
  - {number: 80, name: tcp, protocol: TCP, targetPort: 9000}
  - {number: 81, name: tcp-alt, protocol: TCP, targetPort: 9001}
  workloadSelector: {labels: {app: mkapp}}
"#;

/// The client's address may reach port 9000 and not 9001.
const POLICIES: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-z-on-9001, namespace: mk}
spec:
  action: DENY
  rules:
  - from: [{source: {ipBlocks: [10.250.0.1/32]}}]
    to: [{operation: {ports: ["9001"]}}]
"#;

const STRICT: &str = r#"
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: strict, namespace: mk}
spec: {mtls: {mode: STRICT}}
"#;

/// A client in `Z` that sends `size` bytes to `port` of `ip`: whether mk-app answered with
/// exactly what it was sent.
fn answered(ns: &Netns, client: &Path, ip: &str, port: &str, size: &str) -> Result<(), String> {
    let (answer, expected) =
        exchange(ns, &ns.z, client, &["direct", "10.250.0.1", ip, port, size])?;
    if answer == format!("mk-app {expected}") {
        Ok(())
    } else {
        Err(format!("answered {answer:?}, expected mk-app {expected}"))
    }
}

fn metric(ns: &Netns, prefix: &str) -> Option<String> {
    let out = ns.run(&ns.m, &["curl", "-s", "http://127.0.0.1:15020/metrics"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with(prefix))
        .map(str::to_owned)
}

#[test]
fn redirected_plaintext_is_decided_by_the_mesh_policies_without_an_identity() {
    let ns = match Netns::try_create() {
        Ok(ns) => ns,
        Err(why) => {
            eprintln!("skipped: cannot make network namespaces here ({why})");
            return;
        }
    };
    if let Err(why) = ns.redirect(&ns.m, "10.250.0.2", &[9000, 9001], 15006) {
        eprintln!("skipped: cannot redirect with iptables here ({why})");
        return;
    }
    let dir = std::env::temp_dir().join(format!("meshkit-plaintext-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("manifests")).unwrap();
    std::fs::write(dir.join("manifests/mesh.yaml"), MANIFESTS).unwrap();
    std::fs::write(dir.join("manifests/policies.yaml"), POLICIES).unwrap();
    std::fs::write(dir.join("tokens.txt"), "mk-token node=node-m\n").unwrap();
    std::fs::write(dir.join("mk-token"), "mk-token").unwrap();
    std::fs::write(dir.join("echo.py"), ECHO).unwrap();
    std::fs::write(dir.join("client.py"), CLIENT).unwrap();

    let _cp = ns.control_plane(&dir);
    let _echo = ns.echo(&ns.m, &dir, "10.250.0.2", &["9000", "9001"], "mk-app");
    let _node = ns.node_proxy(&dir, &["--inbound-plaintext", "0.0.0.0:15006"]);
    let client = dir.join("client.py");

    // Allowed: a MiB there, the half-close, the digest back.
    until("plaintext reaches mk-app through the node proxy", || {
        answered(&ns, &client, "10.250.0.2", "9000", "1048576").ok()
    });
    let opened =
        metric(&ns, "istio_tcp_connections_opened_total{").expect("the connection is counted");
    assert!(
        opened.contains("connection_security_policy=\"none\"")
            && opened.contains("destination_workload=\"mk-app\"")
            && opened.contains("reporter=\"destination\""),
        "{opened}"
    );

    // The client's address is what the policies see: the DENY by ipBlocks on 9001.
    let denied = answered(&ns, &client, "10.250.0.2", "9001", "1000");
    assert!(denied.is_err(), "the DENY by ipBlocks admitted it");
    until("the denial counted", || {
        metric(
            &ns,
            "meshkit_node_proxy_policy_denials_total{reason=\"authorization_policy\"} 1",
        )
    });

    // Straight to the listener: no original destination, no workload.
    let direct = answered(&ns, &client, "10.250.0.2", "15006", "1000");
    assert!(
        direct.is_err(),
        "the listener served an unredirected connection"
    );
    until("the unredirected connection counted", || {
        metric(
            &ns,
            "meshkit_node_proxy_policy_denials_total{reason=\"not_redirected\"} 1",
        )
    });

    // STRICT: connections without a principal are denied.
    std::fs::write(
        dir.join("manifests/policies.yaml"),
        format!("{POLICIES}{STRICT}"),
    )
    .unwrap();
    let edited_at = Instant::now();
    until("STRICT refuses the plaintext client", || {
        answered(&ns, &client, "10.250.0.2", "9000", "1000").err()
    });
    let took = edited_at.elapsed();
    eprintln!("the node proxy's decision changed {took:?} after the manifest edit");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // The client sees the refusal before the node proxy's log line reaches the file.
    until(
        "the denial in the node proxy's log names the STRICT policy",
        || {
            let log = std::fs::read_to_string(dir.join("node-proxy.log")).ok()?;
            log.lines()
                .any(|l| {
                    l.contains("inbound plaintext denied by authorization policy")
                        && l.contains("istio_converted_static_strict")
                })
                .then_some(())
        },
    );
    let _ = std::fs::remove_dir_all(&dir);
}
