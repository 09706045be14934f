//! The `node-proxy` binary refuses a configuration it cannot use, saying which file and why,
//! instead of starting half-configured.

use std::process::Command;
use std::time::Duration;

use meshkit_identity::TrustDomain;
use meshkit_identity::test_util::TestCa;

fn temp_dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("meshkit-np-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn a_mesh_file_that_is_not_json_is_refused_by_name() {
    let dir = temp_dir("bad-mesh");
    let ca = TestCa::new(TrustDomain::new("cluster.local").expect("td"));
    std::fs::write(dir.join("root.pem"), ca.root_pem()).expect("root");
    std::fs::write(dir.join("mesh.json"), "{ \"workloads\": [ {\"name\": ").expect("mesh");
    let out = meshkit_test_support::output_within(
        Command::new(env!("CARGO_BIN_EXE_node-proxy"))
            .args(["--node", "node-a", "--ca", "http://127.0.0.1:9"])
            .arg("--ca-root")
            .arg(dir.join("root.pem"))
            .arg("--mesh")
            .arg(dir.join("mesh.json")),
        Duration::from_secs(20),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(
        stderr.contains("mesh.json") && stderr.contains("is not a valid mesh"),
        "stderr: {stderr}"
    );
    // The cause is printed once, after the file.
    assert_eq!(stderr.matches("EOF").count(), 1, "stderr: {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_trust_bundle_is_refused_by_name() {
    let dir = temp_dir("no-root");
    std::fs::write(dir.join("mesh.json"), "{}").expect("mesh");
    let out = meshkit_test_support::output_within(
        Command::new(env!("CARGO_BIN_EXE_node-proxy"))
            .args(["--node", "node-a", "--ca", "http://127.0.0.1:9"])
            .arg("--ca-root")
            .arg(dir.join("absent.pem"))
            .arg("--mesh")
            .arg(dir.join("mesh.json")),
        Duration::from_secs(20),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.contains("absent.pem"), "stderr: {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
