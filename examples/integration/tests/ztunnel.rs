//! A real ztunnel joins a meshkit mesh. Needs a ztunnel binary (`MESHKIT_ZTUNNEL=/path`, built
//! locally: it is in no registry), root (for the network namespaces), `ip`, `iptables` and
//! `python3`;
//! without `MESHKIT_ZTUNNEL` it returns at once, so `--include-ignored` runs stay green.
//!
//! Two network namespaces the test creates, joined by a veth pair:
//!
//! - `Z` (10.250.0.1): ztunnel in dedicated mode for workload `zt/zt-app`, configured only with
//!   the control plane's `https://` addresses for xDS and the CA, their root, an alternate
//!   host name and a token file; an echo application on 10.250.0.1:9000; ztunnel's SOCKS5
//!   listener as the application's way out.
//! - `M` (10.250.0.2, .3): meshkit's control plane, one meshkit node proxy for node `node-m`
//!   (workloads `mk/mk-app` and `mk/mk-other`), and echo applications on both addresses.
//!
//! ztunnel takes its certificate from meshkit's CA and its workloads and policies from
//! meshkit's control plane over Delta xDS: first subscribed to every Address, then again in
//! on-demand mode (`XDS_ON_DEMAND`), where it asks for each address when it needs it. Traffic crosses HBONE both ways, bytes and
//! half-close intact (the echo answers with the length and SHA-256 of everything it read
//! before the client's FIN), each side verifying the other's identity; and the same policy
//! manifests decide on both proxies.

mod netns;

use std::path::{Path, PathBuf};
use std::time::Instant;

use netns::{
    CLIENT, ECHO, Netns, PLAINTEXT, PLAINTEXT_PERMISSIVE, POLICIES, TABLE, exchange, until,
};

const MANIFESTS: &str = r#"
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: zt-app, namespace: zt}
spec: {address: 10.250.0.1, serviceAccount: ztapp, labels: {app: ztapp, role: target, meshkit.io/node: node-z}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: zt-echo, namespace: zt}
spec:
  hosts: [zt-echo.zt.svc.cluster.local]
  ports:
  - {number: 80, name: tcp, protocol: TCP, targetPort: 9000}
  - {number: 81, name: tcp-alt, protocol: TCP, targetPort: 9001}
  workloadSelector: {labels: {app: ztapp}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: mk-app, namespace: mk}
spec: {address: 10.250.0.2, serviceAccount: mkapp, labels: {app: mkapp, meshkit.io/node: node-m}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: mk-other, namespace: mk}
spec: {address: 10.250.0.3, serviceAccount: other, labels: {app: other, meshkit.io/node: node-m}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: mk-echo, namespace: mk}
spec:
  hosts: [mk-echo.mk.svc.cluster.local]
  ports: [{number: 80, name: tcp, protocol: TCP, targetPort: 8080}]
  workloadSelector: {labels: {app: mkapp}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: mk-other, namespace: mk}
spec:
  hosts: [mk-other.mk.svc.cluster.local]
  ports: [{number: 80, name: tcp, protocol: TCP, targetPort: 8080}]
  workloadSelector: {labels: {app: other}}
---
# zt-app's twin behind meshkit's node proxy: same namespace, same `role` label, same ports.
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: mk-twin, namespace: zt}
spec: {address: 10.250.0.9, serviceAccount: twin, labels: {app: twin, role: target, meshkit.io/node: node-m}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: twin, namespace: zt}
spec:
  hosts: [twin.zt.svc.cluster.local]
  ports:
  - {number: 80, name: tcp, protocol: TCP, targetPort: 9000}
  - {number: 81, name: tcp-alt, protocol: TCP, targetPort: 9001}
  workloadSelector: {labels: {app: twin}}
---
# The callers of the decision table, on node-m.
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: src-a, namespace: mk}
spec: {address: 10.250.0.4, serviceAccount: a, labels: {app: src-a, meshkit.io/node: node-m}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: src-admin, namespace: ops}
spec: {address: 10.250.0.5, serviceAccount: admin, labels: {app: src-admin, meshkit.io/node: node-m}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: src-intruder, namespace: ops}
spec: {address: 10.250.0.6, serviceAccount: intruder, labels: {app: src-intruder, meshkit.io/node: node-m}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: src-gw, namespace: edge}
spec: {address: 10.250.0.7, serviceAccount: gw, labels: {app: src-gw, meshkit.io/node: node-m}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: src-quarantined, namespace: ops}
spec: {address: 10.250.0.8, serviceAccount: quarantined, labels: {app: src-quarantined, meshkit.io/node: node-m}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: src-listed, namespace: edge}
spec: {address: 10.250.0.10, serviceAccount: listed, labels: {app: src-listed, meshkit.io/node: node-m}}
"#;

