//! The xDS resource types the control plane serves beyond Envoy's, and their type URLs.
//!
//! [`AddressResource`], [`AuthorizationResource`], [`IngressResource`] and
//! [`IngressClassResource`] implement meshkit-xds-client's [`Resource`] trait, so a node proxy
//! can `watch_all::<AddressResource>()` and `watch_all::<AuthorizationResource>()`, and a
//! gateway `watch_all::<IngressResource>()`.

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
        let policy = Policy::try_from(&proto).map_err(|e| {
            InvalidResource::new(format!("policy {}/{}: {e}", proto.namespace, proto.name))
        })?;
        Ok(Self {
            name: policy.key(),
            policy: Arc::new(policy),
        })
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn validate(&self) -> Result<(), InvalidResource> {
        if self.policy.name.is_empty() {
            return Err(InvalidResource::new("policy name is empty"));
        }
        Ok(())
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
