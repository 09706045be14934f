//! Gateway API validation: each CRD rule rejects what it should, with its field path, and a
//! valid set of objects passes; manifests of every kind load from YAML and JSON.

use meshkit_ingress_model::gateway::{manifest, validation};
use meshkit_ingress_model::manifest::ManifestError;

/// The field paths of the errors of the one object in `yaml`, of whatever kind.
fn error_paths(yaml: &str) -> Vec<String> {
    let objects = manifest::from_yaml_str(yaml).unwrap_or_else(|e| panic!("{e}: {yaml}"));
    let result = if let Some(class) = objects.gateway_classes.first() {
        validation::validate_gateway_class(class)
    } else if let Some(gateway) = objects.gateways.first() {
        validation::validate_gateway(gateway)
    } else if let Some(route) = objects.http_routes.first() {
        validation::validate_http_route(route)
    } else if let Some(grant) = objects.reference_grants.first() {
        validation::validate_reference_grant(grant)
    } else {
        panic!("no object in {yaml}");
    };
    match result {
        Ok(()) => Vec::new(),
        Err(errors) => errors
            .errors()
            .iter()
            .map(|e| e.path().to_owned())
            .collect(),
    }
}

fn route(spec: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r, namespace: ns}}\nspec:\n{spec}"
    )
}

fn gateway(listeners: &str) -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: g, namespace: ns}}\nspec:\n  gatewayClassName: meshkit\n  listeners:\n{listeners}"
    )
}

#[test]
fn valid_objects_pass() {
    let valid = [
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: meshkit}\nspec: {controllerName: meshkit.dev/gateway, description: the meshkit gateway}",
        &gateway(
            "  - {name: http, port: 80, protocol: HTTP, hostname: \"*.example.com\"}\n  - name: https\n    port: 443\n    protocol: HTTPS\n    tls: {certificateRefs: [{name: cert}]}\n    allowedRoutes: {namespaces: {from: All}, kinds: [{kind: HTTPRoute}]}",
        ),
        &route(
            "  parentRefs: [{name: g, sectionName: http}, {name: g, sectionName: https}]\n  hostnames: [shop.example.com]\n  rules:\n  - name: api\n    matches: [{path: {type: PathPrefix, value: /api/v1}, headers: [{name: x-env, value: canary}], queryParams: [{name: q, value: x}], method: GET}]\n    filters:\n    - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-a, value: b}], remove: [x-c]}}\n    - {type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /}}}\n    backendRefs: [{name: api, port: 8080, weight: 0}, {name: next, port: 8080, weight: 1000000}]\n    timeouts: {request: 10s, backendRequest: 1s500ms}",
        ),
        "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g, namespace: backends}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: ns}]\n  to: [{group: \"\", kind: Service}]",
    ];
    for yaml in valid {
        assert_eq!(error_paths(yaml), Vec::<String>::new(), "{yaml}");
    }
}