/// Whether a plaintext client reaches `port` of zt-app (through ztunnel's port 15006) and of
/// mk-twin (through the node proxy's): the echo's own answer, with every byte, counts.
fn plaintext(ns: &Netns, client: &Path, port: u16) -> (bool, bool) {
    let port = port.to_string();
    let reached = |netns: &str, from: &str, to: &str, name: &str| {
        exchange(ns, netns, client, &["direct", from, to, &port, "1000"])
            .is_ok_and(|(answer, expected)| answer == format!("{name} {expected}"))
    };
    (
        reached(&ns.m, "10.250.0.10", "10.250.0.1", "zt-app"),
        reached(&ns.z, "10.250.0.1", "10.250.0.9", "mk-twin"),
    )
}

#[test]
#[ignore = "needs a locally built ztunnel (MESHKIT_ZTUNNEL) and root"]
fn a_real_ztunnel_joins_the_mesh() {
    let Some(ztunnel) = std::env::var_os("MESHKIT_ZTUNNEL").map(PathBuf::from) else {
        eprintln!("MESHKIT_ZTUNNEL is not set: skipped");
        return;
    };
    // ztunnel subscribing to every Address, then on demand (XDS_ON_DEMAND): nothing at
    // first, its own node's workloads pushed, every other address fetched when it needs it.
    for on_demand in [false, true] {
        eprintln!("== ztunnel with XDS_ON_DEMAND={on_demand}");
        joins(&ztunnel, on_demand);
    }
}

