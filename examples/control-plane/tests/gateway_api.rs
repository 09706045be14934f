//! The control plane's Gateway API: manifests in, status conditions, the objects served as
//! they are, and the Envoy listener and routes of each Gateway port.

use std::path::Path;

use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::{
    RouteConfiguration, redirect_action, route, route_action,
};
use meshkit_control_plane::gateway_api::{route_table, status_json};
use meshkit_control_plane::manifests::ManifestSet;
use meshkit_control_plane::translate::{TranslateOptions, build_snapshot};
use meshkit_mesh::resources::{GATEWAY_TYPE_URL, HTTP_ROUTE_TYPE_URL};
use meshkit_xds_client::{LISTENER_TYPE_URL, ROUTE_TYPE_URL};
use prost::Message;

const MANIFESTS: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: web, namespace: shop}
spec:
  hosts: [web.shop.svc.cluster.local]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: api, namespace: shop}
spec:
  hosts: [api.shop.svc.cluster.local]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: meshkit}
spec: {controllerName: meshkit.dev/gateway}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: other}
spec: {controllerName: example.com/other}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: public, namespace: shop}
spec:
  gatewayClassName: meshkit
  listeners:
  - {name: http, port: 18090, protocol: HTTP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: foreign, namespace: shop}
spec:
  gatewayClassName: other
  listeners:
  - {name: http, port: 18091, protocol: HTTP}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: store, namespace: shop}
spec:
  parentRefs: [{name: public}]
  hostnames: [store.example.com]
  rules:
  - matches: [{path: {value: /split}}]
    backendRefs:
    - name: web
      port: 80
      weight: 3
      filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-backend, value: web}]}}]
    - {name: missing, port: 80}
  - matches: [{path: {type: Exact, value: /old}}]
    filters: [{type: RequestRedirect, requestRedirect: {scheme: https, statusCode: 308}}]
  - matches: [{path: {value: /}}]
    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /}}}]
    backendRefs: [{name: api, port: 80}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: elsewhere, namespace: shop}
spec:
  parentRefs: [{name: public, sectionName: https}]
  rules: [{backendRefs: [{name: web, port: 80}]}]
"#;

fn set() -> ManifestSet {
    let mut set = ManifestSet::default();
    let errors = set.add_str(Path::new("gateway.yaml"), MANIFESTS);
    assert!(errors.is_empty(), "{errors:?}");
    set
}

#[test]
fn invalid_objects_are_reported_with_their_field() {
    let mut set = ManifestSet::default();
    let errors = set.add_str(
        Path::new("bad.yaml"),
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: shop}\nspec:\n  rules: [{backendRefs: [{name: web}]}]\n",
    );
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(errors.len(), 1, "{text:?}");
    assert!(
        text[0].contains("spec.rules[0].backendRefs[0].port"),
        "{text:?}"
    );
    assert!(set.gateway_api.http_routes.is_empty());
    let again = set.add_str(
        Path::new("twice.yaml"),
        &format!("{MANIFESTS}\n---\n{MANIFESTS}"),
    );
    assert!(
        again.iter().any(|e| e
            .to_string()
            .contains("HTTPRoute shop/store is defined more than once")),
        "{again:?}"
    );
    assert!(
        again.iter().any(|e| e
            .to_string()
            .contains("GatewayClass meshkit is defined more than once")),
        "{again:?}"
    );
}

#[test]
fn status_conditions_say_what_was_accepted_and_resolved() {
    let set = set();
    let table = route_table(&set, &TranslateOptions::default());
    let status = status_json(&table);
    let routes = status["httpRoutes"].as_array().expect("routes");
    let of = |route: &str| {
        routes
            .iter()
            .find(|r| r["route"] == route)
            .unwrap_or_else(|| panic!("{route} in {status}"))
    };
    let store = &of("shop/store")["conditions"];
    assert_eq!(store["Accepted"]["status"], "True");
    assert_eq!(store["ResolvedRefs"]["status"], "False");
    assert_eq!(store["ResolvedRefs"]["reason"], "BackendNotFound");
    let elsewhere = &of("shop/elsewhere")["conditions"];
    assert_eq!(elsewhere["Accepted"]["reason"], "NoMatchingParent");
    // Only the Gateway of meshkit's class is served.
    let listeners = status["listeners"].as_array().expect("listeners");
    assert_eq!(listeners.len(), 1, "{status}");
    assert_eq!(listeners[0]["gateway"], "shop/public");
    assert_eq!(listeners[0]["attachedRoutes"], 1);
}

