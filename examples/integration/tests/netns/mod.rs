//! What the tests that run the mesh's programs in network namespaces share: two namespaces
//! joined by a veth pair, an echo application that answers with the length and SHA-256 of
//! what it read before the client's FIN, and a client that sends, half-closes and reads.
//!
//! - `Z` has 10.250.0.1;
//! - `M` has 10.250.0.2 to 10.250.0.10.
//!
//! Needs root, `ip` and `python3`; [`Netns::try_create`] says why it cannot run otherwise.

#![allow(dead_code)] // Each test binary uses its own part.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use meshkit_test_support::{KillOnDrop, workspace_bin};

/// Bound on every wait for a state the mesh must reach.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

pub(crate) const ECHO: &str = r#"
import hashlib, socket, sys, threading
addr, port, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((addr, port))
s.listen(64)
def serve(c):
    h, n = hashlib.sha256(), 0
    while True:
        b = c.recv(65536)
        if not b:
            break
        h.update(b)
        n += len(b)
    c.sendall(f"{name} {n} {h.hexdigest()}".encode())
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// `client.py MODE SRC DST_IP DST_PORT BYTES [PROXY_PORT]`: sends BYTES pseudo-random bytes,
/// half-closes, prints the answer and the expected digest. MODE `direct` connects from SRC to
/// DST; `socks` asks ztunnel's SOCKS5 listener on 127.0.0.1:PROXY_PORT for DST.
pub(crate) const CLIENT: &str = r#"
import hashlib, random, socket, struct, sys
mode, src, ip, port, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
data = random.Random(7).randbytes(size)
c = socket.socket()
c.settimeout(20)
if mode == "direct":
    c.bind((src, 0))
    c.connect((ip, port))
else:
    c.connect(("127.0.0.1", int(sys.argv[6])))
    c.sendall(b"\x05\x01\x00")
    assert c.recv(2) == b"\x05\x00", "socks method"
    c.sendall(b"\x05\x01\x00\x01" + socket.inet_aton(ip) + struct.pack(">H", port))
    reply = c.recv(10)
    if len(reply) < 2 or reply[1] != 0:
        print(f"refused socks {reply!r}")
        sys.exit(3)
try:
    c.sendall(data)
    c.shutdown(socket.SHUT_WR)
    answer = b""
    while True:
        b = c.recv(65536)
        if not b:
            break
        answer += b
except (ConnectionResetError, BrokenPipeError) as e:
    print(f"reset {e}")
    sys.exit(2)
print(answer.decode(errors="replace"))
print(f"expect {size} {hashlib.sha256(data).hexdigest()}")
"#;

