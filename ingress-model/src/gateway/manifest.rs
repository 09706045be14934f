//! Gateway API objects from the same JSON and YAML manifests as Ingress.
//!
//! One pass over the documents collects every GatewayClass, Gateway, HTTPRoute and
//! ReferenceGrant; other kinds (Ingresses, Services, ...) are skipped. GatewayClass, Gateway
//! and HTTPRoute are read at `gateway.networking.k8s.io/v1` and `v1beta1`, ReferenceGrant at
//! `v1beta1` and `v1`: the fields meshkit reads have the same shape in both versions.
//!
//! ```
//! use meshkit_ingress_model::gateway::manifest;
//!
//! let objects = manifest::from_yaml_str(r#"
//! apiVersion: gateway.networking.k8s.io/v1
//! kind: Gateway
//! metadata: {name: public, namespace: edge}
//! spec:
//!   gatewayClassName: meshkit
//!   listeners:
//!   - {name: http, port: 80, protocol: HTTP}
//! ---
//! apiVersion: gateway.networking.k8s.io/v1
//! kind: HTTPRoute
//! metadata: {name: shop, namespace: edge}
//! spec:
//!   parentRefs: [{name: public}]
//!   hostnames: [shop.example.com]
//!   rules:
//!   - backendRefs: [{name: web, port: 8080}]
//! "#)?;
//! assert_eq!(objects.gateways.len(), 1);
//! assert_eq!(objects.http_routes[0].spec.rules[0].backend_refs[0].backend.name, "web");
//! # Ok::<(), meshkit_ingress_model::manifest::ManifestError>(())
//! ```

use serde_json::Value;

use super::types::{Gateway, GatewayClass, HttpRoute, ReferenceGrant};
use crate::manifest::{ManifestError, RawObject, for_each_object, yaml_documents};

const VERSIONS: &[&str] = &[
    "gateway.networking.k8s.io/v1",
    "gateway.networking.k8s.io/v1beta1",
];
const GRANT_VERSIONS: &[&str] = &[
    "gateway.networking.k8s.io/v1beta1",
    "gateway.networking.k8s.io/v1",
];
const KINDS: &[&str] = &["GatewayClass", "Gateway", "HTTPRoute", "ReferenceGrant"];

/// The Gateway API objects of a manifest, each kind in input order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GatewayApiObjects {
    /// Every GatewayClass.
    pub gateway_classes: Vec<GatewayClass>,
    /// Every Gateway.
    pub gateways: Vec<Gateway>,
    /// Every HTTPRoute.
    pub http_routes: Vec<HttpRoute>,
    /// Every ReferenceGrant.
    pub reference_grants: Vec<ReferenceGrant>,
}

impl GatewayApiObjects {
    /// Adds the object if it is of one of the four kinds; returns whether it was.
    ///
    /// # Errors
    ///
    /// As [`from_yaml_str`], for this object.
    fn add(&mut self, kind: &str, object: RawObject) -> Result<bool, ManifestError> {
        match kind {
            "GatewayClass" => self.gateway_classes.push(object.decode(VERSIONS)?),
            "Gateway" => self.gateways.push(object.decode(VERSIONS)?),
            "HTTPRoute" => self.http_routes.push(object.decode(VERSIONS)?),
            "ReferenceGrant" => self.reference_grants.push(object.decode(GRANT_VERSIONS)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Appends the objects of `other`.
    pub fn extend(&mut self, other: GatewayApiObjects) {
        self.gateway_classes.extend(other.gateway_classes);
        self.gateways.extend(other.gateways);
        self.http_routes.extend(other.http_routes);
        self.reference_grants.extend(other.reference_grants);
    }

    /// True when there is no object of any kind.
    pub fn is_empty(&self) -> bool {
        self.gateway_classes.is_empty()
            && self.gateways.is_empty()
            && self.http_routes.is_empty()
            && self.reference_grants.is_empty()
    }
}

/// Every Gateway API object in a (multi-document) YAML string; list documents contribute
/// their items; other kinds are skipped.
///
/// # Errors
///
/// [`ManifestError`] naming the document, and the field path for a bad field.
pub fn from_yaml_str(text: &str) -> Result<GatewayApiObjects, ManifestError> {
    collect(yaml_documents(text)?)
}

/// Every Gateway API object in a JSON text holding one object or a list.
///
/// # Errors
///
/// As [`from_yaml_str`].
pub fn from_json_str(text: &str) -> Result<GatewayApiObjects, ManifestError> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| ManifestError::Json(e.to_string()))?;
    collect(vec![value])
}

/// The Gateway API object in one parsed JSON value (an object or a list), for readers that
/// parse documents themselves and dispatch on `kind`.
///
/// # Errors
///
/// As [`from_yaml_str`].
pub fn from_json_value(value: Value) -> Result<GatewayApiObjects, ManifestError> {
    collect(vec![value])
}

/// True for the kinds [`from_yaml_str`] reads.
pub fn is_gateway_api_kind(kind: &str) -> bool {
    KINDS.contains(&kind)
}

fn collect(documents: Vec<Value>) -> Result<GatewayApiObjects, ManifestError> {
    let mut objects = GatewayApiObjects::default();
    for_each_object(documents, KINDS, |kind, object| {
        objects.add(kind, object).map(drop)
    })?;
    Ok(objects)
}