#[test]
fn each_rule_names_its_field() {
    // (object, the field paths its errors name)
    let cases: Vec<(String, Vec<&str>)> = vec![
        (
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: c, namespace: not-allowed}\nspec: {controllerName: no-domain}".into(),
            vec!["metadata.namespace", "spec.controllerName"],
        ),
        (gateway("    []"), vec!["spec.listeners"]),
        (
            gateway("  - {name: Bad_Name, port: 0, protocol: HTTP, hostname: 10.0.0.1}"),
            vec![
                "spec.listeners[0].name",
                "spec.listeners[0].hostname",
                "spec.listeners[0].port",
            ],
        ),
        (
            gateway("  - {name: a, port: 80, protocol: HTTP}\n  - {name: a, port: 80, protocol: HTTP}"),
            vec!["spec.listeners[1].name", "spec.listeners[1]"],
        ),
        (
            gateway("  - {name: a, port: 80, protocol: HTTP, tls: {certificateRefs: [{name: c}]}}"),
            vec!["spec.listeners[0].tls"],
        ),
        (
            gateway("  - {name: a, port: 443, protocol: HTTPS, tls: {mode: Passthrough}}"),
            vec!["spec.listeners[0].tls.mode"],
        ),
        (
            gateway("  - {name: a, port: 443, protocol: HTTPS, tls: {}}"),
            vec!["spec.listeners[0].tls"],
        ),
        (
            gateway("  - {name: a, port: 443, protocol: TLS}"),
            vec!["spec.listeners[0].tls.mode"],
        ),
        (
            gateway("  - {name: a, port: 9000, protocol: TCP, hostname: a.example.com}"),
            vec!["spec.listeners[0].hostname"],
        ),
        (
            gateway("  - {name: a, port: 80, protocol: \"HTTP/2\"}"),
            vec!["spec.listeners[0].protocol"],
        ),
        (
            gateway("  - {name: a, port: 80, protocol: HTTP, allowedRoutes: {namespaces: {from: Everywhere}}}"),
            vec!["spec.listeners[0].allowedRoutes.namespaces.from"],
        ),
        (
            route("  hostnames: [\"*\", Upper.example.com, \"*.ok.example.com\"]"),
            vec!["spec.hostnames[0]", "spec.hostnames[1]"],
        ),
        (
            route("  parentRefs: [{name: g}, {name: g, sectionName: http}]"),
            vec!["spec.parentRefs"],
        ),
        (
            route("  parentRefs: [{name: g, sectionName: a}, {name: g, sectionName: a}]"),
            vec!["spec.parentRefs"],
        ),
        (
            route("  rules:\n  - matches: [{path: {type: Exact, value: /a//b}}, {path: {value: /a/..}}, {path: {value: \"/a b\"}}, {path: {type: Glob, value: /x}}]"),
            vec![
                "spec.rules[0].matches[0].path.value",
                "spec.rules[0].matches[1].path.value",
                "spec.rules[0].matches[2].path.value",
                "spec.rules[0].matches[3].path.type",
            ],
        ),
        (
            route("  rules:\n  - matches: [{headers: [{name: \"bad header\", value: x}, {name: ok, value: \"\"}], method: FETCH}]"),
            vec![
                "spec.rules[0].matches[0].headers[0].name",
                "spec.rules[0].matches[0].headers[1].value",
                "spec.rules[0].matches[0].method",
            ],
        ),
        (
            route("  rules:\n  - filters:\n    - {type: RequestRedirect, requestRedirect: {statusCode: 304}}\n    - {type: URLRewrite, urlRewrite: {hostname: a.test}}"),
            vec!["spec.rules[0].filters", "spec.rules[0].filters[0].requestRedirect.statusCode"],
        ),
        (
            route("  rules:\n  - filters:\n    - {type: RequestHeaderModifier, requestHeaderModifier: {}}\n    - {type: RequestHeaderModifier, responseHeaderModifier: {}}"),
            vec![
                "spec.rules[0].filters",
                "spec.rules[0].filters[1].requestHeaderModifier",
                "spec.rules[0].filters[1].responseHeaderModifier",
            ],
        ),
        (
            route("  rules:\n  - filters: [{type: RequestRedirect, requestRedirect: {scheme: ftp}}]\n    backendRefs: [{name: a, port: 1}]"),
            vec!["spec.rules[0].filters[0].requestRedirect.scheme", "spec.rules[0].filters"],
        ),
        (
            route("  rules:\n  - matches: [{path: {type: Exact, value: /a}}]\n    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /b}}}]"),
            vec!["spec.rules[0].filters[0].urlRewrite.path"],
        ),
        (
            route("  rules:\n  - filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplaceFullPath, replacePrefixMatch: /b}}}]"),
            vec![
                "spec.rules[0].filters[0].urlRewrite.path.replaceFullPath",
                "spec.rules[0].filters[0].urlRewrite.path.replacePrefixMatch",
            ],
        ),
        (
            route("  rules:\n  - backendRefs: [{name: a}, {name: b, port: 70000}, {name: c, port: 1, weight: -1}]"),
            vec![
                "spec.rules[0].backendRefs[0].port",
                "spec.rules[0].backendRefs[1].port",
                "spec.rules[0].backendRefs[2].weight",
            ],
        ),
        (
            route("  rules:\n  - timeouts: {request: 1s, backendRequest: 2s}\n  - timeouts: {request: 1.5s}"),
            vec!["spec.rules[0].timeouts", "spec.rules[1].timeouts.request"],
        ),
        (
            "apiVersion: gateway.networking.k8s.io/v1beta1\nkind: ReferenceGrant\nmetadata: {name: g, namespace: b}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: 9Route, namespace: Not_A_Namespace}]\n  to: []".into(),
            vec!["spec.to", "spec.from[0].kind", "spec.from[0].namespace"],
        ),
    ];
    for (yaml, expected) in cases {
        assert_eq!(error_paths(&yaml), expected, "{yaml}");
    }
}

#[test]
fn the_total_of_matches_is_bounded() {
    let rule = |n: usize| {
        format!(
            "  - matches: [{}]\n",
            vec!["{path: {value: /a}}"; n].join(", ")
        )
    };
    let at_limit = route(&format!("  rules:\n{}", rule(64).repeat(2)));
    assert_eq!(error_paths(&at_limit), Vec::<String>::new());
    let over = route(&format!("  rules:\n{}{}", rule(64).repeat(2), rule(1)));
    assert_eq!(error_paths(&over), ["spec.rules"]);
}

#[test]
fn manifests_read_every_kind_in_yaml_lists_and_json() {
    let yaml = r#"
apiVersion: v1
kind: List
items:
- apiVersion: gateway.networking.k8s.io/v1
  kind: GatewayClass
  metadata: {name: meshkit}
  spec: {controllerName: meshkit.dev/gateway}
- apiVersion: networking.k8s.io/v1
  kind: Ingress
  metadata: {name: skipped}
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: HTTPRouteList
items:
- apiVersion: gateway.networking.k8s.io/v1beta1
  kind: HTTPRoute
  metadata: {name: r}
  spec: {parentRefs: [{name: g}]}
"#;
    let objects = manifest::from_yaml_str(yaml).expect("manifest");
    assert_eq!(objects.gateway_classes.len(), 1);
    assert_eq!(objects.http_routes.len(), 1);
    assert!(objects.gateways.is_empty());

    let json = r#"{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "g"}, "spec": {"gatewayClassName": "meshkit",
        "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}"#;
    let objects = manifest::from_json_str(json).expect("json");
    assert_eq!(objects.gateways[0].spec.listeners[0].port, 80);

    let wrong_version =
        "apiVersion: gateway.networking.k8s.io/v1alpha2\nkind: HTTPRoute\nmetadata: {name: r}";
    assert!(matches!(
        manifest::from_yaml_str(wrong_version),
        Err(ManifestError::UnsupportedVersion { .. })
    ));
    let wrong_type = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: g}\nspec: {listeners: [{name: a, port: eighty}]}";
    match manifest::from_yaml_str(wrong_type) {
        Err(ManifestError::Field { path, .. }) => assert_eq!(path, "spec.listeners[0].port"),
        other => panic!("{other:?}"),
    }
}
