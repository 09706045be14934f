//! meshkit's node proxies in a mesh run by a real istiod (test-support's fixture, against the
//! tests' kube-apiserver): configured only as ztunnel is, they take their workloads'
//! certificates from istiod's CA and their workloads and policies from istiod over Delta xDS,
//! carry traffic between them, and enforce the AuthorizationPolicy and PeerAuthentication
//! objects of the API server. Needs root for the network namespaces, `ip`, `iptables` and
//! `python3`; without them it says why and passes.
//!
//! Two network namespaces the test creates, joined by a veth pair (the ztunnel test's layout):
//!
//! - `Z` (10.250.0.1): node `node-z`, a meshkit node proxy and the workload `zt/zt-app`;
//! - `M` (10.250.0.2 to .10): node `node-m`, a meshkit node proxy, the workloads `mk/mk-app`
//!   and `mk/mk-other`, and the callers of the decision table.
//!
//! The API server holds a Pod for each (its IP, Ready, marked `ambient.istio.io/redirection:
//! enabled` as istio-cni marks an enrolled Pod), the Services over them, and a Pod of
//! ServiceAccount `istio-system/ztunnel` for each node proxy. Each node proxy knows what a
//! ztunnel knows: istiod's address, the root of the `istio-ca-root-cert` ConfigMap, a token
//! file holding a TokenRequest token bound to its own Pod with audience `istio-ca`, its Pod's
//! name and namespace, its node and the cluster id. istiod listens on the host's loopback; in
//! each namespace, `127.0.0.1:15012` relays to it through a Unix socket (Unix sockets belong to
//! no network namespace), so nothing leaves loopback and the namespaces.
//!
//! With `MESHKIT_ZTUNNEL` naming a ztunnel binary (built locally: it is in no registry), a
//! third namespace `Y` (10.251.0.1, joined to `M` by a second veth pair) holds a ztunnel fed by
//! the same istiod in dedicated mode for the workload `zt/yz-app`, labelled `role: target` as
//! zt-app is, so that the decision table's policies select both: traffic crosses between
//! ztunnel and meshkit both ways, and the decision table is run against both, with the same
//! answers required.

mod netns;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use meshkit_test_support::apiserver::{ApiServer, tail};
use meshkit_test_support::istiod::{CLUSTER_ID, Istiod, NODE_ACCOUNT, SERVER_NAME};
use meshkit_test_support::{KillOnDrop, output_within_from, workspace_bin};
use netns::{
    CLIENT, ECHO, Netns, PLAINTEXT, PLAINTEXT_PERMISSIVE, POLICIES, TABLE, exchange, until,
};

/// `relay.py PORT SOCKET`: 127.0.0.1:PORT of its network namespace, relayed to the Unix socket
/// SOCKET, each direction half-closed on its own.
const RELAY: &str = r#"
import socket, sys, threading
port, path = int(sys.argv[1]), sys.argv[2]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(64)
def pump(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass
while True:
    c, _ = s.accept()
    u = socket.socket(socket.AF_UNIX)
    try:
        u.connect(path)
    except OSError:
        c.close()
        continue
    threading.Thread(target=pump, args=(c, u), daemon=True).start()
    threading.Thread(target=pump, args=(u, c), daemon=True).start()
"#;

/// Where istiod is reached from inside a namespace.
const ISTIOD_PORT: u16 = 15012;

/// A workload Pod: (namespace, name, node, ServiceAccount, IP, labels, container ports).
type PodSpec = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static [u16],
);

/// The workloads: zt-app behind node-z's proxy, everything else behind node-m's.
const PODS: [PodSpec; 9] = [
    (
        "zt",
        "zt-app",
        "node-z",
        "ztapp",
        "10.250.0.1",
        "{app: ztapp, role: target}",
        &[9000, 9001],
    ),
    (
        "mk",
        "mk-app",
        "node-m",
        "mkapp",
        "10.250.0.2",
        "{app: mkapp}",
        &[8080],
    ),
    (
        "mk",
        "mk-other",
        "node-m",
        "other",
        "10.250.0.3",
        "{app: other}",
        &[8080],
    ),
    (
        "mk",
        "src-a",
        "node-m",
        "a",
        "10.250.0.4",
        "{app: src-a}",
        &[],
    ),
    (
        "ops",
        "src-admin",
        "node-m",
        "admin",
        "10.250.0.5",
        "{app: src-admin}",
        &[],
    ),
    (
        "ops",
        "src-intruder",
        "node-m",
        "intruder",
        "10.250.0.6",
        "{app: src-intruder}",
        &[],
    ),
    (
        "edge",
        "src-gw",
        "node-m",
        "gw",
        "10.250.0.7",
        "{app: src-gw}",
        &[],
    ),
    (
        "ops",
        "src-quarantined",
        "node-m",
        "quarantined",
        "10.250.0.8",
        "{app: src-quarantined}",
        &[],
    ),
    (
        "edge",
        "src-listed",
        "node-m",
        "listed",
        "10.250.0.10",
        "{app: src-listed}",
        &[],
    ),
];

