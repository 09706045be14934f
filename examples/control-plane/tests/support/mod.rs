//! What the tests against the API server share.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use meshkit_control_plane::kube_source;
use meshkit_test_support::apiserver::{ApiServer, ISSUER};
use serde_json::{Value, json};

/// Creates or updates every object of `yaml` by server-side apply, then sets the `status` a
/// Pod document carries, as a kubelet would (and of any other kind whose document carries one,
/// as its controller would, under the field manager `other-controller`).
pub(crate) async fn apply(api: &ApiServer, yaml: &str) {
    let documents: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("test YAML");
    for document in documents.into_iter().filter(|d| !d.is_null()) {
        let api_version = document["apiVersion"].as_str().unwrap_or_default();
        let kind_name = document["kind"].as_str().unwrap_or_default();
        let (resource, namespaced) = kube_source::resource_of(api_version, kind_name)
            .unwrap_or_else(|| panic!("{api_version} {kind_name} is not a watched kind"));
        let name = document["metadata"]["name"].as_str().expect("a name");
        let objects: Api<DynamicObject> = if namespaced {
            let ns = document["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default");
            Api::namespaced_with(api.client(), ns, &resource)
        } else {
            Api::all_with(api.client(), &resource)
        };
        let params = PatchParams::apply("meshkit-test").force();
        objects
            .patch(name, &params, &Patch::Apply(&document))
            .await
            .unwrap_or_else(|e| panic!("applying {kind_name} {name}: {e}"));
        if let Some(status) = document.get("status") {
            objects
                .patch_status(
                    name,
                    &PatchParams {
                        field_manager: Some("other-controller".into()),
                        ..PatchParams::default()
                    },
                    &Patch::Merge(&json!({ "status": status })),
                )
                .await
                .unwrap_or_else(|e| panic!("setting the status of {kind_name} {name}: {e}"));
        }
    }
}

/// The folder of the install manifests.
pub(crate) fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The documents of the YAML file `deploy/NAME`.
pub(crate) fn deploy_documents(name: &str) -> Vec<Value> {
    let path = deploy_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    documents.into_iter().filter(|d| !d.is_null()).collect()
}

/// Applies `documents` of any kind the API server serves by server-side apply, as a dry run
/// (nothing stored, everything validated and admitted) when `dry_run`; the error of the
/// first refused.
pub(crate) async fn apply_any(
    api: &ApiServer,
    documents: &[Value],
    dry_run: bool,
) -> Result<usize, String> {
    let discovery = Discovery::new(api.client())
        .run()
        .await
        .map_err(|e| format!("discovery: {e}"))?;
    for document in documents {
        let api_version = document["apiVersion"].as_str().unwrap_or_default();
        let kind = document["kind"].as_str().unwrap_or_default();
        let name = document["metadata"]["name"].as_str().unwrap_or_default();
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
        let (resource, capabilities) = discovery
            .resolve_gvk(&gvk)
            .ok_or_else(|| format!("{api_version} {kind} is not served"))?;
        let objects: Api<DynamicObject> = if capabilities.scope == Scope::Namespaced {
            let ns = document["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default");
            Api::namespaced_with(api.client(), ns, &resource)
        } else {
            Api::all_with(api.client(), &resource)
        };
        let mut params = PatchParams::apply("meshkit-test").force();
        params.dry_run = dry_run;
        objects
            .patch(name, &params, &Patch::Apply(document))
            .await
            .map_err(|e| format!("{kind} {name}: {e}"))?;
    }
    Ok(documents.len())
}

/// A client acting as the control plane's own ServiceAccount,
/// `istio-system/meshkit-control-plane`, with nothing but the RBAC of `deploy/rbac.yaml`
/// (applied first).
pub(crate) async fn control_plane_client(api: &ApiServer) -> kube::Client {
    let mut documents = deploy_documents("namespace.yaml");
    documents.extend(deploy_documents("rbac.yaml"));
    apply_any(api, &documents, false)
        .await
        .unwrap_or_else(|e| panic!("deploy/rbac.yaml: {e}"));
    let token = api
        .service_account_token("istio-system", "meshkit-control-plane", &[ISSUER], None)
        .await;
    api.client_with_token(&token)
}
