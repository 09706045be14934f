//! What the tests against the API server share.

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use meshkit_control_plane::kube_source;
use meshkit_test_support::apiserver::ApiServer;
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
