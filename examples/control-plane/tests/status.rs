//! Status written back to a real API server (test-support's etcd + kube-apiserver): Ingress
//! addresses, GatewayClass, Gateway and HTTPRoute conditions, only for meshkit's objects,
//! only when they change; and one writer among replicas, elected on a Lease. The control
//! planes run as their own ServiceAccount, with only the RBAC of `deploy/rbac.yaml`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use meshkit_control_plane::kube_source::{self, KubeSourceConfig};
use meshkit_control_plane::leader::LeaseConfig;
use meshkit_control_plane::status::{AddressSource, FIELD_MANAGER, StatusConfig};
use meshkit_control_plane::{ControlPlane, ControlPlaneConfig};
use meshkit_test_support::apiserver::ApiServer;
use serde_json::{Value, json};

mod support;
use support::apply;

const PATIENCE: Duration = Duration::from_secs(20);

/// Two IngressClasses, GatewayClasses and Gateways: meshkit's and another controller's; three
/// HTTPRoutes: accepted by meshkit's Gateway (with a parent of the other's, whose status that
/// controller already wrote), not accepted (no hostname in common), and the other's alone.
const OBJECTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Service
metadata: {name: gateway, namespace: shop}
spec:
  type: LoadBalancer
  selector: {app: gateway}
  ports: [{name: http, port: 80}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: echo, namespace: shop}