/// The Services: zt-echo over zt-app (80 and 81), mk-echo over mk-app, mk-other over
/// mk-other.
const SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: zt-echo, namespace: zt}
spec:
  selector: {app: ztapp}
  ports:
  - {name: tcp, port: 80, targetPort: 9000}
  - {name: tcp-alt, port: 81, targetPort: 9001}
---
apiVersion: v1
kind: Service
metadata: {name: mk-echo, namespace: mk}
spec:
  selector: {app: mkapp}
  ports: [{name: tcp, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: mk-other, namespace: mk}
spec:
  selector: {app: other}
  ports: [{name: tcp, port: 80, targetPort: 8080}]
"#;

/// The cluster's objects: namespaces, nodes, ServiceAccounts, the workload Pods and the node
/// proxies' Pods (on addresses nothing binds: only their names and nodes matter).
fn cluster_yaml() -> String {
    let mut yaml = String::new();
    for ns in ["zt", "mk", "ops", "edge"] {
        yaml += &format!("---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n");
    }
    for node in ["node-z", "node-m"] {
        yaml += &format!("---\napiVersion: v1\nkind: Node\nmetadata: {{name: {node}}}\n");
    }
    let pod = |ns: &str,
               name: &str,
               node: &str,
               sa: &str,
               ip: &str,
               labels: &str,
               ports: &[u16]| {
        let ports: Vec<String> = ports
            .iter()
            .map(|p| format!("{{containerPort: {p}}}"))
            .collect();
        let enrolled = if ns == "istio-system" {
            String::new()
        } else {
            "\n  annotations: {ambient.istio.io/redirection: enabled}".to_owned()
        };
        format!(
            "---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {sa}, namespace: {ns}}}\n\
             ---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  \
             labels: {labels}{enrolled}\nspec:\n  nodeName: {node}\n  serviceAccountName: {sa}\n  \
             containers: [{{name: app, image: example.invalid/app, ports: [{}]}}]\nstatus:\n  \
             phase: Running\n  podIP: {ip}\n  podIPs: [{{ip: {ip}}}]\n  \
             conditions: [{{type: Ready, status: \"True\"}}]\n",
            ports.join(", ")
        )
    };
    for (ns, name, node, sa, ip, labels, ports) in PODS {
        yaml += &pod(ns, name, node, sa, ip, labels, ports);
    }
    for (name, node, ip) in [
        ("ztunnel-z", "node-z", "10.250.1.1"),
        ("ztunnel-m", "node-m", "10.250.1.2"),
    ] {
        yaml += &pod(
            NODE_ACCOUNT.0,
            name,
            node,
            NODE_ACCOUNT.1,
            ip,
            "{app: ztunnel}",
            &[],
        );
    }
    yaml
}

/// Relays connections to the Unix socket `path` to `upstream`, each direction half-closed on
/// its own; on threads of their own, for the rest of the test process.
fn unix_relay(path: &Path, upstream: SocketAddr) {
    let listener = UnixListener::bind(path).expect("the relay's socket");
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let (Ok(conn), Ok(up)) = (conn, TcpStream::connect(upstream)) else {
                continue;
            };
            let (conn2, up2) = (conn.try_clone().unwrap(), up.try_clone().unwrap());
            std::thread::spawn(move || {
                pump(conn, up2, |s: &TcpStream| s.shutdown(Shutdown::Write))
            });
            std::thread::spawn(move || {
                pump(up, conn2, |s: &UnixStream| s.shutdown(Shutdown::Write))
            });
        }
    });
}

fn pump<R: Read, W: Write>(mut from: R, mut to: W, close: impl Fn(&W) -> std::io::Result<()>) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = close(&to);
}

