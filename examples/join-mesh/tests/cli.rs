//! `join-mesh` refuses what it cannot use before it reaches the network, naming the flag or
//! file at fault; its run against a real istiod is `examples/integration/tests/istiod.rs`.

use std::process::Command;
use std::time::Duration;

use meshkit_test_support::output_within;

/// Runs `join-mesh` with the flags every case needs and `extra`; its exit and standard error.
fn run(extra: &[&str]) -> (bool, String) {
    let dir = std::env::temp_dir().join(format!("meshkit-join-mesh-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("token"), "not-a-real-token").unwrap();
    std::fs::write(dir.join("not-pem"), "hello").unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_join-mesh"));
    command
        .current_dir(&dir)
        .env_clear()
        .args(["--istiod", "https://127.0.0.1:9"])
        .args(["--token-file", "token"])
        .args(["--namespace", "shop", "--service-account", "web"])
        .args(extra);
    let out = output_within(&mut command, Duration::from_secs(20));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_target_without_a_port_is_refused() {
    let (ok, stderr) = run(&[
        "--root",
        "not-pem",
        "--connect",
        "web.shop.svc.cluster.local",
    ]);
    assert!(!ok);
    assert!(stderr.contains("--connect: expected HOST:PORT"), "{stderr}");
}

#[test]
fn a_missing_root_is_named() {
    let (ok, stderr) = run(&[
        "--root",
        "missing.pem",
        "--connect",
        "web.shop.svc.cluster.local:80",
    ]);
    assert!(!ok);
    assert!(stderr.contains("--root missing.pem"), "{stderr}");
}

#[test]
fn a_root_that_is_not_pem_is_refused() {
    let (ok, stderr) = run(&[
        "--root",
        "not-pem",
        "--connect",
        "web.shop.svc.cluster.local:80",
    ]);
    assert!(!ok);
    assert!(
        stderr.starts_with("join-mesh: --root not-pem: "),
        "{stderr}"
    );
}
