//! What the control plane survives on a real API server (test-support's etcd +
//! kube-apiserver): the API server restarting while changes are made behind the control
//! plane's back (its watches then expire, 410 Gone, and are listed again), and a burst of
//! Pod changes. A node proxy's Delta stream stays open throughout and records every push.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Node as XdsNode;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse,
};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use meshkit_control_plane::ca::TokenGrants;
use meshkit_control_plane::kube_source::KubeSourceConfig;
use meshkit_control_plane::{ControlPlane, ControlPlaneConfig};
use meshkit_mesh::resources::ADDRESS_TYPE_URL;
use meshkit_test_support::apiserver::ApiServer;
use meshkit_test_support::relay::Relay;
use meshkit_xds_client::CallCredentials;
use serde_json::json;
use tokio::sync::mpsc;

mod support;
use support::apply;

const NODE_TOKEN: &str = "survival-node-a";
const PATIENCE: Duration = Duration::from_secs(30);

async fn start(client: kube::Client) -> ControlPlane {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let grants = TokenGrants::parse(&format!("{NODE_TOKEN} node=node-a\n")).expect("tokens");
    ControlPlane::start(
        ControlPlaneConfig::kubernetes(KubeSourceConfig::new(client).without_status())
            .with_grants(grants)
            .with_ads_addr(any)
            .with_ca_addr(any)
            .with_admin_addr(any)
            .with_plaintext(),
    )
    .await
    .expect("control plane starts")
}

/// node-a's node proxy: one Delta stream of Address resources, ACKing every push, kept open;
/// the pushes arrive on the receiver, with the time each arrived.
async fn node_proxy(
    cp: &ControlPlane,
) -> mpsc::UnboundedReceiver<(Instant, DeltaDiscoveryResponse)> {
    let channel = tonic::transport::Endpoint::from_shared(cp.ads_uri())
        .expect("ADS URI")
        .connect_lazy();
    let credentials = CallCredentials::bearer_token(NODE_TOKEN).expect("token");
    let mut client = AggregatedDiscoveryServiceClient::with_interceptor(channel, credentials);
    let (requests, rx) = mpsc::unbounded_channel();
    requests
        .send(DeltaDiscoveryRequest {
            node: Some(XdsNode {
                id: "node-a".into(),
                ..Default::default()
            }),
            type_url: ADDRESS_TYPE_URL.to_owned(),
            resource_names_subscribe: vec!["*".into()],
            ..Default::default()
        })
        .expect("queue");
    let mut stream = client
        .delta_aggregated_resources(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await
        .expect("a Delta stream")
        .into_inner();
    let (pushes, received) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(response)) = stream.next().await {
            let _ = requests.send(DeltaDiscoveryRequest {
                type_url: response.type_url.clone(),
                response_nonce: response.nonce.clone(),
                ..Default::default()
            });
            if pushes.send((Instant::now(), response)).is_err() {
                return;
            }
        }
    });
    received
}

/// What a node proxy holds, pushes applied in order.
#[derive(Default)]
struct Held {
    names: BTreeSet<String>,
    removed: Vec<String>,
    pushes: usize,
}

impl Held {
    fn apply(&mut self, push: &DeltaDiscoveryResponse) {
        self.pushes += 1;
        for resource in &push.resources {
            self.names.insert(resource.name.clone());
        }
        for name in &push.removed_resources {
            self.names.remove(name);
            self.removed.push(name.clone());
        }
    }

    /// Applies pushes until `check` holds, for at most [`PATIENCE`].
    async fn until(
        &mut self,
        pushes: &mut mpsc::UnboundedReceiver<(Instant, DeltaDiscoveryResponse)>,
        what: &str,
        check: impl Fn(&Self) -> bool,
    ) -> Instant {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let mut last = Instant::now();
        while !check(self) {
            let Ok(Some((at, push))) = tokio::time::timeout_at(deadline, pushes.recv()).await
            else {
                panic!("{what}: not after {PATIENCE:?}; holding {:?}", self.names);
            };
            self.apply(&push);
            last = at;
        }
        last
    }
}

