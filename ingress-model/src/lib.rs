//! Kubernetes `networking.k8s.io/v1` Ingress for meshkit: generated protobuf types, the
//! Kubernetes protobuf envelope, JSON and YAML manifests, validation by the API server's
//! rules, and an Ingress route table with the Kubernetes matching semantics.
//!
//! # Example: YAML in, route out
//!
//! ```
//! use meshkit_ingress_model::{RouteTable, manifest};
//!
//! let yaml = r#"
//! apiVersion: networking.k8s.io/v1
//! kind: Ingress
//! metadata:
//!   name: shop
//!   namespace: retail
//! spec:
//!   defaultBackend:
//!     service: {name: not-found, port: {number: 8080}}
//!   tls:
//!   - hosts: ["*.shop.example.com"]
//!     secretName: shop-wildcard
//!   rules:
//!   - host: shop.example.com
//!     http:
//!       paths:
//!       - path: /
//!         pathType: Prefix
//!         backend: {service: {name: web, port: {number: 80}}}
//!       - path: /api
//!         pathType: Prefix
//!         backend: {service: {name: api, port: {name: grpc}}}
//! "#;
//! let ingresses = manifest::from_yaml_str(yaml)?;
//! for ingress in &ingresses {
//!     meshkit_ingress_model::validation::validate_ingress(ingress)?;
//! }
//! let table = RouteTable::new(&ingresses);
//!
//! let m = table.route("Shop.Example.com:443", "/api/v1/cart").expect("a route");
//! assert_eq!(m.service_name(), Some("api"));
//! assert_eq!((m.namespace(), m.ingress_name()), ("retail", "shop"));
//! // `/apiary` is not under `/api`: Prefix matches whole path elements.
//! assert_eq!(table.route("shop.example.com", "/apiary").and_then(|m| m.service_name()), Some("web"));
//! // No rule for this host: the default backend.
//! assert_eq!(table.route("other.example.com", "/").and_then(|m| m.service_name()), Some("not-found"));
//! // SNI certificate selection.
//! assert_eq!(table.tls_secret_for("eu.shop.example.com").map(|s| s.secret_name), Some("shop-wildcard"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Modules
//!
//! - [`k8s`]: the prost-generated types, in modules named after the upstream protobuf
//!   packages; the networking ones are re-exported at the crate root. Generated code is
//!   checked in under `src/generated/` and a test fails when it is stale.
//! - [`envelope`]: `k8s\0` + `runtime.Unknown` encoding and decoding.
//! - [`manifest`]: JSON and (multi-document) YAML with the Kubernetes field names.
//! - [`validation`]: the API server's create-time rules, with Kubernetes-style field errors.
//! - [`route`]: [`RouteTable`], the conflict rule, IngressClass filtering and SNI lookup.
//! - [`gateway`]: the Gateway API (GatewayClass, Gateway, HTTPRoute, ReferenceGrant): types,
//!   manifests, the CRDs' validation and [`gateway::HttpRouteTable`].
//!
//! # Feature flags
//!
//! None.
//!
//! # Stability
//!
//! Pre-1.0, like the rest of meshkit. The generated types follow the upstream schema and
//! change only with it; error enums are `#[non_exhaustive]`.

// docs.rs builds with `--cfg docsrs`: items behind a feature show it.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod envelope;
pub mod gateway;
pub mod k8s;
pub mod manifest;
pub mod route;
mod serde_impls;
pub mod validation;

pub use k8s::io::api::networking::v1::{
    HttpIngressPath, HttpIngressRuleValue, Ingress, IngressBackend, IngressClass, IngressClassList,
    IngressClassParametersReference, IngressClassSpec, IngressList, IngressLoadBalancerIngress,
    IngressLoadBalancerStatus, IngressPortStatus, IngressRule, IngressRuleValue,
    IngressServiceBackend, IngressSpec, IngressStatus, IngressTls, ServiceBackendPort,
};
pub use route::{
    HostMatch, MatchSource, PathType, RouteMatch, RouteTable, RouteTableBuilder, TlsSecretRef,
};
