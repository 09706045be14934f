#![no_main]
//! Gateway API lookups, redirects and rewrites on arbitrary requests never panic.
use meshkit_ingress_model::gateway::{Action, Filter, HttpRequest, HttpRouteTable, manifest};
libfuzzer_sys::fuzz_target!(|input: (&str, &str, &str, &str, &str)| {
    let yaml = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: g, namespace: n}\nspec:\n  gatewayClassName: c\n  listeners:\n  - {name: a, port: 80, protocol: HTTP, hostname: '*.a.com'}\n  - {name: b, port: 80, protocol: HTTP}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: r, namespace: n}\nspec:\n  parentRefs: [{name: g}]\n  rules:\n  - matches: [{path: {value: /x}, headers: [{name: h, value: v}], queryParams: [{name: q, value: v}]}]\n    filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /y}}}]\n    backendRefs: [{name: s, port: 1}]\n  - matches: [{path: {type: Exact, value: /x/y}}]\n    filters: [{type: RequestRedirect, requestRedirect: {scheme: https, path: {type: ReplaceFullPath, replaceFullPath: /z}}}]\n";
    let objects = manifest::from_yaml_str(yaml).unwrap_or_default();
    let table = HttpRouteTable::new(&objects.gateways, &objects.http_routes, &[]);
    let (host, path, query, header, method) = input;
    let mut headers = http::HeaderMap::new();
    if let Ok(value) = http::HeaderValue::from_str(header) {
        headers.insert("h", value);
    }
    let request = HttpRequest { port: 80, host, path, query: Some(query), method, headers: &headers };
    let Some(hit) = table.route(&request) else { return };
    if let Action::Redirect(redirect) = hit.action(0) {
        let _ = redirect.location("http", host, 80, path, Some(query), hit.matched_path());
    }
    for filter in hit.filters() {
        if let Filter::Rewrite(rewrite) = filter {
            let _ = rewrite.path(path, hit.matched_path());
        }
    }
    let _ = table.certificates_for(80, host);
});
