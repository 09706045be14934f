//! The `ingress-gateway` binary refuses a configuration it cannot use, saying which file and
//! why, instead of starting half-configured.

use std::process::Command;
use std::time::Duration;

use meshkit_identity::TrustDomain;
use meshkit_identity::test_util::TestCa;

fn temp_dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("meshkit-gw-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn gateway(dir: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ingress-gateway"));
    command
        .args(["--listen", "127.0.0.1:0", "--ca", "http://127.0.0.1:9"])
        // Any free port: tests run at once, and the default admin port is one for all.
        .args(["--admin-addr", "127.0.0.1:0"])
        .arg("--ca-root")
        .arg(dir.join("root.pem"))
        .arg("--ingress")
        .arg(dir.join("ingress.yaml"))
        .arg("--mesh")
        .arg(dir.join("mesh.json"));
    command
}

#[test]
fn an_unparsable_ingress_file_is_refused_by_name() {
    let dir = temp_dir("bad-ingress");
    let ca = TestCa::new(TrustDomain::new("cluster.local").expect("td"));
    std::fs::write(dir.join("root.pem"), ca.root_pem()).expect("root");
    std::fs::write(dir.join("mesh.json"), "{}").expect("mesh");
    // A manifest cut off in the middle of a list.
    std::fs::write(
        dir.join("ingress.yaml"),
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: web}\nspec:\n  rules: [\n",
    )
    .expect("ingress");
    let out = meshkit_test_support::output_within(&mut gateway(&dir), Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.contains("ingress.yaml"), "stderr: {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_invalid_mesh_file_is_refused_by_name() {
    let dir = temp_dir("bad-mesh");
    let ca = TestCa::new(TrustDomain::new("cluster.local").expect("td"));
    std::fs::write(dir.join("root.pem"), ca.root_pem()).expect("root");
    std::fs::write(dir.join("mesh.json"), "{\"workloads\": 7}").expect("mesh");
    std::fs::write(dir.join("ingress.yaml"), "").expect("ingress");
    let out = meshkit_test_support::output_within(&mut gateway(&dir), Duration::from_secs(20));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("mesh.json") && stderr.contains("is not a valid mesh"),
        "stderr: {stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_invalid_trusted_proxy_is_refused() {
    let dir = temp_dir("bad-trusted-proxy");
    let out = meshkit_test_support::output_within(
        gateway(&dir).args(["--trusted-proxy", "10.0.0.0/40"]),
        Duration::from_secs(20),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(
        stderr.contains("--trusted-proxy") && stderr.contains("not a prefix length"),
        "stderr: {stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
