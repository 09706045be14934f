#![no_main]
//! Gateway API manifests never panic the reader, the validators or the table built from
//! whatever loads, nor a lookup of each route hostname and path in it.
use meshkit_ingress_model::gateway::{HttpRequest, HttpRouteTable, manifest, validation};
libfuzzer_sys::fuzz_target!(|s: &str| {
    let Ok(objects) = manifest::from_yaml_str(s) else { return };
    objects.gateway_classes.iter().for_each(|c| drop(validation::validate_gateway_class(c)));
    objects.gateways.iter().for_each(|g| drop(validation::validate_gateway(g)));
    objects.http_routes.iter().for_each(|r| drop(validation::validate_http_route(r)));
    objects.reference_grants.iter().for_each(|g| drop(validation::validate_reference_grant(g)));
    let table = HttpRouteTable::new(&objects.gateways, &objects.http_routes, &objects.reference_grants);
    let headers = http::HeaderMap::new();
    for route in &objects.http_routes {
        for host in &route.spec.hostnames {
            for rule in &route.spec.rules {
                for m in &rule.matches {
                    let path = m.path.as_ref().map_or("/", |p| p.value());
                    for (port, _) in table.ports() {
                        let request = HttpRequest { port, host, path, query: None, method: "GET", headers: &headers };
                        if let Some(hit) = table.route(&request) {
                            let _ = hit.action(7);
                        }
                    }
                }
            }
        }
    }
});
