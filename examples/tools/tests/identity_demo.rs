//! The identity demo, run as a user runs it: it must pass every check and say so.

use std::process::Command;
use std::time::Duration;

#[test]
fn identity_demo_passes_its_checks() {
    let out = meshkit_test_support::output_within(
        &mut Command::new(env!("CARGO_BIN_EXE_identity-demo")),
        Duration::from_secs(60),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains(
        "client spiffe://cluster.local/ns/shop/sa/web verified server spiffe://cluster.local/ns/shop/sa/db"
    ));
    assert!(stdout.contains(
        "server spiffe://cluster.local/ns/shop/sa/db verified client spiffe://cluster.local/ns/shop/sa/web"
    ));
    assert!(stdout.contains("refused as it should be: client certificate refused: peer spiffe://cluster.local/ns/other/sa/scraper is not authorized"));
    assert!(stdout.contains("all identity checks passed"));
}
