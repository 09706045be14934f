//! The Kubernetes Gateway API (`gateway.networking.k8s.io`): GatewayClass, Gateway,
//! HTTPRoute and ReferenceGrant, read from the same manifests as Ingress, validated by the
//! CRDs' rules, and routed by [`HttpRouteTable`] with the specification's semantics.
//!
//! Ingress is untouched: the two models live side by side, and a gateway may serve both.
//!
//! # Example
//!
//! ```
//! use http::HeaderMap;
//! use meshkit_ingress_model::gateway::{Action, HttpRequest, HttpRouteTable, manifest};
//!
//! let objects = manifest::from_yaml_str(r#"
//! apiVersion: gateway.networking.k8s.io/v1
//! kind: Gateway
//! metadata: {name: public, namespace: edge}
//! spec:
//!   gatewayClassName: meshkit
//!   listeners:
//!   - {name: http, port: 80, protocol: HTTP, hostname: "*.example.com"}
//! ---
//! apiVersion: gateway.networking.k8s.io/v1
//! kind: HTTPRoute
//! metadata: {name: shop, namespace: edge}
//! spec:
//!   parentRefs: [{name: public}]
//!   hostnames: [shop.example.com]
//!   rules:
//!   - matches: [{path: {type: PathPrefix, value: /api}, headers: [{name: x-canary, value: "on"}]}]
//!     backendRefs: [{name: api-canary, port: 8080}]
//!   - matches: [{path: {type: PathPrefix, value: /api}}]
//!     backendRefs: [{name: api, port: 8080, weight: 9}, {name: api-next, port: 8080, weight: 1}]
//!   - matches: [{path: {type: Exact, value: /old}}]
//!     filters:
//!     - type: RequestRedirect
//!       requestRedirect: {path: {type: ReplaceFullPath, replaceFullPath: /new}, statusCode: 301}
//! "#)?;
//! let table = HttpRouteTable::new(&objects.gateways, &objects.http_routes, &objects.reference_grants);
//!
//! let plain = HeaderMap::new();
//! let request = HttpRequest {
//!     port: 80,
//!     host: "shop.example.com",
//!     path: "/api/cart",
//!     query: None,
//!     method: "GET",
//!     headers: &plain,
//! };
//! let rule = table.route(&request).expect("a rule");
//! assert_eq!(rule.rule_index(), 1);
//! // Weights 9 and 1: rolls 0 to 8 of every 10 go to `api`.
//! match rule.action(3) {
//!     Action::Forward(backend) => assert_eq!(backend.target.as_ref().map(|s| s.name.as_str()), Ok("api")),
//!     other => panic!("{other:?}"),
//! }
//!
//! // A header match outranks the rule without one.
//! let mut canary = HeaderMap::new();
//! canary.insert("x-canary", "on".parse()?);
//! let with_header = HttpRequest { headers: &canary, ..request };
//! assert_eq!(table.route(&with_header).map(|r| r.rule_index()), Some(0));
//!
//! // The redirect.
//! let request = HttpRequest { path: "/old", ..request };
//! let Some(Action::Redirect(redirect)) = table.route(&request).map(|r| r.action(0)) else { panic!() };
//! assert_eq!(redirect.status(), 301);
//! assert_eq!(redirect.location("http", "shop.example.com", 80, "/old", None, "/old"), "http://shop.example.com/new");
//!
//! // No rule for this path, and no route for this host: 404.
//! assert!(table.route(&HttpRequest { path: "/", ..request }).is_none());
//! assert!(table.route(&HttpRequest { host: "other.example.com", ..request }).is_none());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Modules
//!
//! - [`types`]: the objects, as serde types with the Kubernetes field names.
//! - [`manifest`]: every Gateway API object of a JSON or (multi-document) YAML manifest.
//! - [`validation`]: the CRDs' rules, with field paths.
//! - [`route`]: [`HttpRouteTable`], attachment, status conditions and filters.

pub mod manifest;
pub mod route;
pub mod types;
pub mod validation;

pub use route::{
    Action, Backend, BackendError, CertificateRef, Condition, DomainRules, Filter, HeaderModifier,
    HttpRequest, HttpRouteTable, HttpRouteTableBuilder, ListenerStatus, PathModifier, Reason,
    Redirect, RouteStatus, RuleMatch, ServiceRef, UrlRewrite,
};
pub use types::{GROUP, Gateway, GatewayClass, HttpRoute, ReferenceGrant};
