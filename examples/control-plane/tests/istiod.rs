//! A real istiod in the tests (test-support's fixture: `pilot-discovery` built from the
//! `istio.io/istio` module, against the tests' kube-apiserver): it becomes ready, publishes its
//! root, and its CA signs a workload's own identity for the workload's ServiceAccount token,
//! over TLS verified against that root, as meshkit-identity's Istio CA client asks.

use std::time::Duration;

use meshkit_identity::istio::IstioCaClient;
use meshkit_identity::{SpiffeId, request_svid};
use meshkit_mesh::proto::{security, workload};
use meshkit_test_support::apiserver::ApiServer;
use meshkit_test_support::istiod::{CLUSTER_ID, Istiod, SERVER_NAME};
use meshkit_xds_client::ControlPlaneTls;

mod support;
use support::apply;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istiod_starts_against_the_api_server_and_its_ca_signs_for_service_account_tokens() {
    let test = "istiod_starts_against_the_api_server_and_its_ca_signs_for_service_account_tokens";
    let Some(api) = ApiServer::start_or_skip(test).await else {
        return;
    };
    let Some(istiod) = Istiod::start_or_skip(&api, test).await else {
        return;
    };
    apply(
        &api,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n",
    )
    .await;
    api.ensure_service_account("shop", "web").await;
    let token = api
        .service_account_token("shop", "web", &["istio-ca"], None)
        .await;

    for name in [SERVER_NAME, "127.0.0.1"] {
        let tls = ControlPlaneTls::from_pem(istiod.root_pem())
            .expect("istiod's root")
            .with_server_name(name)
            .expect("a server name");
        let channel = tls
            .connect_lazy(&format!("https://{}", istiod.secure_addr()))
            .expect("a channel");
        let ca = IstioCaClient::new(channel)
            .with_cluster_id(CLUSTER_ID)
            .expect("cluster id")
            .with_bearer_token(&token)
            .expect("token");
        let web: SpiffeId = "spiffe://cluster.local/ns/shop/sa/web".parse().expect("id");
        let svid = request_svid(&ca, &web, Duration::from_secs(3600))
            .await
            .unwrap_or_else(|e| panic!("{e}\nistiod's log:\n{}", istiod.log_tail()));
        assert_eq!(svid.spiffe_id(), &web, "verified as {name}");
        // Its chain ends at the root istiod published.
        let root = rustls_pki_types::pem::PemObject::from_pem_slice(istiod.root_pem().as_bytes())
            .map(|c: rustls_pki_types::CertificateDer<'static>| c)
            .expect("a PEM root");
        assert_eq!(svid.chain().last(), Some(&root));
    }
}

/// The node proxy's Pod, a workload on another node, a terminating Pod, a ServiceEntry with
/// a WorkloadEntry, and policies of every scope, beside the derivation cases.
const POLICIES: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: node-b}
---
apiVersion: v1
kind: Namespace
metadata: {name: billing}
---
apiVersion: v1
kind: Pod
metadata:
  name: batch-b
  namespace: shop
  annotations: {ambient.istio.io/redirection: enabled}
spec:
  nodeName: node-b
  serviceAccountName: api
  containers: [{name: app, image: example.invalid/batch}]