fn joins(ztunnel: &Path, on_demand: bool) {
    let dir = std::env::temp_dir().join(format!("meshkit-ztunnel-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("manifests")).unwrap();
    std::fs::write(dir.join("manifests/mesh.yaml"), MANIFESTS).unwrap();
    std::fs::write(dir.join("manifests/policies.yaml"), POLICIES).unwrap();
    std::fs::write(
        dir.join("tokens.txt"),
        "zt-token node=node-z spiffe://cluster.local/ns/zt/sa/ztapp\nmk-token node=node-m\n",
    )
    .unwrap();
    std::fs::write(dir.join("zt-token"), "zt-token").unwrap();
    std::fs::write(dir.join("mk-token"), "mk-token").unwrap();
    std::fs::write(dir.join("echo.py"), ECHO).unwrap();
    std::fs::write(dir.join("client.py"), CLIENT).unwrap();
    let path = |f: &str| dir.join(f).display().to_string();
    let ns = Netns::create();

    // M: the control plane, the echo applications, the node proxy.
    let _cp = ns.control_plane(&dir);
    let _echo_m = ns.echo(&ns.m, &dir, "10.250.0.2", &["8080"], "mk-app");
    let _echo_o = ns.echo(&ns.m, &dir, "10.250.0.3", &["8080"], "mk-other");
    let _echo_twin = ns.echo(&ns.m, &dir, "10.250.0.9", &["9000", "9001"], "mk-twin");
    let _node = ns.node_proxy(
        &dir,
        &[
            "--outbound",
            "10.250.0.2:15081=zt-echo.zt.svc.cluster.local:80",
            "--outbound",
            "10.250.0.2:15082=zt-echo.zt.svc.cluster.local:81",
            "--outbound",
            "10.250.0.2:15083=twin.zt.svc.cluster.local:80",
            "--outbound",
            "10.250.0.2:15084=twin.zt.svc.cluster.local:81",
            // Tunnels leave from the caller's own address, as ztunnel's in-pod mode's do:
            // ztunnel judges IP blocks by the HBONE connection's source.
            "--preserve-source-address",
            "--inbound-plaintext",
            "0.0.0.0:15006",
        ],
    );

    // Z: ztunnel, configured only by its environment, and its application.
    let zt_env: Vec<(&str, String)> = vec![
        ("PROXY_MODE", "dedicated".into()),
        ("PROXY_WORKLOAD_INFO", "zt/zt-app/ztapp".into()),
        ("POD_NAME", "zt-app".into()),
        ("POD_NAMESPACE", "zt".into()),
        ("SERVICE_ACCOUNT", "ztapp".into()),
        ("NODE_NAME", "node-z".into()),
        ("INSTANCE_IP", "10.250.0.1".into()),
        ("XDS_ADDRESS", "https://10.250.0.2:15010".into()),
        ("CA_ADDRESS", "https://10.250.0.2:15012".into()),
        ("XDS_ROOT_CA", path("root.pem")),
        ("CA_ROOT_CA", path("root.pem")),
        ("ALT_XDS_HOSTNAME", "istiod.istio-system.svc".into()),
        ("ALT_CA_HOSTNAME", "istiod.istio-system.svc".into()),
        ("AUTH_TOKEN", path("zt-token")),
        ("UNSTABLE_ENABLE_SOCKS5", "true".into()),
        // No iptables in the namespace to route answers to a spoofed source back to ztunnel.
        ("ENABLE_ORIG_SRC", "false".into()),
        ("RUST_LOG", "info".into()),
    ];
    let mut zt_env = zt_env;
    if on_demand {
        zt_env.push(("XDS_ON_DEMAND", "true".into()));
        // ztunnel refuses on-demand mode with its DNS proxy on.
        zt_env.push(("ISTIO_META_DNS_CAPTURE", "false".into()));
    }
    let _zt = ns.spawn(
        &ns.z,
        ztunnel,
        &["proxy", "ztunnel"],
        &zt_env,
        &dir.join("ztunnel.log"),
    );
    let _echo_z = ns.echo(&ns.z, &dir, "10.250.0.1", &["9000", "9001"], "zt-app");
    // Plaintext for zt-app and mk-twin arriving over the veth goes to port 15006 of their
    // proxies, as the platform's redirection does for ztunnel.
    ns.redirect(&ns.z, "10.250.0.1", &[9000, 9001], 15006)
        .expect("iptables in Z");
    ns.redirect(&ns.m, "10.250.0.9", &[9000, 9001], 15006)
        .expect("iptables in M");

    // ztunnel's view, from its own config dump: meshkit's workloads and policies.
    let dump = until(
        "ztunnel's workloads and policies from meshkit's control plane",
        || {
            let out = ns.run(
                &ns.z,
                &[
                    "curl",
                    "-s",
                    "--max-time",
                    "2",
                    "http://127.0.0.1:15000/config_dump",
                ],
            );
            let dump: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            let workloads = dump["workloads"].as_array()?.len();
            let policies = dump["policies"].as_array()?.len();
            // On demand, only its own workload comes before anything is asked for.
            let expected = if on_demand { 1 } else { 4 };
            (workloads >= expected && policies >= 6).then_some(dump)
        },
    );
    let names: Vec<&str> = dump["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["name"].as_str())
        .collect();
    let expected: &[&str] = if on_demand {
        &["zt-app"]
    } else {
        &["zt-app", "mk-app", "mk-other"]
    };
    for name in expected {
        assert!(names.contains(name), "{name} in {names:?}");
    }

    let client = path("client.py");
    let size = "1048576";
    // ztunnel -> meshkit: zt-app's connection through ztunnel's SOCKS5 to mk-app.
    let (answer, expected) = until("zt-app reaches mk-app through ztunnel and meshkit", || {
        exchange(
            &ns,
            &ns.z,
            Path::new(&client),
            &["socks", "-", "10.250.0.2", "8080", size, "15080"],
        )
        .ok()
    });
    assert_eq!(
        answer,
        format!("mk-app {expected}"),
        "bytes and half-close through both proxies"
    );
    if on_demand {
        // ztunnel asked for mk-app by its address and got it under that name.
        let log = std::fs::read_to_string(dir.join("ztunnel.log")).unwrap();
        assert!(
            log.lines()
                .any(|l| l.contains("received on demand request") && l.contains("/10.250.0.2")),
            "ztunnel never asked for mk-app's address"
        );
    }
    // meshkit's node proxy read the baggage ztunnel sent with the CONNECT.
    until("meshkit's access log shows ztunnel's baggage", || {
        let log = std::fs::read_to_string(dir.join("node-proxy.log")).ok()?;
        log.lines()
            .any(|l| l.contains("src_baggage=") && l.contains("k8s.namespace.name=zt"))
            .then_some(())
    });
    // ... and ztunnel's certificate came from meshkit's CA for zt-app's identity.
    let certs = ns.run(&ns.z, &["curl", "-s", "http://127.0.0.1:15000/config_dump"]);
    let certs: serde_json::Value = serde_json::from_slice(&certs.stdout).unwrap();
    let identities: Vec<String> = certs["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["identity"].as_str().map(str::to_owned))
        .collect();
    assert!(
        identities
            .iter()
            .any(|i| i == "spiffe://cluster.local/ns/zt/sa/ztapp"),
        "{identities:?}"
    );
    // mk-other, in namespace mk too, takes zt-app: mk's policy admits namespace zt.
    let (answer, expected) = exchange(
        &ns,
        &ns.z,
        Path::new(&client),
        &["socks", "-", "10.250.0.3", "8080", "1000", "15080"],
    )
    .expect("zt may reach mk-other");
    assert_eq!(answer, format!("mk-other {expected}"));

    // meshkit -> ztunnel: mk-app through meshkit's outbound listener to zt-app's echo.
    let (answer, expected) = until("mk-app reaches zt-app through meshkit and ztunnel", || {
        exchange(
            &ns,
            &ns.m,
            Path::new(&client),
            &["direct", "10.250.0.2", "10.250.0.2", "15081", size],
        )
        .ok()
    });
    assert_eq!(
        answer,
        format!("zt-app {expected}"),
        "bytes and half-close through both proxies"
    );
    // mk-other is refused by ztunnel (zt/allow-mkapp admits mk-app only).
    let refused = exchange(
        &ns,
        &ns.m,
        Path::new(&client),
        &["direct", "10.250.0.3", "10.250.0.2", "15081", "1000"],
    );
    assert!(refused.is_err(), "ztunnel admitted mk-other: {refused:?}");
    until("ztunnel's log names the policy rejection", || {
        let log = std::fs::read_to_string(dir.join("ztunnel.log")).ok()?;
        log.lines()
            .any(|l| {
                l.contains("src.identity=\"spiffe://cluster.local/ns/mk/sa/other\"")
                    && l.contains("policy rejection: allow policies exist, but none allowed")
            })
            .then_some(())
    });

    // meshkit refuses ztunnel once mk's policy no longer admits namespace zt: 401, counted.
    std::fs::write(
        dir.join("manifests/policies.yaml"),
        POLICIES.replace("namespaces: [zt]", "namespaces: [elsewhere]"),
    )
    .unwrap();
    let edited_at = Instant::now();
    until("meshkit refuses zt-app after the edit", || {
        exchange(
            &ns,
            &ns.z,
            Path::new(&client),
            &["socks", "-", "10.250.0.2", "8080", "1000", "15080"],
        )
        .err()
    });
    eprintln!(
        "meshkit's decision changed {:?} after the manifest edit",
        edited_at.elapsed()
    );
    let metrics = ns.run(&ns.m, &["curl", "-s", "http://127.0.0.1:15020/metrics"]);
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    assert!(
        metrics.lines().any(|l| l.starts_with(
            "meshkit_node_proxy_policy_denials_total{reason=\"authorization_policy\"}"
        )),
        "{metrics}"
    );
    std::fs::write(dir.join("manifests/policies.yaml"), POLICIES).unwrap();

    // The decision table, on both proxies: zt-app behind ztunnel (through node-m's
    // listeners for zt-echo) and its twin behind meshkit (through those for twin).
    let mut rows = Vec::new();
    for (case, from, port, allowed) in TABLE {
        let listeners = [
            (
                "ztunnel",
                if port == 9000 { "15081" } else { "15082" },
                "zt-app",
            ),
            (
                "meshkit",
                if port == 9000 { "15083" } else { "15084" },
                "mk-twin",
            ),
        ];
        let mut seen = Vec::new();
        for (proxy, listener, name) in listeners {
            // A caller's first tunnel may wait for its certificate: an allowed case is
            // retried until it answers, a denied one must stay denied.
            let result = if allowed {
                until(&format!("{case} on {proxy}"), || {
                    exchange(
                        &ns,
                        &ns.m,
                        Path::new(&client),
                        &["direct", from, "10.250.0.2", listener, "1000"],
                    )
                    .ok()
                });
                true
            } else {
                exchange(
                    &ns,
                    &ns.m,
                    Path::new(&client),
                    &["direct", from, "10.250.0.2", listener, "1000"],
                )
                .map(|(answer, _)| {
                    assert!(!answer.starts_with(name), "{case} on {proxy}: admitted")
                })
                .is_ok()
            };
            assert_eq!(result, allowed, "{case} on {proxy}");
            seen.push(result);
        }
        rows.push(format!("| {case} | {port} | {} | {} |", seen[0], seen[1]));
    }
    let client_path = Path::new(&client);
    for (case, port, allowed) in PLAINTEXT {
        let seen = plaintext(&ns, client_path, port);
        assert_eq!(seen, (allowed, allowed), "{case}");
        rows.push(format!("| {case} | {port} | {} | {} |", seen.0, seen.1));
    }
    eprintln!(
        "| case | port | ztunnel allowed | meshkit allowed |\n|---|---|---|---|\n{}",
        rows.join("\n")
    );
    // Every refusal was a policy's, not a failure on the way: ztunnel logged a policy
    // rejection for each case it refused (and for mk-other above), meshkit counted one for
    // each (and for zt-app above).
    let refused = TABLE.iter().filter(|(.., allowed)| !allowed).count()
        + PLAINTEXT.iter().filter(|(.., allowed)| !allowed).count();
    until("ztunnel's policy rejections", || {
        let log = std::fs::read_to_string(dir.join("ztunnel.log")).ok()?;
        let rejections = log
            .lines()
            .filter(|l| l.contains("policy rejection"))
            .count();
        (rejections == refused + 1).then_some(())
    });
    let metrics = ns.run(&ns.m, &["curl", "-s", "http://127.0.0.1:15020/metrics"]);
    let denials = String::from_utf8_lossy(&metrics.stdout)
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "meshkit_node_proxy_policy_denials_total{reason=\"authorization_policy\"} ",
            )
            .map(str::to_owned)
        })
        .unwrap_or_default();
    assert_eq!(
        denials,
        (refused + 1).to_string(),
        "meshkit's authorization denials"
    );

    // STRICT lifted: plaintext from the listed block is allowed on both, within a second.
    std::fs::write(
        dir.join("manifests/policies.yaml"),
        POLICIES.replace("mode: STRICT", "mode: PERMISSIVE"),
    )
    .unwrap();
    let edited_at = Instant::now();
    let mut changed = [None, None];
    until("both proxies admit plaintext once STRICT is lifted", || {
        let seen = plaintext(&ns, client_path, 9000);
        for (at, now) in changed.iter_mut().zip([seen.0, seen.1]) {
            if now && at.is_none() {
                *at = Some(edited_at.elapsed());
            }
        }
        changed.iter().all(Option::is_some).then_some(())
    });
    eprintln!(
        "STRICT lifted: ztunnel's decision changed {:?}, meshkit's {:?} after the manifest edit",
        changed[0].unwrap(),
        changed[1].unwrap()
    );
    let mut rows = Vec::new();
    for (case, port, allowed) in PLAINTEXT_PERMISSIVE {
        let seen = plaintext(&ns, client_path, port);
        assert_eq!(seen, (allowed, allowed), "{case}");
        rows.push(format!("| {case} | {port} | {} | {} |", seen.0, seen.1));
    }
    eprintln!("{}", rows.join("\n"));
    std::fs::write(dir.join("manifests/policies.yaml"), POLICIES).unwrap();

    // A policy edit: zt-app's policy now names mk-other instead; both decisions flip.
    let edited = POLICIES.replace(
        "cluster.local/ns/mk/sa/mkapp",
        "cluster.local/ns/mk/sa/other",
    );
    std::fs::write(dir.join("manifests/policies.yaml"), edited).unwrap();
    let edited_at = Instant::now();
    until("ztunnel admits mk-other after the edit", || {
        exchange(
            &ns,
            &ns.m,
            Path::new(&client),
            &["direct", "10.250.0.3", "10.250.0.2", "15081", "1000"],
        )
        .ok()
    });
    eprintln!(
        "ztunnel's decision changed {:?} after the manifest edit",
        edited_at.elapsed()
    );
    until("ztunnel refuses mk-app after the edit", || {
        exchange(
            &ns,
            &ns.m,
            Path::new(&client),
            &["direct", "10.250.0.2", "10.250.0.2", "15081", "1000"],
        )
        .err()
    });
    let _ = std::fs::remove_dir_all(&dir);
}
