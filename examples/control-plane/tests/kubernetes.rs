//! The control plane with a real Kubernetes API server as its source (test-support's
//! etcd + kube-apiserver): Pods, Services and EndpointSlices become the Address resources a
//! node proxy receives over xDS, as istiod derives them, and a manifest-folder run and an API
//! run of the same objects serve the same resources.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use meshkit_control_plane::ca::TokenGrants;
use meshkit_control_plane::kube_source::{self, KubeSourceConfig};
use meshkit_control_plane::{ControlPlane, ControlPlaneConfig};
use meshkit_mesh::proto::workload::{self, address};
use meshkit_mesh::resources::ADDRESS_TYPE_URL;
use meshkit_test_support::apiserver::ApiServer;
use prost::Message;
use serde_json::{Value, json};

mod support;
use support::{CLUSTER, apply};

const NODE_TOKEN: &str = "kube-node-a";
const PATIENCE: Duration = Duration::from_secs(20);

async fn start_control_plane(config: ControlPlaneConfig) -> ControlPlane {
    let grants = TokenGrants::parse(&format!(
        "{NODE_TOKEN} node=node-a spiffe://cluster.local/ns/shop/*\n"
    ))
    .expect("tokens");
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    ControlPlane::start(
        config
            .with_ads_addr(any)
            .with_ca_addr(any)
            .with_grants(grants)
            .with_admin_addr(any)
            .with_plaintext()
            .with_poll_interval(Duration::from_millis(100)),
    )
    .await
    .expect("control plane starts")
}

/// The Address resources node-a's node proxy receives on a new Delta stream, by name.
async fn addresses(cp: &ControlPlane) -> BTreeMap<String, address::Type> {
    let response = support::first_address_answer(&cp.ads_uri(), NODE_TOKEN, "node-a")
        .await
        .expect("no error");
    response
        .resources
        .into_iter()
        .map(|r| {
            let any = r.resource.expect("a resource body");
            let address = workload::Address::decode(any.value.as_slice()).expect("an Address");
            (r.name, address.r#type.expect("a workload or service"))
        })
        .collect()
}

/// Polls [`addresses`] until `check` passes, for at most [`PATIENCE`].
async fn until(
    cp: &ControlPlane,
    what: &str,
    check: impl Fn(&BTreeMap<String, address::Type>) -> bool,
) -> BTreeMap<String, address::Type> {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let got = addresses(cp).await;
        if check(&got) {
            return got;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not after {PATIENCE:?}; node-a receives {:#?}",
            got.keys().collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn pod_uid(ns: &str, name: &str) -> String {
    format!("Kubernetes//Pod/{ns}/{name}")
}

fn workload<'a>(all: &'a BTreeMap<String, address::Type>, uid: &str) -> &'a workload::Workload {
    match all.get(uid) {
        Some(address::Type::Workload(w)) => w,
        other => panic!("{uid}: {other:?}"),
    }
}

fn service<'a>(all: &'a BTreeMap<String, address::Type>, name: &str) -> &'a workload::Service {
    match all.get(name) {
        Some(address::Type::Service(s)) => s,
        other => panic!("{name}: {other:?}"),
    }
}

fn ip(bytes: &[u8]) -> IpAddr {
    match bytes.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(bytes).unwrap()),
        _ => IpAddr::from(<[u8; 16]>::try_from(bytes).unwrap()),
    }
}

