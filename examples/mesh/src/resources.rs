//! The xDS resource types the control plane serves beyond Envoy's, and their type URLs.
//!
//! [`AddressResource`], [`AuthorizationResource`], [`IngressResource`] and
//! [`IngressClassResource`] implement meshkit-xds-client's [`Resource`] trait, so a node proxy
//! can `watch_all::<AddressResource>()` and `watch_all::<AuthorizationResource>()`, and a
//! gateway `watch_all::<IngressResource>()`; so do the Gateway API objects as
//! [`GatewayApiResource`]s (`watch_all::<GatewayApiResource<HttpRoute>>()`).
//!
//! The Gateway API kinds have no protobuf schema (their CRDs define JSON only), so their
//! resources carry the object's Kubernetes JSON as the `Any`'s value, under a type URL that
//! says so: `meshkit.dev/k8s-json/<group>/<version>/<Kind>`.

use meshkit_ingress_model::gateway::types::{Gateway, GatewayClass, HttpRoute, ReferenceGrant};
use meshkit_ingress_model::gateway::validation;
use meshkit_ingress_model::k8s::io::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use meshkit_ingress_model::validation::ValidationErrors;
use meshkit_ingress_model::{Ingress, IngressClass};
use meshkit_xds_client::{InvalidResource, Resource};
use prost::Message;

use std::sync::Arc;

use crate::authz::Policy;
use crate::proto::security::Authorization;
use crate::proto::workload::{Address, address};

/// Type URL of the workload API's `Address` resources.
pub const ADDRESS_TYPE_URL: &str = "type.googleapis.com/istio.workload.Address";

/// Type URL of the L4 authorization policies, `istio.security.Authorization`.
pub const AUTHORIZATION_TYPE_URL: &str = "type.googleapis.com/istio.security.Authorization";

/// Type URL under which Ingress objects are served (the generated protobuf type).
pub const INGRESS_TYPE_URL: &str = "type.googleapis.com/k8s.io.api.networking.v1.Ingress";

/// Type URL under which IngressClass objects are served (the generated protobuf type).
pub const INGRESS_CLASS_TYPE_URL: &str =
    "type.googleapis.com/k8s.io.api.networking.v1.IngressClass";

/// Type URL of Gateway API `GatewayClass` objects (Kubernetes JSON).
pub const GATEWAY_CLASS_TYPE_URL: &str =
    "meshkit.dev/k8s-json/gateway.networking.k8s.io/v1/GatewayClass";

/// Type URL of Gateway API `Gateway` objects (Kubernetes JSON).
pub const GATEWAY_TYPE_URL: &str = "meshkit.dev/k8s-json/gateway.networking.k8s.io/v1/Gateway";

/// Type URL of Gateway API `HTTPRoute` objects (Kubernetes JSON).
pub const HTTP_ROUTE_TYPE_URL: &str = "meshkit.dev/k8s-json/gateway.networking.k8s.io/v1/HTTPRoute";

/// Type URL of Gateway API `ReferenceGrant` objects (Kubernetes JSON).
pub const REFERENCE_GRANT_TYPE_URL: &str =
    "meshkit.dev/k8s-json/gateway.networking.k8s.io/v1beta1/ReferenceGrant";

/// The controller name (GatewayClass `spec.controllerName`) of meshkit's gateway: the
/// Gateways of classes with this controller are the ones meshkit serves by default.
pub const GATEWAY_CONTROLLER: &str = "meshkit.dev/gateway";

/// A Gateway API object kind served over xDS as its Kubernetes JSON.
pub trait GatewayApiKind:
    serde::de::DeserializeOwned + serde::Serialize + Clone + PartialEq + Send + Sync + 'static
{
    /// The type URL it is served under.
    const TYPE_URL: &'static str;
    /// Whether objects of the kind live in a namespace (all but GatewayClass).
    const NAMESPACED: bool;
    /// The object's metadata.
    fn metadata(&self) -> &ObjectMeta;
    /// The CRD's validation.
    ///
    /// # Errors
    ///
    /// Every rule the object breaks.
    fn validate(&self) -> Result<(), ValidationErrors>;
}

/// A Gateway API object with its xDS name: `namespace/name`, or the name of a
/// cluster-scoped GatewayClass. Decoded from JSON and validated by the CRD's rules on
/// receipt; an invalid object is refused (NACKed).
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayApiResource<K> {
    /// The xDS name.
    pub name: String,
    /// The object.
    pub object: K,
}

