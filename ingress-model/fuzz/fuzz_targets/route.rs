#![no_main]
//! Route and SNI lookups on arbitrary hosts and paths never panic.
use meshkit_ingress_model::{RouteTable, manifest};
libfuzzer_sys::fuzz_target!(|input: (&str, &str)| {
    let yaml = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: a}\nspec:\n  tls: [{hosts: ['*.a.com'], secretName: s}]\n  rules:\n  - host: '*.a.com'\n    http: {paths: [{path: /x, pathType: Prefix, backend: {service: {name: x, port: {number: 1}}}}]}\n  - http: {paths: [{path: /x/y, pathType: Exact, backend: {service: {name: y, port: {number: 1}}}}]}\n";
    let table = RouteTable::new(&manifest::from_yaml_str(yaml).unwrap_or_default());
    let _ = table.route(input.0, input.1);
    let _ = table.tls_secret_for(input.0);
});
