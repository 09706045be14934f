//! Regenerates `src/generated/` from `proto/workload.proto` and `proto/authorization.proto`,
//! and fails when the checked-in copy is stale. Refresh with
//! `MESHKIT_REGENERATE=1 cargo test -p meshkit-mesh --test codegen`.

use std::path::{Path, PathBuf};

/// The generated files, one per package.
const FILES: [&str; 2] = ["istio.workload.rs", "istio.security.rs"];

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn generate(out_dir: &Path) {
    let fds = protox::compile(
        ["workload.proto", "authorization.proto"],
        [crate_dir().join("proto")],
    )
    .expect("compile the .proto files");
    let mut config = prost_build::Config::new();
    config.out_dir(out_dir);
    // Deterministic encoding of `Workload.services`, so content hashes are stable.
    config.btree_map(["."]);
    config.compile_fds(fds).expect("generate Rust");
}

#[test]
fn checked_in_code_matches_proto() {
    let checked_in = crate_dir().join("src/generated");
    if std::env::var_os("MESHKIT_REGENERATE").is_some() {
        generate(&checked_in);
        return;
    }
    let tmp = std::env::temp_dir().join(format!("meshkit-workload-codegen-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("create temp dir");
    generate(&tmp);
    let stale: Vec<&str> = FILES
        .iter()
        .copied()
        .filter(|file| {
            let fresh = std::fs::read_to_string(tmp.join(file)).expect("fresh code");
            let current = std::fs::read_to_string(checked_in.join(file)).expect("checked-in code");
            fresh != current
        })
        .collect();
    let _ = std::fs::remove_dir_all(&tmp);
    assert!(
        stale.is_empty(),
        "src/generated/{stale:?} are stale; run \
         `MESHKIT_REGENERATE=1 cargo test -p meshkit-mesh --test codegen`"
    );
}
