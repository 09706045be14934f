//! The install manifests of `deploy/` are valid for a real API server (test-support's etcd +
//! kube-apiserver, with the Gateway API's and Istio's CRDs): each object is applied with
//! server-side dry-run, so the API server validates and admits it without storing it.

mod support;
use support::{apply_any, deploy_documents};

use meshkit_test_support::apiserver::ApiServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deploy_manifests_are_valid_for_the_api_server() {
    let Some(api) =
        ApiServer::start_or_skip("the_deploy_manifests_are_valid_for_the_api_server").await
    else {
        return;
    };
    // The namespace is created for real: a dry-run object in a namespace that does not
    // exist is refused.
    apply_any(&api, &deploy_documents("namespace.yaml"), false)
        .await
        .expect("deploy/namespace.yaml");
    let mut files: Vec<String> = std::fs::read_dir(support::deploy_dir())
        .expect("deploy/")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "control-plane.yaml",
            "gateway.yaml",
            "namespace.yaml",
            "node-proxy.yaml",
            "rbac.yaml"
        ]
    );
    let mut kinds = Vec::new();
    for file in &files {
        let documents = deploy_documents(file);
        kinds.extend(
            documents
                .iter()
                .map(|d| d["kind"].as_str().unwrap_or_default().to_owned()),
        );
        apply_any(&api, &documents, true)
            .await
            .unwrap_or_else(|e| panic!("deploy/{file}: {e}"));
    }
    kinds.sort();
    kinds.dedup();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "DaemonSet",
            "Deployment",
            "GatewayClass",
            "IngressClass",
            "Namespace",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
        ]
    );
}
