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
            // Any free port: tests run at once, and the default admin port is one for all.
            .args(["--node", "node-a", "--ca", "http://127.0.0.1:9"])
            .args(["--admin-addr", "127.0.0.1:0"])
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
            // Any free port: tests run at once, and the default admin port is one for all.
            .args(["--node", "node-a", "--ca", "http://127.0.0.1:9"])
            .args(["--admin-addr", "127.0.0.1:0"])
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

/// The admin endpoint answers while the node proxy cannot start serving (its CA is down):
/// not ready, saying why, with metrics and a config dump; SIGTERM then drains and exits 0.
#[test]
fn the_admin_endpoint_reports_why_it_is_not_ready_and_sigterm_drains() {
    use std::process::Stdio;
    let dir = temp_dir("admin");
    let ca = TestCa::new(TrustDomain::new("cluster.local").expect("td"));
    std::fs::write(dir.join("root.pem"), ca.root_pem()).expect("root");
    std::fs::write(
        dir.join("mesh.json"),
        r#"{"workloads": [{"name": "web-1", "namespace": "shop", "service_account": "web",
            "ip": "127.79.27.11", "node": "node-a"}]}"#,
    )
    .expect("mesh");
    let port = meshkit_test_support::free_port();
    let admin: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let stderr = std::fs::File::create(dir.join("stderr")).expect("stderr file");
    let child = Command::new(env!("CARGO_BIN_EXE_node-proxy"))
        .args(["--node", "node-a", "--ca", "http://127.0.0.1:9"])
        .args(["--hbone-port", "25008", "--drain-seconds", "2"])
        .arg("--admin-addr")
        .arg(admin.to_string())
        .arg("--ca-root")
        .arg(dir.join("root.pem"))
        .arg("--mesh")
        .arg(dir.join("mesh.json"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start node-proxy");
    let mut child = meshkit_test_support::KillOnDrop(child);
    meshkit_test_support::wait_port(port, Duration::from_secs(20));

    let (status, body) = meshkit_test_support::http_get(admin, "/healthz/ready");
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        body,
        "not ready: waiting for certificates; waiting for listeners\n"
    );
    let metrics = meshkit_test_support::scrape(admin);
    assert_eq!(
        metrics.value("meshkit_build", &[("component", "node-proxy")]),
        Some(1.0)
    );
    let (status, dump) = meshkit_test_support::http_get(admin, "/config_dump");
    assert_eq!(status, 200, "{dump}");
    let dump: serde_json::Value = serde_json::from_str(&dump).expect("JSON");
    assert_eq!(dump["node"], "node-a");
    assert_eq!(dump["workloads"][0]["name"], "web-1");
    let (status, _) = meshkit_test_support::http_request(admin, "PUT", "/logging?level=debug");
    assert_eq!(status, 200, "the binary lets /logging set its filter");

    let killed = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(exit) = child.0.try_wait().expect("poll node-proxy") {
            break exit;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node-proxy did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = std::fs::read_to_string(dir.join("stderr")).expect("stderr");
    assert_eq!(exit.code(), Some(0), "{log}");
    assert!(log.contains("draining"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}