/// An `Address` with its xDS name: the workload's uid, or `namespace/hostname` for a service.
#[derive(Debug, Clone, PartialEq)]
pub struct AddressResource {
    /// The xDS name.
    pub name: String,
    /// The address.
    pub address: Address,
}

/// An authorization policy with its xDS name, `namespace/name`, checked on receipt: a
/// policy that is not a valid [`Policy`] is refused (NACKed) whole.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthorizationResource {
    /// The xDS name.
    pub name: String,
    /// The policy.
    pub policy: Arc<Policy>,
    /// Why the policy does not convert, when it does not: [`Resource::validate`] refuses it
    /// then, after its name is known, so that the refusal names it in both protocol modes.
    invalid: Option<String>,
}

/// An Ingress with its xDS name, `namespace/name`.
#[derive(Debug, Clone, PartialEq)]
pub struct IngressResource {
    /// The xDS name.
    pub name: String,
    /// The Ingress.
    pub ingress: Ingress,
}

/// An IngressClass with its xDS name, the class name (IngressClasses are cluster-scoped).
#[derive(Debug, Clone, PartialEq)]
pub struct IngressClassResource {
    /// The xDS name.
    pub name: String,
    /// The IngressClass.
    pub class: IngressClass,
}

// === impl AddressResource ===

impl AddressResource {
    /// The xDS name of `address`.
    pub fn name_of(address: &Address) -> Option<String> {
        match address.r#type.as_ref()? {
            address::Type::Workload(w) => Some(w.uid.clone()),
            address::Type::Service(s) => Some(format!("{}/{}", s.namespace, s.hostname)),
        }
    }
}

impl Resource for AddressResource {
    const TYPE_URL: &'static str = ADDRESS_TYPE_URL;
    // meshkit's control plane sends every address in each SotW response.
    const ALL_RESOURCES_REQUIRED_IN_SOTW: bool = true;

    fn decode(bytes: &[u8]) -> Result<Self, InvalidResource> {
        let address = Address::decode(bytes)?;
        let name = Self::name_of(&address)
            .ok_or_else(|| InvalidResource::new("address is neither a workload nor a service"))?;
        Ok(Self { name, address })
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn validate(&self) -> Result<(), InvalidResource> {
        if self.name.is_empty() || self.name == "/" {
            return Err(InvalidResource::new("name is empty"));
        }
        if let Some(address::Type::Workload(w)) = &self.address.r#type {
            for a in &w.addresses {
                if a.len() != 4 && a.len() != 16 {
                    return Err(InvalidResource::new(format!(
                        "workload address of {} bytes is neither IPv4 nor IPv6",
                        a.len()
                    )));
                }
            }
        }
        Ok(())
    }
}

// === impl AuthorizationResource ===

impl Resource for AuthorizationResource {
    const TYPE_URL: &'static str = AUTHORIZATION_TYPE_URL;
    // meshkit's control plane sends every policy in each SotW response.
    const ALL_RESOURCES_REQUIRED_IN_SOTW: bool = true;