#[test]
fn envoy_gets_a_listener_and_routes_per_gateway_port() {
    let set = set();
    let options = TranslateOptions {
        gateway_api_address: "127.0.0.2".parse().unwrap(),
        ..TranslateOptions::default()
    };
    let snapshot = build_snapshot(&set, &options);
    let listeners = snapshot
        .get_type(LISTENER_TYPE_URL)
        .expect("LDS")
        .resources();
    assert!(listeners.contains_key("gateway-api-18090"));
    assert!(
        !listeners.contains_key("gateway-api-18091"),
        "another controller's Gateway"
    );
    let listener = Listener::decode(&*listeners["gateway-api-18090"].resource.value).unwrap();
    let address = format!("{:?}", listener.address);
    assert!(
        address.contains("127.0.0.2") && address.contains("18090"),
        "{address}"
    );

    let routes = snapshot.get_type(ROUTE_TYPE_URL).expect("RDS").resources();
    let config = RouteConfiguration::decode(&*routes["gateway-api-18090"].resource.value).unwrap();
    let hosts: Vec<&str> = config
        .virtual_hosts
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    // The route's hostname, and the listener's own (none: `*`), which no rule serves.
    assert_eq!(hosts, ["store.example.com", "*"]);
    assert!(config.virtual_hosts[1].routes.is_empty());
    let routes = &config.virtual_hosts[0].routes;
    // Exact first, then prefixes from the longest.
    let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "shop/store rule 1 match 0",
            "shop/store rule 0 match 0",
            "shop/store rule 2 match 0"
        ]
    );
    match &routes[0].action {
        Some(route::Action::Redirect(r)) => {
            assert_eq!(
                r.response_code,
                redirect_action::RedirectResponseCode::PermanentRedirect as i32
            );
            // https's own port is left out.
            assert_eq!(r.port_redirect, 0);
        }
        other => panic!("{other:?}"),
    }
    match &routes[1].action {
        Some(route::Action::Route(action)) => {
            assert_eq!(
                action.cluster_not_found_response_code,
                route_action::ClusterNotFoundResponseCode::InternalServerError as i32
            );
            let Some(route_action::ClusterSpecifier::WeightedClusters(w)) =
                &action.cluster_specifier
            else {
                panic!("{action:?}");
            };
            let weights: Vec<(&str, u32)> = w
                .clusters
                .iter()
                .map(|c| (c.name.as_str(), c.weight.as_ref().map_or(0, |v| v.value)))
                .collect();
            assert_eq!(weights[0], ("outbound|80||web.shop.svc.cluster.local", 3));
            // The backend's own header filter, on its cluster entry.
            let headers: Vec<&str> = w.clusters[0]
                .request_headers_to_add
                .iter()
                .filter_map(|h| h.header.as_ref().map(|h| h.key.as_str()))
                .collect();
            assert_eq!(headers, ["x-backend"]);
            assert!(weights[1].0.starts_with("invalid-backend|"), "{weights:?}");
            assert_eq!(weights[1].1, 1);
        }
        other => panic!("{other:?}"),
    }
    match &routes[2].action {
        Some(route::Action::Route(action)) => {
            // ReplacePrefixMatch `/` on prefix `/`: a regex rewrite, not Envoy's prefix one.
            assert!(action.regex_rewrite.is_some(), "{action:?}");
        }
        other => panic!("{other:?}"),
    }

    // The objects themselves, for meshkit gateways: only the Gateways of meshkit's class.
    let gateways = snapshot
        .get_type(GATEWAY_TYPE_URL)
        .expect("Gateways")
        .resources();
    assert_eq!(gateways.keys().collect::<Vec<_>>(), ["shop/public"]);
    let routes = snapshot
        .get_type(HTTP_ROUTE_TYPE_URL)
        .expect("HTTPRoutes")
        .resources();
    let store: serde_json::Value =
        serde_json::from_slice(&routes["shop/store"].resource.value).unwrap();
    assert_eq!(store["spec"]["hostnames"][0], "store.example.com");
}
