//! The main job, run as a user runs it: every check passes and the summary says so.

use std::process::Command;

#[test]
fn mesh_demo_passes_every_check() {
    let out = Command::new(env!("CARGO_BIN_EXE_mesh-demo"))
        .args(["--requests", "6"])
        .output()
        .expect("run mesh-demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("mesh-demo: all checks passed"), "{stdout}");
    assert!(!stdout.contains("FAILED"), "{stdout}");
    // Both hops verified identities: the gateway's at the node proxies, the backends' at
    // the gateway.
    assert!(stdout.contains(
        "node-a: spiffe://cluster.local/ns/istio-system/sa/ingress-gateway -> 127.0.0.13:9090"
    ));
    assert!(stdout.contains("spiffe://cluster.local/ns/blog/sa/blog x"));
}
