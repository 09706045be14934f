//! The API server fixture does what the Kubernetes tests rely on: a ready server of the
//! built version, the CRDs, Pods whose status a test sets, ServiceAccount tokens that
//! TokenReview accepts (bound to a Pod when asked), and RBAC for everyone but the admin.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use meshkit_test_support::apiserver::{self, ApiServer};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_serves_crds_pods_tokens_and_rbac() {
    let Some(api) = ApiServer::start_or_skip("api_server_serves_crds_pods_tokens_and_rbac").await
    else {
        return;
    };
    eprintln!("ready after {:?}", api.ready_after());
    let client = api.client();

    let version = client.apiserver_version().await.expect("GET /version");
    assert_eq!(version.git_version, "v1.37.2");

    // The CRDs the control plane watches, from both modules.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in [
        "gatewayclasses.gateway.networking.k8s.io",
        "gateways.gateway.networking.k8s.io",
        "httproutes.gateway.networking.k8s.io",
        "referencegrants.gateway.networking.k8s.io",
        "authorizationpolicies.security.istio.io",
        "peerauthentications.security.istio.io",
        "serviceentries.networking.istio.io",
        "workloadentries.networking.istio.io",
    ] {
        crds.get(name)
            .await
            .unwrap_or_else(|e| panic!("CRD {name}: {e}"));
    }

    // A Pod, its status set as a kubelet would.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "shop"}})).unwrap(),
        )
        .await
        .expect("create namespace shop");
    api.ensure_service_account("shop", "api").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "api-0", "labels": {"app": "api"}},
        "spec": {
            "serviceAccountName": "api",
            "nodeName": "node-a",
            "containers": [{"name": "app", "image": "example.invalid/app"}]
        }
    }))
    .unwrap();
    let pod = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect("create a Pod");
    let status = json!({"status": {
        "phase": "Running",
        "podIP": "10.1.0.5",
        "podIPs": [{"ip": "10.1.0.5"}],
        "conditions": [{"type": "Ready", "status": "True"}]
    }});
    let patched = pods
        .patch_status("api-0", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("patch the Pod's status");
    assert_eq!(
        patched.status.and_then(|s| s.pod_ip).as_deref(),
        Some("10.1.0.5")
    );

    // A Pod-bound token: TokenReview names the account and the Pod.
    let token = api
        .service_account_token("shop", "api", &["istio-ca"], Some(&pod))
        .await;
    let reviews: Api<TokenReview> = Api::all(client.clone());
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.clone(),
            audiences: Some(vec!["istio-ca".into()]),
        },
        ..Default::default()
    };
    let status = reviews
        .create(&PostParams::default(), &review)
        .await
        .expect("TokenReview")
        .status
        .expect("a review status");
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    let user = status.user.expect("the reviewed user");
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:shop:api")
    );
    let extra = user.extra.unwrap_or_default();
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-name"),
        Some(&vec!["api-0".to_owned()]),
        "{extra:?}"
    );

    // The wrong audience is refused.
    let other_audience = TokenReview {
        spec: TokenReviewSpec {
            token: token.clone(),
            audiences: Some(vec!["some-other-audience".into()]),
        },
        ..Default::default()
    };
    let status = reviews
        .create(&PostParams::default(), &other_audience)
        .await
        .expect("TokenReview")
        .status
        .expect("a review status");
    assert_ne!(status.authenticated, Some(true), "{status:?}");

    // RBAC: a ServiceAccount with no grants reads no Secrets (a token for the API server's
    // own audience, which is its issuer).
    let api_token = api
        .service_account_token("shop", "api", &[apiserver::ISSUER], None)
        .await;
    let as_api: Api<Secret> = Api::namespaced(api.client_with_token(&api_token), "shop");
    match as_api.list(&ListParams::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("listing Secrets without a grant: {other:?}"),
    }
}
