//! What the tests against the API server share.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
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
/// when `dry_run` ([`ApiServer::apply_documents`]); the error of the first refused.
pub(crate) async fn apply_any(
    api: &ApiServer,
    documents: &[Value],
    dry_run: bool,
) -> Result<usize, String> {
    api.apply_documents(documents, dry_run).await
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

/// The objects of the derivation cases (docs/control-plane.md, "Workloads and services from
/// Kubernetes").
pub(crate) const CLUSTER: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: istio-system, labels: {topology.istio.io/network: net-1}}
---
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {topology.kubernetes.io/region: eu-west, topology.kubernetes.io/zone: eu-west-1a}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.10
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: http-web}
  - {name: tcp-admin, port: 9000, targetPort: 9000}
---
apiVersion: v1
kind: Service
metadata: {name: elsewhere, namespace: shop}
spec: {type: ExternalName, externalName: example.com}
---
apiVersion: v1
kind: Service
metadata: {name: legacy, namespace: shop}
spec:
  clusterIP: 10.96.0.11
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: legacy-manual
  namespace: shop
  labels: {kubernetes.io/service-name: legacy}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.2.0.9]
- addresses: [10.1.0.1]
  targetRef: {kind: Pod, namespace: shop, name: web-0}
---
apiVersion: v1
kind: Pod
metadata:
  name: web-0
  namespace: shop
  labels: {app: web, version: v1}
  annotations: {ambient.istio.io/redirection: enabled}
spec:
  nodeName: node-a
  serviceAccountName: web
  containers:
  - name: app
    image: example.invalid/web
    ports: [{name: http-web, containerPort: 8080}]
status:
  phase: Running
  podIP: 10.1.0.1
  podIPs: [{ip: 10.1.0.1}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Pod
metadata:
  name: web-1
  namespace: shop
  labels: {app: web}
spec:
  nodeName: node-a
  serviceAccountName: web
  containers: [{name: app, image: example.invalid/web}]
status:
  phase: Running
  podIP: 10.1.0.2
  podIPs: [{ip: 10.1.0.2}]
  conditions: [{type: Ready, status: "False"}]
---
apiVersion: v1
kind: Pod
metadata: {name: starting, namespace: shop, labels: {app: web}}
spec:
  nodeName: node-a
  containers: [{name: app, image: example.invalid/web}]
---
apiVersion: v1
kind: Pod
metadata: {name: done, namespace: shop, labels: {app: web}}
spec:
  nodeName: node-a
  restartPolicy: Never
  containers: [{name: app, image: example.invalid/job}]
status:
  phase: Succeeded
  podIP: 10.1.0.3
  podIPs: [{ip: 10.1.0.3}]
---
apiVersion: v1
kind: Pod
metadata: {name: host-agent, namespace: shop}
spec:
  nodeName: node-a
  hostNetwork: true
  containers: [{name: agent, image: example.invalid/agent}]
status:
  phase: Running
  podIP: 10.0.0.5
  podIPs: [{ip: 10.0.0.5}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Pod
metadata:
  name: api-7d4b9c-x2x7k
  generateName: api-7d4b9c-
  namespace: shop
  labels: {app.kubernetes.io/name: api-server, pod-template-hash: 7d4b9c}
  ownerReferences:
  - {apiVersion: apps/v1, kind: ReplicaSet, name: api-7d4b9c, uid: 6a0e1f4c-0000-4000-8000-000000000001, controller: true}
spec:
  nodeName: node-a
  serviceAccountName: api
  containers: [{name: app, image: example.invalid/api}]
status:
  phase: Running
  podIP: 10.1.0.4
  podIPs: [{ip: 10.1.0.4}]
  conditions: [{type: Ready, status: "True"}]
"#;
/// A Delta stream of `Address` (every one, `*`) as node proxy `node` with `token`, with
/// its first answer.
pub(crate) async fn first_address_answer(
    ads_uri: &str,
    token: &str,
    node: &str,
) -> Result<envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse, tonic::Status> {
    let mut stream = address_stream(ads_uri, token, node).await?;
    stream.answer().await
}

/// An open Delta stream of `Address` that ACKs what it receives.
pub(crate) struct AddressStream {
    tx: tokio::sync::mpsc::Sender<
        envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest,
    >,
    stream:
        tonic::Streaming<envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse>,
}

/// Opens a Delta stream of every `Address` as node proxy `node` with `token`.
pub(crate) async fn address_stream(
    ads_uri: &str,
    token: &str,
    node: &str,
) -> Result<AddressStream, tonic::Status> {
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
    use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
    let channel = tonic::transport::Endpoint::from_shared(ads_uri.to_owned())
        .expect("ADS URI")
        .connect_lazy();
    let credentials = meshkit_xds_client::CallCredentials::bearer_token(token).expect("token");
    let mut client = AggregatedDiscoveryServiceClient::with_interceptor(channel, credentials);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(DeltaDiscoveryRequest {
        node: Some(Node {
            id: node.to_owned(),
            ..Default::default()
        }),
        type_url: meshkit_mesh::resources::ADDRESS_TYPE_URL.to_owned(),
        resource_names_subscribe: vec!["*".into()],
        ..Default::default()
    })
    .await
    .expect("queue");
    let stream = client
        .delta_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok(AddressStream { tx, stream })
}

impl AddressStream {
    /// The next answer (within 20 s), ACKed.
    pub(crate) async fn answer(
        &mut self,
    ) -> Result<envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryResponse, tonic::Status>
    {
        let response =
            tokio::time::timeout(std::time::Duration::from_secs(20), self.stream.message())
                .await
                .expect("an answer")?
                .expect("a response");
        let ack = envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest {
            type_url: response.type_url.clone(),
            response_nonce: response.nonce.clone(),
            ..Default::default()
        };
        // A stream that ends here reports it at the next answer.
        let _ = self.tx.send(ack).await;
        Ok(response)
    }

    /// The resource `name` as the next answer that holds it has it (earlier answers skipped).
    pub(crate) async fn next_address(
        &mut self,
        name: &str,
    ) -> meshkit_mesh::proto::workload::address::Type {
        loop {
            let response = self.answer().await.expect("the stream stays open");
            if let Some(r) = response.resources.into_iter().find(|r| r.name == name) {
                let any = r.resource.expect("a resource body");
                let address = <meshkit_mesh::proto::workload::Address as prost::Message>::decode(
                    any.value.as_slice(),
                )
                .expect("an Address");
                return address.r#type.expect("a workload or service");
            }
        }
    }
}
