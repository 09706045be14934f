//! `/config_dump`: the gateway's configuration as JSON, rendered once per configuration (the
//! request path never sees it). It names certificates and when they expire, never a key.
//!
//! ```text
//! identity, trust_domain, draining
//! routes[]            route (the metrics' `route` label), ingress, host, path, path_type, backend
//! backends[]          service (host name), namespace, name, ports[], endpoints[] (ip, workload, identity)
//! tls_certificates[]  namespace, name, dns_names[], not_after (RFC 3339), not_after_unix, loaded, error
//! ```

use meshkit_ingress_model::{Ingress, IngressBackend, RouteTableBuilder};
use meshkit_mesh::MeshIndex;
use serde_json::{Value, json};

use crate::tls::CertInfo;
use crate::{GatewayConfig, Shared};

/// The dump of the running gateway: its settings' identity and state, and the current
/// configuration.
pub(crate) fn config_dump(shared: &Shared) -> Value {
    let current = shared.current.borrow().clone();
    let mut dump = json!({
        "identity": shared.settings.identity.as_ref(),
        "trust_domain": shared.settings.trust_domain.to_string(),
        "draining": shared.readiness.is_draining(),
    });
    if let (Some(out), Value::Object(config)) = (dump.as_object_mut(), &current.dump) {
        out.extend(config.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    dump
}

/// The configuration part of the dump.
pub(crate) fn compiled(
    builder: &RouteTableBuilder,
    config: &GatewayConfig,
    index: &MeshIndex,
    certs: &[CertInfo],
) -> Value {
    let routes: Vec<Value> = config
        .ingresses
        .iter()
        .filter(|i| builder.accepts(i))
        .flat_map(ingress_routes)
        .collect();
    let backends: Vec<Value> = config
        .mesh
        .services
        .iter()
        .map(|s| {
            let endpoints: Vec<Value> = s
                .endpoints
                .iter()
                .map(|ip| match index.workload(*ip) {
                    Some((w, id)) => json!({
                        "ip": ip.to_string(),
                        "workload": w.name,
                        "identity": id.as_ref(),
                    }),
                    None => json!({ "ip": ip.to_string(), "workload": null }),
                })
                .collect();
            let ports: Vec<Value> = s
                .ports
                .iter()
                .map(|p| json!({ "name": p.name, "port": p.port, "target_port": p.target_port }))
                .collect();
            json!({
                "service": s.hostname,
                "namespace": s.namespace,
                "name": s.name,
                "ports": ports,
                "endpoints": endpoints,
            })
        })
        .collect();
    let certificates: Vec<Value> = certs
        .iter()
        .map(|c| {
            let rfc3339 = c.not_after.and_then(|t| {
                time::OffsetDateTime::from_unix_timestamp(t)
                    .ok()?
                    .format(&time::format_description::well_known::Rfc3339)
                    .ok()
            });
            json!({
                "namespace": c.namespace,
                "name": c.name,
                "dns_names": c.dns_names,
                "not_after": rfc3339,
                "not_after_unix": c.not_after,
                "loaded": c.error.is_none(),
                "error": c.error,
            })
        })
        .collect();
    json!({
        "routes": routes,
        "backends": backends,
        "tls_certificates": certificates,
    })
}

/// The routes one Ingress adds, in its order, named as the metrics' `route` label names them.
fn ingress_routes(ingress: &Ingress) -> Vec<Value> {
    let meta = ingress.metadata.as_ref();
    let namespace = meta.and_then(|m| m.namespace.as_deref()).unwrap_or("");
    let name = meta.and_then(|m| m.name.as_deref()).unwrap_or("");
    let Some(spec) = ingress.spec.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for rule in &spec.rules {
        let host = rule
            .host
            .as_deref()
            .filter(|h| !h.is_empty())
            .unwrap_or("*");
        let Some(http) = rule
            .ingress_rule_value
            .as_ref()
            .and_then(|v| v.http.as_ref())
        else {
            continue;
        };
        for path in &http.paths {
            let Some(backend) = path.backend.as_ref() else {
                continue;
            };
            let shown = path
                .path
                .as_deref()
                .filter(|p| !p.is_empty())
                .unwrap_or("*");
            out.push(json!({
                "route": format!("{namespace}/{name}:{shown}"),
                "ingress": format!("{namespace}/{name}"),
                "host": host,
                "path": path.path,
                "path_type": path.path_type.as_deref().unwrap_or("ImplementationSpecific"),
                "backend": backend_json(backend),
            }));
        }
    }
    if let Some(backend) = spec.default_backend.as_ref() {
        out.push(json!({
            "route": format!("{namespace}/{name}:defaultBackend"),
            "ingress": format!("{namespace}/{name}"),
            "host": "*",
            "path": null,
            "path_type": null,
            "backend": backend_json(backend),
        }));
    }
    out
}

fn backend_json(backend: &IngressBackend) -> Value {
    match (&backend.service, &backend.resource) {
        (Some(service), _) => {
            let port = service
                .port
                .as_ref()
                .map_or(Value::Null, |p| match (p.number, &p.name) {
                    (Some(n), _) => json!(n),
                    (None, Some(name)) => json!(name),
                    (None, None) => Value::Null,
                });
            json!({ "service": service.name, "port": port })
        }
        (None, Some(resource)) => json!({
            "resource": serde_json::to_value(resource).unwrap_or(Value::Null),
        }),
        (None, None) => Value::Null,
    }
}