status:
  phase: Running
  podIP: 10.1.0.8
  podIPs: [{ip: 10.1.0.8}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Pod
metadata:
  name: leaving
  namespace: shop
  labels: {app: web}
  annotations: {ambient.istio.io/redirection: enabled}
spec:
  nodeName: node-a
  serviceAccountName: web
  containers: [{name: app, image: example.invalid/web, ports: [{name: http-web, containerPort: 8080}]}]
status:
  phase: Running
  podIP: 10.1.0.7
  podIPs: [{ip: 10.1.0.7}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Pod
metadata:
  name: pay-0
  namespace: billing
  labels: {app: pay}
  annotations: {ambient.istio.io/redirection: enabled}
spec:
  nodeName: node-a
  serviceAccountName: pay
  containers: [{name: app, image: example.invalid/pay}]
status:
  phase: Running
  podIP: 10.1.1.1
  podIPs: [{ip: 10.1.1.1}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: vms, namespace: shop}
spec:
  hosts: [vms.shop.example]
  addresses: [240.240.0.1]
  ports: [{number: 80, name: http, protocol: HTTP, targetPort: 8080}]
  resolution: STATIC
  workloadSelector: {labels: {app: vm}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: vm-1, namespace: shop, labels: {app: vm}}
spec:
  address: 10.3.0.1
  labels: {app: vm}
  serviceAccount: vm
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: billing-strict, namespace: billing}
spec:
  mtls: {mode: STRICT}
---
apiVersion: v1
kind: Pod
metadata: {name: ztunnel-a, namespace: istio-system}
spec:
  nodeName: node-a
  serviceAccountName: ztunnel
  containers: [{name: proxy, image: example.invalid/node-proxy}]
status:
  phase: Running
  podIP: 10.0.0.10
  podIPs: [{ip: 10.0.0.10}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: global-deny, namespace: istio-system}
spec:
  action: DENY
  rules: [{from: [{source: {ipBlocks: ["192.0.2.0/24"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: ns-allow, namespace: shop}
spec:
  rules: [{from: [{source: {principals: ["cluster.local/ns/shop/sa/web"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: web-allow, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  rules:
  - to: [{operation: {ports: ["8080"], methods: [GET]}}]
  - from: [{source: {namespaces: [shop], notPrincipals: ["cluster.local/ns/shop/sa/api"]}}]
    when: [{key: destination.port, values: ["9000"]}]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: strict, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  mtls: {mode: STRICT}
  portLevelMtls: {"9000": {mode: PERMISSIVE}}
"#;

/// What a node proxy holds after its first Delta answers of `Address` and `Authorization`.
#[derive(Debug, Default)]
struct View {
    addresses: std::collections::BTreeMap<String, workload::Address>,
    policies: std::collections::BTreeMap<String, security::Authorization>,
}

/// Opens a Delta stream to `channel` as node-a's ztunnel, with `token`, and reads the first
/// answer of each type.
async fn ztunnel_view(channel: tonic::transport::Channel, token: &str) -> View {
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
    use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
    use meshkit_mesh::resources::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};
    use prost::Message as _;
    // ztunnel's node: `ztunnel~IP~POD.NAMESPACE~NAMESPACE.svc.DOMAIN` and its metadata.
    let node: Node = meshkit_mesh::feed::ProxyNode::new(
        "node-a",
        "ztunnel-a",
        "istio-system",
        [10, 0, 0, 10].into(),
    )
    .with_cluster_id(CLUSTER_ID)
    .with_service_account("ztunnel")
    .to_node();
    let credentials = meshkit_xds_client::CallCredentials::bearer_token(token).expect("token");
    let mut client = AggregatedDiscoveryServiceClient::with_interceptor(channel, credentials);
    let (requests, rx) = tokio::sync::mpsc::unbounded_channel();
    for (i, type_url) in [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL]
        .into_iter()
        .enumerate()
    {
        requests
            .send(DeltaDiscoveryRequest {
                node: (i == 0).then(|| node.clone()),
                type_url: type_url.to_owned(),
                resource_names_subscribe: vec!["*".into()],
                ..Default::default()
            })
            .expect("queue");
    }
    let mut stream = client
        .delta_aggregated_resources(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await
        .expect("a Delta stream")
        .into_inner();
    let mut view = View::default();
    let mut answered = std::collections::BTreeSet::new();
    while answered.len() < 2 {
        let response = tokio::time::timeout(Duration::from_secs(30), stream.message())
            .await
            .expect("an answer")
            .expect("no error")
            .expect("a response");
        answered.insert(response.type_url.clone());
        for r in response.resources {
            let Some(any) = r.resource else { continue };
            if response.type_url == ADDRESS_TYPE_URL {
                let address = workload::Address::decode(any.value.as_slice()).expect("an Address");
                view.addresses.insert(r.name, address);
            } else {
                let policy =
                    security::Authorization::decode(any.value.as_slice()).expect("a policy");
                view.policies.insert(r.name, policy);
            }
        }
        let _ = requests.send(DeltaDiscoveryRequest {
            type_url: response.type_url,
            response_nonce: response.nonce,
            ..Default::default()
        });
    }
    view
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn meshkits_control_plane_and_istiod_serve_a_node_proxy_the_same() {
    let test = "meshkits_control_plane_and_istiod_serve_a_node_proxy_the_same";
    let Some(api) = ApiServer::start_or_skip(test).await else {
        return;
    };
    let Some(istiod) = Istiod::start_or_skip(&api, test).await else {
        return;
    };
    apply(&api, support::CLUSTER).await;
    apply(&api, POLICIES).await;
    for (ns, sa) in [("shop", "web"), ("shop", "api"), ("billing", "pay")] {
        api.ensure_service_account(ns, sa).await;
    }
    // A Pod deleted gracefully stays, terminating: no kubelet ends it here.
    kube::api::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(api.client(), "shop")
        .delete("leaving", &kube::api::DeleteParams::default())
        .await
        .expect("delete gracefully");
    let ztunnel: k8s_openapi::api::core::v1::Pod =
        kube::api::Api::namespaced(api.client(), "istio-system")
            .get("ztunnel-a")
            .await
            .expect("the node proxy's Pod");
    let token = api
        .service_account_token("istio-system", "ztunnel", &["istio-ca"], Some(&ztunnel))
        .await;
    let any = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let cp = meshkit_control_plane::ControlPlane::start(
        meshkit_control_plane::ControlPlaneConfig::kubernetes(
            meshkit_control_plane::kube_source::KubeSourceConfig::new(api.client())
                .without_status(),
        )
        .with_service_accounts(
            meshkit_control_plane::service_accounts::ServiceAccountAuth::new(api.client()),
        )
        .with_ads_addr(any)
        .with_ca_addr(any)
        .with_plaintext(),
    )
    .await
    .expect("control plane starts");
    // Both have settled: the policies are there.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let tls = ControlPlaneTls::from_pem(istiod.root_pem())
        .expect("istiod's root")
        .with_server_name(SERVER_NAME)
        .expect("a server name");
    let theirs = ztunnel_view(
        tls.connect_lazy(&format!("https://{}", istiod.secure_addr()))
            .expect("a channel"),
        &token,
    )
    .await;
    let ours = ztunnel_view(
        tonic::transport::Endpoint::from_shared(cp.ads_uri())
            .expect("ADS URI")
            .connect_lazy(),
        &token,
    )
    .await;
    // The two differences docs/control-plane.md's mapping table gives reasons for:
    // 1. a meshkit node proxy is sent its own node's workloads and the endpoints of Services
    //    (istiod sends ztunnel every workload): batch-b runs on node-b and no Service names it;
    // 2. a WorkloadEntry is HBONE for meshkit (its entries stand behind node proxies); istiod
    //    marks one HBONE only with the redirection annotation or the tunnel label.
    let only_istiod: Vec<&String> = theirs
        .addresses
        .keys()
        .filter(|name| !ours.addresses.contains_key(*name))
        .collect();
    assert_eq!(only_istiod, ["Kubernetes//Pod/shop/batch-b"]);
    let only_meshkit: Vec<&String> = ours
        .addresses
        .keys()
        .filter(|name| !theirs.addresses.contains_key(*name))
        .collect();
    assert!(only_meshkit.is_empty(), "{only_meshkit:?}");
    for (name, mine) in &ours.addresses {
        let mut mine = mine.clone();
        if let Some(workload::address::Type::Workload(w)) = &mut mine.r#type
            && w.uid.contains("/WorkloadEntry/")
        {
            assert_eq!(w.tunnel_protocol, workload::TunnelProtocol::Hbone as i32);
            w.tunnel_protocol = workload::TunnelProtocol::None as i32;
        }
        assert_eq!(
            Some(&mine),
            theirs.addresses.get(name),
            "{name}: meshkit's, then istiod's"
        );
    }
    // Every policy the same, field by field: the AuthorizationPolicies, the PeerAuthentication
    // converted, the static STRICT policy.
    assert_eq!(ours.policies, theirs.policies);
    assert!(
        ours.policies
            .contains_key("istio-system/istio_converted_static_strict")
    );
    assert!(
        ours.policies
            .contains_key("shop/converted_peer_authentication_strict")
    );
    // The derivation cases are there on both sides: the terminating Pod, unhealthy.
    let leaving = match theirs
        .addresses
        .get("Kubernetes//Pod/shop/leaving")
        .and_then(|a| a.r#type.as_ref())
    {
        Some(workload::address::Type::Workload(w)) => w.status,
        other => panic!("the terminating Pod: {other:?}"),
    };
    assert_eq!(leaving, workload::WorkloadStatus::Unhealthy as i32);
    cp.shutdown().await;
}