    fn decode(bytes: &[u8]) -> Result<Self, InvalidResource> {
        let proto = Authorization::decode(bytes)?;
        Ok(match Policy::try_from(&proto) {
            Ok(policy) => Self {
                name: policy.key(),
                policy: Arc::new(policy),
                invalid: None,
            },
            Err(e) => {
                let name = format!("{}/{}", proto.namespace, proto.name);
                let invalid = Some(format!("policy {name}: {e}"));
                // Never served: `validate` refuses the resource.
                let policy = Policy {
                    name: proto.name,
                    namespace: proto.namespace,
                    scope: crate::authz::Scope::WorkloadSelector,
                    action: crate::authz::Action::Deny,
                    rules: Vec::new(),
                    dry_run: false,
                };
                Self {
                    name,
                    policy: Arc::new(policy),
                    invalid,
                }
            }
        })
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn validate(&self) -> Result<(), InvalidResource> {
        if let Some(invalid) = &self.invalid {
            return Err(InvalidResource::new(invalid.clone()));
        }
        if self.policy.name.is_empty() {
            return Err(InvalidResource::new("policy name is empty"));
        }
        Ok(())
    }
}

// === impl GatewayApiKind ===

impl GatewayApiKind for GatewayClass {
    const TYPE_URL: &'static str = GATEWAY_CLASS_TYPE_URL;
    const NAMESPACED: bool = false;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn validate(&self) -> Result<(), ValidationErrors> {
        validation::validate_gateway_class(self)
    }
}

impl GatewayApiKind for Gateway {
    const TYPE_URL: &'static str = GATEWAY_TYPE_URL;
    const NAMESPACED: bool = true;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn validate(&self) -> Result<(), ValidationErrors> {
        validation::validate_gateway(self)
    }
}

impl GatewayApiKind for HttpRoute {
    const TYPE_URL: &'static str = HTTP_ROUTE_TYPE_URL;
    const NAMESPACED: bool = true;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn validate(&self) -> Result<(), ValidationErrors> {
        validation::validate_http_route(self)
    }
}

impl GatewayApiKind for ReferenceGrant {
    const TYPE_URL: &'static str = REFERENCE_GRANT_TYPE_URL;
    const NAMESPACED: bool = true;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn validate(&self) -> Result<(), ValidationErrors> {
        validation::validate_reference_grant(self)
    }
}

// === impl GatewayApiResource ===

impl<K: GatewayApiKind> GatewayApiResource<K> {
    /// The xDS name of `object`: `namespace/name` (namespace `default` when unset), or the
    /// name alone for a cluster-scoped kind.
    pub fn name_of(object: &K) -> String {
        let meta = object.metadata();
        let name = meta.name.as_deref().unwrap_or("");
        if K::NAMESPACED {
            format!("{}/{name}", meta.namespace.as_deref().unwrap_or("default"))
        } else {
            name.to_owned()
        }
    }

    /// The bytes served for `object`: its Kubernetes JSON.
    ///
    /// # Errors
    ///
    /// When the object holds a value JSON cannot express (an out-of-range timestamp).
    pub fn encode(object: &K) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(object)
    }
}

impl<K: GatewayApiKind> Resource for GatewayApiResource<K> {
    const TYPE_URL: &'static str = K::TYPE_URL;
    // Served with every object in each response, so absence means deletion.
    const ALL_RESOURCES_REQUIRED_IN_SOTW: bool = true;

    fn decode(bytes: &[u8]) -> Result<Self, InvalidResource> {
        let object: K = serde_json::from_slice(bytes)
            .map_err(|e| InvalidResource::new(format!("invalid {}: {e}", K::TYPE_URL)))?;
        Ok(Self {
            name: Self::name_of(&object),
            object,
        })
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn validate(&self) -> Result<(), InvalidResource> {
        if self
            .object
            .metadata()
            .name
            .as_deref()
            .is_none_or(str::is_empty)
        {
            return Err(InvalidResource::new("name is empty"));
        }
        GatewayApiKind::validate(&self.object).map_err(|e| InvalidResource::new(e.to_string()))
    }
}

// === impl IngressResource ===

impl Resource for IngressResource {
    const TYPE_URL: &'static str = INGRESS_TYPE_URL;
    // Served with every Ingress in each response, so absence means deletion.
    const ALL_RESOURCES_REQUIRED_IN_SOTW: bool = true;

    fn decode(bytes: &[u8]) -> Result<Self, InvalidResource> {
        let ingress = Ingress::decode(bytes)?;
        let meta = ingress.metadata.as_ref();
        let name = format!(
            "{}/{}",
            meta.and_then(|m| m.namespace.as_deref())
                .unwrap_or("default"),
            meta.and_then(|m| m.name.as_deref()).unwrap_or("")
        );
        Ok(Self { name, ingress })
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn validate(&self) -> Result<(), InvalidResource> {
        meshkit_ingress_model::validation::validate_ingress(&self.ingress)
            .map_err(|e| InvalidResource::new(e.to_string()))
    }
}

// === impl IngressClassResource ===

impl Resource for IngressClassResource {
    const TYPE_URL: &'static str = INGRESS_CLASS_TYPE_URL;
    const ALL_RESOURCES_REQUIRED_IN_SOTW: bool = true;

    fn decode(bytes: &[u8]) -> Result<Self, InvalidResource> {
        let class = IngressClass::decode(bytes)?;
        let name = class
            .metadata
            .as_ref()
            .and_then(|m| m.name.clone())
            .unwrap_or_default();
        Ok(Self { name, class })
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn validate(&self) -> Result<(), InvalidResource> {
        if self.name.is_empty() {
            return Err(InvalidResource::new("name is empty"));
        }
        Ok(())
    }
}