fn ports(list: Option<&workload::PortList>) -> Vec<(u32, u32)> {
    list.map(|l| {
        l.ports
            .iter()
            .map(|p| (p.service_port, p.target_port))
            .collect()
    })
    .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_services_and_endpoint_slices_become_what_a_node_proxy_receives() {
    let Some(api) = ApiServer::start_or_skip(
        "pods_services_and_endpoint_slices_become_what_a_node_proxy_receives",
    )
    .await
    else {
        return;
    };
    apply(&api, CLUSTER).await;
    let cp = start_control_plane(ControlPlaneConfig::kubernetes(KubeSourceConfig::new(
        api.client(),
    )))
    .await;
    let all = until(&cp, "the cluster's workloads", |all| {
        all.contains_key(&pod_uid("shop", "api-7d4b9c-x2x7k"))
    })
    .await;

    // A ready, enrolled Pod: HBONE, HEALTHY, its named port resolved, locality from its
    // node, the network of the system namespace.
    let web0 = workload(&all, &pod_uid("shop", "web-0"));
    assert_eq!(web0.name, "web-0");
    assert_eq!(web0.tunnel_protocol, workload::TunnelProtocol::Hbone as i32);
    assert_eq!(web0.status, workload::WorkloadStatus::Healthy as i32);
    assert_eq!(web0.service_account, "web");
    assert_eq!(web0.node, "node-a");
    assert_eq!(web0.network, "net-1");
    assert_eq!(web0.canonical_name, "web");
    assert_eq!(web0.canonical_revision, "v1");
    assert_eq!(web0.workload_name, "web-0");
    assert_eq!(web0.workload_type, workload::WorkloadType::Pod as i32);
    assert_eq!(
        web0.addresses.iter().map(|a| ip(a)).collect::<Vec<_>>(),
        ["10.1.0.1".parse::<IpAddr>().unwrap()]
    );
    let locality = web0.locality.as_ref().expect("a locality");
    assert_eq!(
        (locality.region.as_str(), locality.zone.as_str()),
        ("eu-west", "eu-west-1a")
    );
    let web_key = "shop/web.shop.svc.cluster.local";
    assert_eq!(
        ports(web0.services.get(web_key)),
        [(80, 8080), (9000, 9000)]
    );
    // Named by legacy's manual slice, but without its uid: istiod matches a targetRef by
    // namespace, name and uid, so the slice does not make web-0 one of legacy's.
    assert!(
        !web0
            .services
            .contains_key("shop/legacy.shop.svc.cluster.local")
    );

    // Not Ready, not enrolled, and without the port name: UNHEALTHY, no tunnel, port 80
    // left out.
    let web1 = workload(&all, &pod_uid("shop", "web-1"));
    assert_eq!(web1.status, workload::WorkloadStatus::Unhealthy as i32);
    assert_eq!(web1.tunnel_protocol, workload::TunnelProtocol::None as i32);
    assert_eq!(ports(web1.services.get(web_key)), [(9000, 9000)]);

    // No IP yet, and Succeeded: no workload.
    assert!(!all.contains_key(&pod_uid("shop", "starting")));
    assert!(!all.contains_key(&pod_uid("shop", "done")));

    // The host's network.
    let host = workload(&all, &pod_uid("shop", "host-agent"));
    assert_eq!(host.network_mode, workload::NetworkMode::HostNetwork as i32);

    // A Deployment's Pod: named after the Deployment, canonical name from
    // app.kubernetes.io/name.
    let api_pod = workload(&all, &pod_uid("shop", "api-7d4b9c-x2x7k"));
    assert_eq!(api_pod.workload_name, "api");
    assert_eq!(api_pod.canonical_name, "api-server");
    assert_eq!(api_pod.canonical_revision, "latest");

    // Services: cluster IPs on the local network, a named target port as 0; the
    // ExternalName Service is left out.
    let web = service(&all, web_key);
    assert_eq!(web.hostname, "web.shop.svc.cluster.local");
    assert_eq!(
        web.addresses
            .iter()
            .map(|a| (a.network.as_str(), ip(&a.address)))
            .collect::<Vec<_>>(),
        [("net-1", "10.96.0.10".parse::<IpAddr>().unwrap())]
    );
    assert_eq!(
        web.ports
            .iter()
            .map(|p| (p.service_port, p.target_port, p.app_protocol))
            .collect::<Vec<_>>(),
        [
            (80, 0, workload::AppProtocol::Http11 as i32),
            (9000, 9000, workload::AppProtocol::Tcp as i32)
        ]
    );
    assert_eq!(web.ip_families, workload::IpFamilies::Ipv4Only as i32);
    assert!(web.canonical);
    assert!(!all.contains_key("shop/elsewhere.shop.svc.cluster.local"));

    // The selectorless Service's manual endpoint is a workload; the endpoint of a Pod is not.
    let manual = workload(
        &all,
        "Kubernetes/discovery.k8s.io/EndpointSlice/shop/legacy-manual/10.2.0.9",
    );
    assert_eq!(
        ports(manual.services.get("shop/legacy.shop.svc.cluster.local")),
        [(80, 8080)]
    );
    assert_eq!(manual.status, workload::WorkloadStatus::Healthy as i32);
    assert!(!all.keys().any(|k| {
        k.starts_with("Kubernetes/discovery.k8s.io/EndpointSlice/shop/legacy-manual/10.1.0.1")
    }));

    // The enrolment annotation changes: the Pod is enrolled.
    let pods: Api<Pod> = Api::namespaced(api.client(), "shop");
    let annotate =
        json!({"metadata": {"annotations": {"ambient.istio.io/redirection": "enabled"}}});
    pods.patch("web-1", &PatchParams::default(), &Patch::Merge(&annotate))
        .await
        .expect("annotate web-1");
    until(&cp, "web-1 enrolled for HBONE", |all| {
        matches!(all.get(&pod_uid("shop", "web-1")),
            Some(address::Type::Workload(w)) if w.tunnel_protocol == workload::TunnelProtocol::Hbone as i32)
    })
    .await;

    // web-1 turns Ready: its status alone changes, which the control plane takes in place.
    // What a node proxy is then served, on a stream open before the change and on a new
    // one, is what a control plane that builds its model anew from the same objects serves.
    let mut open = support::address_stream(&cp.ads_uri(), NODE_TOKEN, "node-a")
        .await
        .expect("a Delta stream");
    open.answer().await.expect("the first answer");
    let in_place = cp.status().borrow().in_place;
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    pods.patch_status("web-1", &PatchParams::default(), &Patch::Merge(&ready))
        .await
        .expect("web-1 Ready");
    let served = until(&cp, "web-1 healthy", |all| {
        matches!(all.get(&pod_uid("shop", "web-1")),
            Some(address::Type::Workload(w)) if w.status == workload::WorkloadStatus::Healthy as i32)
    })
    .await;
    assert_eq!(cp.status().borrow().in_place, in_place + 1);
    let pushed = open.next_address(&pod_uid("shop", "web-1")).await;
    assert_eq!(
        Some(&pushed),
        served.get(&pod_uid("shop", "web-1")),
        "the open stream is pushed web-1 as a new one receives it"
    );
    let fresh = start_control_plane(ControlPlaneConfig::kubernetes(KubeSourceConfig::new(
        api.client(),
    )))
    .await;
    let anew = until(&fresh, "a model built anew", |all| {
        all.contains_key(&pod_uid("shop", "web-1"))
    })
    .await;
    assert_eq!(served, anew);
    assert_eq!(*cp.cache().current(), *fresh.cache().current());
    fresh.shutdown().await;

    // Terminating: UNHEALTHY while it stops.
    pods.delete("web-0", &DeleteParams::default())
        .await
        .expect("delete web-0 gracefully");
    until(&cp, "web-0 unhealthy while terminating", |all| {
        matches!(all.get(&pod_uid("shop", "web-0")),
            Some(address::Type::Workload(w)) if w.status == workload::WorkloadStatus::Unhealthy as i32)
    })
    .await;

    // A namespace added, then removed (its Pods deleted and the namespace finalized, as the
    // kubelet and the namespace controller would).
    apply(
        &api,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: blog}\n---\napiVersion: v1\nkind: \
         Pod\nmetadata: {name: blog-0, namespace: blog, labels: {app: blog}}\nspec:\n  \
         nodeName: node-a\n  containers: [{name: app, image: example.invalid/blog}]\nstatus:\n  \
         phase: Running\n  podIP: 10.3.0.1\n  podIPs: [{ip: 10.3.0.1}]\n  conditions: [{type: \
         Ready, status: \"True\"}]\n",
    )
    .await;
    until(&cp, "blog-0 appears", |all| {
        all.contains_key(&pod_uid("blog", "blog-0"))
    })
    .await;
    let blog_pods: Api<Pod> = Api::namespaced(api.client(), "blog");
    blog_pods
        .delete(
            "blog-0",
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await
        .expect("delete blog-0");
    let namespaces: Api<Namespace> = Api::all(api.client());
    namespaces
        .delete("blog", &DeleteParams::default())
        .await
        .expect("delete namespace blog");
    let mut blog = namespaces.get("blog").await.expect("blog is terminating");
    if let Some(spec) = blog.spec.as_mut() {
        spec.finalizers = Some(Vec::new());
    }
    namespaces
        .replace_subresource("finalize", "blog", &PostParams::default(), &blog)
        .await
        .expect("finalize namespace blog");
    until(&cp, "blog-0 gone", |all| {
        !all.contains_key(&pod_uid("blog", "blog-0"))
    })
    .await;
    cp.shutdown().await;
}

/// Beside the demo's manifests, an object of each kind they lack (a Node, a Pod, a Service,
/// an EndpointSlice, a PeerAuthentication), and the namespaces they are all in.
const EXTRA: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Namespace
metadata: {name: blog}
---
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {topology.kubernetes.io/region: eu-west, topology.kubernetes.io/zone: eu-west-1b}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: cart-strict, namespace: shop}
spec:
  selector: {matchLabels: {app: cart}}
  mtls: {mode: STRICT}
---
apiVersion: v1
kind: Service
metadata: {name: ledger, namespace: shop}
spec:
  clusterIP: 10.96.1.21
  ports: [{name: tcp-ledger, port: 7000, targetPort: 7000}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: ledger-vm
  namespace: shop
  labels: {kubernetes.io/service-name: ledger}
addressType: IPv4
ports: [{name: tcp-ledger, port: 7000, protocol: TCP}]
endpoints:
- addresses: [10.4.0.7]
---
apiVersion: v1
kind: Service
metadata: {name: cart, namespace: shop}
spec:
  type: ClusterIP
  clusterIP: 10.96.1.20
  clusterIPs: [10.96.1.20]
  ipFamilies: [IPv4]
  ipFamilyPolicy: SingleStack
  internalTrafficPolicy: Cluster
  selector: {app: cart}
  ports: [{name: http, port: 80, protocol: TCP, targetPort: http}]
---
apiVersion: v1
kind: Pod
metadata:
  name: cart-0
  namespace: shop
  labels: {app: cart}
  annotations: {ambient.istio.io/redirection: enabled}
spec:
  nodeName: node-a
  serviceAccountName: cart
  containers:
  - name: app
    image: example.invalid/cart
    ports: [{name: http, containerPort: 8080, protocol: TCP}]
status:
  phase: Running
  podIP: 10.1.1.20
  podIPs: [{ip: 10.1.1.20}]
  conditions: [{type: Ready, status: "True"}]
"#;

fn demo_manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../demo/manifests")
}

/// Writes every object of the watched kinds that the API server holds into `dir`, one file
/// per kind, as the API serves them (`apiVersion` and `kind` set, as a watch event has them;
/// `managedFields` and `resourceVersion` left out, as the control plane leaves them out).
async fn dump(api: &ApiServer, dir: &Path) -> BTreeMap<&'static str, usize> {
    let mut counts = BTreeMap::new();
    for kind in kube_source::KINDS {
        let objects: Api<DynamicObject> = Api::all_with(api.client(), &kind.api_resource());
        let mut params = kube::api::ListParams::default();
        if let Some(fields) = kind.fields {
            params = params.fields(fields);
        }
        let list = objects.list(&params).await.expect("list a watched kind");
        let mut file = String::new();
        for object in list.items {
            let mut value = serde_json::to_value(object).expect("JSON");
            value["apiVersion"] = Value::String(kind.api_version());
            value["kind"] = Value::String(kind.kind.to_owned());
            if let Some(meta) = value["metadata"].as_object_mut() {
                meta.remove("managedFields");
                meta.remove("resourceVersion");
            }
            file.push_str("---\n");
            file.push_str(&value.to_string());
            file.push('\n');
            *counts.entry(kind.kind).or_default() += 1;
        }
        std::fs::write(dir.join(format!("{}.yaml", kind.plural)), file).expect("write");
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_and_the_api_of_the_same_objects_serve_the_same_resources() {
    let Some(api) = ApiServer::start_or_skip(
        "a_folder_and_the_api_of_the_same_objects_serve_the_same_resources",
    )
    .await
    else {
        return;
    };
    // The demo's manifests, and a Pod and Service beside them, in the API.
    let mut yaml = String::new();
    for entry in std::fs::read_dir(demo_manifests()).expect("the demo's manifests") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            yaml.push_str("\n---\n");
            yaml.push_str(&std::fs::read_to_string(&path).expect("read"));
        }
    }
    apply(&api, EXTRA).await;
    apply(&api, &yaml).await;
    // The folder: every object the API holds now, as the API holds it (with its uid,
    // creation time and defaults), the API server's own (its `kubernetes` Service, its
    // namespaces) included.
    let dir = std::env::temp_dir().join(format!("meshkit-kube-folder-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("folder");
    let objects = dump(&api, &dir).await;
    // Every watched kind is there, so each must reach the model the same way from both.
    for kind in kube_source::KINDS {
        assert!(
            objects.get(kind.kind).is_some_and(|n| *n > 0),
            "no {} among {objects:?}",
            kind.kind
        );
    }
    let folder = start_control_plane(ControlPlaneConfig::new(&dir)).await;
    assert!(
        folder.status().borrow().errors.is_empty(),
        "the folder loads: {:?}",
        folder.status().borrow().errors
    );
    let kube = start_control_plane(ControlPlaneConfig::kubernetes(KubeSourceConfig::new(
        api.client(),
    )))
    .await;

    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let a = folder.cache().current();
        let b = kube.cache().current();
        let differing: Vec<String> = meshkit_control_plane::translate::TYPE_URLS
            .iter()
            .flat_map(|url| {
                let resources = |s: &meshkit_xds_server::Snapshot| {
                    s.get_type(url)
                        .map(|t| {
                            t.resources()
                                .iter()
                                .map(|(name, r)| (name.to_owned(), r.resource.value.clone()))
                                .collect::<BTreeMap<_, _>>()
                        })
                        .unwrap_or_default()
                };
                let (left, right) = (resources(&a), resources(&b));
                left.keys()
                    .chain(right.keys())
                    .filter(|name| left.get(*name) != right.get(*name))
                    .map(|name| format!("{url} {name}"))
                    .collect::<Vec<_>>()
            })
            .collect();
        let served = a.names(ADDRESS_TYPE_URL).len();
        if differing.is_empty() && served > 0 {
            let addresses = a.names(ADDRESS_TYPE_URL);
            for name in [
                pod_uid("shop", "cart-0"),
                "Kubernetes/discovery.k8s.io/EndpointSlice/shop/ledger-vm/10.4.0.7".to_owned(),
                "shop/cart.shop.svc.cluster.local".to_owned(),
            ] {
                assert!(addresses.contains(&name), "{name} served: {addresses:?}");
            }
            let policies = a.names(meshkit_mesh::resources::AUTHORIZATION_TYPE_URL);
            assert!(
                policies.contains(&"istio-system/istio_converted_static_strict".to_owned()),
                "the PeerAuthentication's STRICT: {policies:?}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the folder and the API serve different resources: {differing:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    folder.shutdown().await;
    kube.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A policy the model cannot enforce (`action: CUSTOM`, which the CRD stores without Istio's
/// webhook) is left out alone, as istiod leaves it out for ztunnel: the others apply, and the
/// refusal is a warning of the load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_the_model_refuses_is_left_out_alone() {
    let Some(api) = ApiServer::start_or_skip("a_policy_the_model_refuses_is_left_out_alone").await
    else {
        return;
    };
    let pod = |name: &str, ip: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: shop, labels: \
             {{app: web}}}}\nspec:\n  nodeName: node-a\n  containers: [{{name: app, image: \
             example.invalid/web}}]\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs: \
             [{{ip: {ip}}}]\n  conditions: [{{type: Ready, status: \"True\"}}]\n"
        )
    };
    apply(
        &api,
        &format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: shop}}\n---\n{}",
            pod("web-0", "10.1.0.1")
        ),
    )
    .await;
    let cp = start_control_plane(ControlPlaneConfig::kubernetes(KubeSourceConfig::new(
        api.client(),
    )))
    .await;
    until(&cp, "web-0 served", |all| {
        all.contains_key(&pod_uid("shop", "web-0"))
    })
    .await;

    apply(
        &api,
        &format!(
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: \
             ext, namespace: shop}}\nspec:\n  action: CUSTOM\n  provider: {{name: ext-authz}}\n  \
             rules: [{{to: [{{operation: {{ports: [\"8080\"]}}}}]}}]\n---\n{}",
            pod("web-1", "10.1.0.2")
        ),
    )
    .await;
    let mut status = cp.status();
    tokio::time::timeout(
        PATIENCE,
        status.wait_for(|s| {
            s.warnings
                .iter()
                .any(|e| e.to_string().contains("AuthorizationPolicy shop/ext"))
        }),
    )
    .await
    .expect("the refusal is published")
    .expect("status");
    // The rest applies: web-1, created with the policy, is served.
    until(&cp, "web-1 served beside the refused policy", |all| {
        all.contains_key(&pod_uid("shop", "web-1"))
    })
    .await;
    assert!(cp.status().borrow().errors.is_empty());

    // A policy the model accepted, then edited into one it refuses, stays enforced as it was
    // accepted: leaving it out would open what it closes.
    let authz = meshkit_mesh::resources::AUTHORIZATION_TYPE_URL;
    apply(
        &api,
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: guard, \
         namespace: shop}\nspec:\n  action: DENY\n  rules: [{to: [{operation: {ports: [\"9090\"]}}]}]\n",
    )
    .await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let accepted = loop {
        if let Some(r) = cp.cache().current().get(authz, "shop/guard") {
            break r.version.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "guard not served");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    apply(
        &api,
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: guard, \
         namespace: shop}\nspec:\n  action: DENY\n  rules: [{to: [{operation: {ports: [\"not-a-port\"]}}]}]\n",
    )
    .await;
    tokio::time::timeout(
        PATIENCE,
        status.wait_for(|s| {
            s.warnings.iter().any(|e| {
                let e = e.to_string();
                e.contains("AuthorizationPolicy shop/guard") && e.contains("stays enforced")
            })
        }),
    )
    .await
    .expect("the refused edit is published")
    .expect("status");
    assert_eq!(
        cp.cache()
            .current()
            .get(authz, "shop/guard")
            .map(|r| r.version.clone()),
        Some(accepted),
        "the accepted version stays served"
    );

    // Another kind the model refuses (a WorkloadEntry by host name: meshkit's node proxies
    // need an address) is left out with a warning, and does not hold the rest back.
    apply(
        &api,
        "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: vm, \
         namespace: shop}\nspec: {address: vm.example.com}\n",
    )
    .await;
    let policies: Api<DynamicObject> = Api::namespaced_with(
        api.client(),
        "shop",
        &kube_source::resource_of("security.istio.io/v1", "AuthorizationPolicy")
            .expect("watched")
            .0,
    );
    policies
        .delete("ext", &DeleteParams::default())
        .await
        .expect("delete the policy");
    tokio::time::timeout(
        PATIENCE,
        status.wait_for(|s| {
            !s.warnings
                .iter()
                .any(|e| e.to_string().contains("AuthorizationPolicy shop/ext"))
        }),
    )
    .await
    .expect("the policy's warning goes with it")
    .expect("status");
    let status = cp.status().borrow().clone();
    assert!(status.errors.is_empty(), "{:?}", status.errors);
    assert!(
        status
            .warnings
            .iter()
            .any(|w| w.to_string().contains("WorkloadEntry shop/vm")),
        "{:?}",
        status.warnings
    );
    let dump =
        meshkit_test_support::http_get(cp.admin_addr().expect("an admin address"), "/config_dump")
            .1;
    assert!(dump.contains("WorkloadEntry shop/vm"), "{dump}");
    cp.shutdown().await;
}
