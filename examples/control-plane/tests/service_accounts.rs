//! ServiceAccount tokens as the credentials of ADS and the CA, checked by TokenReview against
//! a real API server (test-support's etcd + kube-apiserver): a node proxy's Pod-bound token
//! acts for its Pod's node and no other, a workload's token obtains its own identity only,
//! and expired, wrong-audience and foreign tokens are refused.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use meshkit_control_plane::kube_source::KubeSourceConfig;
use meshkit_control_plane::service_accounts::{ServiceAccountAuth, ServiceAccountRef};
use meshkit_control_plane::{ControlPlane, ControlPlaneConfig};
use meshkit_identity::istio::IstioCaClient;
use meshkit_identity::{CaError, SpiffeId, request_svid};
use meshkit_test_support::apiserver::ApiServer;

mod support;
use support::apply;

/// Two nodes, a node proxy Pod on each (ServiceAccount `istio-system/ztunnel`), a gateway
/// Pod, and a workload on each node.
const CLUSTER: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: istio-system}
---
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
---
apiVersion: v1
kind: Node
metadata: {name: node-b}
---
apiVersion: v1
kind: Pod
metadata: {name: ztunnel-a, namespace: istio-system}
spec:
  nodeName: node-a
  serviceAccountName: ztunnel
  containers: [{name: proxy, image: example.invalid/node-proxy}]
---
apiVersion: v1
kind: Pod
metadata: {name: ztunnel-b, namespace: istio-system}
spec:
  nodeName: node-b
  serviceAccountName: ztunnel
  containers: [{name: proxy, image: example.invalid/node-proxy}]
---
apiVersion: v1
kind: Pod
metadata:
  name: web-1
  namespace: shop
  annotations: {ambient.istio.io/redirection: enabled}
spec:
  nodeName: node-a
  serviceAccountName: web
  containers: [{name: app, image: example.invalid/web}]
status:
  phase: Running
  podIP: 10.1.0.1
  podIPs: [{ip: 10.1.0.1}]
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Pod
metadata:
  name: api-1
  namespace: shop
  annotations: {ambient.istio.io/redirection: enabled}
spec:
  nodeName: node-b
  serviceAccountName: api
  containers: [{name: app, image: example.invalid/api}]
status:
  phase: Running
  podIP: 10.1.0.2
  podIPs: [{ip: 10.1.0.2}]
  conditions: [{type: Ready, status: "True"}]
"#;

fn id(s: &str) -> SpiffeId {
    format!("spiffe://cluster.local/{s}").parse().expect("id")
}

async fn pod(api: &ApiServer, ns: &str, name: &str) -> Pod {
    Api::<Pod>::namespaced(api.client(), ns)
        .get(name)
        .await
        .expect("the Pod")
}

/// The Address names a Delta stream with `token` as node `node` receives first, or the
/// status the stream ends with.
async fn addresses(
    cp: &ControlPlane,
    token: &str,
    node: &str,
) -> Result<BTreeSet<String>, tonic::Status> {
    let response = support::first_address_answer(&cp.ads_uri(), token, node).await?;
    Ok(response.resources.into_iter().map(|r| r.name).collect())
}

fn ca(cp: &ControlPlane, token: &str, impersonate: bool) -> IstioCaClient {
    IstioCaClient::new(cp.ca_channel().expect("CA channel"))
        .with_impersonated_identity(impersonate)
        .with_bearer_token(token)
        .expect("token")
}