/// The policies of the ztunnel and istiod tests: zt-app (namespace zt, labels `app: ztapp`,
/// `role: target`) takes mk-app only and the decision table's callers; mk's workloads take the
/// zt namespace only.
pub(crate) const POLICIES: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-mkapp, namespace: zt}
spec:
  selector: {matchLabels: {app: ztapp}}
  rules:
  - from: [{source: {principals: [cluster.local/ns/mk/sa/mkapp]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-zt, namespace: mk}
spec:
  rules:
  - from: [{source: {namespaces: [zt]}}]
---
# The decision table's policies: one set, for zt-app behind ztunnel and mk-twin behind
# meshkit alike.
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: target-allow, namespace: zt}
spec:
  selector: {matchLabels: {role: target}}
  rules:
  - from: [{source: {principals: [cluster.local/ns/mk/sa/a]}}]
    to: [{operation: {ports: ["9000"]}}]
  - from: [{source: {namespaces: [ops]}}]
  - from: [{source: {ipBlocks: [10.250.0.10/32, 10.250.0.1/32]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-quarantine, namespace: zt}
spec:
  action: DENY
  rules:
  - from: [{source: {ipBlocks: [10.250.0.8/32]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-intruders, namespace: zt}
spec:
  action: DENY
  rules:
  - from: [{source: {principals: ["*/sa/intruder"]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-9001, namespace: zt}
spec:
  action: DENY
  rules:
  - to: [{operation: {ports: ["9001"]}}]
    when: [{key: source.principal, notValues: [cluster.local/ns/ops/sa/admin]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: deny-mk-trial
  namespace: zt
  annotations: {istio.io/dry-run: "true"}
spec:
  action: DENY
  rules:
  - from: [{source: {namespaces: [mk]}}]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: strict, namespace: zt}
spec: {mtls: {mode: STRICT}}
"#;

/// Plaintext cases: (case, destination port, allowed), the same on both proxies. A client
/// without a mesh identity connects to the workload's own address, from a listed IP block
/// (10.250.0.10 in `M` for zt-app, 10.250.0.1 in `Z` for mk-twin); netfilter in the
/// destination's namespace redirects it to its proxy's port 15006.
pub(crate) const PLAINTEXT: [(&str, u16, bool); 2] = [
    (
        "plaintext from a listed IP block: STRICT denies (DENY over ALLOW)",
        9000,
        false,
    ),
    ("plaintext from a listed IP block, other port", 9001, false),
];

/// The same once STRICT is lifted (PERMISSIVE).
pub(crate) const PLAINTEXT_PERMISSIVE: [(&str, u16, bool); 2] = [
    (
        "plaintext, PERMISSIVE: ALLOW by IP block without an identity",
        9000,
        true,
    ),
    (
        "plaintext, PERMISSIVE, other port: DENY by notValues (no principal)",
        9001,
        false,
    ),
];

/// The decision table: (caller, its address, destination port, allowed), the same on
/// ztunnel's zt-app and meshkit's mk-twin.
pub(crate) const TABLE: [(&str, &str, u16, bool); 13] = [
    (
        "mk/sa/a: principal on its port (dry-run DENY not enforced)",
        "10.250.0.4",
        9000,
        true,
    ),
    (
        "mk/sa/a: principal on another port (DENY with notValues)",
        "10.250.0.4",
        9001,
        false,
    ),
    ("mk/sa/other: no ALLOW matches", "10.250.0.3", 9000, false),
    (
        "mk/sa/other: no ALLOW matches, other port",
        "10.250.0.3",
        9001,
        false,
    ),
    ("ops/sa/admin: namespace", "10.250.0.5", 9000, true),
    (
        "ops/sa/admin: exempt from the port DENY by notValues",
        "10.250.0.5",
        9001,
        true,
    ),
    (
        "ops/sa/intruder: DENY over ALLOW (principal suffix)",
        "10.250.0.6",
        9000,
        false,
    ),
    (
        "ops/sa/intruder: DENY over ALLOW, other port",
        "10.250.0.6",
        9001,
        false,
    ),
    (
        "edge/sa/gw: namespace not listed",
        "10.250.0.7",
        9000,
        false,
    ),
    (
        "edge/sa/gw: namespace not listed, other port",
        "10.250.0.7",
        9001,
        false,
    ),
    (
        "ops/sa/quarantined: DENY by IP block over the namespace ALLOW",
        "10.250.0.8",
        9000,
        false,
    ),
    (
        "edge/sa/listed: ALLOW by IP block (its namespace is not listed)",
        "10.250.0.10",
        9000,
        true,
    ),
    (
        "edge/sa/listed: ALLOW by IP block, other port (DENY with notValues)",
        "10.250.0.10",
        9001,
        false,
    ),
];

/// The network namespaces and veth pair of one run; removed on drop.
pub(crate) struct Netns {
    pub(crate) z: String,
    pub(crate) m: String,
}

impl Netns {
    /// The two namespaces, or why they cannot be made here.
    pub(crate) fn try_create() -> Result<Self, String> {
        let id = std::process::id() % 100_000;
        let (z, m) = (format!("mkzt-z-{id}"), format!("mkzt-m-{id}"));
        let (vz, vm) = (format!("mkz{id}"), format!("mkm{id}"));
        let run = |args: &[&str]| -> Result<(), String> {
            let out = Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| format!("ip: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "ip {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        run(&["netns", "add", &z])?;
        // From here on, a failure drops `ns`, which deletes what was made.
        let ns = Self {
            z: z.clone(),
            m: m.clone(),
        };
        run(&["netns", "add", &m])?;
        run(&[
            "link", "add", &vz, "netns", &z, "type", "veth", "peer", "name", &vm, "netns", &m,
        ])?;
        for (netns, dev, addrs) in [
            (&z, &vz, &["10.250.0.1/24"][..]),
            (
                &m,
                &vm,
                &[
                    "10.250.0.2/24",
                    "10.250.0.3/24",
                    "10.250.0.4/24",
                    "10.250.0.5/24",
                    "10.250.0.6/24",
                    "10.250.0.7/24",
                    "10.250.0.8/24",
                    "10.250.0.9/24",
                    "10.250.0.10/24",
                ][..],
            ),
        ] {
            for addr in addrs {
                run(&["-n", netns, "addr", "add", addr, "dev", dev])?;
            }
            run(&["-n", netns, "link", "set", dev, "up"])?;
            run(&["-n", netns, "link", "set", "lo", "up"])?;
        }
        Ok(ns)
    }

    /// The two namespaces; panics when they cannot be made.
    pub(crate) fn create() -> Self {
        Self::try_create().unwrap_or_else(|e| panic!("network namespaces: {e}"))
    }

    /// Runs `iptables ARGS` in `netns`.
    pub(crate) fn iptables(&self, netns: &str, args: &[&str]) -> Result<(), String> {
        let mut full = vec!["iptables"];
        full.extend_from_slice(args);
        let out = Command::new("ip")
            .args(["netns", "exec", netns])
            .args(&full)
            .output()
            .map_err(|e| format!("iptables: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "iptables {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Sends every TCP connection that arrives on `netns`'s veth for `ip` and one of
    /// `ports` to local port `to`, as a platform redirects a workload's traffic to its
    /// node proxy (netfilter `REDIRECT` in PREROUTING: local connections are not taken).
    pub(crate) fn redirect(
        &self,
        netns: &str,
        ip: &str,
        ports: &[u16],
        to: u16,
    ) -> Result<(), String> {
        let ports = ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let to = to.to_string();
        self.iptables(
            netns,
            &[
                "-t",
                "nat",
                "-A",
                "PREROUTING",
                "-p",
                "tcp",
                "-d",
                ip,
                "-m",
                "multiport",
                "--dports",
                &ports,
                "-j",
                "REDIRECT",
                "--to-ports",
                &to,
            ],
        )
    }

    pub(crate) fn spawn(
        &self,
        netns: &str,
        program: &Path,
        args: &[&str],
        envs: &[(&str, String)],
        log: &Path,
    ) -> KillOnDrop {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", netns])
            .arg(program)
            .args(args);
        for (k, v) in envs {
            command.env(k, v);
        }
        KillOnDrop(
            command
                .stdout(std::fs::File::create(log).unwrap())
                .stderr(Stdio::from(
                    std::fs::File::options().append(true).open(log).unwrap(),
                ))
                .spawn()
                .unwrap(),
        )
    }

    /// meshkit's control plane in `M`, on 10.250.0.2 (ADS :15010, CA :15012, admin on
    /// loopback :15014), reading `dir/manifests` and `dir/tokens.txt`; returns once it has
    /// written its root to `dir/root.pem`.
    pub(crate) fn control_plane(&self, dir: &Path) -> KillOnDrop {
        let path = |f: &str| dir.join(f).display().to_string();
        let cp = self.spawn(
            &self.m,
            &workspace_bin("control-plane"),
            &[
                "--manifests",
                &path("manifests"),
                "--tokens",
                &path("tokens.txt"),
                "--ads-listen",
                "10.250.0.2:15010",
                "--ca-listen",
                "10.250.0.2:15012",
                "--root-out",
                &path("root.pem"),
                "--admin-addr",
                "127.0.0.1:15014",
            ],
            &[],
            &dir.join("control-plane.log"),
        );
        until("the control plane's root", || {
            dir.join("root.pem").exists().then_some(())
        });
        cp
    }

    /// meshkit's node proxy for node `node-m` in `M`, fed by [`Netns::control_plane`] over
    /// `https://` with the token in `dir/mk-token`, its admin on loopback :15020, with
    /// `extra` arguments.
    pub(crate) fn node_proxy(&self, dir: &Path, extra: &[&str]) -> KillOnDrop {
        let path = |f: &str| dir.join(f).display().to_string();
        let (root, token) = (path("root.pem"), path("mk-token"));
        let mut args = vec![
            "--node",
            "node-m",
            "--xds",
            "https://10.250.0.2:15010",
            "--ca",
            "https://10.250.0.2:15012",
            "--ca-root",
            &root,
            "--xds-ca",
            &root,
            "--xds-token-file",
            &token,
            "--admin-addr",
            "127.0.0.1:15020",
        ];
        args.extend_from_slice(extra);
        self.spawn(
            &self.m,
            &workspace_bin("node-proxy"),
            &args,
            &[("RUST_LOG", "info".to_owned())],
            &dir.join("node-proxy.log"),
        )
    }

    /// The echo application (`dir/echo.py`) answering as `name` on each of `ports` of
    /// `addr`, in `netns`.
    pub(crate) fn echo(
        &self,
        netns: &str,
        dir: &Path,
        addr: &str,
        ports: &[&str],
        name: &str,
    ) -> Vec<KillOnDrop> {
        let script = dir.join("echo.py").display().to_string();
        ports
            .iter()
            .map(|port| {
                self.spawn(
                    netns,
                    Path::new("python3"),
                    &[&script, addr, port, name],
                    &[],
                    &dir.join(format!("echo-{name}-{port}.log")),
                )
            })
            .collect()
    }

    pub(crate) fn run(&self, netns: &str, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", netns])
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in [&self.z, &self.m] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// What a client run saw: `Ok((answer, expected))` or `Err(why)`.
pub(crate) fn exchange(
    ns: &Netns,
    netns: &str,
    script: &Path,
    args: &[&str],
) -> Result<(String, String), String> {
    let mut full = vec!["python3", script.to_str().unwrap()];
    full.extend_from_slice(args);
    let out = ns.run(netns, &full);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)));
    }
    let mut lines = stdout.lines();
    let answer = lines.next().unwrap_or_default().to_owned();
    let expected = lines
        .next()
        .unwrap_or_default()
        .trim_start_matches("expect ")
        .to_owned();
    Ok((answer, expected))
}

/// Polls `f` until it returns `Some`, for at most [`PATIENCE`].
pub(crate) fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "{what}: not after {PATIENCE:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