spec:
  hosts: [echo.shop.example]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.1.0.5}]
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: meshkit}
spec: {controller: meshkit.io/ingress-gateway}
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: other}
spec: {controller: example.com/ingress}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web, namespace: shop}
spec:
  ingressClassName: meshkit
  defaultBackend: {service: {name: echo, port: {number: 80}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: theirs, namespace: shop}
spec:
  ingressClassName: other
  defaultBackend: {service: {name: echo, port: {number: 80}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: meshkit}
spec: {controllerName: meshkit.dev/gateway}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: other}
spec: {controllerName: example.com/gateway}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: shop}
spec:
  gatewayClassName: meshkit
  listeners:
  - {name: http, port: 80, protocol: HTTP, hostname: "*.example.com"}
  - name: https
    port: 443
    protocol: HTTPS
    hostname: "*.example.com"
    tls: {mode: Terminate, certificateRefs: [{name: missing}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: theirs, namespace: shop}
spec:
  gatewayClassName: other
  listeners: [{name: http, port: 80, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r1, namespace: shop}
spec:
  parentRefs: [{name: gw, sectionName: http}, {name: theirs}]
  hostnames: [a.example.com]
  rules: [{backendRefs: [{name: echo, port: 80}]}]
status:
  parents:
  - parentRef: {group: gateway.networking.k8s.io, kind: Gateway, name: theirs}
    controllerName: example.com/gateway
    conditions:
    - {type: Accepted, status: "True", reason: Accepted, message: "", lastTransitionTime: "2026-01-01T00:00:00Z"}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r2, namespace: shop}
spec:
  parentRefs: [{name: gw}]
  hostnames: [b.example.org]
  rules: [{backendRefs: [{name: echo, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: r3, namespace: shop}
spec:
  parentRefs: [{name: theirs}]
  rules: [{backendRefs: [{name: echo, port: 80}]}]
"#;

/// A control plane under its own ServiceAccount, with only the RBAC of `deploy/rbac.yaml`.
async fn start(api: &ApiServer, status: StatusConfig) -> ControlPlane {
    let any = SocketAddr::from(([127, 0, 0, 1], 0));
    let client = support::control_plane_client(api).await;
    let source = KubeSourceConfig::new(client).with_status(status);
    ControlPlane::start(
        ControlPlaneConfig::kubernetes(source)
            .with_ads_addr(any)
            .with_ca_addr(any)
            .with_plaintext(),
    )
    .await
    .expect("control plane starts")
}

/// The object as the API server holds it.
async fn get(api: &ApiServer, api_version: &str, kind: &str, ns: &str, name: &str) -> Value {
    let (resource, namespaced) = kube_source::resource_of(api_version, kind).expect("a kind");
    let objects: Api<DynamicObject> = if namespaced {
        Api::namespaced_with(api.client(), ns, &resource)
    } else {
        Api::all_with(api.client(), &resource)
    };
    let object = objects.get(name).await.expect("the object");
    serde_json::to_value(object).expect("JSON")
}

/// Polls the object until `check` passes on it, for at most [`PATIENCE`].
async fn until(
    api: &ApiServer,
    (api_version, kind, ns, name): (&str, &str, &str, &str),
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let object = get(api, api_version, kind, ns, name).await;
        if check(&object) {
            return object;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not after {PATIENCE:?}; {kind} {ns}/{name} is {:#}",
            object["status"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const GW: (&str, &str, &str, &str) = ("gateway.networking.k8s.io/v1", "Gateway", "shop", "gw");
const R1: (&str, &str, &str, &str) = ("gateway.networking.k8s.io/v1", "HTTPRoute", "shop", "r1");
const R2: (&str, &str, &str, &str) = ("gateway.networking.k8s.io/v1", "HTTPRoute", "shop", "r2");
const WEB: (&str, &str, &str, &str) = ("networking.k8s.io/v1", "Ingress", "shop", "web");

/// The condition of `type` in a list of conditions.
fn condition<'v>(conditions: &'v Value, kind: &str) -> &'v Value {
    conditions
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == kind))
        .unwrap_or(&Value::Null)
}

fn listener<'v>(gateway: &'v Value, name: &str) -> &'v Value {
    gateway["status"]["listeners"]
        .as_array()
        .and_then(|l| l.iter().find(|l| l["name"] == name))
        .unwrap_or(&Value::Null)
}

/// Whether `field_manager` wrote any of the object's fields.
fn managed_by(object: &Value, field_manager: &str) -> bool {
    object["metadata"]["managedFields"]
        .as_array()
        .is_some_and(|m| m.iter().any(|f| f["manager"] == field_manager))
}

fn resource_versions(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|o| {
            o["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_meshkits_objects_is_written_once_and_kept_right() {
    let Some(api) =
        ApiServer::start_or_skip("status_of_meshkits_objects_is_written_once_and_kept_right").await
    else {
        return;
    };
    apply(&api, OBJECTS).await;
    let status = StatusConfig::default().with_address(AddressSource::Service {
        namespace: "shop".into(),
        name: "gateway".into(),
    });
    let cp = start(&api, status).await;

    // Before the gateway's Service has an address: accepted, not programmed.
    let gw = until(&api, GW, "the Gateway accepted", |g| {
        condition(&g["status"]["conditions"], "Accepted")["status"] == "True"
    })
    .await;
    let programmed = condition(&gw["status"]["conditions"], "Programmed");
    assert_eq!(programmed["status"], "False", "{gw:#}");
    assert_eq!(programmed["reason"], "AddressNotAssigned");
    assert_eq!(
        condition(&gw["status"]["conditions"], "Accepted")["observedGeneration"],
        gw["metadata"]["generation"]
    );
    let http = listener(&gw, "http");
    // r1 is Accepted on it; r2 names no hostname of it, so is not counted.
    assert_eq!(http["attachedRoutes"], 1, "{gw:#}");
    assert_eq!(http["supportedKinds"][0]["kind"], "HTTPRoute");
    assert_eq!(condition(&http["conditions"], "Accepted")["status"], "True");
    assert_eq!(
        condition(&http["conditions"], "Conflicted")["status"],
        "False"
    );
    let https = listener(&gw, "https");
    let refs = condition(&https["conditions"], "ResolvedRefs");
    assert_eq!(refs["status"], "False", "{gw:#}");
    assert_eq!(refs["reason"], "InvalidCertificateRef");
    let class = until(
        &api,
        (
            "gateway.networking.k8s.io/v1",
            "GatewayClass",
            "",
            "meshkit",
        ),
        "the GatewayClass accepted",
        |c| condition(&c["status"]["conditions"], "Accepted")["status"] == "True",
    )
    .await;
    assert!(managed_by(&class, FIELD_MANAGER));

    // r1: meshkit's parent beside the other controller's, kept as it wrote it.
    let r1 = until(&api, R1, "r1's parent status", |r| {
        r["status"]["parents"]
            .as_array()
            .is_some_and(|p| p.len() == 2)
    })
    .await;
    let parents = r1["status"]["parents"].as_array().expect("parents");
    assert_eq!(
        parents[0]["controllerName"], "example.com/gateway",
        "{r1:#}"
    );
    assert_eq!(
        condition(&parents[0]["conditions"], "Accepted")["lastTransitionTime"],
        "2026-01-01T00:00:00Z"
    );
    assert_eq!(parents[1]["controllerName"], "meshkit.dev/gateway");
    assert_eq!(parents[1]["parentRef"]["name"], "gw");
    assert_eq!(parents[1]["parentRef"]["sectionName"], "http");
    assert_eq!(
        condition(&parents[1]["conditions"], "Accepted")["status"],
        "True"
    );
    assert_eq!(
        condition(&parents[1]["conditions"], "ResolvedRefs")["status"],
        "True"
    );
    let r2 = until(&api, R2, "r2's parent status", |r| {
        r["status"]["parents"]
            .as_array()
            .is_some_and(|p| p.len() == 1)
    })
    .await;
    let accepted = condition(&r2["status"]["parents"][0]["conditions"], "Accepted");
    assert_eq!(accepted["status"], "False", "{r2:#}");
    assert_eq!(accepted["reason"], "NoMatchingListenerHostname");

    // Another controller's objects: nothing written.
    for (api_version, kind, ns, name) in [
        ("networking.k8s.io/v1", "Ingress", "shop", "theirs"),
        ("gateway.networking.k8s.io/v1", "Gateway", "shop", "theirs"),
        ("gateway.networking.k8s.io/v1", "GatewayClass", "", "other"),
        ("gateway.networking.k8s.io/v1", "HTTPRoute", "shop", "r3"),
    ] {
        let object = get(&api, api_version, kind, ns, name).await;
        assert!(
            !managed_by(&object, FIELD_MANAGER),
            "{kind} {name}: {object:#}"
        );
    }
    let web = get(&api, WEB.0, WEB.1, WEB.2, WEB.3).await;
    assert!(!managed_by(&web, FIELD_MANAGER), "no address yet: {web:#}");

    // The gateway's Service gets its load balancer: the Ingress and the Gateway follow.
    apply(
        &api,
        "apiVersion: v1\nkind: Service\nmetadata: {name: gateway, namespace: shop}\nspec:\n  type: LoadBalancer\n  selector: {app: gateway}\n  ports: [{name: http, port: 80}]\nstatus:\n  loadBalancer: {ingress: [{ip: 192.0.2.10}]}\n",
    )
    .await;
    until(&api, WEB, "the Ingress's address", |i| {
        i["status"]["loadBalancer"]["ingress"][0]["ip"] == "192.0.2.10"
    })
    .await;
    let gw = until(&api, GW, "the Gateway programmed", |g| {
        condition(&g["status"]["conditions"], "Programmed")["status"] == "True"
    })
    .await;
    assert_eq!(
        gw["status"]["addresses"],
        json!([{ "type": "IPAddress", "value": "192.0.2.10" }])
    );
    assert_eq!(
        condition(&listener(&gw, "http")["conditions"], "Programmed")["status"],
        "True"
    );

    // Settled: a change elsewhere writes nothing.
    let settled = |cp: &ControlPlane| cp.metrics().status().total_writes();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writes = settled(&cp);
    let before = vec![
        get(&api, GW.0, GW.1, GW.2, GW.3).await,
        get(&api, R1.0, R1.1, R1.2, R1.3).await,
        get(&api, R2.0, R2.1, R2.2, R2.3).await,
        get(&api, WEB.0, WEB.1, WEB.2, WEB.3).await,
    ];
    apply(
        &api,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, labels: {touched: \"yes\"}}\n",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = vec![
        get(&api, GW.0, GW.1, GW.2, GW.3).await,
        get(&api, R1.0, R1.1, R1.2, R1.3).await,
        get(&api, R2.0, R2.1, R2.2, R2.3).await,
        get(&api, WEB.0, WEB.1, WEB.2, WEB.3).await,
    ];
    assert_eq!(settled(&cp), writes, "no status changed, none written");
    assert_eq!(resource_versions(&before), resource_versions(&after));

    // Someone else changes a condition meshkit owns: it is written back, once.
    api_patch_status(
        &api,
        GW,
        json!({ "status": { "conditions": [{
            "type": "Accepted", "status": "False", "reason": "Pending", "message": "meddled",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }]}}),
    )
    .await;
    until(&api, GW, "the meddled condition written back", |g| {
        condition(&g["status"]["conditions"], "Accepted")["status"] == "True"
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(settled(&cp), writes + 1, "one write puts it right");

    // A new generation of r2, now with a hostname in common: accepted, and attached.
    apply(
        &api,
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r2, namespace: shop}\nspec:\n  parentRefs: [{name: gw}]\n  hostnames: [b.example.com]\n  rules: [{backendRefs: [{name: echo, port: 80}]}]\n",
    )
    .await;
    let r2 = until(&api, R2, "r2 accepted", |r| {
        condition(&r["status"]["parents"][0]["conditions"], "Accepted")["status"] == "True"
    })
    .await;
    let accepted = condition(&r2["status"]["parents"][0]["conditions"], "Accepted");
    assert_eq!(accepted["observedGeneration"], r2["metadata"]["generation"]);
    assert_eq!(r2["metadata"]["generation"], 2);
    until(&api, GW, "both routes attached", |g| {
        listener(g, "http")["attachedRoutes"] == 2
    })
    .await;

    // Objects the model refuses are left out, each reported as an Event on it: a
    // WorkloadEntry by host name, an AuthorizationPolicy a node proxy cannot enforce.
    apply(
        &api,
        "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata: {name: vm, namespace: shop}\nspec: {address: vm.example.com}\n---\n\
         apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: ext, namespace: shop}\n\
         spec: {action: CUSTOM, provider: {name: ext-authz}, rules: [{to: [{operation: {ports: [\"8080\"]}}]}]}\n",
    )
    .await;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(api.client(), "shop");
    for (name, kind, words) in [
        ("vm", "WorkloadEntry", "address"),
        ("ext", "AuthorizationPolicy", "CUSTOM"),
    ] {
        let deadline = Instant::now() + PATIENCE;
        let event = loop {
            let params =
                kube::api::ListParams::default().fields(&format!("involvedObject.name={name}"));
            let list = events.list(&params).await.expect("Events");
            if let Some(event) = list.items.into_iter().next() {
                break event;
            }
            assert!(Instant::now() < deadline, "no Event for the refused {kind}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(event.reason.as_deref(), Some("Refused"));
        assert_eq!(event.type_.as_deref(), Some("Warning"));
        assert_eq!(event.involved_object.kind.as_deref(), Some(kind));
        assert!(
            event.message.as_deref().is_some_and(|m| m.contains(words)),
            "{event:?}"
        );
    }
    // r1 leaves meshkit's Gateway: the parent meshkit wrote goes, the other controller's
    // stays.
    apply(
        &api,
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r1, namespace: shop}\nspec:\n  parentRefs: [{name: theirs}]\n  hostnames: [a.example.com]\n  rules: [{backendRefs: [{name: echo, port: 80}]}]\n",
    )
    .await;
    let r1 = until(&api, R1, "meshkit's parent removed from r1", |r| {
        r["status"]["parents"]
            .as_array()
            .is_some_and(|p| p.len() == 1)
    })
    .await;
    assert_eq!(
        r1["status"]["parents"][0]["controllerName"],
        "example.com/gateway"
    );
    // The gateway's Service loses its address: the Ingress's is taken back.
    api_patch_status(
        &api,
        ("v1", "Service", "shop", "gateway"),
        json!({ "status": { "loadBalancer": { "ingress": null } } }),
    )
    .await;
    until(&api, WEB, "the Ingress's address taken back", |i| {
        i["status"]["loadBalancer"]["ingress"]
            .as_array()
            .is_none_or(|a| a.is_empty())
    })
    .await;

    // Once: another change does not report it again.
    apply(
        &api,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop, labels: {touched: \"again\"}}\n",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let params = kube::api::ListParams::default().fields("involvedObject.name=vm");
    assert_eq!(events.list(&params).await.expect("Events").items.len(), 1);
    cp.shutdown().await;
}

/// Patches the status of `object` as another controller would.
async fn api_patch_status(
    api: &ApiServer,
    (api_version, kind, ns, name): (&str, &str, &str, &str),
    patch: Value,
) {
    let (resource, _) = kube_source::resource_of(api_version, kind).expect("a kind");
    let objects: Api<DynamicObject> = Api::namespaced_with(api.client(), ns, &resource);
    objects
        .patch_status(
            name,
            &PatchParams {
                field_manager: Some("meddler".into()),
                ..PatchParams::default()
            },
            &Patch::Merge(&patch),
        )
        .await
        .expect("status patched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_writes_and_another_takes_over_when_it_stops() {
    let Some(api) =
        ApiServer::start_or_skip("one_replica_writes_and_another_takes_over_when_it_stops").await
    else {
        return;
    };
    apply(&api, OBJECTS).await;
    let lease_duration = Duration::from_secs(3);
    let replica = |identity: &str| {
        StatusConfig::default().with_lease(LeaseConfig::new("istio-system", identity).with_timing(
            lease_duration,
            Duration::from_secs(2),
            Duration::from_millis(300),
        ))
    };
    let a = start(&api, replica("replica-a")).await;
    let b = start(&api, replica("replica-b")).await;
    until(&api, GW, "the Gateway accepted", |g| {
        condition(&g["status"]["conditions"], "Accepted")["status"] == "True"
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (a_leads, b_leads) = (
        a.metrics().status().leading(),
        b.metrics().status().leading(),
    );
    assert!(
        a_leads != b_leads,
        "exactly one leads: a {a_leads}, b {b_leads}"
    );
    let (leader, standby) = if a_leads { (a, b) } else { (b, a) };
    assert!(leader.metrics().status().total_writes() > 0);
    assert_eq!(
        standby.metrics().status().total_writes(),
        0,
        "the standby writes nothing"
    );

    // The leader stops without giving the Lease up (a crash): the standby waits out the
    // lease, then corrects what changed meanwhile.
    drop(leader);
    let stopped = Instant::now();
    api_patch_status(
        &api,
        GW,
        json!({ "status": { "conditions": [{
            "type": "Accepted", "status": "False", "reason": "Pending", "message": "meddled",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }]}}),
    )
    .await;
    apply(
        &api,
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r2, namespace: shop}\nspec:\n  parentRefs: [{name: gw}]\n  hostnames: [b.example.com]\n  rules: [{backendRefs: [{name: echo, port: 80}]}]\n",
    )
    .await;
    while !standby.metrics().status().leading() {
        assert!(
            stopped.elapsed() < 2 * lease_duration,
            "no takeover after {:?}",
            stopped.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = stopped.elapsed();
    // Within the lease duration of the last renewal, plus one read of the Lease.
    assert!(
        took <= lease_duration + Duration::from_millis(900),
        "took over after {took:?}"
    );
    until(&api, GW, "the meddled condition corrected", |g| {
        condition(&g["status"]["conditions"], "Accepted")["status"] == "True"
            && listener(g, "http")["attachedRoutes"] == 2
    })
    .await;
    until(&api, R2, "r2's new generation reported", |r| {
        condition(&r["status"]["parents"][0]["conditions"], "Accepted")["observedGeneration"] == 2
    })
    .await;
    let lease = api_lease(&api).await;
    assert_eq!(lease["spec"]["leaseTransitions"], 1, "{lease:#}");
    standby.shutdown().await;
    // Released on a clean stop.
    let lease = api_lease(&api).await;
    assert!(lease["spec"]["holderIdentity"].is_null(), "{lease:#}");
}

async fn api_lease(api: &ApiServer) -> Value {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(api.client(), "istio-system");
    serde_json::to_value(
        leases
            .get("meshkit-control-plane")
            .await
            .expect("the Lease"),
    )
    .expect("JSON")
}