fn refused_with(result: Result<meshkit_identity::X509Svid, CaError>, code: &str, words: &str) {
    match result {
        Err(CaError::Rejected(m)) if m.contains(code) && m.contains(words) => {}
        other => panic!("expected {code} with {words:?}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_tokens_are_reviewed_and_bound_to_their_node() {
    let Some(api) =
        ApiServer::start_or_skip("service_account_tokens_are_reviewed_and_bound_to_their_node")
            .await
    else {
        return;
    };
    apply(&api, CLUSTER).await;
    for (ns, sa) in [
        ("istio-system", "ztunnel"),
        ("istio-system", "gateway"),
        ("shop", "web"),
        ("shop", "api"),
    ] {
        api.ensure_service_account(ns, sa).await;
    }
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let gateway: ServiceAccountRef = "istio-system/gateway".parse().expect("account");
    // The control plane as its own ServiceAccount, with only the RBAC of deploy/rbac.yaml.
    let client = support::control_plane_client(&api).await;
    let cp = ControlPlane::start(
        ControlPlaneConfig::kubernetes(KubeSourceConfig::new(client.clone()).without_status())
            .with_service_accounts(
                ServiceAccountAuth::new(client).with_gateway_accounts(vec![gateway]),
            )
            .with_ads_addr(any)
            .with_ca_addr(any)
            .with_plaintext(),
    )
    .await
    .expect("control plane starts");
    let mut status = cp.status();
    tokio::time::timeout(Duration::from_secs(20), status.wait_for(|s| s.applied > 0))
        .await
        .expect("the first load")
        .expect("status");

    let ztunnel_a = pod(&api, "istio-system", "ztunnel-a").await;
    let node_a = api
        .service_account_token("istio-system", "ztunnel", &["istio-ca"], Some(&ztunnel_a))
        .await;
    let hour = Duration::from_secs(3600);

    // The CA: node-a's token obtains node-a's workload's identity, not node-b's.
    let svid = request_svid(&ca(&cp, &node_a, true), &id("ns/shop/sa/web"), hour)
        .await
        .expect("web-1 runs on node-a");
    assert_eq!(svid.spiffe_id(), &id("ns/shop/sa/web"));
    refused_with(
        request_svid(&ca(&cp, &node_a, true), &id("ns/shop/sa/api"), hour).await,
        "PermissionDenied",
        "no workload on node node-a",
    );
    // ADS: node-a's workloads (web-1), not node-b's (api-1, which no Service names).
    let seen = addresses(&cp, &node_a, "node-a")
        .await
        .expect("node-a's view");
    assert!(seen.contains("Kubernetes//Pod/shop/web-1"), "{seen:?}");
    assert!(!seen.contains("Kubernetes//Pod/shop/api-1"), "{seen:?}");
    // The token speaks for node-a only.
    let refused = addresses(&cp, &node_a, "node-b")
        .await
        .expect_err("another node");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused}");

    // A node proxy account's token that is not bound to its Pod acts for no node.
    let unbound = api
        .service_account_token("istio-system", "ztunnel", &["istio-ca"], None)
        .await;
    refused_with(
        request_svid(&ca(&cp, &unbound, true), &id("ns/shop/sa/web"), hour).await,
        "PermissionDenied",
        "bound to its Pod",
    );

    // A workload's token: its own identity only, and no xDS.
    let web = api
        .service_account_token("shop", "web", &["istio-ca"], None)
        .await;
    request_svid(&ca(&cp, &web, false), &id("ns/shop/sa/web"), hour)
        .await
        .expect("its own identity");
    refused_with(
        request_svid(&ca(&cp, &web, false), &id("ns/shop/sa/api"), hour).await,
        "PermissionDenied",
        "only its own identity",
    );
    refused_with(
        request_svid(&ca(&cp, &web, true), &id("ns/shop/sa/web"), hour).await,
        "PermissionDenied",
        "only a node proxy's credential",
    );
    let refused = addresses(&cp, &web, "node-a")
        .await
        .expect_err("not a proxy");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused}");

    // A gateway's ServiceAccount is served as a gateway (every Address, whatever its id).
    let gw = api
        .service_account_token("istio-system", "gateway", &["istio-ca"], None)
        .await;
    let seen = addresses(&cp, &gw, "ingress-1")
        .await
        .expect("a gateway's view");
    assert!(seen.contains("Kubernetes//Pod/shop/api-1"), "{seen:?}");

    // Refused tokens: another audience, expired, not a token at all.
    let reviews_before = cp.metrics().service_accounts().reviews("refused");
    let wrong_audience = api
        .service_account_token("shop", "web", &["another-audience"], None)
        .await;
    let expired = api
        .expired_service_account_token("shop", "web", &["istio-ca"])
        .await;
    for (what, token) in [
        ("another audience", wrong_audience.as_str()),
        ("expired", expired.as_str()),
        ("forged", "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.c2ln"),
    ] {
        refused_with(
            request_svid(&ca(&cp, token, false), &id("ns/shop/sa/web"), hour).await,
            "Unauthenticated",
            "",
        );
        let refused = addresses(&cp, token, "node-a").await.expect_err(what);
        assert_eq!(
            refused.code(),
            tonic::Code::Unauthenticated,
            "{what}: {refused}"
        );
    }
    // The tokens of another audience and expired are refused by their own claims, without a
    // review; the forged one was reviewed once, its second use answered from the cache.
    assert_eq!(
        cp.metrics().service_accounts().reviews("refused"),
        reviews_before + 1
    );
    // Accepted tokens too: node-a's token was reviewed once for five calls.
    assert_eq!(cp.metrics().service_accounts().reviews("authenticated"), 4);

    // A Pod-bound token stops acting for its node when its Pod is gone (deleted at once: no
    // kubelet ends a graceful deletion here).
    Api::<Pod>::namespaced(api.client(), "istio-system")
        .delete(
            "ztunnel-a",
            &kube::api::DeleteParams::default().grace_period(0),
        )
        .await
        .expect("delete the Pod");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match request_svid(&ca(&cp, &node_a, true), &id("ns/shop/sa/web"), hour).await {
            Err(CaError::Unavailable(m)) if m.contains("is not known") => break,
            other => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "still accepted: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    cp.shutdown().await;
}
