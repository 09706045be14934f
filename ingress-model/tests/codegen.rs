//! Regenerates the Rust code for `proto/` into a temporary folder and fails when the
//! checked-in copy under `src/generated/` differs.
//!
//! To refresh the checked-in code after editing a `.proto` file or the configuration below:
//! `MESHKIT_REGENERATE=1 cargo test -p meshkit-ingress-model --test codegen`.

use std::path::{Path, PathBuf};

const PROTO_FILES: &[&str] = &[
    "k8s.io/api/networking/v1/generated.proto",
    "k8s.io/api/core/v1/generated.proto",
    "k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto",
    "k8s.io/apimachinery/pkg/runtime/generated.proto",
    "k8s.io/apimachinery/pkg/util/intstr/generated.proto",
];

/// Messages whose serde impls are derived; the others (`Time`, `IntOrString`, `FieldsV1`,
/// `RawExtension`, `Unknown`, and `IngressRule`, whose `IngressRuleValue` is embedded in Go so
/// that `http` sits directly on the rule in JSON) have hand-written forms in `src/serde_impls.rs`.
const SERDE_DERIVED: &[&str] = &[
    ".k8s.io.api.networking.v1.HTTPIngressPath",
    ".k8s.io.api.networking.v1.HTTPIngressRuleValue",
    ".k8s.io.api.networking.v1.Ingress",
    ".k8s.io.api.networking.v1.IngressBackend",
    ".k8s.io.api.networking.v1.IngressClass",
    ".k8s.io.api.networking.v1.IngressClassList",
    ".k8s.io.api.networking.v1.IngressClassParametersReference",
    ".k8s.io.api.networking.v1.IngressClassSpec",
    ".k8s.io.api.networking.v1.IngressList",
    ".k8s.io.api.networking.v1.IngressLoadBalancerIngress",
    ".k8s.io.api.networking.v1.IngressLoadBalancerStatus",
    ".k8s.io.api.networking.v1.IngressPortStatus",
    ".k8s.io.api.networking.v1.IngressRuleValue",
    ".k8s.io.api.networking.v1.IngressServiceBackend",
    ".k8s.io.api.networking.v1.IngressSpec",
    ".k8s.io.api.networking.v1.IngressStatus",
    ".k8s.io.api.networking.v1.IngressTLS",
    ".k8s.io.api.networking.v1.ServiceBackendPort",
    ".k8s.io.api.core.v1.TypedLocalObjectReference",
    ".k8s.io.apimachinery.pkg.apis.meta.v1.ListMeta",
    ".k8s.io.apimachinery.pkg.apis.meta.v1.ManagedFieldsEntry",
    ".k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta",
    ".k8s.io.apimachinery.pkg.apis.meta.v1.OwnerReference",
    ".k8s.io.apimachinery.pkg.apis.meta.v1.TypeMeta",
    ".k8s.io.apimachinery.pkg.runtime.TypeMeta",
];

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn generate(out_dir: &Path) {
    let fds = protox::compile(PROTO_FILES, [crate_dir().join("proto")]).expect("compile protos");
    let mut config = prost_build::Config::new();
    config.out_dir(out_dir);
    // Deterministic iteration order for labels and annotations, and stable YAML output.
    config.btree_map(["."]);
    for message in SERDE_DERIVED {
        config.type_attribute(
            message,
            "#[derive(::serde::Serialize, ::serde::Deserialize)]\n\
             #[serde(rename_all = \"camelCase\", default)]",
        );
        // Kubernetes omits unset and empty fields; `is_default` covers None, empty lists and maps.
        config.field_attribute(
            message,
            "#[serde(skip_serializing_if = \"crate::serde_impls::is_default\")]",
        );
    }
    // The Go field is `APIGroup`; the JSON name is `apiGroup`.
    config.field_attribute(
        ".k8s.io.api.networking.v1.IngressClassParametersReference.aPIGroup",
        "#[serde(rename = \"apiGroup\")]",
    );
    config.compile_fds(fds).expect("generate Rust");
}

fn generated_files(dir: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|entry| entry.expect("dir entry").path())
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("k8s.io."))
        })
        .map(|path| {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            let text = std::fs::read_to_string(&path).expect("read generated file");
            (name, text)
        })
        .collect();
    files.sort();
    files
}

#[test]
fn checked_in_code_matches_proto() {
    let checked_in = crate_dir().join("src").join("generated");
    if std::env::var_os("MESHKIT_REGENERATE").is_some() {
        generate(&checked_in);
        return;
    }
    let tmp = std::env::temp_dir().join(format!("meshkit-ingress-codegen-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).expect("create temp dir");
    generate(&tmp);
    let fresh = generated_files(&tmp);
    let current = generated_files(&checked_in);
    let _ = std::fs::remove_dir_all(&tmp);
    assert_eq!(
        fresh.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        current.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        "generated file set differs; run with MESHKIT_REGENERATE=1"
    );
    for ((name, fresh), (_, current)) in fresh.iter().zip(current.iter()) {
        assert!(
            fresh == current,
            "src/generated/{name} is stale; run `MESHKIT_REGENERATE=1 cargo test -p meshkit-ingress-model --test codegen`"
        );
    }
}