/// A meshkit node proxy in `netns`, configured as a ztunnel is: istiod's address (through
/// the relay), its root, the token file, its Pod, node and cluster; workloads over Delta xDS,
/// certificates from istiod's CA for the workloads of its node.
fn node_proxy(
    ns: &Netns,
    netns: &str,
    dir: &Path,
    (node, pod): (&str, &str),
    extra: &[&str],
) -> KillOnDrop {
    let path = |f: &str| dir.join(f).display().to_string();
    let istiod = format!("https://127.0.0.1:{ISTIOD_PORT}");
    let env: Vec<(&str, String)> = vec![
        ("NODE_NAME", node.to_owned()),
        ("POD_NAME", pod.to_owned()),
        ("POD_NAMESPACE", NODE_ACCOUNT.0.to_owned()),
        ("SERVICE_ACCOUNT", NODE_ACCOUNT.1.to_owned()),
        ("CLUSTER_ID", CLUSTER_ID.to_owned()),
        ("RUST_LOG", "info".to_owned()),
    ];
    let (root, token) = (path("root.pem"), path(&format!("{pod}.token")));
    let mut args = vec![
        "--xds",
        &istiod,
        "--ca",
        &istiod,
        "--ca-root",
        &root,
        "--xds-ca",
        &root,
        "--xds-server-name",
        SERVER_NAME,
        "--xds-token-file",
        &token,
        "--admin-addr",
        "127.0.0.1:15020",
        // Tunnels leave from the caller's own address, as ztunnel's in-pod mode's do: IP
        // blocks are judged by the HBONE connection's source.
        "--preserve-source-address",
        "--inbound-plaintext",
        "0.0.0.0:15006",
    ];
    args.extend_from_slice(extra);
    ns.spawn(
        netns,
        &workspace_bin("node-proxy"),
        &args,
        &env,
        &dir.join(format!("{node}.log")),
    )
}

/// A node proxy's config dump, from its admin endpoint in `netns`.
fn config_dump(ns: &Netns, netns: &str) -> Option<serde_json::Value> {
    config_dump_at(ns, netns, 15020)
}

/// The config dump of the admin endpoint on `127.0.0.1:port` in `netns` (ztunnel's is 15000).
fn config_dump_at(ns: &Netns, netns: &str, port: u16) -> Option<serde_json::Value> {
    let url = format!("http://127.0.0.1:{port}/config_dump");
    let out = ns.run(netns, &["curl", "-s", "--max-time", "2", &url]);
    serde_json::from_slice(&out.stdout).ok()
}

/// The identities of the certificates a node proxy holds.
fn identities(dump: &serde_json::Value) -> Vec<String> {
    dump["certificates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["identity"].as_str().map(str::to_owned))
        .collect()
}

/// Whether a client run from `from` in `netns` to `to:port` got the echo of `name` back with
/// every byte it sent.
fn reaches(
    ns: &Netns,
    netns: &str,
    client: &Path,
    (from, to, port): (&str, &str, &str),
    name: &str,
) -> bool {
    exchange(ns, netns, client, &["direct", from, to, port, "1000"])
        .is_ok_and(|(answer, expected)| answer == format!("{name} {expected}"))
}

/// The namespace of the ztunnel run, joined to `M` by a veth pair; removed on drop.
struct ZtunnelNamespace {
    name: String,
}

impl ZtunnelNamespace {
    fn create() -> Result<Self, String> {
        let id = std::process::id() % 100_000;
        let y = Self {
            name: format!("mkzt-y-{id}"),
        };
        let m = format!("mkzt-m-{id}");
        let (vy, vm) = (format!("mky{id}"), format!("mkn{id}"));
        let run = |args: &[&str]| -> Result<(), String> {
            let out = Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| format!("ip: {e}"))?;
            out.status.success().then_some(()).ok_or_else(|| {
                format!(
                    "ip {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )
            })
        };
        run(&["netns", "add", &y.name])?;
        run(&[
            "link", "add", &vy, "netns", &y.name, "type", "veth", "peer", "name", &vm, "netns", &m,
        ])?;
        run(&["-n", &y.name, "addr", "add", "10.251.0.1/24", "dev", &vy])?;
        run(&["-n", &m, "addr", "add", "10.251.0.254/24", "dev", &vm])?;
        for (netns, dev) in [(&y.name, &vy), (&m, &vm)] {
            run(&["-n", netns, "link", "set", dev, "up"])?;
        }
        run(&["-n", &y.name, "link", "set", "lo", "up"])?;
        run(&[
            "-n",
            &y.name,
            "route",
            "add",
            "default",
            "via",
            "10.251.0.254",
        ])?;
        Ok(y)
    }
}

impl Drop for ZtunnelNamespace {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// ztunnel's workload, its Service, its node.
const ZTUNNEL_OBJECTS: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: node-y}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: yzapp, namespace: zt}
---
apiVersion: v1
kind: Pod
metadata:
  name: yz-app
  namespace: zt
  labels: {app: yzapp, role: target}
  annotations: {ambient.istio.io/redirection: enabled}
