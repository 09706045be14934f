//! Small constructors for Ingress objects in tests.

#![allow(dead_code, unreachable_pub)]

use meshkit_ingress_model::k8s::io::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use meshkit_ingress_model::{
    HttpIngressPath, HttpIngressRuleValue, Ingress, IngressBackend, IngressRule, IngressRuleValue,
    IngressServiceBackend, IngressSpec, IngressTls, ServiceBackendPort,
};

pub fn backend(service: &str, port: i32) -> IngressBackend {
    IngressBackend {
        service: Some(IngressServiceBackend {
            name: Some(service.to_owned()),
            port: Some(ServiceBackendPort {
                name: None,
                number: Some(port),
            }),
        }),
        resource: None,
    }
}

pub fn path(path: &str, path_type: Option<&str>, service: &str, port: i32) -> HttpIngressPath {
    HttpIngressPath {
        path: Some(path.to_owned()),
        path_type: path_type.map(str::to_owned),
        backend: Some(backend(service, port)),
    }
}

pub fn rule(host: Option<&str>, paths: Vec<HttpIngressPath>) -> IngressRule {
    IngressRule {
        host: host.map(str::to_owned),
        ingress_rule_value: Some(IngressRuleValue {
            http: Some(HttpIngressRuleValue { paths }),
        }),
    }
}

pub fn tls(hosts: &[&str], secret: &str) -> IngressTls {
    IngressTls {
        hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
        secret_name: Some(secret.to_owned()),
    }
}

pub fn ingress(
    namespace: &str,
    name: &str,
    created: Option<i64>,
    rules: Vec<IngressRule>,
) -> Ingress {
    Ingress {
        metadata: Some(ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            creation_timestamp: created.map(|s| Time {
                seconds: Some(s),
                nanos: Some(0),
            }),
            ..Default::default()
        }),
        spec: Some(IngressSpec {
            rules,
            ..Default::default()
        }),
        status: None,
    }
}

pub fn with_default(mut ingress: Ingress, service: &str, port: i32) -> Ingress {
    if let Some(spec) = ingress.spec.as_mut() {
        spec.default_backend = Some(backend(service, port));
    }
    ingress
}

pub fn with_class(mut ingress: Ingress, class: &str) -> Ingress {
    if let Some(spec) = ingress.spec.as_mut() {
        spec.ingress_class_name = Some(class.to_owned());
    }
    ingress
}

pub fn with_tls(mut ingress: Ingress, entries: Vec<IngressTls>) -> Ingress {
    if let Some(spec) = ingress.spec.as_mut() {
        spec.tls = entries;
    }
    ingress
}

/// `(service name, port number)` of a Service backend.
pub fn service_of(backend: &IngressBackend) -> (String, i32) {
    let service = backend.service.as_ref().expect("service backend");
    let port = service.port.as_ref().and_then(|p| p.number).unwrap_or(-1);
    (service.name.clone().unwrap_or_default(), port)
}