fn pod_yaml(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop, annotations: {{ambient.istio.io/redirection: enabled}}}}\n\
         spec: {{nodeName: node-a, serviceAccountName: app, containers: [{{name: app, image: example.invalid/app}}]}}\n\
         status: {{phase: Running, podIP: {ip}, podIPs: [{{ip: {ip}}}], conditions: [{{type: Ready, status: \"True\"}}]}}\n"
    )
}

fn uid(name: &str) -> String {
    format!("Kubernetes//Pod/shop/{name}")
}

const BASE: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: node-a}\n---\n\
apiVersion: v1\nkind: Service\nmetadata: {name: app, namespace: shop}\nspec:\n  selector: {app: none}\n  ports: [{name: http, port: 80}]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_restart_and_expired_watches_lose_nothing() {
    let Some(mut api) =
        ApiServer::start_or_skip("an_api_server_restart_and_expired_watches_lose_nothing").await
    else {
        return;
    };
    apply(&api, BASE).await;
    apply(&api, &pod_yaml("kept", "10.2.0.1")).await;
    apply(&api, &pod_yaml("gone", "10.2.0.2")).await;
    // The control plane reaches the API server through a relay the test can cut.
    let relay = Relay::start(api.addr()).await;
    let client = api.client_at(&format!("https://{}", relay.addr()), api.admin_token());
    let cp = start(client).await;
    let mut pushes = node_proxy(&cp).await;
    let mut held = Held::default();
    held.until(&mut pushes, "the first view", |h| {
        h.names.contains(&uid("kept")) && h.names.contains(&uid("gone"))
    })
    .await;
    let before = held.names.clone();
    let lists = cp.metrics().kube().lists("Pod");
    let admin = cp.admin_addr().expect("an admin address");

    // Cut off: the control plane keeps serving what it has, and stays ready.
    relay.cut();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (code, body) = meshkit_test_support::http_get(admin, "/healthz/ready");
    assert_eq!(code, 200, "ready while the API server is away: {body}");
    // Meanwhile one Pod goes, another comes, and the API server restarts: its watch cache
    // starts at the new revision, so the control plane's watches, resumed from before, are
    // too old (410 Gone) and must be listed again.
    Api::<Pod>::namespaced(api.client(), "shop")
        .delete("gone", &kube::api::DeleteParams::default().grace_period(0))
        .await
        .expect("delete a Pod");
    apply(&api, &pod_yaml("fresh", "10.2.0.3")).await;
    api.restart().await;
    let (code, _) = meshkit_test_support::http_get(admin, "/healthz/ready");
    assert_eq!(code, 200, "ready across the restart");
    assert!(
        held.removed.is_empty(),
        "nothing removed while the API server was away: {:?}",
        held.removed
    );
    relay.restore();
    held.until(&mut pushes, "the changes made meanwhile", |h| {
        h.names.contains(&uid("fresh")) && !h.names.contains(&uid("gone"))
    })
    .await;
    // Exactly what changed: nothing else was removed, not even for a moment.
    assert_eq!(held.removed, [uid("gone")]);
    let mut expected = before;
    expected.remove(&uid("gone"));
    expected.insert(uid("fresh"));
    assert_eq!(held.names, expected);
    assert!(
        cp.metrics().kube().lists("Pod") > lists,
        "the Pods were listed again"
    );
    cp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_pod_changes_is_pushed_in_a_few_coalesced_pushes() {
    let Some(api) =
        ApiServer::start_or_skip("a_burst_of_pod_changes_is_pushed_in_a_few_coalesced_pushes")
            .await
    else {
        return;
    };
    const PODS: usize = 500;
    apply(&api, BASE).await;
    // The Pods exist, without an address yet: not workloads.
    let pods: Api<Pod> = Api::namespaced(api.client(), "shop");
    let created = futures::stream::iter(0..PODS)
        .map(|i| {
            let pods = pods.clone();
            async move {
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": format!("p{i}"), "namespace": "shop",
                        "annotations": {"ambient.istio.io/redirection": "enabled"}},
                    "spec": {"nodeName": "node-a", "serviceAccountName": "app",
                        "containers": [{"name": "app", "image": "example.invalid/app"}]},
                }))
                .expect("a Pod");
                pods.create(&PostParams::default(), &pod).await
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    assert!(created.iter().all(Result::is_ok), "every Pod created");
    let cp = start(api.client()).await;
    let mut pushes = node_proxy(&cp).await;
    let mut held = Held::default();
    held.until(&mut pushes, "the first view", |h| h.pushes > 0)
        .await;
    let first = held.names.clone();

    // The burst: each Pod gets its address and turns Ready, as fast as the API server takes
    // it.
    let started = Instant::now();
    let patched = futures::stream::iter(0..PODS)
        .map(|i| {
            let pods = pods.clone();
            async move {
                let ip = format!("10.3.{}.{}", i / 250, i % 250 + 1);
                let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                    "conditions": [{"type": "Ready", "status": "True"}]}});
                pods.patch_status(&format!("p{i}"), &PatchParams::default(), &Patch::Merge(&status))
                    .await
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let burst = started.elapsed();
    assert!(patched.iter().all(Result::is_ok), "every status patched");
    let pushes_before = held.pushes;
    let last = held
        .until(&mut pushes, "every Pod a workload", |h| {
            (0..PODS).all(|i| h.names.contains(&uid(&format!("p{i}"))))
        })
        .await;
    let pushes_for_burst = held.pushes - pushes_before;
    // The final state is exact: the first view and the 500 workloads, nothing else.
    let mut expected = first;
    expected.extend((0..PODS).map(|i| uid(&format!("p{i}"))));
    assert_eq!(held.names, expected);
    assert!(held.removed.is_empty(), "{:?}", held.removed);
    // Changes are gathered for 100 ms before a snapshot is built: at most one push per
    // 100 ms of burst, and one more for the tail.
    let bound = usize::try_from(burst.as_millis() / 100).unwrap_or(usize::MAX) + 2;
    eprintln!(
        "{PODS} Pod changes in {burst:?}; {pushes_for_burst} pushes (bound {bound}); last push {:?} after the burst began",
        last.duration_since(started)
    );
    assert!(
        pushes_for_burst <= bound,
        "{pushes_for_burst} pushes for a burst of {burst:?}"
    );
    cp.shutdown().await;
}