spec:
  nodeName: node-y
  serviceAccountName: yzapp
  containers: [{name: app, image: example.invalid/app, ports: [{containerPort: 9000}, {containerPort: 9001}]}]
status:
  phase: Running
  podIP: 10.251.0.1
  podIPs: [{ip: 10.251.0.1}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Service
metadata: {name: yz-echo, namespace: zt}
spec:
  selector: {app: yzapp}
  ports:
  - {name: tcp, port: 80, targetPort: 9000}
  - {name: tcp-alt, port: 81, targetPort: 9001}
"#;

/// ztunnel in `netns`, in dedicated mode for zt/yz-app, configured only by its environment:
/// istiod (through the relay), its root, the workload's token.
fn ztunnel(ns: &Netns, netns: &str, binary: &Path, dir: &Path) -> KillOnDrop {
    let path = |f: &str| dir.join(f).display().to_string();
    let istiod = format!("https://127.0.0.1:{ISTIOD_PORT}");
    let env: Vec<(&str, String)> = vec![
        ("PROXY_MODE", "dedicated".into()),
        ("PROXY_WORKLOAD_INFO", "zt/yz-app/yzapp".into()),
        ("POD_NAME", "yz-app".into()),
        ("POD_NAMESPACE", "zt".into()),
        ("SERVICE_ACCOUNT", "yzapp".into()),
        ("NODE_NAME", "node-y".into()),
        ("INSTANCE_IP", "10.251.0.1".into()),
        ("CLUSTER_ID", CLUSTER_ID.into()),
        ("XDS_ADDRESS", istiod.clone()),
        ("CA_ADDRESS", istiod),
        ("XDS_ROOT_CA", path("root.pem")),
        ("CA_ROOT_CA", path("root.pem")),
        ("ALT_XDS_HOSTNAME", SERVER_NAME.into()),
        ("ALT_CA_HOSTNAME", SERVER_NAME.into()),
        ("AUTH_TOKEN", path("yz-app.token")),
        ("UNSTABLE_ENABLE_SOCKS5", "true".into()),
        // No iptables in the namespace to route answers to a spoofed source back to ztunnel.
        ("ENABLE_ORIG_SRC", "false".into()),
        ("RUST_LOG", "info".into()),
    ];
    ns.spawn(
        netns,
        binary,
        &["proxy", "ztunnel"],
        &env,
        &dir.join("ztunnel.log"),
    )
}

/// One workload the decision table runs against: which proxy fronts it, the outbound
/// listeners of node-m that reach its ports 9000 and 9001, its echo's name and its address.
struct TableTarget {
    proxy: &'static str,
    listeners: (&'static str, &'static str),
    name: &'static str,
    ip: &'static str,
}

/// The policy denials node proxy in `netns` has counted (every reason).
fn denials(ns: &Netns, netns: &str) -> usize {
    let metrics = ns.run(netns, &["curl", "-s", "http://127.0.0.1:15020/metrics"]);
    String::from_utf8_lossy(&metrics.stdout)
        .lines()
        .filter(|l| l.starts_with("meshkit_node_proxy_policy_denials_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
        .sum()
}

/// The refusals by policy of `target`'s proxy so far: node-z's denial count, or the policy
/// rejections in ztunnel's log `ztunnel_log`.
fn refusals(ns: &Netns, target: &TableTarget, ztunnel_log: &Path) -> usize {
    if target.proxy == "ztunnel" {
        let log = std::fs::read_to_string(ztunnel_log).unwrap_or_default();
        log.lines()
            .filter(|l| l.contains("policy rejection"))
            .count()
    } else {
        denials(ns, &ns.z)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meshkit_node_proxies_in_a_mesh_run_by_istiod() {
    let test = "meshkit_node_proxies_in_a_mesh_run_by_istiod";
    let Some(api) = ApiServer::start_or_skip(test).await else {
        return;
    };
    let ns = match Netns::try_create() {
        Ok(ns) => ns,
        Err(why) => {
            eprintln!("{test}: skipped, no network namespaces here: {why}");
            return;
        }
    };
    if let Err(why) = ns.iptables(&ns.z, &["-t", "nat", "-L"]) {
        eprintln!("{test}: skipped, no iptables in the namespaces: {why}");
        return;
    }
    let Some(istiod) = Istiod::start_or_skip(&api, test).await else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("meshkit-istiod-mesh-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = |f: &str| dir.join(f);
    for (file, text) in [
        ("echo.py", ECHO),
        ("client.py", CLIENT),
        ("relay.py", RELAY),
    ] {
        std::fs::write(path(file), text).unwrap();
    }
    // The root as istiod publishes it, in the ConfigMap every namespace gets.
    std::fs::write(path("root.pem"), istiod.root_pem()).unwrap();

    api.apply(&cluster_yaml()).await;
    api.apply(SERVICES).await;
    api.apply(POLICIES).await;
    let ztunnel_binary = std::env::var_os("MESHKIT_ZTUNNEL").map(std::path::PathBuf::from);
    let y = match &ztunnel_binary {
        Some(_) => {
            api.apply(ZTUNNEL_OBJECTS).await;
            let token = api
                .service_account_token("zt", "yzapp", &["istio-ca"], None)
                .await;
            std::fs::write(path("yz-app.token"), token).unwrap();
            Some(ZtunnelNamespace::create().expect("the ztunnel's namespace"))
        }
        None => {
            eprintln!("{test}: MESHKIT_ZTUNNEL is not set: no ztunnel in this run");
            None
        }
    };
    // Each node proxy's token: its ServiceAccount's, bound to its own Pod, for `istio-ca`.
    let pods: kube::Api<Pod> = kube::Api::namespaced(api.client(), NODE_ACCOUNT.0);
    for pod in ["ztunnel-z", "ztunnel-m"] {
        let object = pods.get(pod).await.expect("the node proxy's Pod");
        let token = api
            .service_account_token(NODE_ACCOUNT.0, NODE_ACCOUNT.1, &["istio-ca"], Some(&object))
            .await;
        std::fs::write(path(&format!("{pod}.token")), token).unwrap();
    }

    // istiod, reached from each namespace's loopback.
    let socket = path("istiod.sock");
    unix_relay(&socket, istiod.secure_addr());
    let relay = path("relay.py").display().to_string();
    let socket = socket.display().to_string();
    let port = ISTIOD_PORT.to_string();
    let _relays: Vec<KillOnDrop> = [&ns.z, &ns.m]
        .into_iter()
        .chain(y.as_ref().map(|y| &y.name))
        .map(|netns| {
            ns.spawn(
                netns,
                Path::new("python3"),
                &[&relay, &port, &socket],
                &[],
                &path(&format!("relay-{netns}.log")),
            )
        })
        .collect();

    // The applications, and the node proxies.
    let _echo_z = ns.echo(&ns.z, &dir, "10.250.0.1", &["9000", "9001"], "zt-app");
    let _echo_m = ns.echo(&ns.m, &dir, "10.250.0.2", &["8080"], "mk-app");
    let _echo_o = ns.echo(&ns.m, &dir, "10.250.0.3", &["8080"], "mk-other");
    let _proxy_z = node_proxy(
        &ns,
        &ns.z,
        &dir,
        ("node-z", "ztunnel-z"),
        &[
            "--instance-ip",
            "10.250.1.1",
            "--outbound",
            "10.250.0.1:15081=mk-echo.mk.svc.cluster.local:80",
            "--outbound",
            "10.250.0.1:15082=mk-other.mk.svc.cluster.local:80",
        ],
    );
    let mut m_args = vec![
        "--instance-ip",
        "10.250.1.2",
        "--outbound",
        "10.250.0.2:15081=zt-echo.zt.svc.cluster.local:80",
        "--outbound",
        "10.250.0.2:15082=zt-echo.zt.svc.cluster.local:81",
    ];
    if y.is_some() {
        m_args.extend([
            "--outbound",
            "10.250.0.2:15083=yz-echo.zt.svc.cluster.local:80",
            "--outbound",
            "10.250.0.2:15084=yz-echo.zt.svc.cluster.local:81",
        ]);
    }
    let _proxy_m = node_proxy(&ns, &ns.m, &dir, ("node-m", "ztunnel-m"), &m_args);
    // ztunnel, its application, and the redirection of its plaintext to its port 15006.
    let _ztunnel = match (&y, &ztunnel_binary) {
        (Some(y), Some(binary)) => {
            let echo = ns.echo(&y.name, &dir, "10.251.0.1", &["9000", "9001"], "yz-app");
            ns.redirect(&y.name, "10.251.0.1", &[9000, 9001], 15006)
                .expect("iptables in Y");
            Some((ztunnel(&ns, &y.name, binary, &dir), echo))
        }
        _ => None,
    };
    // Plaintext for zt-app arriving over the veth goes to its node proxy's port 15006, as
    // the platform's redirection does for ztunnel.
    ns.redirect(&ns.z, "10.250.0.1", &[9000, 9001], 15006)
        .expect("iptables in Z");

    // Each holds istiod's certificates for its own node's workloads, got by impersonation.
    let logs = || {
        format!(
            "node-z:\n{}\nnode-m:\n{}\nztunnel:\n{}\nistiod:\n{}",
            tail(&path("node-z.log")),
            tail(&path("node-m.log")),
            tail(&path("ztunnel.log")),
            istiod.log_tail()
        )
    };
    for (netns, expected) in [
        (&ns.z, &["spiffe://cluster.local/ns/zt/sa/ztapp"][..]),
        (
            &ns.m,
            &[
                "spiffe://cluster.local/ns/mk/sa/mkapp",
                "spiffe://cluster.local/ns/mk/sa/other",
                "spiffe://cluster.local/ns/ops/sa/admin",
            ][..],
        ),
    ] {
        let started = Instant::now();
        loop {
            let held = config_dump(&ns, netns)
                .map(|d| identities(&d))
                .unwrap_or_default();
            if expected.iter().all(|id| held.iter().any(|h| h == id)) {
                break;
            }
            assert!(
                started.elapsed() < netns::PATIENCE,
                "{netns}: certificates {held:?}, expected {expected:?}\n{}",
                logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    // Traffic both ways, bytes and half-close intact (the echo answers with the length and
    // SHA-256 of everything it read before the client's FIN).
    let client = path("client.py");
    let size = "1048576";
    let (answer, expected) = until("mk-app reaches zt-app through both node proxies", || {
        exchange(
            &ns,
            &ns.m,
            &client,
            &["direct", "10.250.0.2", "10.250.0.2", "15081", size],
        )
        .ok()
    });
    assert_eq!(answer, format!("zt-app {expected}"), "M -> Z\n{}", logs());
    let (answer, expected) = until("zt-app reaches mk-app through both node proxies", || {
        exchange(
            &ns,
            &ns.z,
            &client,
            &["direct", "10.250.0.1", "10.250.0.1", "15081", size],
        )
        .ok()
    });
    assert_eq!(answer, format!("mk-app {expected}"), "Z -> M\n{}", logs());
    // Each side verified the other's identity from istiod's CA: the access logs name both.
    for (log, line) in [
        (
            "node-z.log",
            "src_identity=spiffe://cluster.local/ns/mk/sa/mkapp",
        ),
        (
            "node-m.log",
            "src_identity=spiffe://cluster.local/ns/zt/sa/ztapp",
        ),
    ] {
        until(&format!("{log} names the peer"), || {
            let text = std::fs::read_to_string(path(log)).ok()?;
            text.lines().any(|l| l.contains(line)).then_some(())
        });
    }

    // ztunnel fed by the same istiod: its workload and certificate, then traffic both ways
    // between ztunnel and meshkit, 1 MiB each, bytes and half-close intact.
    if let Some(y) = &y {
        until(
            "ztunnel's workloads from istiod, its own among them",
            || {
                let dump = config_dump_at(&ns, &y.name, 15000)?;
                let workloads = dump["workloads"].as_array()?;
                let own = workloads.iter().any(|w| w["name"] == "yz-app");
                (own && workloads.len() > PODS.len()).then_some(())
            },
        );
        let (answer, expected) = until("yz-app reaches mk-app through ztunnel and meshkit", || {
            exchange(
                &ns,
                &y.name,
                &client,
                &["socks", "-", "10.250.0.2", "8080", size, "15080"],
            )
            .ok()
        });
        assert_eq!(
            answer,
            format!("mk-app {expected}"),
            "ztunnel -> meshkit\n{}",
            logs()
        );
        until("node-m's access log names ztunnel's workload", || {
            let text = std::fs::read_to_string(path("node-m.log")).ok()?;
            text.lines()
                .any(|l| l.contains("src_identity=spiffe://cluster.local/ns/zt/sa/yzapp"))
                .then_some(())
        });
        let (answer, expected) = until("src-a reaches yz-app through meshkit and ztunnel", || {
            exchange(
                &ns,
                &ns.m,
                &client,
                &["direct", "10.250.0.4", "10.250.0.2", "15083", size],
            )
            .ok()
        });
        assert_eq!(
            answer,
            format!("yz-app {expected}"),
            "meshkit -> ztunnel\n{}",
            logs()
        );
        // ztunnel's certificate (fetched when first needed) came from istiod's CA.
        let dump = config_dump_at(&ns, &y.name, 15000).expect("ztunnel's config dump");
        let held = identities(&dump);
        assert!(
            held.iter()
                .any(|i| i == "spiffe://cluster.local/ns/zt/sa/yzapp"),
            "{held:?}"
        );
    }

    // A Rust service built on the SDK crates alone joins the mesh (examples/join-mesh): its
    // own SVID from istiod's CA for its token, the workload API from istiod, an HBONE tunnel
    // to zt-echo by host name, verified as zt-app's identity; node-z's proxy decides by the
    // same policies (namespace ops admitted; edge refused, 401 as ztunnel answers).
    let data = path("join-mesh.in");
    std::fs::write(&data, meshkit_test_support::pattern(300_000)).unwrap();
    let digest = Command::new("sha256sum")
        .arg(&data)
        .output()
        .expect("sha256sum");
    let digest = String::from_utf8_lossy(&digest.stdout);
    let digest = digest
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned();
    for (namespace, admitted) in [("ops", true), ("edge", false)] {
        api.ensure_service_account(namespace, "sdk").await;
        let token = api
            .service_account_token(namespace, "sdk", &["istio-ca"], None)
            .await;
        let token_file = path(&format!("sdk-{namespace}.token"));
        std::fs::write(&token_file, token).unwrap();
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &ns.m])
            .arg(workspace_bin("join-mesh"))
            .args(["--istiod", &format!("https://127.0.0.1:{ISTIOD_PORT}")])
            .arg("--root")
            .arg(path("root.pem"))
            .arg("--token-file")
            .arg(&token_file)
            .args(["--namespace", namespace, "--service-account", "sdk"])
            .args(["--connect", "zt-echo.zt.svc.cluster.local:80"]);
        let input = std::fs::File::open(&data).unwrap();
        let out = output_within_from(&mut command, input, Duration::from_secs(60));
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        if admitted {
            assert!(
                out.status.success(),
                "join-mesh as {namespace}/sdk: {stderr}"
            );
            assert_eq!(stdout, format!("zt-app 300000 {digest}"), "{stderr}");
            assert!(
                stderr.contains("SVID from istiod's CA")
                    && stderr.contains("spiffe://cluster.local/ns/zt/sa/ztapp"),
                "{stderr}"
            );
        } else {
            assert!(
                !out.status.success(),
                "join-mesh as {namespace}/sdk was admitted"
            );
            assert!(
                stderr.contains("HBONE peer answered CONNECT with 401"),
                "refused by the policy: {stderr}"
            );
        }
    }

    // The decision table on zt-app, behind node-z's proxy, and on yz-app, behind ztunnel,
    // from the callers on node-m: the same answers on both.
    let mut targets = vec![TableTarget {
        proxy: "meshkit",
        listeners: ("15081", "15082"),
        name: "zt-app",
        ip: "10.250.0.1",
    }];
    if y.is_some() {
        targets.push(TableTarget {
            proxy: "ztunnel",
            listeners: ("15083", "15084"),
            name: "yz-app",
            ip: "10.251.0.1",
        });
    }
    // Each case's answer; a refusal must be a policy's at the destination's proxy, not a
    // failure on the way: that proxy counts (meshkit) or logs (ztunnel) exactly this one.
    let decide = |target: &TableTarget, case: &str, allowed: bool, attempt: &dyn Fn() -> bool| {
        if allowed {
            // A caller's first tunnel may wait for its certificate: an allowed case is
            // retried until it answers.
            until(&format!("{case} on {}", target.proxy), || {
                attempt().then_some(())
            });
            return true;
        }
        let before = refusals(&ns, target, &path("ztunnel.log"));
        let reached = attempt();
        if !reached {
            until(
                &format!("{case}: {} counts one refusal", target.proxy),
                || (refusals(&ns, target, &path("ztunnel.log")) == before + 1).then_some(()),
            );
        }
        reached
    };
    let mut rows = Vec::new();
    for (case, from, port, allowed) in TABLE {
        let mut seen = Vec::new();
        for target in &targets {
            let listener = if port == 9000 {
                target.listeners.0
            } else {
                target.listeners.1
            };
            let attempt = || {
                reaches(
                    &ns,
                    &ns.m,
                    &client,
                    (from, "10.250.0.2", listener),
                    target.name,
                )
            };
            let result = decide(target, case, allowed, &attempt);
            assert_eq!(result, allowed, "{case} on {}\n{}", target.proxy, logs());
            seen.push(result.to_string());
        }
        rows.push(format!("| {case} | {port} | {} |", seen.join(" | ")));
    }
    let plaintext = |target: &TableTarget, port: u16| {
        reaches(
            &ns,
            &ns.m,
            &client,
            ("10.250.0.10", target.ip, &port.to_string()),
            target.name,
        )
    };
    for (case, port, allowed) in PLAINTEXT {
        let mut seen = Vec::new();
        for target in &targets {
            let result = decide(target, case, allowed, &|| plaintext(target, port));
            assert_eq!(result, allowed, "{case} on {}\n{}", target.proxy, logs());
            seen.push(result.to_string());
        }
        rows.push(format!("| {case} | {port} | {} |", seen.join(" | ")));
    }

    // PeerAuthentication STRICT lifted in the API server: plaintext from the listed block is
    // admitted.
    let edited_at = Instant::now();
    api.apply(&POLICIES.replace("mode: STRICT", "mode: PERMISSIVE"))
        .await;
    let mut lifted = Vec::new();
    for target in &targets {
        until(
            &format!("{} admits plaintext once STRICT is lifted", target.proxy),
            || plaintext(target, 9000).then_some(()),
        );
        lifted.push(format!("{} {:?}", target.proxy, edited_at.elapsed()));
    }
    for (case, port, allowed) in PLAINTEXT_PERMISSIVE {
        let mut seen = Vec::new();
        for target in &targets {
            let result = decide(target, case, allowed, &|| plaintext(target, port));
            assert_eq!(result, allowed, "{case} on {}\n{}", target.proxy, logs());
            seen.push(result.to_string());
        }
        rows.push(format!("| {case} | {port} | {} |", seen.join(" | ")));
    }
    let header: Vec<&str> = targets.iter().map(|t| t.proxy).collect();
    eprintln!(
        "| case | port | {} allowed |\n|---|---|{}\n{}\nSTRICT lifted: enforced by {} after the edit",
        header.join(" allowed | "),
        "---|".repeat(targets.len()),
        rows.join("\n"),
        lifted.join(", ")
    );

    // An AuthorizationPolicy edit in the API server takes effect within a second: mk's
    // workloads stop admitting namespace zt, and node-m counts the refusal as a policy's.
    let before = denials(&ns, &ns.m);
    let (mut tries, edited_at) = (0, Instant::now());
    api.apply(&POLICIES.replace("namespaces: [zt]", "namespaces: [elsewhere]"))
        .await;
    loop {
        tries += 1;
        let refused = !reaches(
            &ns,
            &ns.z,
            &client,
            ("10.250.0.1", "10.250.0.1", "15081"),
            "mk-app",
        );
        if refused && denials(&ns, &ns.m) > before {
            break;
        }
        assert!(
            edited_at.elapsed() < netns::PATIENCE,
            "zt-app still admitted after the edit\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = edited_at.elapsed();
    eprintln!("the AuthorizationPolicy edit was enforced {took:?} after the write ({tries} tries)");
    assert!(took < Duration::from_secs(1), "the edit took {took:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
